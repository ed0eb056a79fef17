"""Files transformers 5 writes, in the form transformers 4 reads (lmi_trt.sources.transformers5): the rewrites as pure
functions, and the view of a folder under whichever transformers this run has."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version
from tinymodels import TRANSFORMERS5_FIXTURE

from lmi_trt.sources.artifact import SourceError
from lmi_trt.sources.transformers5 import (
    config_for_4,
    config_written_by_5,
    for_installed_transformers,
    installed,
    merges_as_text,
    source_of,
    tokenizer_config_for_4,
    tokenizer_config_written_by_5,
)

V4_57, V4_53, V4_42 = Version("4.57.3"), Version("4.53.1"), Version("4.42.4")


def test_rope_parameters_become_rope_theta_and_rope_scaling():
    written = {
        "transformers_version": "5.2.0",
        "dtype": "bfloat16",
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0},
    }
    assert config_written_by_5(written) and not config_written_by_5({"transformers_version": "4.57.3"})
    out = config_for_4(written, V4_57)
    assert "rope_parameters" not in out and out["rope_theta"] == 500000.0
    assert out["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}
    assert "torch_dtype" not in out  # 4.56 on read "dtype"
    assert config_for_4(written, V4_53)["torch_dtype"] == "bfloat16"
    linear = {
        "transformers_version": "5.0.0",
        "rope_parameters": {"rope_theta": 100.0, "rope_type": "linear", "factor": 4.0},
    }
    assert config_for_4(linear, V4_42)["rope_scaling"] == {
        "type": "linear",
        "factor": 4.0,
    }  # 4.42: type and factor only
    plain = config_for_4({"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}, V4_57)
    assert plain["rope_scaling"] is None and plain["rope_theta"] == 10000.0
    partial = config_for_4({"rope_parameters": {"rope_theta": 1.0, "partial_rotary_factor": 0.5}}, V4_57)
    assert partial["partial_rotary_factor"] == 0.5 and partial["rope_scaling"] is None
    nested = {"text_config": {"rope_parameters": {"rope_theta": 7.0}}}
    assert config_for_4(nested, V4_57)["text_config"]["rope_theta"] == 7.0


def test_rope_per_layer_type_is_refused():
    per_layer = {"rope_parameters": {"full_attention": {"rope_theta": 1e6}, "sliding_attention": {"rope_theta": 1e4}}}
    with pytest.raises(ValueError, match="per layer type"):
        config_for_4(per_layer, V4_57)


def test_tokenizer_config_in_4x_form():
    written = json.loads((TRANSFORMERS5_FIXTURE / "tokenizer_config.json").read_text())
    assert tokenizer_config_written_by_5(written)
    out = tokenizer_config_for_4(written, {"default": "{{ x }}"})
    assert out["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert out["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"] and "extra_special_tokens" not in out
    assert "backend" not in out and out["clean_up_tokenization_spaces"] is False  # 5.x's default, not 4.42's
    assert out["chat_template"] == "{{ x }}"
    many = tokenizer_config_for_4(written, {"default": "a", "tool_use": "b"})
    assert many["chat_template"] == [{"name": "default", "template": "a"}, {"name": "tool_use", "template": "b"}]
    assert not tokenizer_config_written_by_5({"tokenizer_class": "LlamaTokenizer", "extra_special_tokens": {}})


def test_pair_merges_become_strings_for_tokenizers_before_0_20():
    spec = json.loads((TRANSFORMERS5_FIXTURE / "tokenizer.json").read_text())
    assert isinstance(spec["model"]["merges"][0], list)
    text = merges_as_text(spec)
    assert text["model"]["merges"][0] == " ".join(spec["model"]["merges"][0])
    assert merges_as_text(text) is None
    with pytest.raises(ValueError, match="spaces"):
        merges_as_text({"model": {"type": "BPE", "merges": [["a b", "c"]]}})


def test_the_view_under_this_runs_transformers(tmp_path):
    """transformers 5 reads the folder as it is; 4.x reads it through a view that links everything else."""
    view = for_installed_transformers(TRANSFORMERS5_FIXTURE, tmp_path / "views")
    if installed("transformers").major >= 5:
        assert view == TRANSFORMERS5_FIXTURE
        return
    assert view.parent == tmp_path / "views" and source_of(view) == TRANSFORMERS5_FIXTURE.resolve()
    assert json.loads((view / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "rope_theta" in json.loads((view / "config.json").read_text())
    assert not (view / "chat_template.jinja").exists()  # folded into tokenizer_config.json
    assert for_installed_transformers(TRANSFORMERS5_FIXTURE, tmp_path / "views") == view  # built once


def test_a_config_no_rewrite_can_carry_is_refused_naming_the_file(tmp_path):
    (tmp_path / "m").mkdir()
    config = {"transformers_version": "5.1.0", "rope_parameters": {"full_attention": {"rope_theta": 1.0}}}
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    if installed("transformers").major >= 5:
        assert for_installed_transformers(tmp_path / "m", tmp_path / "views") == tmp_path / "m"
        return
    with pytest.raises(SourceError, match="config.json was written by transformers 5.1.0"):
        for_installed_transformers(tmp_path / "m", tmp_path / "views")
