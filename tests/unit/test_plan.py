"""plan: BuildPlan golden tests for every architecture, validation errors, memory estimates."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import BuildPlan, GpuFacts, check_fits, estimate_memory, make_plan

GiB = 1024**3
H100 = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
H100x8 = H100.model_copy(update={"count": 8})
A100 = GpuFacts(name="NVIDIA A100-SXM4-80GB", sm=80, memory_gib=80, count=1)
L4 = GpuFacts(name="NVIDIA L4", sm=89, memory_gib=22, count=1)
T4 = GpuFacts(name="Tesla T4", sm=75, memory_gib=15, count=1)

# Real-shaped config.json dicts (values from the published model configs).
LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-5,
}
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
    "rms_norm_eps": 1e-5,
}
MISTRAL_7B = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
}
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "torch_dtype": "bfloat16",
}
FALCON_7B = {
    "architectures": ["RWForCausalLM"],
    "model_type": "RefinedWebModel",
    "hidden_size": 4544,
    "n_head": 71,
    "n_layer": 32,
    "multi_query": True,
    "parallel_attn": True,
    "vocab_size": 65024,
    "torch_dtype": "bfloat16",
}
FALCON_40B = {
    "architectures": ["FalconForCausalLM"],
    "model_type": "falcon",
    "hidden_size": 8192,
    "num_attention_heads": 128,
    "num_kv_heads": 8,
    "num_hidden_layers": 60,
    "new_decoder_architecture": True,
    "vocab_size": 65024,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
QWEN_7B = {
    "architectures": ["QWenLMHeadModel"],
    "model_type": "qwen",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "intermediate_size": 22016,
    "kv_channels": 128,
    "seq_length": 8192,
    "max_position_embeddings": 8192,
    "rotary_emb_base": 10000,
    "vocab_size": 151936,
    "bf16": True,
}
QWEN2_7B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rope_theta": 1e6,
    "torch_dtype": "bfloat16",
}
CHATGLM3_6B = {
    "architectures": ["ChatGLMModel"],
    "model_type": "chatglm",
    "_name_or_path": "THUDM/chatglm3-6b",
    "hidden_size": 4096,
    "num_layers": 28,
    "num_attention_heads": 32,
    "multi_query_attention": True,
    "multi_query_group_num": 2,
    "ffn_hidden_size": 13696,
    "kv_channels": 128,
    "seq_length": 8192,
    "padded_vocab_size": 65024,
    "layernorm_epsilon": 1e-5,
    "torch_dtype": "float16",
}
GPTJ_6B = {
    "architectures": ["GPTJForCausalLM"],
    "model_type": "gptj",
    "n_embd": 4096,
    "n_head": 16,
    "n_layer": 28,
    "n_positions": 2048,
    "rotary_dim": 64,
    "vocab_size": 50400,
    "torch_dtype": "float16",
}
GPT2 = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "vocab_size": 50257,
}
STARCODER = {
    "architectures": ["GPTBigCodeForCausalLM"],
    "model_type": "gpt_bigcode",
    "n_embd": 6144,
    "n_head": 48,
    "n_layer": 40,
    "n_positions": 8192,
    "multi_query": True,
    "vocab_size": 49152,
    "n_inner": 24576,
    "torch_dtype": "float32",
}
INTERNLM2_7B = {
    "architectures": ["InternLM2ForCausalLM"],
    "model_type": "internlm2",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000,
    "rope_scaling": {"type": "dynamic", "factor": 2.0},
    "vocab_size": 92544,
    "torch_dtype": "bfloat16",
}
BAICHUAN2_13B = {
    "architectures": ["BaichuanForCausalLM"],
    "model_type": "baichuan",
    "hidden_size": 5120,
    "intermediate_size": 13696,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "model_max_length": 4096,
    "vocab_size": 125696,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_MOE_16B = {
    "architectures": ["DeepseekForCausalLM"],
    "model_type": "deepseek",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 28,
    "max_position_embeddings": 4096,
    "vocab_size": 102400,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 27,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "max_position_embeddings": 163840,
    "vocab_size": 102400,
    "torch_dtype": "bfloat16",
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
}
GEMMA_7B = {
    "architectures": ["GemmaForCausalLM"],
    "model_type": "gemma",
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "num_hidden_layers": 28,
    "max_position_embeddings": 8192,
    "vocab_size": 256000,
    "torch_dtype": "bfloat16",
}
PHI2 = {
    "architectures": ["PhiForCausalLM"],
    "model_type": "phi",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 2048,
    "vocab_size": 51200,
    "torch_dtype": "float16",
}
PHI3_MINI = {
    "architectures": ["Phi3ForCausalLM"],
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "max_position_embeddings": 4096,
    "vocab_size": 32064,
    "torch_dtype": "bfloat16",
}

SMALL = dict(max_input_len=1024, max_output_len=512, trust_remote_code=True)

# name: (config, published parameter count in billions, dtype, converter kwargs, KV bytes/token at TP1 fp16/bf16)
GOLDEN = {
    "llama3.1-8b": (LLAMA31_8B, 8.03, "bfloat16", {"trust_remote_code": True}, 32 * 8 * 128 * 2 * 2),
    "llama2-7b": (LLAMA2_7B, 6.74, "float16", {"trust_remote_code": True}, 32 * 32 * 128 * 2 * 2),
    "mistral-7b": (MISTRAL_7B, 7.24, "bfloat16", {"trust_remote_code": True}, 32 * 8 * 128 * 2 * 2),
    "mixtral-8x7b": (MIXTRAL_8X7B, 46.7, "bfloat16", {"trust_remote_code": True}, 32 * 8 * 128 * 2 * 2),
    "falcon-7b": (FALCON_7B, 6.92, "bfloat16", {}, 32 * 1 * 64 * 2 * 2),
    "falcon-40b": (FALCON_40B, 41.8, "bfloat16", {}, 60 * 8 * 64 * 2 * 2),
    "qwen-7b": (QWEN_7B, 7.72, "float16", {"trust_remote_code": True}, 32 * 32 * 128 * 2 * 2),
    "qwen2-7b": (QWEN2_7B, 7.62, "bfloat16", {"trust_remote_code": True}, 28 * 4 * 128 * 2 * 2),
    "chatglm3-6b": (CHATGLM3_6B, 6.24, "float16", {"chatglm_version": "chatglm3"}, 28 * 2 * 128 * 2 * 2),
    "gpt-j-6b": (GPTJ_6B, 6.05, "float16", {}, 28 * 16 * 256 * 2 * 2),
    "starcoder": (
        STARCODER,
        15.5,
        "float16",
        {"trust_remote_code": True, "gpt_variant": "starcoder"},
        40 * 1 * 128 * 2 * 2,
    ),
    "internlm2-7b": (INTERNLM2_7B, 7.74, "bfloat16", {"trust_remote_code": True}, 32 * 8 * 128 * 2 * 2),
    "baichuan2-13b": (
        BAICHUAN2_13B,
        13.9,
        "bfloat16",
        {"trust_remote_code": True, "model_version": "v2_13b"},
        40 * 40 * 128 * 2 * 2,
    ),
    "deepseek-moe-16b": (DEEPSEEK_MOE_16B, 16.4, "bfloat16", {}, 28 * 16 * 128 * 2 * 2),
    # MLA caches kv_lora_rank + qk_rope_head_dim per layer (the attention math here is approximate).
    "deepseek-v2-lite": (DEEPSEEK_V2_LITE, 15.7, "bfloat16", {}, 27 * (512 + 64) * 2),
    "gemma-7b": (GEMMA_7B, 8.54, "bfloat16", {}, 28 * 16 * 256 * 2 * 2),
    "phi-2": (PHI2, 2.78, "float16", {}, 32 * 32 * 80 * 2 * 2),
    "phi-3-mini": (PHI3_MINI, 3.82, "bfloat16", {}, 32 * 32 * 96 * 2 * 2),
}


TIED_EMBEDDINGS = {"falcon-7b", "gemma-7b", "starcoder"}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_real_shaped(name):
    hf, billions, dtype, kwargs, kv_per_token = GOLDEN[name]
    plan = make_plan(CompileOptions(**SMALL), hf, H100, "1.0.0")
    assert plan.dtype == dtype
    assert plan.converter.kwargs == kwargs
    assert (plan.max_seq_len, plan.tp_size, plan.pp_size) == (1536, 1, 1)
    est = estimate_memory(plan, hf, H100)
    assert est.kv_bytes_per_token == kv_per_token
    # Engine bytes = every parameter in the model dtype, plus a separate lm_head copy for tied models
    # (published counts hold a tied matrix once).
    params = est.weight_bytes_total / 2
    lm_head = (hf.get("vocab_size") or hf["padded_vocab_size"]) * (hf.get("hidden_size") or hf["n_embd"])
    tied = name in TIED_EMBEDDINGS
    assert params - lm_head * tied == pytest.approx(billions * 1e9, rel=0.06)


def test_golden_llama31_8b_whole_plan():
    plan = make_plan(
        CompileOptions(max_input_len=4096, max_output_len=1024, max_batch_size=64), LLAMA31_8B, H100, "1.0.0"
    )
    assert plan.key_dict() == {
        "schema_version": 1,
        "architecture": "LlamaForCausalLM",
        "family": "llama",
        "trtllm_version": "1.0.0",
        "dtype": "bfloat16",
        "max_input_len": 4096,
        "max_output_len": 1024,
        "max_seq_len": 5120,
        "max_batch_size": 64,
        "max_beam_width": 1,
        "max_num_tokens": 8192,
        "max_draft_len": 0,
        "tp_size": 1,
        "pp_size": 1,
        "plugins": {
            "gpt_attention_plugin": "auto",
            "gemm_plugin": "auto",
            "context_fmha": True,
            "paged_kv_cache": True,
            "remove_input_padding": True,
            "tokens_per_block": 32,
            "use_paged_context_fmha": True,
            "use_fp8_context_fmha": False,
            "use_fused_mlp": False,
            "weight_only_quant_matmul_plugin": None,
            "weight_only_groupwise_quant_matmul_plugin": None,
            "use_custom_all_reduce": None,
            "multi_block_mode": None,
        },
        "quant": {
            "quantize": "none",
            "method": "none",
            "quant_algo": None,
            "kv_cache_quant_algo": None,
            "group_size": None,
            "smoothquant_val": None,
            "modelopt_qformat": None,
            "modelopt_kv_cache_dtype": None,
            "modelopt_decoder": None,
            "calibration": None,
        },
        "converter": {
            "source": "hf",
            "trtllm_class": "LLaMAForCausalLM",
            "kwargs": {"trust_remote_code": False},
            "hf_config_overrides": {},
            "trust_remote_code": False,
        },
    }
    assert any("max_seq_len = max_input_len + max_output_len = 4096 + 1024 = 5120" in n for n in plan.notes)
    est = estimate_memory(plan, LLAMA31_8B, H100)
    assert est.weight_bytes_per_gpu == pytest.approx(16.06e9, rel=0.01)
    assert est.kv_bytes_per_token == 131072
    free = 80 * GiB - est.weight_bytes_per_gpu - est.activation_reserve_bytes
    # option.kv_cache_free_gpu_mem_fraction's default (0.95), the one the Executor is given (issue 14: not 0.9)
    assert est.max_kv_tokens == int(free * 0.95) // 131072 // 32 * 32
    assert est.max_concurrent_sequences == est.max_kv_tokens // 32 // (5120 // 32)
    assert est.fits


@pytest.fixture(scope="module")
def tiny_configs():
    import tinymodels

    return {arch: tinymodels.model_config(tinymodels.tiny_model(arch)) for arch in tinymodels.ARCHS}


@pytest.mark.parametrize(
    "arch,family,cls,kv_per_token",
    [
        ("llama", "llama", "LLaMAForCausalLM", 2 * 2 * 16 * 2 * 2),
        ("qwen2", "qwen2", "QWenForCausalLM", 2 * 2 * 16 * 2 * 2),
        ("mistral", "mistral", "LLaMAForCausalLM", 2 * 2 * 16 * 2 * 2),
        ("gpt2", "gpt", "GPTForCausalLM", 2 * 4 * 16 * 2 * 2),
        ("falcon", "falcon", "FalconForCausalLM", 2 * 2 * 16 * 2 * 2),
        ("gptj", "gptj", "GPTJForCausalLM", 2 * 4 * 16 * 2 * 2),
    ],
)
def test_golden_tiny_models(tiny_configs, arch, family, cls, kv_per_token):
    hf = tiny_configs[arch]
    # transformers 5 writes "dtype" (the default run's format); the images' 4.x write "torch_dtype"
    assert hf.get("dtype", hf.get("torch_dtype")) == "float32"
    plan = make_plan(CompileOptions(max_input_len=128, max_output_len=64, max_batch_size=4), hf, H100, "1.0.0")
    assert (plan.family, plan.converter.trtllm_class, plan.dtype) == (family, cls, "float16")
    assert plan.max_seq_len == 192 and plan.max_num_tokens == 4 * 192  # default capped at batch × seq
    assert any("float32" in n and "float16" in n for n in plan.notes)
    assert estimate_memory(plan, hf, H100).kv_bytes_per_token == kv_per_token
    if arch == "gpt2":
        assert plan.converter.kwargs["gpt_variant"] == "gpt2"


def test_plan_is_pure_frozen_and_json_roundtrips():
    a = make_plan(CompileOptions(**SMALL, quantize="awq"), MISTRAL_7B, A100, "1.0.0")
    b = make_plan(CompileOptions(**SMALL, quantize="awq"), MISTRAL_7B, A100, "1.0.0")
    assert a == b
    again = BuildPlan.model_validate_json(a.model_dump_json())
    assert again == a and json.loads(again.model_dump_json()) == json.loads(a.model_dump_json())
    with pytest.raises(ValidationError):
        a.max_input_len = 1  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- lengths


def test_output_len_is_new_tokens_and_over_the_model_limit_is_an_error():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(max_input_len=4000, max_output_len=200), LLAMA2_7B, H100, "1.0.0")
    assert e.value.key == "option.max_input_len + option.max_output_len"
    assert "4000 + 200 = 4200" in str(e.value) and "≤ 4096" in str(e.value) and "rotary_scaling" in str(e.value)
    make_plan(CompileOptions(max_input_len=3896, max_output_len=200), LLAMA2_7B, H100, "1.0.0")


def test_linear_rope_scaling_extends_the_limit():
    opts = CompileOptions(
        max_input_len=7000, max_output_len=1000, rotary_scaling_type="linear", rotary_scaling_factor=2.0
    )
    plan = make_plan(opts, LLAMA2_7B, H100, "1.0.0")
    assert plan.max_seq_len == 8000
    assert plan.converter.hf_config_overrides["rope_scaling"]["factor"] == 2.0
    with pytest.raises(PlanError, match="8192 positions"):
        make_plan(opts.model_copy(update={"max_output_len": 1193}), LLAMA2_7B, H100, "1.0.0")


def test_yarn_extends_the_limit_as_the_builder_computes_it():
    """TensorRT-LLM's builder (_init_max_seq_len) scales max_position_embeddings by the factor for every
    RoPE type but su/longrope/llama3, rounding up: Qwen2.5's YaRN ×4 over 32768 builds 131072 positions."""
    qwen25_yarn = {
        **QWEN2_7B,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    plan = make_plan(
        CompileOptions(max_input_len=130000, max_output_len=1072, max_batch_size=1), qwen25_yarn, H100, "1.0.0"
    )
    assert plan.max_seq_len == 131072
    with pytest.raises(PlanError, match="131072 positions"):
        make_plan(
            CompileOptions(max_input_len=130000, max_output_len=1073, max_batch_size=1), qwen25_yarn, H100, "1.0.0"
        )
    odd = {**LLAMA2_7B, "rope_scaling": {"rope_type": "yarn", "factor": 1.5001}}  # ceil(4096 × 1.5001) = 6145
    make_plan(CompileOptions(max_input_len=6000, max_output_len=145, max_batch_size=1), odd, H100, "1.0.0")


def test_llama31_already_states_its_extended_length():
    make_plan(CompileOptions(max_input_len=131000, max_output_len=72, max_batch_size=1), LLAMA31_8B, H100, "1.0.0")
    with pytest.raises(PlanError, match="131072 positions"):
        make_plan(CompileOptions(max_input_len=131000, max_output_len=73), LLAMA31_8B, H100, "1.0.0")


def test_explicit_max_seq_len():
    plan = make_plan(CompileOptions(max_input_len=1024, max_output_len=512, max_seq_len=1200), LLAMA2_7B, H100, "1.0.0")
    assert plan.max_seq_len == 1200 and any("min(512, 1200 - n)" in n for n in plan.notes)
    with pytest.raises(PlanError) as e:  # djl#3489: max_input_len would be clipped to max_seq_len
        make_plan(CompileOptions(max_input_len=1024, max_seq_len=1024), LLAMA2_7B, H100, "1.0.0")
    assert e.value.key == "option.max_seq_len" and "> 1024" in str(e.value)
    with pytest.raises(PlanError, match="option.max_seq_len ≤ 4096"):
        make_plan(CompileOptions(max_input_len=1024, max_seq_len=5000), LLAMA2_7B, H100, "1.0.0")


def test_learned_positions_do_not_suggest_rope_scaling():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(), GPT2, H100, "1.0.0")
    assert "rotary" not in str(e.value) and "≤ 1024" in str(e.value)


