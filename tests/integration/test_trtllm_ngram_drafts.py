"""n-gram (prompt lookup) draft tokens on the Executor over a draft_tokens_external engine (issue 29), through the fake
TensorRT-LLM per release: the compile stage builds the engine for it, the draft loop sends each iteration's drafts as
an ExternalDraftTokensConfig, greedy outputs equal decoding without drafts (the fake verifies them against its tiny
model), and what is not read beside drafts is refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tinymodels import build_model, tiny_model
from trtllm_spec_testing import (
    compiled,
    generate,
    greedy_reference,
    greedy_text_and_sampled_refusal,
    greedy_text_tokens,
    jit_config,
    jit_server,
    outputs_accepting_every_draft,
    spec_engine,
    started,
    tokens_of,
)
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.engines.base import FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.trtllm import TrtllmConfigError, TrtllmEngine, TrtllmSettings
from lmi_trt.engines.trtllm_drafts import ExternalDrafts, executor_drafts, stop_at
from lmi_trt.speculative import SpeculationError, resolve

RELEASES = ("1.0.0", "1.1.0", "1.2.1")
DRAFTS = ExternalDrafts(4, "option.speculative_config.decoding_type", ngram_min=1, ngram_max=3, oldest=True)


def drafting(drafts: ExternalDrafts = DRAFTS, **more) -> TrtllmSettings:
    """The Executor's settings for ``drafts`` as lmi_trt.stages.executor_settings makes them: block reuse on, and for a
    draft model orchestrator mode."""
    orchestrator = drafts.method == "draft_model"
    return TrtllmSettings(drafts=drafts, enable_kv_cache_reuse=True, orchestrator=orchestrator, **more)


def draft_model(engine_dir) -> ExternalDrafts:
    return ExternalDrafts(
        4, "option.speculative_draft_model", "draft_model", draft_model=str(engine_dir), kv_fraction=0.1
    )


# max_input_len = max_seq_len - 1: each iteration resends the sequence (the compile stage plans it so)
BUILD = dict(max_batch_size=4, max_input_len=159, max_seq_len=160, max_draft_len=4)
# A prompt that repeats itself (drafts from its own n-grams get accepted) and two ordinary ones.
PROMPTS = [[1, 45, 67, 89, 100, 45, 67, 89, 100, 45, 67], [1, 300, 22, 7], [1, 5, 6, 7, 5, 8, 9, 5]]


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


def drafts_engine(out, **build):
    return spec_engine(out, "DRAFT_TOKENS_EXTERNAL", **{**BUILD, **build})


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()


@pytest.mark.parametrize("release", RELEASES)
async def test_greedy_outputs_equal_decoding_without_drafts(trt, tmp_path, reference, release, caplog):
    trt.__version__ = release
    engine_dir = drafts_engine(tmp_path / "engine")
    built = json.loads((engine_dir / "config.json").read_text())["build_config"]
    # builder.py: DRAFT_TOKENS_EXTERNAL's integer 2, max_seq_len raised by max_draft_len
    assert (built["speculative_decoding_mode"], built["max_draft_len"], built["max_seq_len"]) == (2, 4, 164)
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(engine_dir, drafting())
    try:
        assert "speculative decoding: n-gram (prompt lookup) draft tokens on a draft_tokens_external" in caplog.text
        for i, prompt in enumerate(PROMPTS):
            for n in (24, 7, 1):
                outputs = await generate(engine, f"g{i}-{n}", prompt, max_new_tokens=n)
                assert tokens_of(outputs) == reference(prompt, n), (prompt, n)
                assert outputs[-1].finished and sum(o.finished for o in outputs) == 1
        extra = engine.stats().extra
        assert extra["spec_decode_num_draft_tokens"] > 0 and extra["spec_decode_num_accepted_tokens"] > 0
        assert extra["spec_decode_num_accepted_tokens"] <= extra["spec_decode_num_draft_tokens"]
    finally:
        await engine.close()


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory) -> Path:
    """A draft model: the tiny Llama's shape and tokenizer with other random weights (its drafts mostly disagree)."""
    return build_model("llama", tmp_path_factory.mktemp("draft") / "llama-seed1", seed=1)


