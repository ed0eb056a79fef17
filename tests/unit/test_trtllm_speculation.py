"""Speculative decoding on the Executor over TensorRT engines (issue 29), as configured and planned: lookahead
decoding's (W, N, G) from trtllm-serve's and DJL's keys, its draft length, the compile plan and cache key, and the
refusals (other methods, members, beams, releases, GPUs), each naming the key."""

from __future__ import annotations

import json

import pytest

from lmi_trt import stages
from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import GpuFacts, make_plan
from lmi_trt.config import ConfigError, load_config
from lmi_trt.engines.registry import TENSORRT
from lmi_trt.engines.trtllm import parse_engine_config
from lmi_trt.engines.trtllm_speculation import Lookahead, engine_speculation_errors
from lmi_trt.speculative import SpeculationError, lookahead_draft_len

ENV = {"HF_MODEL_ID": "m"}
LOOKAHEAD_JSON = (
    '{"decoding_type": "Lookahead", "max_window_size": 2, "max_ngram_size": 3, "max_verification_set_size": 2}'
)
H100 = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
T4 = H100.model_copy(update={"name": "Tesla T4", "sm": 75})


@pytest.fixture(scope="module")
def llama():
    from tinymodels import tiny_model

    return json.loads((tiny_model("llama") / "config.json").read_text())


def config(**options):
    return load_config(overrides={f"option.{k}": v for k, v in options.items()}, env=ENV)


def executor_view(**options):
    return stages.executor_settings(stages.settle(config(**options), "trtllm"))


def test_lookahead_draft_len_is_calculate_speculative_resources():
    # decodingConfig.cpp: (N - 2) + (W - 1 + G) * (N - 1); README's example engine (7, 7, 7) is built with 83
    assert (
        lookahead_draft_len(7, 7, 7) == 83 and lookahead_draft_len(4, 3, 4) == 15 and lookahead_draft_len(2, 3, 2) == 7
    )


def test_trtllm_serves_and_djls_spellings_give_the_executor_its_lookahead():
    la = executor_view(speculative_config=LOOKAHEAD_JSON).lookahead
    assert (la.window, la.ngram, la.verification_set, la.draft_len) == (2, 3, 2, 7)
    assert la.key == "option.speculative_config.decoding_type"
    # DJL's keys (trtllm-build's flags): the Executor's default (4, 3, 4), whose draft length is 15
    djl = executor_view(speculative_decoding_mode="lookahead_decoding").lookahead
    assert (djl.window, djl.ngram, djl.verification_set, djl.draft_len) == (4, 3, 4, 15)
    assert executor_view(speculative_decoding_mode="lookahead_decoding", max_draft_len="15").lookahead == djl
    # a larger engine draft length is served (trtGptModelInflightBatching.cpp checks maxDraftTokens <= the engine's)
    assert executor_view(speculative_decoding_mode="lookahead_decoding", max_draft_len="20").lookahead == djl
    assert executor_view().lookahead is None


@pytest.mark.parametrize(
    ("options", "key", "words"),
    [
        ({"speculative_decoding_mode": "lookahead_decoding", "max_draft_len": "4"}, "option.max_draft_len", "at least"),
        (
            {"speculative_config": '{"decoding_type": "Lookahead", "max_ngram_size": 1}'},
            "option.speculative_config.max_ngram_size",
            "isLegal",
        ),
        (
            {"speculative_config": '{"decoding_type": "Lookahead", "max_window_size": 0}'},
            "option.speculative_config.max_window_size",
            "positive",
        ),
        (
            {"speculative_config": '{"decoding_type": "Lookahead", "is_public_pool": true}'},
            "option.speculative_config.is_public_pool",
            "not a member",
        ),
        (
            {"speculative_config": '{"decoding_type": "NGram", "max_draft_len": 3, "max_window_size": 2}'},
            "option.speculative_config.max_window_size",
            "configures lookahead decoding, not ngram",
        ),
        ({"speculative_decoding_mode": "lookahead_decoding", "max_beam_width": "2"}, "option.max_beam_width", "one"),
        # n-gram draft tokens run (lmi_trt.engines.trtllm_drafts), with one beam
        ({"speculative_decoding_mode": "ngram", "max_beam_width": "2"}, "option.max_beam_width", "with beam search"),
        # a draft model runs on a second Executor (lmi_trt.engines.trtllm_drafts), drafting for every request
        (
            {"speculative_draft_model": "/d", "speculative_disable_by_batch_size": "4"},
            "option.speculative_disable_by_batch_size",
            "pytorch backend's",
        ),
        # Medusa runs (lmi_trt.engines.trtllm_medusa), with one beam
        ({"speculative_decoding_mode": "medusa", "max_beam_width": "2"}, "option.max_beam_width", "one draft path"),
        ({"speculative_decoding_mode": "eagle"}, "option.speculative_decoding_mode", "examples/eagle"),
        (
            {"speculative_config": '{"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "e"}'},
            "option.speculative_config.decoding_type",
            "pytorch backend only",
        ),
    ],
)
def test_what_the_executor_cannot_run_is_refused_at_start_up_naming_the_key(options, key, words):
    # a ConfigError when the configuration alone is wrong (load_config), a SpeculationError when the Executor is
    with pytest.raises((SpeculationError, ConfigError)) as err:
        executor_view(**options)
    assert str(err.value).startswith(f"{key}=") and words in str(err.value)