def test_missing_max_positions_is_noted():
    plan = make_plan(CompileOptions(**SMALL), FALCON_7B, H100, "1.0.0")
    assert any("not checked" in n for n in plan.notes)


# ----------------------------------------------------------------------------------- max_num_tokens


def test_max_num_tokens_above_batch_times_seq_is_an_error_not_a_silent_cap():
    with pytest.raises(PlanError) as e:
        make_plan(
            CompileOptions(max_input_len=512, max_output_len=512, max_batch_size=4, max_num_tokens=8192),
            LLAMA2_7B,
            H100,
            "1.0.0",
        )
    assert e.value.key == "option.max_num_tokens" and "4 × 1024 = 4096" in str(e.value)
    plan = make_plan(
        CompileOptions(max_input_len=512, max_output_len=512, max_batch_size=4, max_num_tokens=4096),
        LLAMA2_7B,
        H100,
        "1.0.0",
    )
    assert plan.max_num_tokens == 4096


def test_max_num_tokens_below_max_input_len_needs_chunked_context():
    opts = CompileOptions(max_input_len=2048, max_output_len=512, max_num_tokens=1024)
    plan = make_plan(opts, LLAMA2_7B, H100, "1.0.0")
    assert any("chunks" in n for n in plan.notes)
    with pytest.raises(PlanError, match="paged_context_fmha"):
        make_plan(opts, LLAMA2_7B, H100, "0.12.0")  # paged context FMHA off by default before 1.0