def draft_engine(hf_dir, out):
    """The draft model's own plain engine, whose max_input_len reaches its max_seq_len - 1 (it drafts from the sequence
    so far)."""
    return make_engine_dir(hf_dir, out, max_batch_size=4, max_input_len=163, max_seq_len=164)


@pytest.mark.parametrize("release", RELEASES)
async def test_greedy_outputs_equal_decoding_without_a_draft_model(trt, tmp_path, reference, other_draft, release):
    """A second Executor over the draft engine proposes each iteration's drafts: with another model's drafts (mostly
    rejected) and the model itself as its draft (every draft accepted), the output is the greedy one."""
    trt.__version__ = release
    target = drafts_engine(tmp_path / "target")
    for name, hf_dir in (("other", other_draft), ("self", tiny_model("llama"))):
        drafts = draft_model(draft_engine(hf_dir, tmp_path / name))
        engine = await started(target, drafting(drafts))
        try:
            for i, prompt in enumerate(PROMPTS):
                for n in (24, 5):
                    assert tokens_of(await generate(engine, f"{name}{i}-{n}", prompt, max_new_tokens=n)) == reference(
                        prompt, n
                    )
            extra = engine.stats().extra
            if name == "self":  # its own greedy tokens: all kept
                assert extra["spec_decode_num_accepted_tokens"] == extra["spec_decode_num_draft_tokens"] > 0
        finally:
            await engine.close()


def test_a_draft_model_of_another_vocabulary_is_refused(trt, tmp_path):
    trt.__version__ = "1.2.1"
    small = build_model("llama", tmp_path / "vocab", seed=2)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] += 8
    (small / "config.json").write_text(json.dumps(config))
    drafts = draft_model(draft_engine(small, tmp_path / "d"))
    with pytest.raises(TrtllmConfigError, match=r"draft engine's vocab_size is \d+ and the model's"):
        TrtllmEngine(drafts_engine(tmp_path / "t"), drafting(drafts), eos_token_ids=[2])


@pytest.mark.parametrize("drafter", ["ngram", "draft_model"])
async def test_a_verifier_that_accepts_every_draft_changes_the_output(
    trt, tmp_path, reference, monkeypatch, other_draft, drafter
):
    """The equality above can fail: with the fake's verification patched to keep every draft token, the output
    is no longer the greedy one."""
    trt.__version__ = "1.2.1"
    drafts = DRAFTS
    if drafter == "draft_model":
        drafts = draft_model(draft_engine(other_draft, tmp_path / "draft"))
    engine = await started(drafts_engine(tmp_path / "engine"), drafting(drafts))
    outputs = await outputs_accepting_every_draft(engine, monkeypatch, PROMPTS)
    assert outputs != [reference(p, 24) for p in PROMPTS]


async def test_eos_and_stop_tokens_end_it_as_without_drafts(trt, tmp_path, reference):
    trt.__version__ = "1.1.0"
    prompt = PROMPTS[0]
    want = reference(prompt, 24)
    stop = want[5]
    engine = await started(drafts_engine(tmp_path / "engine"), drafting(), eos=(2, stop))
    try:
        # a further EOS id: the output ends before it, finish reason EOS
        out = await generate(engine, "e", prompt)
        assert tokens_of(out) == want[: want.index(stop)] and out[-1].finish_reason == FinishReason.EOS
        # ignore_eos: the whole length, through the EOS ids
        out = await generate(engine, "i", prompt, ignore_eos=True, max_new_tokens=8)
        assert len(tokens_of(out)) == 8 and out[-1].finish_reason == FinishReason.LENGTH
    finally:
        await engine.close()
    engine = await started(drafts_engine(tmp_path / "engine2"), drafting())
    try:
        sequence = want[6:8]
        end = next(e for e in range(2, len(want) + 1) if want[e - 2 : e] == sequence)  # its first completion
        out = await generate(engine, "s", prompt, stop_token_ids=[sequence])
        assert tokens_of(out) == want[:end] and out[-1].finish_reason == FinishReason.STOP_SEQUENCE
    finally:
        await engine.close()


