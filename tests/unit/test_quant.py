"""quant: the quantize choice → QuantConfig, calibration data, and real modelopt calibration on a tiny Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmi_trt.compile.archs import lookup_arch, read_dims
from lmi_trt.compile.errors import BuildError, PlanError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import GpuFacts, make_plan
from lmi_trt.compile.quant import QuantPlan, fix_exported_config, load_calibration_texts, plan_quant

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
H100 = GpuFacts(name="H100", sm=90, memory_gib=80, count=8)


def qplan(**opts) -> tuple[QuantPlan, list[str]]:
    spec = lookup_arch(LLAMA)
    return plan_quant(
        CompileOptions(**opts), spec, LLAMA, read_dims(spec, LLAMA), gpu_sm=90, tp=opts.get("tensor_parallel_degree", 1)
    )


@pytest.mark.parametrize(
    "quantize,algo,kv,method,qformat,kv_dtype",
    [
        ("none", None, None, "none", None, None),
        ("weights_int8", "W8A16", None, "convert", None, None),
        ("weights_int4", "W4A16", None, "convert", None, None),
        ("weights_kv_int8", "W8A16", "INT8", "modelopt", "int8_wo", "int8"),
        ("weights_kv_int4", "W4A16", "INT8", "modelopt", "int4_wo", "int8"),
        ("awq", "W4A16_AWQ", None, "modelopt", "int4_awq", None),
        ("fp8", "FP8", None, "modelopt", "fp8", None),
        ("fp8_kv", "FP8", "FP8", "modelopt", "fp8", "fp8"),
    ],
)
def test_quantize_maps_to_quant_config(quantize, algo, kv, method, qformat, kv_dtype):
    plan, _ = qplan(quantize=quantize)
    assert (plan.quant_algo, plan.kv_cache_quant_algo, plan.method) == (algo, kv, method)
    assert (plan.modelopt_qformat, plan.modelopt_kv_cache_dtype) == (qformat, kv_dtype)
    assert plan.needs_calibration == (method in ("modelopt", "trtllm_native"))
    assert plan.quant_config_kwargs()["quant_algo"] == algo
    assert (plan.calibration is not None) == plan.needs_calibration


@pytest.mark.parametrize(
    "per_token,per_channel,algo,method",
    [
        (False, False, "W8A8_SQ_PER_TENSOR_PLUGIN", "trtllm_native"),
        (True, False, "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN", "trtllm_native"),
        (False, True, "W8A8_SQ_PER_CHANNEL", "modelopt"),
        (True, True, "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", "trtllm_native"),
    ],
)
def test_smoothquant_variants(per_token, per_channel, algo, method):
    plan, _ = qplan(
        quantize="smoothquant",
        smoothquant_per_token=per_token,
        smoothquant_per_channel=per_channel,
        smoothquant_alpha=0.6,
    )
    assert (plan.quant_algo, plan.method) == (algo, method)
    assert plan.smoothquant_val == 0.6 and plan.quant_config_kwargs()["smoothquant_val"] == 0.6
    assert plan.calibration is not None and plan.calibration.smoothquant_alpha == 0.6


def test_native_smoothquant_variants_need_the_llama_quantizer():
    baichuan = {
        "architectures": ["BaichuanForCausalLM"],
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "vocab_size": 125696,
        "intermediate_size": 13696,
    }
    spec = lookup_arch(baichuan)
    with pytest.raises(PlanError, match="smoothquant_per_channel=true"):
        plan_quant(
            CompileOptions(quantize="smoothquant", trust_remote_code=True),
            spec,
            baichuan,
            read_dims(spec, baichuan),
            gpu_sm=90,
            tp=1,
        )
    plan, _ = plan_quant(
        CompileOptions(quantize="smoothquant", smoothquant_per_channel=True),
        spec,
        baichuan,
        read_dims(spec, baichuan),
        gpu_sm=90,
        tp=1,
    )
    assert (plan.quant_algo, plan.modelopt_decoder) == ("W8A8_SQ_PER_CHANNEL", "baichuan")


def test_awq_group_size_and_w4a8():
    plan, _ = qplan(quantize="awq", awq_block_size=64)
    assert plan.group_size == 64 and plan.quant_config_kwargs()["group_size"] == 64
    assert plan.calibration.awq_block_size == 64
    plan, _ = qplan(quantize="awq", q_format="w4a8_awq")
    assert (plan.quant_algo, plan.modelopt_qformat) == ("W4A8_AWQ", "w4a8_awq")
    spec = lookup_arch(LLAMA)
    with pytest.raises(PlanError, match="8.9"):
        plan_quant(
            CompileOptions(quantize="awq", q_format="w4a8_awq"), spec, LLAMA, read_dims(spec, LLAMA), gpu_sm=80, tp=1
        )


def test_awq_block_must_divide_the_per_rank_dims():
    odd = {**LLAMA, "hidden_size": 4160, "num_attention_heads": 65, "num_key_value_heads": 5}
    spec = lookup_arch(odd)
    with pytest.raises(PlanError) as e:
        plan_quant(CompileOptions(quantize="awq"), spec, odd, read_dims(spec, odd), gpu_sm=90, tp=1)
    # Only sizes the configuration accepts are suggested (issue 14: 32 was suggested and then refused).
    assert e.value.key == "option.awq_block_size" and "[64]" in str(e.value)


def test_calibration_defaults_and_offline_note(tmp_path):
    plan, notes = qplan(quantize="fp8", calib_size=64, calib_batch_size=8, calib_max_seq_length=256)
    assert plan.calibration.dataset == "cnn_dailymail" and any("offline" in n for n in notes)
    assert (plan.calibration.size, plan.calibration.batch_size, plan.calibration.max_seq_length) == (64, 8, 256)
    plan, notes = qplan(quantize="fp8", calib_dataset=str(tmp_path / "c.txt"))
    assert plan.calibration.dataset == str(tmp_path / "c.txt") and not notes


def test_whole_plan_with_quantization_roundtrips():
    plan = make_plan(CompileOptions(quantize="fp8_kv", max_input_len=1024, max_output_len=512), LLAMA, H100, "1.0.0")
    assert plan.quant == type(plan.quant).model_validate_json(plan.quant.model_dump_json())


# ------------------------------------------------------------------------------ calibration data


def test_reader_txt_jsonl_json_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\nsecond line\n")
    (tmp_path / "b.jsonl").write_text(
        json.dumps({"text": "from jsonl"})
        + "\n"
        + json.dumps({"article": "an article", "id": 3})
        + "\n"
        + json.dumps("plain")
        + "\n"
    )
    (tmp_path / "c.json").write_text(json.dumps([{"prompt": "p1"}, "s2"]))
    assert load_calibration_texts(str(tmp_path / "a.txt"), 10) == ["first line", "second line"]
    assert load_calibration_texts(str(tmp_path / "b.jsonl"), 10) == ["from jsonl", "an article", "plain"]
    assert load_calibration_texts(str(tmp_path), 4) == ["first line", "second line", "from jsonl", "an article"]
    assert load_calibration_texts(str(tmp_path / "c.json"), 10) == ["p1", "s2"]


def test_reader_errors(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(PlanError, match="no text samples"):
        load_calibration_texts(str(tmp_path / "empty.txt"), 4)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(PlanError, match="line 2 is not JSON"):
        load_calibration_texts(str(tmp_path / "bad.jsonl"), 4)
    with pytest.raises(PlanError) as e:  # a hub name with the hub out of reach
        load_calibration_texts("no-such-dataset-here", 4)
    assert e.value.key == "option.calib_dataset" and "local" in str(e.value)


# ------------------------------------------------------------------------------ exported config fixes


def test_fix_exported_config_uses_the_hf_values(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architecture": "LlamaForCausalLM",
                "norm_epsilon": 1e-6,
                "position_embedding_type": "rope_gpt_neox",
                "quantization": {"quant_algo": None, "kv_cache_quant_algo": "INT8"},
            }
        )
    )
    (tmp_path / "quant_cfg.json").write_text("{}")
    hf = {
        "model_type": "llama",
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0},
    }
    quant, _ = qplan(quantize="weights_kv_int8")
    fixed = fix_exported_config(tmp_path, hf, quant)
    assert fixed["norm_epsilon"] == 1e-5 and fixed["rotary_base"] == 500000.0
    assert fixed["rotary_scaling"]["type"] == "llama3" and fixed["rotary_scaling"]["factor"] == 8.0
    assert fixed["quantization"]["quant_algo"] == "W8A16" and not (tmp_path / "quant_cfg.json").exists()
    assert json.loads((tmp_path / "config.json").read_text()) == fixed


def test_fix_exported_config_rejects_a_different_algorithm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    quant, _ = qplan(quantize="awq")
    with pytest.raises(BuildError, match="W4A16_AWQ"):
        fix_exported_config(tmp_path, {}, quant)


# ------------------------------------------------------------------------------ real modelopt


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    """The tiny Llama with a norm epsilon and RoPE base that modelopt's exporter would get wrong."""
    import shutil

    import tinymodels

    model = tmp_path_factory.mktemp("model") / "llama"
    shutil.copytree(tinymodels.tiny_model("llama"), model)
    config = json.loads((model / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    if "rope_parameters" in config:  # transformers 5's format; the images' 4.x keep rope_theta at the top
        config["rope_parameters"]["rope_theta"] = 500000.0
    else:
        config["rope_theta"] = 500000.0
    (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory) -> Path:
    import tinymodels

    path = tmp_path_factory.mktemp("calib") / "calib.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in tinymodels.CORPUS))
    return path


# (quantize options, quant_algo, kv algo, {tensor suffix: safetensors dtype}) for layer 0
MODELOPT_CASES = {
    "fp8": (
        dict(quantize="fp8_kv"),
        "FP8",
        "FP8",
        {
            "attention.qkv.weight": "F8_E4M3",
            "attention.qkv.weights_scaling_factor": "F32",
            "attention.qkv.activation_scaling_factor": "F32",
            "attention.kv_cache_scaling_factor": "F32",
            "input_layernorm.weight": "F16",
        },
    ),
    "int4_awq": (
        dict(quantize="awq", awq_block_size=64),
        "W4A16_AWQ",
        None,
        {
            "attention.qkv.weight": "I8",
            "attention.qkv.weights_scaling_factor": "F32",
            "attention.qkv.prequant_scaling_factor": "F16",
            "mlp.proj.weight": "I8",
        },
    ),
    "int8_sq": (
        dict(quantize="smoothquant", smoothquant_per_channel=True),
        "W8A8_SQ_PER_CHANNEL",
        None,
        {
            "attention.qkv.weight": "I8",
            "attention.qkv.activation_scaling_factor": "F32",
            "attention.qkv.prequant_scaling_factor": "F16",
            "mlp.fc.weight": "I8",
        },
    ),
    "weights_kv_int8": (
        dict(quantize="weights_kv_int8"),
        "W8A16",
        "INT8",
        {"attention.qkv.weight": "F16", "attention.kv_cache_scaling_factor": "F32"},
    ),
}


@pytest.mark.parametrize("case", sorted(MODELOPT_CASES))
def test_modelopt_calibration_writes_a_trtllm_checkpoint(case, tiny_llama, calib_file, tmp_path):
    pytest.importorskip("modelopt.torch.quantization")
    from safetensors import safe_open

    from lmi_trt.compile.quant import calibrate_and_export

    opts, algo, kv, tensors = MODELOPT_CASES[case]
    hf = json.loads((tiny_llama / "config.json").read_text())
    gpu = GpuFacts(name="H100", sm=90, memory_gib=80, count=2)
    tp = 2 if case == "int8_sq" else 1
    plan = make_plan(
        CompileOptions(
            **opts,
            calib_dataset=str(calib_file),
            calib_size=6,
            calib_batch_size=4,
            max_input_len=64,
            max_output_len=16,
            tensor_parallel_degree=tp,
        ),
        hf,
        gpu,
        "1.0.0",
    )
    messages: list[str] = []
    out = calibrate_and_export(
        tiny_llama,
        tmp_path / "ckpt",
        plan.quant,
        hf,
        dtype=plan.dtype,
        tp=plan.tp_size,
        pp=plan.pp_size,
        trust_remote_code=False,
        progress=messages.append,
    )
    assert "quantize: calibration batch 2/2" in messages
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"]["quant_algo"] == algo
    assert config["quantization"].get("kv_cache_quant_algo") == kv
    assert config["mapping"]["tp_size"] == tp and config["dtype"] == "float16"
    assert config["norm_epsilon"] == 1e-5 and config["rotary_base"] == 500000.0  # modelopt: 1e-6 and none
    if case == "int4_awq":
        assert config["quantization"]["group_size"] == 64
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(tp)]
    with safe_open(str(out / "rank0.safetensors"), "pt") as f:
        names = set(f.keys())
        for suffix, dtype in tensors.items():
            name = f"transformer.layers.0.{suffix}"
            assert name in names, sorted(n for n in names if "layers.0." in n)
            assert f.get_slice(name).get_dtype() == dtype, name
        assert f.get_slice("lm_head.weight").get_dtype() == "F16"  # lm_head stays unquantized


@pytest.mark.parametrize(
    "arch,decoder",
    [
        ("GemmaForCausalLM", "gemma"),
        ("Gemma2ForCausalLM", "gemma2"),
        ("Gemma3ForCausalLM", "gemma3"),
    ],
)
def test_gemma_modelopt_decoder_types_are_modelopts(arch, decoder):
    """modelopt maps Gemma 2/3 to "gemma2"/"gemma3" (its MODEL_NAME_TO_TYPE); "gemma" for them exports wrong."""
    from modelopt.torch.export.model_utils import MODEL_NAME_TO_TYPE

    gemma = {
        "architectures": [arch],
        "hidden_size": 2304,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "intermediate_size": 9216,
        "max_position_embeddings": 8192,
    }
    spec = lookup_arch(gemma)
    plan, _ = plan_quant(CompileOptions(quantize="fp8"), spec, gemma, read_dims(spec, gemma), gpu_sm=90, tp=1)
    assert plan.modelopt_decoder == decoder
    assert MODEL_NAME_TO_TYPE[arch.removesuffix("ForCausalLM")] == decoder