# ------------------------------------------------------------------------------------- parallelism


def test_heads_must_divide_tp_with_valid_choices_listed():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, tensor_parallel_degree=8), QWEN2_7B, H100x8, "1.0.0")
    assert e.value.key == "option.tensor_parallel_degree" and "[1, 2, 4]" in str(e.value)
    assert make_plan(CompileOptions(**SMALL, tensor_parallel_degree=4), QWEN2_7B, H100x8, "1.0.0").tp_size == 4


def test_kv_heads_split_or_replicated():
    odd = {
        **LLAMA2_7B,
        "num_attention_heads": 12,
        "num_key_value_heads": 3,
        "hidden_size": 1536,
        "intermediate_size": 4096,
    }
    with pytest.raises(PlanError, match="3 KV heads"):
        make_plan(CompileOptions(**SMALL, tensor_parallel_degree=2), odd, H100x8, "1.0.0")
    # fewer KV heads than ranks: replicated, and each rank caches one head
    plan = make_plan(CompileOptions(**SMALL, tensor_parallel_degree=8), STARCODER, H100x8, "1.0.0")
    assert estimate_memory(plan, STARCODER, H100x8).kv_bytes_per_token == 40 * 1 * 128 * 2 * 2
    plan = make_plan(CompileOptions(**SMALL, tensor_parallel_degree=4), MISTRAL_7B, H100x8, "1.0.0")
    assert estimate_memory(plan, MISTRAL_7B, H100x8).kv_bytes_per_token == 32 * 8 * 128 * 2 * 2 // 4


