"""Planning option.quantize for TensorRT-LLM's pytorch backend (lmi_trt/compile/hf_quant.py): pure parts."""

from __future__ import annotations

import json

import pytest

from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.hf_quant import already_quantized, checkpoint_dtype, plan_hf_quant
from lmi_trt.compile.options import CompileOptions


@pytest.mark.parametrize(
    ("quantize", "q_format", "algo", "kv"),
    [
        ("fp8", "int4_awq", "FP8", None),
        ("fp8_kv", "int4_awq", "FP8", "FP8"),
        ("awq", "int4_awq", "W4A16_AWQ", None),
        ("awq", "w4a8_awq", "W4A8_AWQ", None),
    ],
)
def test_the_formats_the_backend_loads_are_calibrated_with_modelopt(quantize, q_format, algo, kv):
    plan, notes = plan_hf_quant(CompileOptions(quantize=quantize, q_format=q_format, calib_dataset="c.txt"), None)
    assert (plan.method, plan.quant_algo, plan.kv_cache_quant_algo) == ("modelopt", algo, kv)
    assert plan.calibration.dataset == "c.txt" and notes == []
    _, notes = plan_hf_quant(CompileOptions(quantize=quantize, q_format=q_format), None)
    assert "option.calib_dataset" in notes[0]  # the hub default needs network


@pytest.mark.parametrize("quantize", ["smoothquant", "weights_int8", "weights_int4", "weights_int8_kv_int8"])
def test_engine_formats_are_refused_naming_the_key(quantize):
    with pytest.raises(PlanError) as err:
        plan_hf_quant(CompileOptions(quantize=quantize), None)
    assert err.value.key == "option.quantize" and "fp8, fp8_kv or awq" in str(err.value)


def test_a_quantized_checkpoint_is_not_quantized_again(tmp_path):
    assert already_quantized({"model_type": "llama"}, tmp_path) is None
    assert already_quantized({"quantization_config": {"quant_method": "awq"}}) == "awq"
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    assert already_quantized({}, tmp_path) == "FP8"
    with pytest.raises(PlanError, match="already quantized \\(FP8\\)"):
        plan_hf_quant(CompileOptions(quantize="fp8"), "FP8")


def test_the_export_keeps_the_models_dtype():
    assert checkpoint_dtype({"torch_dtype": "float16"}) == "float16"
    assert checkpoint_dtype({"dtype": "float32"}) == "float32"
    assert checkpoint_dtype({}) == "bfloat16"
