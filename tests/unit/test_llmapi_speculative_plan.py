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
from lmi_trt.engines.llmapi_speculation import (
    SpecPlan,
    advanced_sampling,
    probed,
    speculation_refusals,
)
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
        {
            "option.speculative_config": '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, '
            '"prompt_lookup_min": 1, "is_use_oldest": false}'
        },
    ):
        config, plan = built(release, **props)
        assert type(config).__name__ == "NGramDecodingConfig"
        # is_use_oldest passed only when set: TensorRT-LLM's default (True, llm_args.py NGramDecodingConfig) otherwise
        oldest = "is_use_oldest" not in json.dumps(props)
        assert (config.max_draft_len, config.max_matching_ngram_size, config.is_use_oldest) == (3, 4, oldest)
        assert ("is_use_oldest" in plan.speculative.fields) != oldest
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
    # num_nextn_predict_layers overwrites max_draft_len before PR 12341, and main remaps a given one: passed on every
    # release, max_draft_len never
    fields = plan_mtp(release).speculative.fields
    assert fields["num_nextn_predict_layers"] == 2 and "max_draft_len" not in fields


def plan_mtp(release: str):
    props = {"option.speculative_config": '{"decoding_type": "MTP", "max_draft_len": 2}'}
    return llm_plan(settings(**props), Version(release), {"num_nextn_predict_layers": 1})


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
    # two-model EAGLE-3 too (interface.py support_overlap_scheduler: MTP and EAGLE-3 one-model in the oldest copy)
    two = '{"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": "/d", "eagle3_one_model": false}'
    overlap = {"option.enable_overlap_scheduler": "true"}
    with pytest.raises(TrtllmConfigError, match="option.enable_overlap_scheduler.*eagle3_one_model=true"):
        llm_plan(settings(**{"option.speculative_config": two}, **overlap), Version("1.2.1"))
    one = two.replace("false", "true")
    assert llm_plan(settings(**{"option.speculative_config": one}, **overlap), Version("1.2.1")).speculative


def plan_of(method: str, **kw) -> SpecPlan:
    return SpecPlan("X", {}, method, "", one_model=method in ("eagle3", "mtp"), **kw)


def test_what_each_release_refuses_beside_each_method():
    # two-model paths: the TorchSampler's per-request strategies and log probs beside drafts from 1.2 (sampler.py of
    # the 1.2 line; 1.1's not read), the argmax on 1.0
    assert {"sampling", "logprobs"} <= set(speculation_refusals(plan_of("ngram"), "1.0.0", (1, 0)))
    assert {"sampling", "logprobs", "top_logprobs"} <= set(speculation_refusals(plan_of("ngram"), "1.1.0", (1, 1)))
    for release, line in (("1.2.1", (1, 2)), ("1.3.0", (1, 3))):
        no = speculation_refusals(plan_of("draft_model"), release, line)
        assert not {"sampling", "logprobs", "top_logprobs", "guided"} & set(no)
        assert {"prompt_logprobs", "bad_words", "logit_bias"} <= set(no)
    for method in ("eagle3", "mtp"):
        # one-model: greedy unless the release's allow_advanced_sampling is deprecated (per-request auto-detection);
        # absent or a prototype whose sampling was not read → refused
        for status in (None, "absent", "prototype", "stable"):
            no = speculation_refusals(plan_of(method, advanced_sampling=status), "1.2.1", (1, 2))
            assert {"sampling", "seed", "guided", "logprobs"} <= set(no) and "allow_advanced_sampling" in no["sampling"]
        no = speculation_refusals(plan_of(method, advanced_sampling="deprecated"), "1.3.0rc5", (1, 3))
        assert "sampling" not in no and {"seed", "guided", "logprobs"} <= set(no)
    # 1.0's py_executor_creator.py raises for guided decoding beside any speculation (lifted by PR 6300, in 1.1)
    assert "PR 6300" in speculation_refusals(plan_of("ngram"), "1.0.0", (1, 0))["guided"]
    assert "guided" not in speculation_refusals(plan_of("ngram"), "1.1.0", (1, 1))