def test_layers_must_divide_pp():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, pipeline_parallel_degree=3), LLAMA2_7B, H100x8, "1.0.0")
    assert e.value.key == "option.pipeline_parallel_degree" and "32 layers" in str(e.value)
    plan = make_plan(CompileOptions(**SMALL, pipeline_parallel_degree=4), LLAMA2_7B, H100x8, "1.0.0")
    assert estimate_memory(plan, LLAMA2_7B, H100x8).kv_bytes_per_token == 8 * 32 * 128 * 2 * 2


def test_tp_times_pp_vs_visible_gpus():
    with pytest.raises(PlanError, match="2×2 = 4 GPUs, but 2 are visible"):
        make_plan(
            CompileOptions(**SMALL, tensor_parallel_degree=2, pipeline_parallel_degree=2),
            LLAMA2_7B,
            H100.model_copy(update={"count": 2}),
            "1.0.0",
        )


def test_tp_max_uses_the_gpus_the_model_can_split_over():
    plan = make_plan(CompileOptions(**SMALL, tensor_parallel_degree="max"), QWEN2_7B, H100x8, "1.0.0")
    assert plan.tp_size == 4 and any("max → 4" in n for n in plan.notes)
    plan = make_plan(
        CompileOptions(**SMALL, tensor_parallel_degree="max", pipeline_parallel_degree=2), LLAMA2_7B, H100x8, "1.0.0"
    )
    assert (plan.tp_size, plan.pp_size) == (4, 2)