def test_stop_at_finds_eos_and_stop_sequences_across_iterations():
    eos = frozenset({2})
    assert stop_at([5, 6, 2, 7], 0, eos, []) == (2, FinishReason.EOS)
    assert stop_at([5, 6, 7, 8], 3, eos, [[7, 8]]) == (4, FinishReason.STOP_SEQUENCE)  # begun before ``start``
    assert stop_at([5, 6, 7, 8], 0, eos, [[9]]) is None


async def test_a_client_that_goes_away_cancels_the_iteration(trt, tmp_path):
    trt.__version__ = "1.2.1"
    engine = await started(drafts_engine(tmp_path / "engine"), drafting())
    try:
        request = GenerationRequest("c", PROMPTS[1], SamplingParams(max_new_tokens=100, ignore_eos=True))
        stream = engine.submit(request)
        first = await asyncio.wait_for(anext(stream), 60)
        assert first.token_ids and not first.finished
        await stream.aclose()
        assert engine.stats().active_requests == 0  # the iteration's Executor request was cancelled
        again = await generate(engine, "c", PROMPTS[1], max_new_tokens=3)  # the id is free again
        assert len(tokens_of(again)) == 3
        # engine.cancel (the stall watchdog's, an error's) between two iterations ends the loop with CANCELLED
        stream = engine.submit(GenerationRequest("b", PROMPTS[1], SamplingParams(max_new_tokens=100, ignore_eos=True)))
        first = await asyncio.wait_for(anext(stream), 60)
        await engine.cancel("b")  # the loop waits at its yield: no Executor request is in flight
        rest = [out async for out in stream]
        assert rest[-1].finish_reason == FinishReason.CANCELLED and len(first.token_ids + tokens_of(rest)) < 100
    finally:
        await engine.close()


async def test_what_is_not_read_beside_drafts_is_refused(trt, tmp_path):
    trt.__version__ = "1.1.0"
    engine = await started(drafts_engine(tmp_path / "engine"), drafting())
    try:
        sampled = await generate(engine, "s", PROMPTS[1], do_sample=True, temperature=0.8)
        assert sampled[-1].error_code == 400 and sampled[-1].error_field == "temperature"
        caps = engine.capabilities
        assert not caps.logprobs.honoured and not caps.beam_search.honoured and not caps.guided.honoured
        assert not caps.repetition_penalty.honoured and "draft tokens" in caps.min_new_tokens.reason
        assert caps.stop_token_ids.honoured  # the loop looks for them on the host too (stop_at)
    finally:
        await engine.close()


def test_an_engine_built_otherwise_is_a_start_up_error_naming_config_json(trt, tmp_path):
    trt.__version__ = "1.2.1"
    plain = make_engine_dir(tiny_model("llama"), tmp_path / "plain", **{**BUILD, "max_draft_len": 0})
    with pytest.raises(TrtllmConfigError, match=r"build_config.speculative_decoding_mode is 1 \(2 is draft_tokens"):
        TrtllmEngine(plain, drafting(), eos_token_ids=[2])
    short = drafts_engine(tmp_path / "short", max_draft_len=2)
    with pytest.raises(TrtllmConfigError, match=r"build_config.max_draft_len=2 and 4 draft tokens"):
        TrtllmEngine(short, drafting(), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match="built with --speculative_decoding_mode draft_tokens_external and no"):
        TrtllmEngine(drafts_engine(tmp_path / "d"), TrtllmSettings(), eos_token_ids=[2])