def test_the_tensorrt_entry_honours_lookahead_keys():
    cfg = stages.settle(config(speculative_config=LOOKAHEAD_JSON), "trtllm")
    stages.refuse_ignored(TENSORRT, cfg)
    assert {"speculative_config", "speculative_decoding_mode"} <= stages.honoured(TENSORRT, cfg)


def plan(hf, gpu=H100, version="1.2.1", **opts):
    base = dict(max_input_len=64, max_output_len=32, max_batch_size=4)
    return make_plan(CompileOptions(**{**base, **opts}), hf, gpu, version)


def test_the_plan_and_its_cache_key_carry_the_mode_and_draft_length(llama):
    opts = stages.compile_options(stages.settle(config(speculative_config=LOOKAHEAD_JSON), "trtllm"))
    assert (opts.speculative_decoding_mode, opts.max_draft_len) == ("lookahead_decoding", 7)
    small = {"max_batch_size": 4, "max_input_len": 64, "max_output_len": 32}
    planned = make_plan(opts.model_copy(update=small), llama, H100, "1.2.1")
    key = planned.key_dict()
    assert (key["speculative_decoding_mode"], key["max_draft_len"]) == ("lookahead_decoding", 7)
    assert "speculative_decoding_mode" not in plan(llama).key_dict()  # plain plans keep their keys
    assert planned.build_config_kwargs()["max_draft_len"] == 7


@pytest.mark.parametrize(
    ("opts", "key", "words"),
    [
        (dict(version="0.12.0"), "option.speculative_decoding_mode", "predates lookahead decoding (0.13)"),
        (dict(gpu=T4), "option.speculative_decoding_mode", "compute capability 8.0"),
        (dict(max_beam_width=2), "option.max_beam_width", "one beam"),
        (dict(speculative_decoding_mode="eagle"), "option.speculative_decoding_mode", "not eagle"),
        # Medusa is planned from its heads: named, and on local disk only once fetched (`lmi-trt plan` does not)
        (dict(speculative_decoding_mode="medusa"), "option.speculative_decoding_mode", "not named, or not on local"),
        (dict(speculative_decoding_mode=None), "option.max_draft_len", "need a speculative decoding mode"),
    ],
)
def test_the_plan_refuses_engines_lmi_trt_would_not_serve(llama, opts, key, words):
    opts = {"speculative_decoding_mode": "lookahead_decoding", "max_draft_len": 7, **opts}
    with pytest.raises(PlanError) as err:
        plan(llama, **opts)
    assert err.value.key == key and words in str(err.value)