# ------------------------------------------------------------------------------------ quantization


def test_fp8_needs_sm89():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, quantize="fp8"), LLAMA2_7B, A100, "1.0.0")
    assert e.value.key == "option.quantize" and "8.9" in str(e.value) and "8.0" in str(e.value)
    plan = make_plan(CompileOptions(**SMALL, quantize="fp8"), MISTRAL_7B, L4, "1.0.0")
    assert (plan.quant.quant_algo, plan.quant.kv_cache_quant_algo, plan.plugins.gemm_plugin) == ("FP8", None, None)


def test_fp8_context_fmha_hopper_only_and_fp8_only():
    with pytest.raises(PlanError, match="Hopper"):
        make_plan(CompileOptions(**SMALL, quantize="fp8_kv", use_fp8_context_fmha=True), MISTRAL_7B, L4, "1.0.0")
    with pytest.raises(PlanError, match="needs an FP8 model"):
        make_plan(CompileOptions(**SMALL, use_fp8_context_fmha=True), MISTRAL_7B, H100, "1.0.0")
    plan = make_plan(CompileOptions(**SMALL, quantize="fp8_kv", use_fp8_context_fmha=True), MISTRAL_7B, H100, "1.0.0")
    assert plan.plugins.use_fp8_context_fmha and plan.quant.kv_cache_quant_algo == "FP8"