@pytest.mark.parametrize("release", RELEASES)
async def test_an_engine_built_with_a_shorter_max_input_len_serves_longer_iterations(trt, tmp_path, reference, release):
    """The build's max_input_len does not bound an iteration's input: the Executor's maxInputLen is
    min(max_seq_len - 1, max_num_tokens) for an engine with context FMHA and packed input (trtGptModel.h), and NVIDIA's
    examples/draft_target_model/README.md builds its target with MAX_INPUT_LEN below MAX_SEQ_LEN - 1. Sequences grow
    past the build's max_input_len=16 here, and the client's prompt is still bounded by it (the engine's limits)."""
    trt.__version__ = release
    engine = await started(drafts_engine(tmp_path / "narrow", max_input_len=16), drafting())
    try:
        assert engine.limits.max_input_len == 16
        prompt = PROMPTS[0]
        assert tokens_of(await generate(engine, "long", prompt, max_new_tokens=40)) == reference(prompt, 40)
        assert engine.stats().extra["spec_decode_num_draft_tokens"] > 0
    finally:
        await engine.close()


async def test_the_draft_engine_gets_the_models_runner_settings_and_input_limit(trt, tmp_path):
    """run_dtm_pld.py gives both runners the same settings (block reuse, chunked context): a draft engine whose
    max_num_tokens is below what the iterations send needs chunked context as the model does, or start-up refuses it
    naming the draft's engine; with it, the draft proposes for the whole sequence (the model as its own draft: every
    draft kept, none missed past the draft's max_num_tokens)."""
    trt.__version__ = "1.2.1"
    llama = tiny_model("llama")
    few = make_engine_dir(
        llama, tmp_path / "few", max_batch_size=4, max_input_len=163, max_seq_len=164, max_num_tokens=32
    )
    target = drafts_engine(tmp_path / "target")
    with pytest.raises(TrtllmConfigError, match=r"the draft model's engine .*max_num_tokens=32 is below 159.*chunked"):
        TrtllmEngine(target, drafting(draft_model(few)), eos_token_ids=[2])
    engine = await started(target, drafting(draft_model(few), enable_chunked_context=True))
    try:
        draft = engine._draft_engine.settings
        assert draft.enable_chunked_context and draft.enable_kv_cache_reuse
        prompt, n = PROMPTS[1], 60
        assert len(tokens_of(await generate(engine, "long", prompt, max_new_tokens=n, ignore_eos=True))) == n
        extra = engine.stats().extra
        # n tokens in iterations of 4 drafts + the model's own token, every iteration drafted (4 of each 5 tokens)
        assert extra["spec_decode_num_accepted_tokens"] == extra["spec_decode_num_draft_tokens"] >= 4 * n // 5 - 4
    finally:
        await engine.close()


async def test_a_failed_draft_request_fails_the_clients_request(trt, tmp_path, other_draft):
    """run_dtm_pld.py has no fallback for a failing draft runner: the client's request fails with the draft's error
    (424 naming the draft model; 503 where its engine is shutting down), rather than decoding on without drafts
    unseen."""
    trt.__version__ = "1.2.1"
    engine = await started(
        drafts_engine(tmp_path / "target"), drafting(draft_model(draft_engine(other_draft, tmp_path / "d")))
    )
    try:
        await engine._draft_engine.close()  # its Executor gone: every draft request fails
        outputs = await generate(engine, "r", PROMPTS[0], max_new_tokens=8)
        assert outputs[-1].finished and outputs[-1].error_code in (424, 503)
        assert "the draft model's request failed" in outputs[-1].error
    finally:
        await engine.close()


