"""archs: HF architecture → TensorRT-LLM converter facts, per-family options and checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from lmi_trt.compile.archs import (
    ARCHS,
    check_arch_options,
    converter_kwargs,
    hf_config_overrides,
    lookup_arch,
    min_version_for,
    read_dims,
    rope_scaling,
    rope_theta,
    supported_architectures,
)
from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.options import CompileOptions, normalize_quantize
from lmi_trt.vocabulary import Quantization

# The MODEL_MAP subset (NVIDIA/TensorRT-LLM tensorrt_llm/models/__init__.py) the registry must agree with.
SURFACE_MODEL_MAP = {
    "LlamaForCausalLM": "LLaMAForCausalLM",
    "MistralForCausalLM": "LLaMAForCausalLM",
    "MixtralForCausalLM": "LLaMAForCausalLM",
    "InternLMForCausalLM": "LLaMAForCausalLM",
    "InternLM2ForCausalLM": "LLaMAForCausalLM",
    "FalconForCausalLM": "FalconForCausalLM",
    "RWForCausalLM": "FalconForCausalLM",
    "QWenLMHeadModel": "QWenForCausalLM",
    "QWenForCausalLM": "QWenForCausalLM",
    "Qwen2ForCausalLM": "QWenForCausalLM",
    "Qwen2MoeForCausalLM": "QWenForCausalLM",
    "Qwen3ForCausalLM": "QWenForCausalLM",
    "ChatGLMModel": "ChatGLMForCausalLM",
    "ChatGLMForCausalLM": "ChatGLMForCausalLM",
    "ChatGLMForConditionalGeneration": "ChatGLMForCausalLM",
    "GLMModel": "ChatGLMForCausalLM",
    "GPTJForCausalLM": "GPTJForCausalLM",
    "GPT2LMHeadModel": "GPTForCausalLM",
    "GPT2LMHeadCustomModel": "GPTForCausalLM",
    "GPTBigCodeForCausalLM": "GPTForCausalLM",
    "Starcoder2ForCausalLM": "GPTForCausalLM",
    "BaichuanForCausalLM": "BaichuanForCausalLM",
    "BaiChuanForCausalLM": "BaichuanForCausalLM",
    "DeepseekForCausalLM": "DeepseekForCausalLM",
    "DeepseekV2ForCausalLM": "DeepseekV2ForCausalLM",
}


def llama(**extra):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 512,
        "max_position_embeddings": 512,
        "dtype": "float32",
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        **extra,
    }


def test_registry_matches_trtllm_model_map():
    for arch, cls in SURFACE_MODEL_MAP.items():
        assert lookup_arch({"architectures": [arch]}).trtllm_class == cls, arch
    assert len({a for s in ARCHS for a in s.hf_architectures}) == sum(len(s.hf_architectures) for s in ARCHS)


def test_gemma_and_phi_are_known():
    assert lookup_arch({"architectures": ["GemmaForCausalLM"]}).trtllm_class == "GemmaForCausalLM"
    assert lookup_arch({"architectures": ["Phi3ForCausalLM"]}).trtllm_class == "Phi3ForCausalLM"


def test_unknown_architecture_lists_supported_and_precompiled_route():
    with pytest.raises(PlanError) as e:
        lookup_arch({"architectures": ["MambaForCausalLM"]})
    msg = str(e.value)
    assert "MambaForCausalLM" in msg and "LlamaForCausalLM" in msg and "Qwen2ForCausalLM" in msg
    assert "lmi-trt compile" in msg and "option.model_id" in msg
    assert e.value.key == "architectures[0]"


def test_missing_architectures_is_an_error():
    with pytest.raises(PlanError, match="names no architecture"):
        lookup_arch({"model_type": "llama"})


def test_transformers5_rope_parameters_and_dtype():
    hf = llama()
    assert rope_theta(hf) == 10000.0
    assert rope_scaling(hf) is None
    hf31 = llama(
        rope_parameters={
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 8192,
        }
    )
    assert rope_theta(hf31) == 500000.0
    assert rope_scaling(hf31)["rope_type"] == "llama3"
    # transformers 4.x spelling
    assert rope_scaling({"rope_scaling": {"type": "linear", "factor": 2.0}})["rope_type"] == "linear"


def test_llama3_rope_needs_trtllm_012():
    hf = llama(rope_scaling={"rope_type": "llama3", "factor": 8.0})
    assert min_version_for(lookup_arch(hf), hf) == "0.12.0"
    assert min_version_for(lookup_arch(llama()), llama()) == "0.11.0"
    gemma2 = {"architectures": ["Gemma2ForCausalLM"]}
    assert min_version_for(lookup_arch(gemma2), gemma2) == "0.13.0"


@pytest.mark.parametrize(
    "arch,spec_flag",
    [
        ("ChatGLMModel", True),
        ("QWenLMHeadModel", True),
        ("BaichuanForCausalLM", True),
        ("InternLM2ForCausalLM", True),
        ("LlamaForCausalLM", False),
        ("Qwen2ForCausalLM", False),
    ],
)
def test_trust_remote_code_requirement(arch, spec_flag):
    assert lookup_arch({"architectures": [arch]}).trust_remote_code is spec_flag


def test_trust_remote_code_error_names_key():
    hf = {
        "architectures": ["BaichuanForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 512,
    }
    spec = lookup_arch(hf)
    with pytest.raises(PlanError) as e:
        check_arch_options(spec, CompileOptions(), hf, read_dims(spec, hf))
    assert e.value.key == "option.trust_remote_code" and "BaichuanForCausalLM" in str(e.value)
    check_arch_options(spec, CompileOptions(trust_remote_code=True), hf, read_dims(spec, hf))


def test_fused_mlp_only_for_llama_family():
    qwen2 = {**llama(), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    spec = lookup_arch(qwen2)
    with pytest.raises(PlanError, match="LLaMA family"):
        check_arch_options(spec, CompileOptions(use_fused_mlp=True), qwen2, read_dims(spec, qwen2))
    spec = lookup_arch(llama())
    assert check_arch_options(spec, CompileOptions(use_fused_mlp=True), llama(), read_dims(spec, llama())) == []


def test_multi_block_mode_not_for_qwen():
    qwen2 = {**llama(), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    spec = lookup_arch(qwen2)
    with pytest.raises(PlanError) as e:
        check_arch_options(spec, CompileOptions(multi_block_mode=True), qwen2, read_dims(spec, qwen2))
    assert e.value.key == "option.multi_block_mode"


@pytest.mark.parametrize("opts", [dict(rotary_scaling_type="linear"), dict(rotary_scaling_factor=2.0)])
def test_rotary_scaling_type_and_factor_together(opts):
    spec = lookup_arch(llama())
    with pytest.raises(PlanError, match="both a type and a factor"):
        check_arch_options(spec, CompileOptions(**opts), llama(), read_dims(spec, llama()))


def test_rotary_scaling_factor_must_stretch_and_family_must_support_it():
    with pytest.raises(ValidationError, match="greater than 1"):  # the configuration's bound, > 1
        CompileOptions(rotary_scaling_type="linear", rotary_scaling_factor=1.0)
    gptj = {
        "architectures": ["GPTJForCausalLM"],
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "vocab_size": 512,
        "rotary_dim": 8,
        "n_positions": 512,
    }
    spec = lookup_arch(gptj)
    with pytest.raises(PlanError, match="not GPTJForCausalLM"):
        check_arch_options(
            spec, CompileOptions(rotary_scaling_type="linear", rotary_scaling_factor=2.0), gptj, read_dims(spec, gptj)
        )
    with pytest.raises(PlanError) as e:
        check_arch_options(spec, CompileOptions(rotary_base=1e6), gptj, read_dims(spec, gptj))
    assert e.value.key == "option.rotary_base"


def test_rotary_dim_gptj_only_and_bounded():
    gptj = {
        "architectures": ["GPTJForCausalLM"],
        "n_embd": 64,
        "n_head": 4,
        "n_layer": 2,
        "vocab_size": 512,
        "rotary_dim": 8,
        "n_positions": 512,
    }
    spec = lookup_arch(gptj)
    dims = read_dims(spec, gptj)
    check_arch_options(spec, CompileOptions(rotary_dim=16), gptj, dims)
    assert hf_config_overrides(spec, CompileOptions(rotary_dim=16), gptj) == {"rotary_dim": 16}
    with pytest.raises(PlanError, match="at most the head size 16"):
        check_arch_options(spec, CompileOptions(rotary_dim=32), gptj, dims)
    spec = lookup_arch(llama())
    with pytest.raises(PlanError, match="GPT-J only"):
        check_arch_options(spec, CompileOptions(rotary_dim=8), llama(), read_dims(spec, llama()))


def test_rotary_overrides_write_both_transformers_spellings():
    spec = lookup_arch(llama())
    out = hf_config_overrides(
        spec, CompileOptions(rotary_base=5e5, rotary_scaling_type="dynamic", rotary_scaling_factor=2.0), llama()
    )
    assert out["rope_theta"] == 5e5
    assert out["rope_scaling"] == {"type": "dynamic", "rope_type": "dynamic", "factor": 2.0}
    assert out["rope_parameters"] == {"rope_theta": 5e5, "rope_type": "dynamic", "factor": 2.0}
    qwen1 = {"architectures": ["QWenLMHeadModel"], "rotary_emb_base": 10000}
    assert hf_config_overrides(lookup_arch(qwen1), CompileOptions(rotary_base=2e4), qwen1) == {"rotary_emb_base": 2e4}


def test_chatglm_version_from_option_config_or_error():
    base = {"architectures": ["ChatGLMModel"], "model_type": "chatglm", "multi_query_group_num": 2}
    spec = lookup_arch(base)
    assert converter_kwargs(spec, CompileOptions(chatglm_model_version="chatglm3_6b"), base) == {
        "chatglm_version": "chatglm3"
    }
    assert converter_kwargs(spec, CompileOptions(), {**base, "_name_or_path": "THUDM/chatglm2-6b"}) == {
        "chatglm_version": "chatglm2"
    }
    assert converter_kwargs(spec, CompileOptions(), {**base, "padded_vocab_size": 151552}) == {
        "chatglm_version": "glm4"
    }
    assert converter_kwargs(spec, CompileOptions(), {"architectures": ["ChatGLMModel"]}) == {
        "chatglm_version": "chatglm"
    }
    with pytest.raises(PlanError) as e:
        converter_kwargs(spec, CompileOptions(), base)  # chatglm2 and chatglm3 look alike
    assert e.value.key == "option.chatglm_model_version" and "chatglm3" in str(e.value)
    # A variant the key does not take never reaches the converter: the options refuse it as the key does.
    with pytest.raises(ValidationError, match="chatglm_model_version"):
        CompileOptions(chatglm_model_version="chatglm9")


def test_gpt_variant_and_baichuan_version():
    gpt = lookup_arch({"architectures": ["GPT2LMHeadModel"]})
    assert (
        converter_kwargs(
            gpt, CompileOptions(), {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode"}
        )["gpt_variant"]
        == "starcoder"
    )
    assert (
        converter_kwargs(gpt, CompileOptions(), {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})[
            "gpt_variant"
        ]
        == "gpt2"
    )
    assert (
        converter_kwargs(gpt, CompileOptions(gpt_model_version="santacoder"), {"architectures": ["GPT2LMHeadModel"]})[
            "gpt_variant"
        ]
        == "santacoder"
    )
    bc = lookup_arch({"architectures": ["BaichuanForCausalLM"]})
    hf = {"architectures": ["BaichuanForCausalLM"], "num_attention_heads": 40, "vocab_size": 125696}
    assert converter_kwargs(bc, CompileOptions(trust_remote_code=True), hf) == {
        "trust_remote_code": True,
        "model_version": "v2_13b",
    }
    assert converter_kwargs(bc, CompileOptions(baichuan_model_version="v1_7b"), hf)["model_version"] == "v1_7b"


def test_version_key_for_other_family_is_noted_not_silent():
    spec = lookup_arch(llama())
    notes = check_arch_options(
        spec, CompileOptions(chatglm_model_version="chatglm3"), llama(), read_dims(spec, llama())
    )
    assert notes and "ignored" in notes[0]


def test_quantizations_per_family_follow_djl():
    by = {s.family: s.quantizations for s in ARCHS}
    assert {Quantization.SMOOTHQUANT, Quantization.AWQ, Quantization.FP8} <= by["llama"]
    assert {Quantization.SMOOTHQUANT, Quantization.AWQ, Quantization.FP8} <= by["mistral"]
    assert Quantization.FP8 in by["mixtral"] and Quantization.AWQ not in by["mixtral"]
    assert Quantization.SMOOTHQUANT in by["internlm"] and Quantization.SMOOTHQUANT in by["baichuan"]
    assert Quantization.FP8 in by["gemma"] and Quantization.FP8 in by["gpt"] and Quantization.FP8 in by["baichuan"]
    assert by["chatglm"] == {None, Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_INT4}


@pytest.mark.parametrize(
    "spelling,expected",
    [
        ("smoothquant", Quantization.SMOOTHQUANT),
        ("smooth_quant", Quantization.SMOOTHQUANT),
        ("AWQ", Quantization.AWQ),
        ("no_quant", None),
        (None, None),
        ("weights_kv_int4", Quantization.WEIGHTS_INT4_KV_INT8),
        ("weights_int4_kv_int8", Quantization.WEIGHTS_INT4_KV_INT8),
        ("fp8_kv", Quantization.FP8_KV),
        ("weights_int8_kv_int8", Quantization.WEIGHTS_INT8_KV_INT8),
        ("weights_kv_int8", Quantization.WEIGHTS_INT8_KV_INT8),
    ],
)
def test_quantize_spellings(spelling, expected):
    assert normalize_quantize(spelling) is expected


def test_unknown_quantize_spelling():
    with pytest.raises(PlanError) as e:
        normalize_quantize("gptq")
    assert e.value.key == "option.quantize" and "smoothquant" in str(e.value)


def test_supported_architectures_sorted_and_complete():
    names = supported_architectures()
    assert names == sorted(names) and set(SURFACE_MODEL_MAP) <= set(names)


def test_compile_options_view_of_the_real_lmi_config(tmp_path):
    # The wiring builds CompileOptions from the configuration (max_batch_size ← max_rolling_batch_size).
    from lmi_trt.config import LmiConfig
    from lmi_trt.stages import compile_options, settle

    data = tmp_path / "calib.jsonl"
    config = LmiConfig(
        max_input_len=512,
        quantize=Quantization.WEIGHTS_INT4_KV_INT8,
        calib_dataset=data,
        max_rolling_batch_size=8,
        awq_block_size=64,
        use_fused_mlp=True,
        tensor_parallel_degree="max",
    )
    opts = compile_options(config)
    assert opts.quantize is Quantization.WEIGHTS_INT4_KV_INT8 and opts.calib_dataset == data
    assert (opts.max_input_len, opts.max_batch_size, opts.awq_block_size, opts.use_fused_mlp) == (512, 8, 64, True)
    assert opts.tensor_parallel_degree == "max" and opts.max_num_tokens is None
    assert compile_options(settle(LmiConfig(), "trtllm")).quantize is None