def test_quantization_must_be_supported_by_the_architecture():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, quantize="fp8"), CHATGLM3_6B, H100, "1.0.0")
    assert "Supported for ChatGLMModel: none, weights_int4, weights_int8" in str(e.value)
    with pytest.raises(PlanError, match="djl#3343"):
        make_plan(CompileOptions(**SMALL, quantize="awq"), MIXTRAL_8X7B, H100, "1.0.0")


def test_weights_kv_int4_is_w4a16_with_int8_kv_and_says_so():
    plan = make_plan(CompileOptions(**SMALL, quantize="weights_kv_int4"), LLAMA2_7B, A100, "1.0.0")
    assert (plan.quant.quant_algo, plan.quant.kv_cache_quant_algo) == ("W4A16", "INT8")
    assert any("no INT4 KV cache" in n for n in plan.notes)
    assert plan.plugins.weight_only_quant_matmul_plugin == "auto"


def test_quantized_plan_rejects_fp32():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, quantize="weights_int8", dtype="fp32"), LLAMA2_7B, A100, "1.0.0")
    assert e.value.key == "option.dtype"


def test_memory_reflects_quantization():
    base = make_plan(CompileOptions(**SMALL), LLAMA31_8B, H100, "1.0.0")
    awq = make_plan(CompileOptions(**SMALL, quantize="awq"), LLAMA31_8B, H100, "1.0.0")
    fp8kv = make_plan(CompileOptions(**SMALL, quantize="fp8_kv"), LLAMA31_8B, H100, "1.0.0")
    e_base, e_awq, e_fp8 = (estimate_memory(p, LLAMA31_8B, H100) for p in (base, awq, fp8kv))
    embeddings = 2 * 128256 * 4096 * 2
    linear = e_base.weight_bytes_total - embeddings
    assert e_awq.weight_bytes_total == pytest.approx(embeddings + linear / 2 * (0.5 + 2 / 128), rel=1e-6)
    assert e_fp8.weight_bytes_total == pytest.approx(embeddings + linear / 2, rel=1e-6)
    assert e_fp8.kv_bytes_per_token == e_base.kv_bytes_per_token // 2
    assert e_awq.max_kv_tokens > e_base.max_kv_tokens


# ----------------------------------------------------------------------------------------- plugins


def test_kv_cache_reuse_forces_paged_context_fmha():
    plan = make_plan(CompileOptions(**SMALL), LLAMA2_7B, A100, "0.12.0")
    assert not plan.plugins.use_paged_context_fmha and plan.plugins.tokens_per_block == 64
    plan = make_plan(CompileOptions(**SMALL, enable_kv_cache_reuse=True), LLAMA2_7B, A100, "0.12.0")
    assert plan.plugins.use_paged_context_fmha and any("forced on" in n for n in plan.notes)
    with pytest.raises(PlanError, match="2166"):
        make_plan(
            CompileOptions(**SMALL, enable_kv_cache_reuse=True, quantize="weights_kv_int8"), LLAMA2_7B, A100, "1.0.0"
        )
    with pytest.raises(PlanError, match="8.0"):
        make_plan(CompileOptions(**SMALL, enable_kv_cache_reuse=True), LLAMA2_7B, T4, "1.0.0")


def test_explicit_paged_context_fmha():
    assert make_plan(
        CompileOptions(**SMALL, use_paged_context_fmha=True), LLAMA2_7B, A100, "0.12.0"
    ).plugins.use_paged_context_fmha
    assert not make_plan(
        CompileOptions(**SMALL, use_paged_context_fmha=False), LLAMA2_7B, A100, "1.0.0"
    ).plugins.use_paged_context_fmha
    with pytest.raises(PlanError, match="enable_kv_cache_reuse needs it"):
        make_plan(
            CompileOptions(**SMALL, use_paged_context_fmha=False, enable_kv_cache_reuse=True), LLAMA2_7B, A100, "1.0.0"
        )
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, use_paged_context_fmha=True), LLAMA2_7B, T4, "1.0.0")
    assert e.value.key == "option.use_paged_context_fmha"


def test_logits_dtype_reaches_the_build():
    plan = make_plan(CompileOptions(**SMALL, logits_dtype="fp16"), LLAMA2_7B, H100, "1.0.0")
    assert plan.build_config_kwargs()["max_draft_len"] == 0
    assert plan.converter.kwargs["logits_dtype"] == "float16"