def test_what_the_executor_needs_for_block_reuse_is_a_start_up_error_naming_it(trt, tmp_path):
    """The Executor refuses a draft_tokens_external engine without block reuse, and 1.x turns reuse off for an engine
    without paged context FMHA or with context logits (trtGptModelInflightBatching.cpp, trtllm_drafts' docstring)."""
    trt.__version__ = "1.2.1"
    engine_dir = drafts_engine(tmp_path / "engine")
    with pytest.raises(
        TrtllmConfigError, match=r"option.enable_kv_cache_reuse=false beside .*KV cache block reuse must"
    ):
        TrtllmEngine(engine_dir, TrtllmSettings(drafts=DRAFTS), eos_token_ids=[2])
    unpaged = drafts_engine(tmp_path / "unpaged", plugin_config={"use_paged_context_fmha": False})
    with pytest.raises(TrtllmConfigError, match=r"build_config.plugin_config.use_paged_context_fmha is off.*draft"):
        TrtllmEngine(unpaged, drafting(), eos_token_ids=[2])
    logits = drafts_engine(tmp_path / "logits", gather_context_logits=True)
    with pytest.raises(TrtllmConfigError, match=r"build_config.gather_context_logits is true"):
        TrtllmEngine(logits, drafting(), eos_token_ids=[2])
    # trtGptModel.h: without chunked context the input is capped at max_num_tokens, below what iterations resend
    few = drafts_engine(tmp_path / "few", max_num_tokens=64)
    with pytest.raises(TrtllmConfigError, match=r"max_num_tokens=64 is below 159, the longest input.*enable_chunked"):
        TrtllmEngine(few, drafting(), eos_token_ids=[2])
    TrtllmEngine(few, drafting(enable_chunked_context=True), eos_token_ids=[2])


async def test_a_draft_model_starts_first_on_the_copys_gpus_and_refuses_parallelism(trt, tmp_path, other_draft, caplog):
    """Both Executors in orchestrator mode on the copy's device_ids (run_dtm_pld.py), the draft's first with its
    bounded KV-cache share; a draft engine over several GPUs is refused, naming the keys."""
    trt.__version__ = "1.2.1"
    drafts = draft_model(draft_engine(other_draft, tmp_path / "draft"))
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(drafts_engine(tmp_path / "engine"), drafting(drafts, device_ids=(3,)))
    try:
        draft = engine._draft_engine
        assert draft.settings.device_ids == (3,) and draft.settings.orchestrator
        assert draft.settings.kv_cache_free_gpu_mem_fraction == 0.1
        loads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loading TensorRT-LLM")]
        assert str(tmp_path / "draft") in loads[0] and str(tmp_path / "engine") in loads[1], loads
    finally:
        await engine.close()
    wide = make_engine_dir(
        other_draft, tmp_path / "wide", tp_size=2, max_batch_size=4, max_input_len=163, max_seq_len=164
    )
    with pytest.raises(TrtllmConfigError, match=r"draft model's engine has tp=2 pp=1.*option.tensor_parallel_degree=1"):
        TrtllmEngine(drafts_engine(tmp_path / "t"), drafting(draft_model(wide)), eos_token_ids=[2])


async def test_012_is_refused(trt, tmp_path):
    trt.__version__ = "0.12.0"
    engine = TrtllmEngine(drafts_engine(tmp_path / "engine"), drafting(), eos_token_ids=[2], gpu_available=lambda: True)
    with pytest.raises(TrtllmConfigError, match=r"draft tokens on TensorRT-LLM 0.12.0's Executor"):
        await engine.start()