@pytest.mark.parametrize("release", RELEASES)
def test_allow_advanced_sampling_is_probed_and_never_set(release, tmp_path):
    """The field is probed on the installed class and never passed: absent (1.0, 1.1) or a prototype (the 1.2-dated
    copy, 1.3.0 candidates before PR 14745; what it honours was not read) → sampling refused on one-model paths;
    deprecated (main: per-request auto-detection) → sampling served."""
    eagle = {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": str(tmp_path)}
    line = tuple(int(n) for n in release.split(".")[:2])
    for extra, one_model in (({}, True), ({"eagle3_one_model": False}, False)):
        with fake_tensorrt_llm(release):
            import tensorrt_llm.llmapi as llmapi

            plan = llm_plan(settings(**{"option.speculative_config": json.dumps(eagle | extra)}), Version(release))
            cls = getattr(llmapi, plan.speculative.config_class)
            fields, status = plan.speculative.fields, advanced_sampling(cls)
            refused = "sampling" in speculation_refusals(probed(plan.speculative, cls), release, line)
        assert status == {"1.0.0": "absent", "1.1.0": "absent", "1.2.1": "prototype", "1.3.0": "deprecated"}[release]
        assert "allow_advanced_sampling" not in fields
        assert refused == (release in ("1.0.0", "1.1.0") or (one_model and status != "deprecated"))


def test_a_shortest_ngram_is_refused_naming_the_key():
    with pytest.raises(TrtllmConfigError, match="option.prompt_lookup_min=2"):
        llm_plan(
            settings(**{"option.speculative_decoding_mode": "ngram", "option.prompt_lookup_min": "2"}), Version("1.2.1")
        )
    with pytest.raises(ConfigError):
        load_config(overrides={"option.speculative_decoding_mode": "nope"}, env={"HF_MODEL_ID": "m"})


@pytest.mark.parametrize("release", ["1.1.0", "1.2.1", "1.3.0"])
def test_max_concurrency_beside_one_model_speculation_is_refused(release, tmp_path):
    """max_concurrency is read by the drafter only (py_executor.py, 1.1 line: ``if self.drafter is not None``), and
    get_spec_drafter (_torch/speculative/utils.py) gives EAGLE3_ONE_MODEL and MTP one-model none: it would be
    ignored. Two-model EAGLE-3 (eagle3_one_model=false) has a drafter and keeps it."""
    eagle = {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": str(tmp_path), "max_concurrency": 4}
    with pytest.raises(TrtllmConfigError, match=r"option\.speculative_config\.max_concurrency=4.*eagle3_one_model"):
        built(release, **{"option.speculative_config": json.dumps(eagle)})
    mtp = {"option.speculative_config": '{"decoding_type": "MTP", "max_draft_len": 2}'}
    with pytest.raises(TrtllmConfigError, match=r"option\.speculative_disable_by_batch_size=4.*get_spec_drafter"):
        built(release, {"num_nextn_predict_layers": 1}, **mtp, **{"option.speculative_disable_by_batch_size": "4"})
    config, _ = built(release, **{"option.speculative_config": json.dumps(eagle | {"eagle3_one_model": False})})
    assert (config.max_concurrency, config.eagle3_one_model) == (4, False)


def test_vllm_ngram_bounds_that_tensorrt_llm_cannot_honour_are_refused():
    """vLLM's form copies prompt_lookup_max into prompt_lookup_min (vllm/config/speculative.py __post_init__);
    TensorRT-LLM matches down to one token, so an implied shortest n-gram above 1 is refused, naming the member."""
    for member in ({"prompt_lookup_max": 4}, {}):
        raw = json.dumps({"method": "ngram", "num_speculative_tokens": 3, **member})
        with pytest.raises(TrtllmConfigError, match=r"option\.speculative_config\.prompt_lookup_min=[45]"):
            built("1.2.1", **{"option.speculative_config": raw})


@pytest.mark.parametrize("release", RELEASES)
def test_tensorrt_llms_own_spellings_for_eagle3_and_mtp(release, tmp_path):
    """decoding_type "Eagle" is EAGLE-3 on the PyTorch backend (EagleDecodingConfig.spec_dec_mode: EAGLE3_ONE_MODEL or
    EAGLE3; 1.0/1.1's from_dict knows no "Eagle3"), and num_nextn_predict_layers is MTP's draft length (llm_args.py
    of 1.0-1.2); vLLM's method "eagle" stays EAGLE-1/2, refused here."""
    eagle = {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model": str(tmp_path)}
    config, plan = built(release, **{"option.speculative_config": json.dumps(eagle)})
    assert plan.speculative.method == "eagle3" and type(config).__name__.startswith("Eagle")
    mtp = {"option.speculative_config": '{"decoding_type": "MTP", "num_nextn_predict_layers": 3}'}
    config, _ = built(release, {"num_nextn_predict_layers": 1}, **mtp)
    assert (type(config).__name__, config.max_draft_len) == ("MTPDecodingConfig", 3)
    vllm = {"method": "eagle", "num_speculative_tokens": 3, "model": str(tmp_path)}
    with pytest.raises(TrtllmConfigError, match="decoding_type Eagle or Eagle3"):
        built(release, **{"option.speculative_config": json.dumps(vllm)})