def test_draft_tokens_are_refused_until_served():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, max_draft_len=4), LLAMA2_7B, H100, "1.0.0")
    assert e.value.key == "option.max_draft_len"


def test_tokens_per_block_power_of_two():
    with pytest.raises(ValidationError, match="tokens_per_block"):  # the configuration's choices, powers of two
        CompileOptions(**SMALL, tokens_per_block=100)
    assert (
        make_plan(CompileOptions(**SMALL, tokens_per_block=128), LLAMA2_7B, H100, "1.0.0").plugins.tokens_per_block
        == 128
    )


def test_legacy_plugin_flags_by_version():
    opts = CompileOptions(**SMALL, use_custom_all_reduce=True, multi_block_mode=True)
    old = make_plan(opts, LLAMA2_7B, H100, "0.11.0")
    assert (old.plugins.use_custom_all_reduce, old.plugins.multi_block_mode) == (True, True)
    new = make_plan(opts, LLAMA2_7B, H100, "1.0.0")
    assert (new.plugins.use_custom_all_reduce, new.plugins.multi_block_mode) == (None, None)
    assert "use_custom_all_reduce" not in new.plugins.plugin_config_kwargs()
    assert sum("runtime" in n or "run time" in n for n in new.notes) == 2


def test_fused_mlp_is_off_unless_the_option_sets_it():
    # option.use_fused_mlp defaults to false in the configuration, and the planner has the same default
    # (issue 14: the planner once defaulted to "on for Llama", which serving never reached).
    assert make_plan(CompileOptions(**SMALL, use_fused_mlp=True), LLAMA2_7B, H100, "1.0.0").plugins.use_fused_mlp
    assert not make_plan(CompileOptions(**SMALL), LLAMA2_7B, H100, "1.0.0").plugins.use_fused_mlp
    assert not make_plan(CompileOptions(**SMALL), QWEN2_7B, H100, "1.0.0").plugins.use_fused_mlp


# ------------------------------------------------------------------------------------------- dtype


def test_dtype_auto_and_explicit():
    assert make_plan(CompileOptions(**SMALL), MISTRAL_7B, T4, "1.0.0").dtype == "float16"
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL, dtype="bf16"), MISTRAL_7B, T4, "1.0.0")
    assert e.value.key == "option.dtype" and "fp16" in str(e.value)
    assert make_plan(CompileOptions(**SMALL, dtype="fp32"), MISTRAL_7B, H100, "1.0.0").dtype == "float32"
    assert make_plan(CompileOptions(**SMALL), STARCODER, H100, "1.0.0").dtype == "float16"


def test_trtllm_version_gate():
    with pytest.raises(PlanError) as e:
        make_plan(CompileOptions(**SMALL), LLAMA2_7B, H100, "0.10.0")
    assert e.value.key == "tensorrt_llm version" and "0.11.0" in str(e.value)
    with pytest.raises(PlanError, match="0.13.0"):
        make_plan(CompileOptions(**SMALL), INTERNLM2_7B, H100, "0.12.0")
    with pytest.raises(PlanError, match="0.12.0"):
        make_plan(CompileOptions(**SMALL), LLAMA31_8B, H100, "0.11.0")


# ------------------------------------------------------------------------------------------ memory


def test_mixtral_does_not_fit_one_gpu_and_fits_two():
    one = make_plan(CompileOptions(**SMALL), MIXTRAL_8X7B, H100, "1.0.0")
    est = estimate_memory(one, MIXTRAL_8X7B, H100)
    assert not est.fits and est.max_concurrent_sequences == 0 and "exceed" in est.notes[0]
    with pytest.raises(PlanError) as e:
        check_fits(one, est)
    assert "option.quantize" in str(e.value)
    gpus = H100.model_copy(update={"count": 2})
    two = make_plan(CompileOptions(**SMALL, tensor_parallel_degree=2), MIXTRAL_8X7B, gpus, "1.0.0")
    est2 = estimate_memory(two, MIXTRAL_8X7B, gpus)
    assert est2.fits
    assert est2.weight_bytes_per_gpu < est.weight_bytes_per_gpu * 0.52
    check_fits(two, est2)


def test_fewer_full_sequences_than_batch_is_noted():
    plan = make_plan(CompileOptions(max_input_len=3000, max_output_len=1000), LLAMA2_7B, L4, "1.0.0")
    est = estimate_memory(plan, LLAMA2_7B, L4)
    assert est.fits and est.max_concurrent_sequences < plan.max_batch_size
    assert "share the KV pool" in est.notes[0]


