"""Pure parts of the trtllm engine: versions, engine facts, settings checks, request mapping."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import pytest
from tinymodels import tiny_model
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.engines.base import (
    EngineError,
    FinishReason,
    GenerationRequest,
    GuidedDecoding,
    SamplingParams,
    can,
)
from lmi_trt.engines.trtllm import (
    TrtllmConfigError,
    TrtllmSettings,
    TrtllmUnavailable,
    api_spec,
    build_executor_config,
    check_settings,
    effective_multi_block_mode,
    executor_capabilities,
    expected_engine_file,
    final_tokens_and_reason,
    map_request,
    parse_engine_config,
    plan_engine_links,
    prepare_engine_dir,
    probe_runtime,
    read_engine_facts,
    resolve_engine_dir,
    sampling_kwargs,
    to_executor_request,
)

# A 0.10-era builder config: max_output_len instead of max_seq_len, multi_block_mode as a plugin flag.
CONFIG_0X = {
    "version": "0.10.0",
    "pretrained_config": {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
        "quantization": {"quant_algo": "W8A16", "kv_cache_quant_algo": None},
    },
    "build_config": {
        "max_batch_size": 64,
        "max_input_len": 2048,
        "max_output_len": 512,
        "max_num_tokens": 8192,
        "max_beam_width": 1,
        "plugin_config": {
            "paged_kv_cache": True,
            "use_paged_context_fmha": False,
            "remove_input_padding": True,
            "tokens_per_block": 128,
            "multi_block_mode": False,
            "gpt_attention_plugin": "float16",
        },
    },
}
# ≤0.7: builder_config + plugin_config, no version.
CONFIG_LEGACY = {
    "builder_config": {
        "name": "llama",
        "precision": "float16",
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
        "max_batch_size": 8,
        "max_input_len": 1024,
        "max_output_len": 256,
        "max_beam_width": 1,
    },
    "plugin_config": {"paged_kv_cache": True, "remove_input_padding": True, "tokens_per_block": 64},
}


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


@pytest.fixture(scope="module")
def built_facts(trt, tmp_path_factory):
    out = make_engine_dir(
        tiny_model("llama"), tmp_path_factory.mktemp("eng") / "e", max_batch_size=8, max_input_len=64, max_seq_len=256
    )
    return read_engine_facts(out)


def facts_1x(**changes):
    return replace(
        parse_engine_config(
            {
                "version": "1.2.0rc2",
                "pretrained_config": {
                    "architecture": "LlamaForCausalLM",
                    "dtype": "bfloat16",
                    "mapping": {"tp_size": 1},
                },
                "build_config": {
                    "max_batch_size": 16,
                    "max_input_len": 128,
                    "max_seq_len": 512,
                    "max_num_tokens": 2048,
                    "max_beam_width": 2,
                    "kv_cache_type": "PAGED",
                    "plugin_config": {"use_paged_context_fmha": True, "remove_input_padding": True},
                },
            }
        ),
        **changes,
    )


def request(streaming=True, **sampling) -> GenerationRequest:
    return GenerationRequest("r1", [1, 5, 6], SamplingParams(**sampling), streaming=streaming)


# ------------------------------------------------------------------------------ versions


@pytest.mark.parametrize("version", ["0.12.0", "1.0.0", "1.1.0", "1.2.0rc2"])
def test_supported_versions(version):
    assert api_spec(version).version == version


@pytest.mark.parametrize("version", ["0.11.0", "0.16.0", "1.3.0", "2.0.0", "nightly"])
def test_unsupported_versions_are_refused_naming_the_supported_ones(version):
    with pytest.raises(TrtllmUnavailable, match=r"0\.12\.x, 1\.0\.x"):
        api_spec(version)


def test_only_1x_sends_a_final_result_on_cancel():
    assert not api_spec("0.12.0").final_result_on_cancel
    assert api_spec("1.0.0").final_result_on_cancel


def test_probe_runtime_without_tensorrt_llm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import fails, whatever else is on sys.path
    with pytest.raises(TrtllmUnavailable, match="not installed"):
        probe_runtime(lambda: True)


def test_probe_runtime_checks_gpu_version_and_executor(trt, monkeypatch):
    tle, spec = probe_runtime(lambda: True)
    assert spec.version == trt.__version__ and hasattr(tle, "Executor")
    with pytest.raises(TrtllmUnavailable, match="no CUDA GPU"):
        probe_runtime(lambda: False)
    monkeypatch.setattr(trt, "__version__", "1.3.0")
    with pytest.raises(TrtllmUnavailable, match="1.3.0 is not supported"):
        probe_runtime(lambda: True)
    monkeypatch.undo()
    monkeypatch.delattr(tle, "Executor")
    with pytest.raises(TrtllmUnavailable, match="without the TensorRT-engine Executor"):
        probe_runtime(lambda: True)


# ------------------------------------------------------------------------------ engine facts


def test_facts_from_an_engine_the_build_api_wrote(built_facts, trt):
    f = built_facts
    assert (f.layout, f.version, f.name, f.dtype) == ("builder", trt.__version__, "LlamaForCausalLM", "float16")
    assert (f.tp_size, f.pp_size, f.max_batch_size, f.max_input_len, f.max_seq_len) == (1, 1, 8, 64, 256)
    assert f.paged_kv_cache is True and f.use_paged_context_fmha is True and f.remove_input_padding is True
    assert f.multi_block_mode is None  # a runtime knob in 1.x


def test_facts_from_a_0x_config():
    f = parse_engine_config(CONFIG_0X)
    assert (f.layout, f.version, f.tp_size, f.max_seq_len, f.max_num_tokens) == ("builder", "0.10.0", 2, 2560, 8192)
    assert (f.use_paged_context_fmha, f.multi_block_mode, f.tokens_per_block, f.quant_algo) == (
        False,
        False,
        128,
        "W8A16",
    )


def test_facts_from_a_legacy_config():
    f = parse_engine_config(CONFIG_LEGACY)
    assert (f.layout, f.version, f.name, f.dtype, f.tp_size, f.max_seq_len) == (
        "legacy",
        None,
        "llama",
        "float16",
        2,
        1280,
    )
    assert f.use_paged_context_fmha is False and f.paged_kv_cache is True


def test_continuous_kv_cache_is_not_paged():
    cfg = json.loads(json.dumps(CONFIG_0X))
    cfg["build_config"]["kv_cache_type"] = "CONTINUOUS"
    assert parse_engine_config(cfg).paged_kv_cache is False


@pytest.mark.parametrize(
    "config, message",
    [
        ({"architecture": "LlamaForCausalLM", "mapping": {}}, "TRT-LLM checkpoint"),
        (
            {"pretrained_config": {"architecture": "x", "dtype": "float16"}, "build_config": {}},
            "build_config.max_input_len",
        ),
    ],
)
def test_unrecognised_configs_are_explained(config, message):
    with pytest.raises(TrtllmConfigError, match=message):
        parse_engine_config(config)


def test_resolve_engine_dir_finds_the_triton_layout(tmp_path):
    inner = tmp_path / "tensorrt_llm" / "1"
    inner.mkdir(parents=True)
    (inner / "config.json").write_text("{}")
    assert resolve_engine_dir(tmp_path) == inner
    assert resolve_engine_dir(tmp_path / "tensorrt_llm") == inner
    with pytest.raises(TrtllmConfigError, match="no engine config.json"):
        resolve_engine_dir(inner.parent.parent.parent)


# ------------------------------------------------------------------------------ plan file names


def test_expected_plan_names_follow_the_version_key():
    legacy = parse_engine_config(CONFIG_LEGACY)
    assert expected_engine_file(legacy, 1) == "llama_float16_tp2_rank1.engine"
    assert expected_engine_file(replace(legacy, pp_size=2), 3) == "llama_float16_tp2_pp2_rank3.engine"
    assert expected_engine_file(parse_engine_config(CONFIG_0X), 1) == "rank1.engine"


def test_plan_links_rename_either_way():
    new = parse_engine_config(CONFIG_0X)  # tp2, expects rank{r}.engine
    assert plan_engine_links(["config.json", "rank0.engine", "rank1.engine"], new) == {}
    legacy_names = ["config.json", "llama_float16_tp2_rank0.engine", "llama_float16_tp2_rank1.engine"]
    assert plan_engine_links(legacy_names, new) == {
        "rank0.engine": "llama_float16_tp2_rank0.engine",
        "rank1.engine": "llama_float16_tp2_rank1.engine",
    }
    assert plan_engine_links(["config.json", "rank0.engine", "rank1.engine"], parse_engine_config(CONFIG_LEGACY)) == {
        "llama_float16_tp2_rank0.engine": "rank0.engine",
        "llama_float16_tp2_rank1.engine": "rank1.engine",
    }


def test_plan_links_refuse_missing_or_ambiguous_ranks():
    new = parse_engine_config(CONFIG_0X)
    with pytest.raises(TrtllmConfigError, match="loads rank1.engine for rank 1, but the folder has no plan"):
        plan_engine_links(["config.json", "rank0.engine"], new)
    with pytest.raises(TrtllmConfigError, match="2 candidate plans"):
        plan_engine_links(["rank0.engine", "a_float16_tp2_rank1.engine", "b_float16_tp2_rank1.engine"], new)


def test_prepare_engine_dir_links_into_scratch(tmp_path):
    src = tmp_path / "engine"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(CONFIG_0X))
    for r in (0, 1):
        (src / f"llama_float16_tp2_rank{r}.engine").write_bytes(b"plan%d" % r)
    out = prepare_engine_dir(src, read_engine_facts(src), tmp_path / "scratch")
    assert out != src and os.path.islink(out / "rank1.engine")
    assert (out / "rank1.engine").read_bytes() == b"plan1" and (out / "config.json").is_file()
    assert sorted(os.listdir(src)) == [
        "config.json",
        "llama_float16_tp2_rank0.engine",
        "llama_float16_tp2_rank1.engine",
    ]
    (src / "rank0.engine").write_bytes(b"x")  # now both namings: nothing to do for rank 0 only
    assert plan_engine_links(os.listdir(src), read_engine_facts(src)) == {
        "rank1.engine": "llama_float16_tp2_rank1.engine"
    }


# ------------------------------------------------------------------------------ settings


def test_batch_above_the_engine_names_the_key_and_the_engine_value():
    with pytest.raises(
        TrtllmConfigError, match=r"option.max_rolling_batch_size=32 exceeds the engine's built max_batch_size=16"
    ):
        check_settings(
            TrtllmSettings(max_batch_size=32, max_batch_size_key="option.max_rolling_batch_size"), facts_1x()
        )


def test_a_default_batch_above_the_engine_is_lowered_with_a_warning():
    warnings = check_settings(TrtllmSettings(max_batch_size=256), facts_1x())
    assert any("serving at most 16" in w for w in warnings)


def test_kv_reuse_needs_paged_context_fmha():
    check_settings(TrtllmSettings(enable_kv_cache_reuse=True), facts_1x())
    with pytest.raises(
        TrtllmConfigError, match="option.enable_kv_cache_reuse=true needs an engine built with paged context FMHA"
    ):
        check_settings(TrtllmSettings(enable_kv_cache_reuse=True), facts_1x(use_paged_context_fmha=False))


def test_lora_beside_kv_reuse_is_refused_before_the_release_that_keyed_blocks_by_task():
    from lmi_trt.engines.trtllm_lora import LoraBuild

    lora = dict(lora=LoraBuild(True, 8, ("attn_q",)), num_layers=2)
    settings = TrtllmSettings(enable_lora=True, max_lora_rank=8, enable_kv_cache_reuse=True)
    check_settings(settings, facts_1x(**lora))
    for version in ("0.12.0", None):
        with pytest.raises(TrtllmConfigError, match="option.enable_lora=true beside option.enable_kv_cache_reuse=true"):
            check_settings(settings, facts_1x(version=version, **lora))
        check_settings(settings.model_copy(update={"enable_kv_cache_reuse": False}), facts_1x(version=version, **lora))


def test_parallelism_must_match_the_engine():
    with pytest.raises(TrtllmConfigError, match=r"tensor_parallel_degree=1 .* built for tp=2 pp=1"):
        check_settings(TrtllmSettings(), parse_engine_config(CONFIG_0X))
    check_settings(TrtllmSettings(tensor_parallel_degree=2), parse_engine_config(CONFIG_0X))
    check_settings(TrtllmSettings(tensor_parallel_degree=None), parse_engine_config(CONFIG_0X))  # TP "max"


def test_all_problems_are_reported_at_once():
    settings = TrtllmSettings(max_num_tokens=4096, max_beam_width=4, enable_chunked_context=True)
    with pytest.raises(TrtllmConfigError) as err:
        check_settings(settings, facts_1x(paged_kv_cache=False, use_paged_context_fmha=False))
    message = str(err.value)
    for needle in (
        "option.max_num_tokens=4096",
        "option.max_beam_width=4",
        "paged KV cache",
        "option.enable_chunked_context",
    ):
        assert needle in message


def test_small_kv_cache_warns():
    assert check_settings(TrtllmSettings(max_tokens_in_paged_kv_cache=100), facts_1x())


def test_settings_validate_values():
    with pytest.raises(ValueError, match="kv_cache_free_gpu_mem_fraction"):
        TrtllmSettings(kv_cache_free_gpu_mem_fraction=1.5)
    with pytest.raises(ValueError, match="batch_scheduler_policy"):
        TrtllmSettings(batch_scheduler_policy="fifo")


def test_settings_from_config_follow_djl_precedence():
    from lmi_trt.config import LmiConfig
    from lmi_trt.stages import settle, trtllm_settings

    config = LmiConfig(
        max_rolling_batch_size=64,
        tensor_parallel_degree="max",
        kv_cache_free_gpu_mem_fraction=0.8,
        enable_kv_cache_reuse=True,
    )
    s = trtllm_settings(settle(config, "trtllm"))
    assert (s.max_batch_size, s.max_batch_size_key, s.tensor_parallel_degree) == (
        64,
        "option.max_rolling_batch_size",
        None,
    )
    assert (s.kv_cache_free_gpu_mem_fraction, s.enable_kv_cache_reuse) == (0.8, True)
    s = trtllm_settings(settle(LmiConfig(max_rolling_batch_size=64, max_num_sequences=32), "trtllm"))
    assert (s.max_batch_size, s.max_batch_size_key) == (32, "option.max_num_sequences")
    s = trtllm_settings(settle(LmiConfig(), "trtllm"))
    assert (s.max_batch_size, s.max_batch_size_key) == (256, None)


# ------------------------------------------------------------------------------ executor config


def test_executor_config_1x(trt, monkeypatch):
    from tensorrt_llm.bindings import executor as tle

    if trt.__version__.startswith("0."):  # under LMI_TRT_FAKE_RELEASE=0.12.0: this test is about 1.x
        monkeypatch.setattr(trt, "__version__", "1.0.0")

    settings = TrtllmSettings(
        max_batch_size=8,
        max_beam_width=2,
        kv_cache_free_gpu_mem_fraction=0.5,
        max_tokens_in_paged_kv_cache=4096,
        kv_cache_host_memory_bytes=2**30,
        batch_scheduler_policy="guaranteed_no_evict",
        multi_block_mode=False,
        enable_trt_overlap=True,
    )
    config, warnings = build_executor_config(tle, settings, facts_1x())
    assert warnings == []
    assert (config.max_batch_size, config.max_beam_width, config.batching_type) == (8, 2, tle.BatchingType.INFLIGHT)
    kv = config.kv_cache_config
    # 1.x defaults block reuse on: it must be passed off explicitly.
    assert (kv.enable_block_reuse, kv.free_gpu_memory_fraction, kv.max_tokens) == (False, 0.5, 4096)
    assert kv.host_cache_size == 2**30  # option.kv_cache_host_memory_bytes: the host tier for offloaded blocks
    assert config.scheduler_config.capacity_scheduler_policy == tle.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    assert config.extended_runtime_perf_knob_config.multi_block_mode is False
    assert config.enable_trt_overlap is True and config.enable_chunked_context is False
    assert config.parallel_config.communication_mode == tle.CommunicationMode.LEADER


def test_executor_config_012_refuses_knobs_it_lacks(trt, monkeypatch):
    """Never accepted and ignored: a knob this release's Executor lacks, or a build option set against the built
    engine, stops the start naming the key."""
    from tensorrt_llm.bindings import executor as tle

    monkeypatch.setattr(trt, "__version__", "0.12.0")
    config, _ = build_executor_config(tle, TrtllmSettings(), facts_1x())
    assert type(config).__name__ == "ExecutorConfig" and not hasattr(config, "enable_trt_overlap")
    assert config.scheduler_config.capacity_scheduler_policy.name == "MAX_UTILIZATION"
    with pytest.raises(TrtllmConfigError, match="option.enable_trt_overlap=true: .* has no enable_trt_overlap"):
        build_executor_config(tle, TrtllmSettings(enable_trt_overlap=True), facts_1x())
    monkeypatch.delattr(tle, "ExtendedRuntimePerfKnobConfig")  # a release where it is a build flag
    with pytest.raises(TrtllmConfigError, match="built with multi_block_mode=false"):
        build_executor_config(tle, TrtllmSettings(multi_block_mode=True), facts_1x(multi_block_mode=False))
    config, _ = build_executor_config(tle, TrtllmSettings(multi_block_mode=False), facts_1x(multi_block_mode=False))


@pytest.mark.parametrize("release,unset", [("0.12.0", False), ("1.0.0", True), ("1.2.1", True)])
def test_multi_block_mode_is_what_was_set_or_the_releases_default(trt, monkeypatch, release, unset):
    """ExtendedRuntimePerfKnobConfig.multi_block_mode defaults off in 0.12 and on in 1.x: the Executor
    gets the option's value on every release, and an unset option is this release's default, stated."""
    from tensorrt_llm.bindings import executor as tle

    monkeypatch.setattr(trt, "__version__", release)
    for chosen in (True, False):
        config, _ = build_executor_config(tle, TrtllmSettings(multi_block_mode=chosen), facts_1x())
        assert config.extended_runtime_perf_knob_config.multi_block_mode is chosen
    config, _ = build_executor_config(tle, TrtllmSettings(), facts_1x())
    assert config.extended_runtime_perf_knob_config.multi_block_mode is unset
    assert effective_multi_block_mode(tle, TrtllmSettings()) == (unset, "this TensorRT-LLM's default")


# ------------------------------------------------------------------------------ requests


def test_greedy_is_top_k_1_whatever_the_sampling_values():
    kw = sampling_kwargs(SamplingParams(do_sample=False, temperature=0.3, top_p=0.5, top_k=9), seed=7)
    assert kw == {"beam_width": 1, "top_k": 1}


def test_do_sample_fills_only_unset_values_djl_style():
    # The core fills DJL's defaults where the request left them unset; the engine applies them as given.
    from lmi_trt.serving.core import GenerateParams, sampling_params

    unset = sampling_params(GenerateParams(do_sample=True), max_new_tokens=4, logprobs=False)
    assert sampling_kwargs(unset, seed=7) == {
        "beam_width": 1,
        "top_k": 5,
        "top_p": 0.85,
        "temperature": 0.8,
        "seed": 7,
    }
    explicit = sampling_params(GenerateParams(do_sample=True, top_p=1.0), max_new_tokens=4, logprobs=False)
    assert sampling_kwargs(explicit, seed=7)["top_p"] == 1.0  # an explicit 1.0 was turned into 0.85
    kw = sampling_kwargs(SamplingParams(do_sample=True, top_k=50, top_p=0.9, temperature=0.5, seed=-1), seed=7)
    assert (kw["top_k"], kw["top_p"], kw["temperature"], kw["seed"]) == (50, 0.9, 0.5, 2**64 - 1)


def test_penalties_and_min_tokens_pass_through():
    kw = sampling_kwargs(
        SamplingParams(repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.1, min_new_tokens=3), seed=0
    )
    assert (kw["repetition_penalty"], kw["presence_penalty"], kw["frequency_penalty"], kw["min_tokens"]) == (
        1.2,
        0.5,
        0.1,
        3,
    )
    assert "repetition_penalty" not in sampling_kwargs(SamplingParams(), seed=0)


def test_request_keywords_and_extra_eos_as_stop_words():
    req = GenerationRequest(
        "r",
        [1, 2, 3],
        SamplingParams(max_new_tokens=9, logprobs=True),
        stop_token_ids=[[7, 8], []],
        bad_words_ids=[[9]],
        streaming=True,
    )
    spec = map_request(req, eos_token_ids=[2, 128009], pad_token_id=0, max_beam_width=1, seed=1)
    assert spec.request == {
        "input_token_ids": [1, 2, 3],
        "max_tokens": 9,
        "streaming": True,
        "end_id": 2,
        "pad_id": 0,
        "stop_words": [[7, 8], [128009]],
        "bad_words": [[9]],
    }
    assert spec.output == {"exclude_input_from_output": True, "return_log_probs": True}


def test_ignore_eos_never_matches_an_end_id():
    spec = map_request(request(ignore_eos=True), eos_token_ids=[2, 3], pad_token_id=0, max_beam_width=1, seed=1)
    assert spec.request["end_id"] == -1 and spec.request["stop_words"] is None


@pytest.mark.parametrize(
    "req, max_beam, message",
    [
        (request(streaming=True, beam_width=2), 4, "needs a non-streaming request"),
        (request(streaming=False, beam_width=4), 2, "exceeds the engine's max_beam_width=2"),
        (request(max_new_tokens=0), 1, "at least 1"),
        (GenerationRequest("r", [], SamplingParams()), 1, "no tokens"),
    ],
)
def test_unservable_requests_are_400(req, max_beam, message):
    with pytest.raises(EngineError, match=message) as err:
        map_request(req, eos_token_ids=[2], pad_token_id=0, max_beam_width=max_beam, seed=1)
    assert err.value.code == 400


def test_beam_search_when_built_for_it():
    spec = map_request(
        request(streaming=False, beam_width=2), eos_token_ids=[2], pad_token_id=0, max_beam_width=2, seed=1
    )
    # executor.h SamplingConfig: transformers' defaults sent as they are (TensorRT-LLM's own are lengthPenalty 0
    # and earlyStopping 1); numReturnSequences beams come back
    assert spec.sampling == {"beam_width": 2, "length_penalty": 1.0, "early_stopping": 0, "num_return_sequences": 1}
    never = request(streaming=False, beam_width=2, early_stopping="never")
    with pytest.raises(EngineError, match="bounds a running beam's best score by the engine's max_seq_len") as e:
        map_request(never, eos_token_ids=[2], pad_token_id=0, max_beam_width=2, seed=1)
    assert e.value.field == "early_stopping"


def test_a_negative_length_penalty_with_beams_is_a_400_naming_it():
    # samplingConfig.cpp (1.x) checkLengthPenalty: lengthPenalty >= 0, asserted in the constructor
    negative = request(streaming=False, beam_width=2, length_penalty=-1.0)
    with pytest.raises(EngineError, match="length_penalty=-1.0") as e:
        map_request(negative, eos_token_ids=[2], pad_token_id=0, max_beam_width=2, seed=1)
    assert (e.value.code, e.value.field) == (400, "length_penalty")


@pytest.mark.parametrize(
    "eos, stop_ids, field",
    [([2, 128009], [], "beam_width"), ([2], [[7]], "stop_token_ids")],
)
def test_beams_with_stop_words_are_refused_on_the_executor_only(eos, stop_ids, field):
    req = GenerationRequest("r", [1, 2, 3], SamplingParams(beam_width=2), stop_token_ids=stop_ids, streaming=False)
    with pytest.raises(EngineError, match="finishes a beam on the end id only") as e:
        map_request(req, eos_token_ids=eos, pad_token_id=0, max_beam_width=2, seed=1)
    assert (e.value.code, e.value.field) == (400, field)
    # the LLM API's release table decides there (its beam_width+stop row)
    spec = map_request(req, eos_token_ids=eos, pad_token_id=0, max_beam_width=2, seed=1, beams_stop=True)
    assert spec.request["stop_words"]
    ignoring = GenerationRequest("r", [1, 2, 3], SamplingParams(beam_width=2, ignore_eos=True), streaming=False)
    assert (
        map_request(ignoring, eos_token_ids=eos, pad_token_id=0, max_beam_width=2, seed=1).request["stop_words"] is None
    )


def test_beams_are_refused_on_0_12_where_their_settings_are_unread():
    caps = executor_capabilities("TensorRT-LLM 0.12.0", True, can(), 4, (0, 12))
    assert not caps.beam_search.honoured and "TensorRT-LLM 0.12" in caps.beam_search.reason
    assert executor_capabilities("TensorRT-LLM 1.0.0", True, can(), 4, (1, 0)).beam_search.most == 4


@pytest.mark.parametrize("version", ["0.12.0", "1.2.0rc2"])
def test_mapped_requests_construct_in_both_releases(trt, monkeypatch, version):
    from tensorrt_llm.bindings import executor as tle

    monkeypatch.setattr(trt, "__version__", version)
    req = GenerationRequest(
        "r", [1, 2], SamplingParams(max_new_tokens=5, do_sample=True, min_new_tokens=2, seed=3), stop_token_ids=[[4]]
    )
    made = to_executor_request(tle, map_request(req, eos_token_ids=[2], pad_token_id=0, max_beam_width=1, seed=0))
    assert type(made) is tle.Request
    assert (made.input_token_ids, made.max_tokens, made.end_id, made.stop_words) == ([1, 2], 5, 2, [[4]])
    assert (made.sampling_config.seed, made.sampling_config.min_tokens) == (3, 2)
    assert made.output_config.exclude_input_from_output is True
    if version.startswith("0."):
        assert made.sampling_config.random_seed == 3  # the 0.12 alias reads the same value


def test_guided_requests_and_config_where_the_release_has_guided_decoding(trt):
    """1.x: ExecutorConfig.guided_decoding_config (xgrammar, the tokenizer's vocabulary) and each guided request's
    GuidedDecodingParams (a regex as REGEX; grammars and JSON as EBNF_GRAMMAR); 0.12's Executor has neither."""
    from tensorrt_llm.bindings import executor as tle

    from lmi_trt.engines.guided import GuideVocab

    reads = []

    def vocab() -> GuideVocab:
        reads.append(1)
        return GuideVocab(["<s>", "a", "b"], None, [0])

    config, _ = build_executor_config(tle, TrtllmSettings(), facts_1x(), vocab)
    regex = GenerationRequest("r", [1, 2], SamplingParams(guided=GuidedDecoding("regex", "a+")))
    spec = map_request(regex, eos_token_ids=[2], pad_token_id=0, max_beam_width=1, seed=0)
    assert spec.guide == ("regex", "a+")
    if not hasattr(tle, "GuidedDecodingConfig"):
        assert getattr(config, "guided_decoding_config", None) is None
        assert reads == []  # the tokenizer's vocabulary is not read where nothing takes it
        return
    assert config.guided_decoding_config._backend == tle.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR
    assert config.guided_decoding_config._encoded_vocab == ["<s>", "a", "b"]
    made = to_executor_request(tle, spec)
    assert (made.guided_decoding_params.guide_type, made.guided_decoding_params.guide) == (
        tle.GuidedDecodingParams.GuideType.REGEX,
        "a+",
    )
    grammar = GenerationRequest("g", [1, 2], SamplingParams(guided=GuidedDecoding("grammar", 'root ::= "a"')))
    made = to_executor_request(tle, map_request(grammar, eos_token_ids=[2], pad_token_id=0, max_beam_width=1, seed=0))
    assert made.guided_decoding_params.guide_type == tle.GuidedDecodingParams.GuideType.EBNF_GRAMMAR


# ------------------------------------------------------------------------------ results


@pytest.mark.parametrize(
    "tokens, reason, expected",
    [
        ([5, 6], "LENGTH", ([5, 6], FinishReason.LENGTH)),
        ([5], "END_ID", ([5], FinishReason.EOS)),
        ([5, 2], "END_ID", ([5], FinishReason.EOS)),  # defensive: never emit the end id
        ([5, 9], "STOP_WORDS", ([5, 9], FinishReason.STOP_SEQUENCE)),
        ([5, 77], "STOP_WORDS", ([5], FinishReason.EOS)),  # an extra EOS id
        ([], "CANCELLED", ([], FinishReason.CANCELLED)),
        ([], "TIMED_OUT", ([], FinishReason.CANCELLED)),
        ([5], "NOT_FINISHED", ([5], FinishReason.EOS)),
    ],
)
def test_final_tokens_and_reason(tokens, reason, expected):
    assert (
        final_tokens_and_reason(tokens, reason, end_id=2, extra_eos=frozenset({77}), generated=3, max_new_tokens=8)
        == expected
    )


def test_no_reason_after_all_tokens_is_length():
    assert (
        final_tokens_and_reason([5], "NOT_FINISHED", end_id=2, extra_eos=frozenset(), generated=8, max_new_tokens=8)[1]
        is FinishReason.LENGTH
    )
