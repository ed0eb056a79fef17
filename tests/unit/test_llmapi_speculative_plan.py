"""Speculative decoding planned per TensorRT-LLM release for the LLM API (lmi_trt.engines.llmapi_speculation): the
release's config class and field names, built by the fake's own classes (which validate as llm_args.py does), from
DJL's, TensorRT-LLM's and vLLM's keys; and what each release refuses, naming the key."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version
from trtllm_testing import fake_tensorrt_llm

from lmi_trt.config import ConfigError, load_config
from lmi_trt.engines.llmapi import llm_api_release, llm_configs, llm_plan
from lmi_trt.engines.llmapi_speculation import speculation_refusals
from lmi_trt.engines.trtllm import TrtllmConfigError
from lmi_trt.stages import llmapi_settings, settle

RELEASES = ("1.0.0", "1.1.0", "1.2.1", "1.3.0")


def settings(**props):
    config = load_config(
        overrides={"option.rolling_batch": "trtllm", "option.backend": "pytorch", **props}, env={"HF_MODEL_ID": "m"}
    )
    return llmapi_settings(settle(config, "trtllm"))


def built(release: str, hf_config=None, **props):
    """The speculative_config the LLM would get on ``release`` (the fake's class, validated)."""
    with fake_tensorrt_llm(release) as trt:
        import tensorrt_llm.llmapi as llmapi

        plan = llm_plan(settings(**props), llm_api_release(release), hf_config)
        return llm_configs(llmapi, plan, trt.__version__)["speculative_config"], plan


@pytest.mark.parametrize("release", RELEASES)
def test_ngram_from_each_vocabulary_is_the_releases_ngram_config(release):
    for props in (
        {
            "option.speculative_decoding_mode": "ngram",
            "option.max_draft_len": "3",
            "option.max_matching_ngram_size": "4",
        },
        {"option.speculative_config": '{"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4}'},
        {"option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'},
    ):
        config, plan = built(release, **props)
        assert type(config).__name__ == "NGramDecodingConfig"
        assert (config.max_draft_len, config.max_matching_ngram_size, config.is_use_oldest) == (3, 4, False)
        assert plan.origins["speculative_config"].startswith("option.speculative_")
        assert "llm_args" not in plan.keywords and "enable_trtllm_sampler" not in plan.keywords


@pytest.mark.parametrize("release", RELEASES)
def test_draft_model_eagle3_and_mtp_are_the_releases_classes(release, tmp_path):
    config, _ = built(release, **{"option.speculative_draft_model": str(tmp_path), "option.speculative_length": "5"})
    assert type(config).__name__ == "DraftTargetDecodingConfig"
    assert (config.max_draft_len, config.speculative_model_dir) == (5, str(tmp_path))
    eagle = json.dumps({"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": str(tmp_path)})
    config, plan = built(release, **{"option.speculative_config": eagle})
    assert type(config).__name__ == ("Eagle3DecodingConfig" if release >= "1.3" else "EagleDecodingConfig")
    assert config.speculative_model_dir == str(tmp_path) and "EAGLE-3" in plan.speculative.description
    config, _ = built(
        release,
        {"num_nextn_predict_layers": 1},
        **{"option.speculative_config": '{"decoding_type": "MTP", "max_draft_len": 2}'},
    )
    assert type(config).__name__ == "MTPDecodingConfig"
    assert (config.num_nextn_predict_layers, config.max_draft_len) == (2, 2)


def test_mtp_needs_the_models_heads_once_the_model_is_read():
    props = {"option.speculative_config": '{"decoding_type": "MTP", "max_draft_len": 2}'}
    assert llm_plan(settings(**props), Version("1.2.1")).speculative is not None  # not read yet: checked later
    with pytest.raises(TrtllmConfigError, match="option.speculative_config.decoding_type=.*num_nextn_predict_layers"):
        llm_plan(settings(**props), Version("1.2.1"), {"architectures": ["LlamaForCausalLM"]})


def test_max_concurrency_from_11_and_members_passed_or_refused():
    props = {"option.speculative_config": '{"decoding_type": "NGram", "max_draft_len": 3, "max_concurrency": 8}'}
    with pytest.raises(TrtllmConfigError, match=r"max_concurrency=8: TensorRT-LLM 1\.0\.0.*from 1\.1"):
        built("1.0.0", **props)
    config, _ = built("1.1.0", **props)
    assert config.max_concurrency == 8
    passed = '{"decoding_type": "NGram", "max_draft_len": 3, "is_public_pool": false, "is_keep_all": false}'
    config, _ = built("1.2.1", **{"option.speculative_config": passed})
    assert (config.is_public_pool, config.is_keep_all) == (False, False)
    unknown = '{"decoding_type": "NGram", "max_draft_len": 3, "draft_len_schedule": {"1": 3}}'
    with pytest.raises(TrtllmConfigError, match="option.speculative_config.draft_len_schedule"):
        built("1.2.1", **{"option.speculative_config": unknown})


@pytest.mark.parametrize("mode", ["medusa", "lookahead", "eagle", "explicit_draft_tokens"])
def test_engine_only_modes_are_refused_on_the_pytorch_backend(mode):
    with pytest.raises(TrtllmConfigError, match=f"option.speculative_decoding_mode='?{mode}.*pytorch"):
        llm_plan(settings(**{"option.speculative_decoding_mode": mode, "option.max_draft_len": "2"}), Version("1.2.1"))


def test_beam_search_and_the_overlap_scheduler_beside_speculation_are_refused():
    ngram = {"option.speculative_decoding_mode": "ngram"}
    with pytest.raises(TrtllmConfigError, match="option.max_beam_width=2"):
        llm_plan(settings(**ngram, **{"option.max_beam_width": "2"}), Version("1.1.0"))
    with pytest.raises(TrtllmConfigError, match="option.enable_overlap_scheduler"):
        llm_plan(settings(**ngram, **{"option.enable_overlap_scheduler": "true"}), Version("1.1.0"))


def test_what_each_release_refuses_beside_each_method():
    assert "sampling" in speculation_refusals("ngram", "1.1.0", (1, 1))
    assert "sampling" not in speculation_refusals("ngram", "1.2.1", (1, 2))
    assert "sampling" not in speculation_refusals("draft_model", "1.3.0", (1, 3))
    for method in ("eagle3", "mtp"):
        no = speculation_refusals(method, "1.2.1", (1, 2))
        assert {"sampling", "seed", "guided"} <= set(no) and "allow_advanced_sampling" in no["sampling"]
        assert "sampling" not in speculation_refusals(method, "1.3.0", (1, 3))  # "auto-detected per request"
        assert "guided" in speculation_refusals(method, "1.3.0", (1, 3))
    assert "guided" not in speculation_refusals("ngram", "1.0.0", (1, 0))
    assert {"logprobs", "top_logprobs", "bad_words", "logit_bias"} <= set(
        speculation_refusals("ngram", "1.3.0", (1, 3))
    )


def test_a_shortest_ngram_is_refused_naming_the_key():
    with pytest.raises(TrtllmConfigError, match="option.prompt_lookup_min=2"):
        llm_plan(
            settings(**{"option.speculative_decoding_mode": "ngram", "option.prompt_lookup_min": "2"}), Version("1.2.1")
        )
    with pytest.raises(ConfigError):
        load_config(overrides={"option.speculative_decoding_mode": "nope"}, env={"HF_MODEL_ID": "m"})