# ------------------------------------------------------------------------------ TensorRT-LLM checkpoints

# What modelopt / convert_checkpoint.py write for Llama-3.1-8B, FP8, TP2.
CKPT_LLAMA31_FP8_TP2 = {
    "architecture": "LlamaForCausalLM",
    "dtype": "bfloat16",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "head_size": 128,
    "position_embedding_type": "rope_gpt_neox",
    "rotary_base": 500000.0,
    "rotary_scaling": {"rope_type": "llama3", "factor": 8.0},
    "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
    "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
}


def test_checkpoint_plan_takes_split_dtype_and_quantization_from_the_checkpoint():
    from lmi_trt.compile.plan import make_checkpoint_plan

    gpus = H100.model_copy(update={"count": 2})
    plan = make_checkpoint_plan(
        CompileOptions(**SMALL, tensor_parallel_degree="max"), CKPT_LLAMA31_FP8_TP2, gpus, "1.0.0"
    )
    assert (plan.tp_size, plan.pp_size, plan.dtype) == (2, 1, "bfloat16")
    assert (plan.quant.method, plan.quant.quant_algo, plan.quant.kv_cache_quant_algo) == ("checkpoint", "FP8", "FP8")
    assert plan.converter.source == "trtllm_checkpoint" and plan.converter.kwargs == {}
    assert not plan.quant.needs_calibration and plan.plugins.gemm_plugin is None
    from lmi_trt.compile.archs import checkpoint_as_hf_config

    memory = estimate_memory(plan, checkpoint_as_hf_config(CKPT_LLAMA31_FP8_TP2), gpus)
    assert memory.kv_bytes_per_token == 32 * 4 * 128 * 2 * 1  # 4 KV heads per rank, FP8 KV


@pytest.mark.parametrize(
    "opts,key",
    [
        (dict(tensor_parallel_degree=1), "option.tensor_parallel_degree"),
        (dict(pipeline_parallel_degree=2), "option.pipeline_parallel_degree"),
        (dict(quantize="awq"), "option.quantize"),
        (dict(dtype="fp16"), "option.dtype"),
        (dict(rotary_base=1e6), "option.rotary_base"),
    ],
)
def test_checkpoint_plan_refuses_options_fixed_at_conversion(opts, key):
    from lmi_trt.compile.plan import make_checkpoint_plan

    with pytest.raises(PlanError) as e:
        make_checkpoint_plan(
            CompileOptions(**{**SMALL, "tensor_parallel_degree": 2, **opts}), CKPT_LLAMA31_FP8_TP2, H100x8, "1.0.0"
        )
    assert e.value.key == key


def test_option_enable_lora_plans_the_lora_plugin_into_the_cache_key_and_counts_the_peft_cache():
    opts = CompileOptions(max_input_len=1024, max_output_len=512)
    plain = make_plan(opts, LLAMA2_7B, H100, "1.0.0")
    lora = make_plan(opts.model_copy(update={"enable_lora": True, "max_lora_rank": 16}), LLAMA2_7B, H100, "1.0.0")
    assert "lora" not in plain.key_dict() and "lora_plugin" not in plain.key_dict()["plugins"]
    assert lora.plugins.lora_plugin == lora.dtype and lora.plugin_settings()["lora_plugin"] == lora.dtype
    assert lora.key_dict()["lora"] == {
        "max_lora_rank": 16,
        "target_modules": ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"],
    }
    rank8 = make_plan(opts.model_copy(update={"enable_lora": True, "max_lora_rank": 8}), LLAMA2_7B, H100, "1.0.0")
    more = make_plan(
        opts.model_copy(update={"enable_lora": True, "max_lora_rank": 16, "max_loras": 8}), LLAMA2_7B, H100, "1.0.0"
    )
    assert rank8.key_dict() != lora.key_dict() and more.key_dict() == lora.key_dict()  # max_loras: run time only
    # The device PEFT cache: rank 16 × 32 layers × 7 modules × 4 adapters units of the widest module's in + out
    # (4096 + 11008) weights, at 2 bytes.
    peft = 16 * 32 * 7 * 4 * (4096 + 11008) * 2
    with_lora, without = estimate_memory(lora, LLAMA2_7B, H100), estimate_memory(plain, LLAMA2_7B, H100)
    assert with_lora.activation_reserve_bytes - without.activation_reserve_bytes == peft
    assert any("PEFT cache" in note and f"{peft / 2**20:.1f} MiB" in note for note in with_lora.notes)
    with pytest.raises(PlanError, match="option.enable_lora"):
        make_plan(CompileOptions(max_input_len=512, max_output_len=256, enable_lora=True), GPT2, H100, "1.0.0")
