"""Unset max_input_len / max_output_len follow the model's positions; set ones that do not fit fail
naming the keys (issue 12, item 1)."""

from __future__ import annotations

import pytest

from lmi_trt.config import LmiConfig, StartupError
from lmi_trt.stages import fit_lengths, model_positions


@pytest.mark.parametrize(
    "hf,expected",
    [
        ({"max_position_embeddings": 512}, (384, 128)),  # the README's tiny model
        ({"n_positions": 1024}, (768, 256)),  # GPT-2
        ({"max_position_embeddings": 8192}, (1024, 512)),  # room for the defaults: unchanged
        ({"text_config": {"max_position_embeddings": 512}}, (384, 128)),
    ],
)
def test_unset_limits_follow_the_model(hf, expected):
    config = fit_lengths(LmiConfig(), hf, "torch")
    assert (config.max_input_len, config.max_output_len) == expected
    assert config.max_input_len + config.max_output_len <= model_positions(hf)[0]


def test_the_unset_limit_fits_around_the_set_one():
    hf = {"max_position_embeddings": 512}
    assert fit_lengths(LmiConfig(max_input_len=500), hf, "torch").max_output_len == 12
    assert fit_lengths(LmiConfig(max_output_len=300), hf, "torch").max_input_len == 212
    assert fit_lengths(LmiConfig(max_input_len=64, max_output_len=32), hf, "torch").max_input_len == 64


@pytest.mark.parametrize(
    "kwargs,key",
    [
        ({"max_input_len": 400, "max_output_len": 200}, "option.max_input_len + option.max_output_len"),
        ({"max_input_len": 512}, "option.max_input_len"),
        ({"max_output_len": 600}, "option.max_output_len"),
    ],
)
def test_set_limits_that_do_not_fit_fail_naming_the_keys(kwargs, key):
    with pytest.raises(StartupError) as e:
        fit_lengths(LmiConfig(**kwargs), {"max_position_embeddings": 512}, "torch")
    assert e.value.key == key and "512 positions" in str(e.value)


def test_trtllm_limits_follow_the_model_and_its_plan_checks_set_ones():
    # RoPE scaling may let a TensorRT-LLM build exceed max_position_embeddings: the plan decides.
    hf = {"max_position_embeddings": 512, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert fit_lengths(LmiConfig(), hf, "trtllm").max_input_len == 384
    assert fit_lengths(LmiConfig(max_input_len=400, max_output_len=200), hf, "trtllm").max_input_len == 400


def test_no_positions_in_config_changes_nothing():
    assert fit_lengths(LmiConfig(), {"model_type": "x"}, "torch") == LmiConfig()