def test_the_keys_resolve_to_executor_drafts_and_what_they_cannot_run_beside_is_refused():
    spec = resolve({"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4}, {})
    key = "option.speculative_config.decoding_type"
    assert executor_drafts(spec, 1) == ExternalDrafts(3, key, ngram_min=1, ngram_max=4, oldest=True)
    vllm = resolve({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}, {})
    key = "option.speculative_config.method"
    assert executor_drafts(vllm, 1) == ExternalDrafts(2, key, ngram_min=2, ngram_max=2, oldest=True)
    djl = resolve(None, {"draft_model": ("option.speculative_draft_model", "/d")})
    assert executor_drafts(djl, 1) == ExternalDrafts(
        5, "option.speculative_draft_model", "draft_model", draft_model="/d"
    )
    with pytest.raises(SpeculationError, match="option.max_beam_width=2"):
        executor_drafts(spec, 2)
    busy = resolve({"decoding_type": "NGram", "max_draft_len": 3, "max_concurrency": 4}, {})
    with pytest.raises(SpeculationError, match="max_concurrency"):
        executor_drafts(busy, 1)
    assert executor_drafts(resolve({"decoding_type": "Lookahead"}, {}), 1) is None


def test_the_fake_executor_checks_what_the_real_one_checks(trt, tmp_path):
    """llmRequest.cpp LlmRequest::validate: no more drafts than the engine's max_draft_len; the constructor in
    trtGptModelInflightBatching.cpp: no draft_tokens_external engine without KV-cache block reuse."""
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = "1.2.1"
    engine_dir = drafts_engine(tmp_path / "engine")
    no_reuse = tle.ExecutorConfig(kv_cache_config=tle.KvCacheConfig(enable_block_reuse=False))
    with pytest.raises(RuntimeError, match="KV cache block reuse must be enabled for speculative decoding target"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, no_reuse)
    reuse = tle.ExecutorConfig(kv_cache_config=tle.KvCacheConfig(enable_block_reuse=True))
    executor = tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, reuse)
    try:
        request = tle.Request(
            PROMPTS[1],
            max_tokens=6,
            sampling_config=tle.SamplingConfig(top_k=1),
            external_draft_tokens_config=tle.ExternalDraftTokensConfig([5, 6, 7, 8, 9]),
        )
        rid = executor.enqueue_request(request)
        (response,) = executor.await_responses(rid, timeout=60)
        assert (
            response.has_error()
            and "Draft tokens length (5) exceeds maximum draft tokens length (4)." in response.error_msg
        )
    finally:
        executor.shutdown()
    assert "fast_logits" in dir(tle.ExternalDraftTokensConfig([1]))
    trt.__version__ = "0.12.0"
    assert "fast_logits" not in dir(tle.ExternalDraftTokensConfig([1]))


@pytest.mark.parametrize("release", ["0.12.0", *RELEASES])
def test_the_fake_executor_refuses_what_the_real_one_refuses_per_release(trt, tmp_path, release, caplog):
    """Block reuse beside an engine without paged context FMHA: refused by 0.x's constructor, turned off with a warning
    by 1.x's fixExecutorConfig (then a draft_tokens_external engine fails the reuse check); KvCacheConfig's
    freeGpuMemoryFraction < 1.F (kvCacheConfig.cpp); ParallelConfig as executorImpl.cpp checks it, with 0.x's
    two-argument OrchestratorConfig (pybind executorConfig.cpp)."""
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = release
    old = release == "0.12.0"
    unpaged = {"plugin_config": {"use_paged_context_fmha": False}}
    plain = make_engine_dir(tiny_model("llama"), tmp_path / "plain", **{**BUILD, "max_draft_len": 0}, **unpaged)
    reuse = tle.ExecutorConfig(kv_cache_config=tle.KvCacheConfig(enable_block_reuse=True))
    if old:
        with pytest.raises(RuntimeError, match="When KV cache block reuse is set, model has to be built with paged"):
            tle.Executor(str(plain), tle.ModelType.DECODER_ONLY, reuse)
    else:
        with caplog.at_level("WARNING", logger="tensorrt_llm"):
            tle.Executor(str(plain), tle.ModelType.DECODER_ONLY, reuse).shutdown()
        assert "KV cache reuse disabled because model was not built with paged context FMHA" in caplog.text
        with pytest.raises(RuntimeError, match="KV cache block reuse must be enabled for speculative decoding target"):
            tle.Executor(str(drafts_engine(tmp_path / "dte", **unpaged)), tle.ModelType.DECODER_ONLY, reuse)
    with pytest.raises(RuntimeError, match=r"freeGpuMemoryFraction < 1.F"):
        tle.KvCacheConfig(free_gpu_memory_fraction=1.0)

    def start(**parallel):
        config = tle.ExecutorConfig(parallel_config=tle.ParallelConfig(**parallel))
        tle.Executor(str(plain), tle.ModelType.DECODER_ONLY, config).shutdown()

    orchestrator = tle.CommunicationMode.ORCHESTRATOR
    worker = str(tmp_path / "bin" / "executorWorker")
    with pytest.raises(RuntimeError, match="OrchestratorConfig must be set when using ORCHESTRATOR communication mode"):
        start(communication_mode=orchestrator)
    with pytest.raises(RuntimeError, match="MPI_Comm_spawn of the worker executable ''"):
        start(communication_mode=orchestrator, orchestrator_config=tle.OrchestratorConfig(True, ""))
    with pytest.raises(RuntimeError, match=r"deviceIds \(2\) \* numNodes \(1\) must be equal to tp\*pp\*cp"):
        start(
            communication_mode=orchestrator, orchestrator_config=tle.OrchestratorConfig(True, worker), device_ids=[0, 1]
        )
    with pytest.raises(RuntimeError, match="Participant ids should not be set when using CommunicationMode::kORCH"):
        start(
            communication_mode=orchestrator,
            orchestrator_config=tle.OrchestratorConfig(True, worker),
            participant_ids=[1],
        )
    start(communication_mode=orchestrator, orchestrator_config=tle.OrchestratorConfig(True, worker), device_ids=[0])
    if old:
        with pytest.raises(TypeError):
            tle.OrchestratorConfig(True, worker, None, True)
    else:
        assert tle.OrchestratorConfig(True, worker, None, True).spawn_processes


def test_the_compile_stage_builds_for_ngram_and_keys_the_cache_by_it(trt, tmp_path, monkeypatch, caplog):
    built = compiled(
        tmp_path, monkeypatch, trt, "1.2.1", speculative_config={"decoding_type": "NGram", "max_draft_len": 3}
    )
    build = json.loads((built.path / "config.json").read_text())["build_config"]
    # max_input_len 64 + max_output_len 32 → max_seq_len 96, max_input_len raised to 95 (each iteration resends)
    assert (build["speculative_decoding_mode"], build["max_draft_len"], build["max_input_len"]) == (2, 3, 95)
    with caplog.at_level("INFO", logger="lmi_trt.compile"):
        other = compiled(tmp_path, monkeypatch, trt, "1.2.1")
    assert other.path != built.path and "plan.speculative_decoding_mode" in caplog.text


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("drafter", ["ngram", "draft_model"])
async def test_served_over_http_from_the_checkpoint_with_its_log_metrics_and_refusals(
    trt, tmp_path, monkeypatch, caplog, release, drafter, other_draft
):
    """The real load path: trtllm-serve's NGram speculative_config, or DJL's option.speculative_draft_model (the
    sources stage resolves the folder) → the compile stage builds the draft_tokens_external engine (and the draft
    model's plain one) → the draft loop decodes greedily as without it; a sampled request is a 400 naming its field;
    /metrics counts draft tokens proposed, and accepted on a self-repeating prompt (n-gram)."""
    hf_dir = tiny_model("llama")
    if drafter == "ngram":
        spec = {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 3}
        config, logged = jit_config(tmp_path, speculative_config=spec), "n-gram (prompt lookup) draft tokens"
    else:
        config = jit_config(
            tmp_path,
            speculative_draft_model=str(other_draft),
            max_draft_len=3,
            draft_kv_cache_free_gpu_mem_fraction=0.1,
        )
        logged = "draft-model draft tokens on a draft_tokens_external engine"
    prompt = "the cat the cat the cat the cat"
    text, want = greedy_text_tokens(hf_dir, prompt, 16)
    assert len(want) >= 4  # something to compare
    with caplog.at_level("INFO"):
        async with jit_server(monkeypatch, trt, release, config) as (server, s):
            metrics = await greedy_text_and_sampled_refusal(server, s, prompt, text)
    values = {
        line.split(" ")[0].split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("lmi_spec_decode")
    }
    assert values["lmi_spec_decode_num_draft_tokens_total"] > 0, metrics
    if drafter == "ngram":
        assert values["lmi_spec_decode_num_accepted_tokens_total"] > 0, metrics
    assert f"speculative decoding: {logged}" in caplog.text
    engines = [json.loads(p.read_text())["build_config"] for p in (tmp_path / "dl").rglob("config.json")]
    built = sorted((e.get("speculative_decoding_mode", 1), e["max_draft_len"]) for e in engines if "max_draft_len" in e)
    # the target's engine, and the draft model's plain one
    assert built == ([(2, 3)] if drafter == "ngram" else [(1, 0), (2, 3)]), built