def test_engine_facts_take_the_draft_slack_off_max_seq_len_and_name_the_built_mode():
    built = {
        "version": "1.2.1",
        "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16"},
        "build_config": {
            "max_input_len": 64,
            "max_seq_len": 167,
            "max_batch_size": 4,
            "speculative_decoding_mode": 8,
            "max_draft_len": 7,
        },
    }
    facts = parse_engine_config(built)
    assert (facts.max_seq_len, facts.speculative_decoding_mode, facts.max_draft_len) == (160, 8, 7)
    la = Lookahead(2, 3, 2, "option.speculative_decoding_mode")
    assert engine_speculation_errors(la, 8, 7) == []
    assert engine_speculation_errors(la, 8, 15) == []  # the Executor resizes a larger draft length down
    assert "needs at least 7" in engine_speculation_errors(la, 8, 6)[0]
    medusa = engine_speculation_errors(None, 4, 3)[0]
    assert (
        "built with --speculative_decoding_mode medusa" in medusa and "name no heads" in medusa
    )  # stages.py refuses them
    assert "this one was built with none" in engine_speculation_errors(la, 1, 0)[0]


NGRAM_JSON = '{"decoding_type": "NGram", "max_draft_len": 3}'


def test_draft_tokens_turn_block_reuse_on_when_unset_and_refuse_it_off():
    """trtGptModelInflightBatching.cpp: "KV cache block reuse must be enabled for speculative decoding target model"."""
    assert executor_view(speculative_config=NGRAM_JSON).enable_kv_cache_reuse is True
    assert executor_view(speculative_config=NGRAM_JSON, enable_kv_cache_reuse="true").enable_kv_cache_reuse is True
    assert executor_view().enable_kv_cache_reuse is False  # DJL's default stays without drafts
    with pytest.raises(SpeculationError) as err:
        executor_view(speculative_config=NGRAM_JSON, enable_kv_cache_reuse="false")
    assert str(err.value).startswith("option.enable_kv_cache_reuse=False") and "KV cache block reuse must" in str(
        err.value
    )


def test_a_draft_model_needs_its_memory_share_and_runs_both_executors_in_orchestrator_mode():
    with pytest.raises(SpeculationError) as err:
        executor_view(speculative_draft_model="/d")
    assert str(err.value).startswith("option.draft_kv_cache_free_gpu_mem_fraction=None")
    view = executor_view(speculative_draft_model="/d", draft_kv_cache_free_gpu_mem_fraction="0.2")
    assert view.drafts.kv_fraction == 0.2 and view.orchestrator and view.enable_kv_cache_reuse
    assert not executor_view(speculative_config=NGRAM_JSON).orchestrator
    with pytest.raises(SpeculationError, match="no draft model is served"):
        executor_view(speculative_config=NGRAM_JSON, draft_kv_cache_free_gpu_mem_fraction="0.2")
    cfg = stages.settle(config(speculative_draft_model="/d", draft_kv_cache_free_gpu_mem_fraction="0.2"), "trtllm")
    assert "draft_kv_cache_free_gpu_mem_fraction" in stages.honoured(TENSORRT, cfg)


@pytest.mark.parametrize(
    ("opts", "key", "words"),
    [
        (dict(gpu=T4), "option.speculative_config.decoding_type", "compute capability 8.0"),
        (dict(use_paged_context_fmha=False), "option.use_paged_context_fmha", "KV-cache block reuse"),
    ],
)
def test_the_plan_refuses_draft_tokens_where_block_reuse_cannot_run(llama, opts, key, words):
    drafts = dict(
        speculative_decoding_mode="draft_tokens_external",
        max_draft_len=3,
        speculative_method="ngram",
        speculative_key="option.speculative_config.decoding_type",
    )
    with pytest.raises(PlanError) as err:
        plan(llama, **{**drafts, **opts})
    assert err.value.key == key and words in str(err.value)


def test_the_plan_builds_draft_tokens_with_paged_context_fmha_and_plans_max_num_tokens_for_the_raised_input(llama):
    drafts = dict(
        speculative_decoding_mode="draft_tokens_external",
        max_draft_len=3,
        speculative_method="ngram",
        speculative_key="option.speculative_config.decoding_type",
    )
    planned = plan(llama, **drafts)
    assert planned.plugins.use_paged_context_fmha and planned.max_input_len == 95
    # max_input_len 64 is raised to max_seq_len - 1 = 95: a max_num_tokens below it needs chunked context
    chunked = plan(llama, max_num_tokens=80, **drafts)
    assert any("processed in chunks" in note for note in chunked.notes), chunked.notes
    assert not any("processed in chunks" in note for note in plan(llama, max_num_tokens=80).notes)
