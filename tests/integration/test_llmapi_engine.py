"""LlmApiEngine end to end against the fake LLM API (PyTorch backend), which really generates with a tiny Llama."""

from __future__ import annotations

import asyncio

import pytest
from tinymodels import beam_reference, tiny_model
from trtllm_testing import fake_tensorrt_llm

from lmi_trt.compat import dtype_kwargs
from lmi_trt.engines.base import Engine, EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.llmapi import LlmApiEngine, LlmApiSettings
from lmi_trt.engines.trtllm import TrtllmSettings

PROMPTS = [[1, 45, 67, 89, 100], [1, 300, 22], [1, 7, 8, 9, 10, 11, 12], [1, 250], [1, 99, 98, 97], [1, 5]]


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


@pytest.fixture(scope="module")
def model_dir():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def hf_model(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), **dtype_kwargs(torch.float32)).eval()


@pytest.fixture(scope="module")
def reference(hf_model):
    """Greedy continuations from transformers' own generate."""
    import torch

    def generate(prompt: list[int], max_new_tokens: int, eos: int | None = 2, bad: list[list[int]] | None = None):
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([prompt]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=0,
                bad_words_ids=bad,
            )[0, len(prompt) :].tolist()
        return out[: out.index(eos)] if eos in out else out

    return generate


def settings(batch: int = 4, **runtime) -> LlmApiSettings:
    """The engine's settings with ``runtime`` as options the user set."""
    return LlmApiSettings(
        runtime=TrtllmSettings(max_batch_size=batch, max_batch_size_key="option.max_rolling_batch_size", **runtime),
        max_input_len=64,
        max_seq_len=200,
        given=frozenset(runtime),
    )


async def started(model_dir, config: LlmApiSettings | None = None, **kwargs) -> LlmApiEngine:
    kwargs.setdefault("eos_token_ids", [2])
    engine = LlmApiEngine(model_dir, config or settings(), pad_token_id=0, gpu_available=lambda: True, **kwargs)
    await asyncio.wait_for(engine.start(), 120)
    return engine


def req(rid: str, prompt: list[int], streaming: bool = True, stop=(), bad=(), **sampling) -> GenerationRequest:
    sampling.setdefault("max_new_tokens", 20)
    return GenerationRequest(
        rid,
        prompt,
        SamplingParams(**sampling),
        stop_token_ids=[list(s) for s in stop],
        bad_words_ids=[list(b) for b in bad],
        streaming=streaming,
    )


async def collect(engine: LlmApiEngine, request: GenerationRequest) -> list:
    async def run():
        return [out async for out in engine.submit(request)]

    return await asyncio.wait_for(run(), 120)


def capabilities_beams(engine: LlmApiEngine) -> int | None:
    beams = engine.capabilities.beam_search
    return beams.most if beams.honoured else None


def tokens_of(outputs) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


async def test_greedy_tokens_equal_transformers_generate(trt, model_dir, reference):
    engine = await started(model_dir)
    try:
        assert isinstance(engine, Engine) and engine.healthy
        assert engine.limits.max_batch_size == 4 and engine.limits.max_seq_len == 200
        for i, prompt in enumerate(PROMPTS[:3]):
            want = reference(prompt, 24)
            streamed = await collect(engine, req(f"s{i}", prompt, max_new_tokens=24))
            whole = await collect(engine, req(f"w{i}", prompt, streaming=False, max_new_tokens=24))
            assert tokens_of(streamed) == want and tokens_of(whole) == want
            assert len(whole) == 1 and whole[0].finished
            reason = FinishReason.LENGTH if len(want) == 24 else FinishReason.EOS
            assert streamed[-1].finish_reason is reason and whole[0].finish_reason is reason
            assert all(not o.finished for o in streamed[:-1]) and streamed[-1].finished
    finally:
        await engine.close()


async def test_concurrent_streams_reassemble_one_token_per_step(trt, model_dir, reference):
    engine = await started(model_dir)
    try:
        requests = [req(f"c{i}", p, max_new_tokens=8 + 3 * i, ignore_eos=True) for i, p in enumerate(PROMPTS)]
        results = await asyncio.gather(*(collect(engine, r) for r in requests))
        for r, outs in zip(requests, results):
            assert tokens_of(outs) == reference(r.prompt_token_ids, r.sampling.max_new_tokens, eos=None)
            assert all(len(o.token_ids) == 1 for o in outs)  # token_ids_diff: one step, one new token
            assert outs[-1].finish_reason is FinishReason.LENGTH
        stats = engine.stats()
        assert stats.total_requests == len(PROMPTS) and stats.active_requests == 0
        assert stats.total_generated_tokens == sum(r.sampling.max_new_tokens for r in requests)
    finally:
        await engine.close()


async def test_cancel_and_disconnect_end_the_request_and_free_the_slot(trt, model_dir, reference):
    engine = await started(model_dir, settings(batch=1))
    try:
        outputs = []
        async for out in engine.submit(req("long", PROMPTS[0], max_new_tokens=150, ignore_eos=True)):
            outputs.append(out)
            if len(outputs) == 3:
                await engine.cancel("long")
        assert outputs[-1].finished and outputs[-1].finish_reason is FinishReason.CANCELLED
        assert 3 <= len(tokens_of(outputs)) < 150
        assert engine.stats().active_requests == 0
        # A consumer that goes away (client disconnect) aborts too.
        before = engine.stats().total_generated_tokens
        gone = engine.submit(req("gone", PROMPTS[2], max_new_tokens=150, ignore_eos=True))
        await gone.__anext__()
        await gone.aclose()
        # max_batch_size is 1: this one runs only once "gone" left the batch.
        after = await collect(engine, req("after", PROMPTS[1], max_new_tokens=6, ignore_eos=True))
        assert tokens_of(after) == reference(PROMPTS[1], 6, eos=None)
        assert engine.stats().total_generated_tokens - before < 150
        assert engine.stats().active_requests == 0
    finally:
        await engine.close()


async def test_errors_stay_per_request(trt, model_dir, reference):
    engine = await started(model_dir, settings(max_num_tokens=48))
    try:
        good = [req(f"g{i}", p, max_new_tokens=10, ignore_eos=True) for i, p in enumerate(PROMPTS[:3])]
        # refused by generate_async itself (prompt over max_num_tokens without chunked prefill): 400
        refused = req("refused", list(range(1, 50)))
        # failed while running (the fake's stand-in: a prompt not shorter than max_seq_len): 424
        failing_engine = await started(
            model_dir, LlmApiSettings(runtime=TrtllmSettings(max_batch_size=4), max_seq_len=8)
        )
        try:
            failed, ok = await asyncio.gather(
                collect(failing_engine, req("fails", list(range(1, 11)))),
                collect(failing_engine, req("ok", PROMPTS[1], max_new_tokens=4, ignore_eos=True)),
            )
            assert len(failed) == 1 and failed[0].error_code == 424 and failed[0].finish_reason is FinishReason.ERROR
            assert "max_seq_len (8)" in failed[0].error
            assert tokens_of(ok) == reference(PROMPTS[1], 4, eos=None) and failing_engine.healthy
        finally:
            await failing_engine.close()
        results = await asyncio.gather(*(collect(engine, r) for r in [good[0], refused, *good[1:]]))
        assert len(results[1]) == 1 and results[1][0].error_code == 400
        assert "max_num_tokens (48)" in results[1][0].error
        for r, outs in zip(good, [results[0], *results[2:]]):
            assert tokens_of(outs) == reference(r.prompt_token_ids, 10, eos=None) and outs[-1].error is None
        dup = engine.submit(req("dup", PROMPTS[0], max_new_tokens=50, ignore_eos=True))
        await dup.__anext__()
        out = await collect(engine, req("dup", PROMPTS[1]))
        assert out[0].error_code == 400 and "already in flight" in out[0].error
        await dup.aclose()
        beam_stream = await collect(engine, req("beam-stream", PROMPTS[0], beam_width=2))
        assert beam_stream[0].error_code == 400 and "non-streaming" in beam_stream[0].error
        assert engine.healthy
    finally:
        await engine.close()


async def test_logprobs_match_the_model(trt, model_dir, hf_model, reference):
    import torch

    engine = await started(model_dir)
    try:
        prompt = PROMPTS[1]
        outs = await collect(engine, req("lp", prompt, max_new_tokens=6, logprobs=True, ignore_eos=True))
        tokens = tokens_of(outs)
        got = [lp for o in outs for lp in o.logprobs]
        assert [len(o.logprobs) for o in outs] == [len(o.token_ids) for o in outs]
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + tokens])).logits[0].float()
        want = [float(torch.log_softmax(logits[len(prompt) + i - 1], -1)[t]) for i, t in enumerate(tokens)]
        assert got == pytest.approx(want, abs=1e-4)
    finally:
        await engine.close()


def round_trips(tokenizer, ids: list[int]) -> bool:
    return tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


async def test_stop_words_and_extra_eos(trt, model_dir, reference):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    want = reference(PROMPTS[0], 20, eos=None)
    assert 2 not in want  # the model's EOS does not come within these 20 tokens
    extra = want[3]  # a token the model will produce: declared a second EOS id
    engine = await started(model_dir, eos_token_ids=[2, extra])
    try:
        # a second EOS id ends like EOS and is not part of the output
        outs = await collect(engine, req("eos2", PROMPTS[0], max_new_tokens=20))
        assert tokens_of(outs) == want[: want.index(extra)] and outs[-1].finish_reason is FinishReason.EOS
    finally:
        await engine.close()
    engine = await started(model_dir)
    try:
        # a one-token stop word (stop_token_ids) and a two-token one (a stop string) stay in the output
        outs = await collect(engine, req("stop1", PROMPTS[0], max_new_tokens=20, stop=[[want[2]]]))
        assert tokens_of(outs) == want[: want.index(want[2]) + 1]
        assert outs[-1].finish_reason is FinishReason.STOP_SEQUENCE
        pair = next(want[i : i + 2] for i in range(len(want) - 1) if round_trips(tokenizer, want[i : i + 2]))
        outs = await collect(engine, req("stop2", PROMPTS[0], max_new_tokens=20, stop=[pair]))
        assert tokens_of(outs)[-2:] == pair and outs[-1].finish_reason is FinishReason.STOP_SEQUENCE
        # one the LLM cannot match as text is left to the serving layer's text match: generation goes on
        odd = next(want[i : i + 2] for i in range(len(want) - 1) if not round_trips(tokenizer, want[i : i + 2]))
        outs = await collect(engine, req("stop3", PROMPTS[0], max_new_tokens=20, stop=[odd]))
        assert tokens_of(outs) == want and outs[-1].finish_reason is FinishReason.LENGTH
    finally:
        await engine.close()


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0", "1.2.1", "1.3.0"])
async def test_stop_tokens_with_ignore_eos_stop_or_are_refused(trt, monkeypatch, model_dir, reference, release):
    """main's worker drops every stop word of an ignore_eos request (base_worker.py); 1.2 was not read."""
    monkeypatch.setattr(trt, "__version__", release)
    want = reference(PROMPTS[0], 20, eos=None)
    engine = await started(model_dir)
    try:
        outs = await collect(engine, req("stop", PROMPTS[0], max_new_tokens=20, ignore_eos=True, stop=[[want[2]]]))
        if release in ("1.2.1", "1.3.0"):
            assert outs[0].error_code == 400 and outs[0].error_field == "stop_token_ids" and release in outs[0].error
        else:
            assert tokens_of(outs) == want[:3] and outs[-1].finish_reason is FinishReason.STOP_SEQUENCE
    finally:
        await engine.close()


# What each release's sampler does with the fields that TensorRT-LLM's samplers differ on (the fake cites the
# sources, tests/fakes/tensorrt_llm/_llm_runtime.py): 1.0 is built with its TRTLLMSampler, the C++ decoder, which
# honours them all; 1.1 and 1.2 run the TorchSampler, which ignores penalties, the request's seed and bad words and
# counts the prompt into min_tokens, so a request with them is refused; main's TorchSampler honours them all.
RELEASES = ("1.0.0", "1.1.0", "1.2.1", "1.3.0")
REFUSING = ("1.1.0", "1.2.1")
# main's TorchSampler fixes reach the 1.3.0 release candidates one by one: each pair is the last candidate not verified
# to hold one and the first verified to (lmi_trt/engines/llmapi_releases.py, the fake's _state.FIXES)
SEED_AND_PENALTIES = ("1.3.0rc24", "1.3.0rc25")  # PRs 17172, 16485
BAD_WORDS = ("1.3.0rc22", "1.3.0rc23")  # PR 16052
MIN_TOKENS = ("1.3.0rc10", "1.3.0rc11")  # PRs 12166, 12358
HOT = {"do_sample": True, "temperature": 2.0, "top_k": 0, "top_p": 1.0, "ignore_eos": True, "max_new_tokens": 16}


def refused(outs, field: str, release: str) -> bool:
    """A single 400 naming the field and the release."""
    return len(outs) == 1 and outs[0].error_code == 400 and outs[0].error_field == field and release in outs[0].error


@pytest.mark.parametrize("release", RELEASES)
async def test_a_sampled_request_samples_on_every_release(trt, monkeypatch, model_dir, reference, release):
    """1.0's default TorchSampler takes the argmax for the whole batch: sampling there needs its TRTLLMSampler."""
    monkeypatch.setattr(trt, "__version__", release)
    engine = await started(model_dir)
    try:
        greedy = reference(PROMPTS[0], 16, eos=None)
        assert tokens_of(await collect(engine, req("hot", PROMPTS[0], **HOT))) != greedy
        top1 = {**HOT, "top_k": 1}  # top_k 1 is greedy whatever the temperature
        assert tokens_of(await collect(engine, req("top1", PROMPTS[0], **top1))) == greedy
    finally:
        await engine.close()


@pytest.mark.parametrize("release", RELEASES)
async def test_log_probs_of_sampled_requests_are_the_tokens_or_refused(trt, monkeypatch, model_dir, release):
    """From 1.2 the TorchSampler reports only the top k of each step (PR 7976), so a sampled token outside them would
    come back with trtllm-serve's floor, -9999: logprobs/top_logprobs with sampling are refused there (and on the
    1.3.0 candidates until one is verified to add the sampled token); greedy requests keep them."""
    monkeypatch.setattr(trt, "__version__", release)
    engine = await started(model_dir)
    try:
        hot = await collect(engine, req("hot", PROMPTS[0], logprobs=True, **HOT))
        top = await collect(engine, req("top", PROMPTS[0], logprobs=True, top_logprobs=2, **HOT))
        if release in ("1.2.1", "1.3.0"):
            assert refused(hot, "logprobs", release) and "sampling" in hot[0].error, hot
            assert refused(top, "logprobs", release), top
        else:  # 1.0's TRTLLMSampler, 1.1's TorchSampler: the sampled token's own log prob
            assert hot[-1].error is None
            got = [lp for o in hot for lp in o.logprobs]
            assert len(got) == 16 and all(-100 < lp <= 0 for lp in got), got
        greedy = await collect(engine, req("greedy", PROMPTS[0], logprobs=True, max_new_tokens=4))
        assert greedy[-1].error is None and all(-100 < lp <= 0 for o in greedy for lp in o.logprobs)
    finally:
        await engine.close()


@pytest.mark.parametrize("release", RELEASES + SEED_AND_PENALTIES)
async def test_seed_and_penalties_are_honoured_or_refused(trt, monkeypatch, model_dir, reference, release):
    monkeypatch.setattr(trt, "__version__", release)
    refusing = (*REFUSING, SEED_AND_PENALTIES[0])
    engine = await started(model_dir)
    try:
        if release in refusing:
            assert refused(await collect(engine, req("seed", PROMPTS[0], seed=5, **HOT)), "seed", release)
        else:
            seeded = [tokens_of(await collect(engine, req(f"s{s}", PROMPTS[0], seed=s, **HOT))) for s in (5, 5, 6)]
            assert seeded[0] == seeded[1] != seeded[2]
        greedy = reference(PROMPTS[0], 16, eos=None)
        for field, value in (("repetition_penalty", 3.0), ("presence_penalty", 2.0), ("frequency_penalty", 2.0)):
            outs = await collect(engine, req(field, PROMPTS[0], max_new_tokens=16, ignore_eos=True, **{field: value}))
            if release in refusing:
                assert refused(outs, field, release), outs
            else:
                assert tokens_of(outs) != greedy, field  # the tiny model repeats itself; a penalty breaks that
    finally:
        await engine.close()


@pytest.mark.parametrize("release", RELEASES + BAD_WORDS)
async def test_bans_work_or_are_refused(trt, monkeypatch, model_dir, reference, release):
    """A one-token ban goes as bad_token_ids, a longer one as text the LLM tokenizes: both need a release whose
    sampler applies bad words; a sequence whose text tokenizes differently cannot be banned on any."""
    from transformers import AutoTokenizer

    monkeypatch.setattr(trt, "__version__", release)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    want = reference(PROMPTS[0], 12, eos=None)
    pair = next(want[i : i + 2] for i in range(len(want) - 1) if round_trips(tokenizer, want[i : i + 2]))
    odd = next(want[i : i + 2] for i in range(len(want) - 1) if not round_trips(tokenizer, want[i : i + 2]))
    engine = await started(model_dir)
    try:
        for ban in ([want[0]], pair):
            outs = await collect(engine, req("ban", PROMPTS[0], max_new_tokens=12, ignore_eos=True, bad=[ban]))
            if release in (*REFUSING, BAD_WORDS[0]):
                assert refused(outs, "bad_words", release), outs
            else:
                assert tokens_of(outs) == reference(PROMPTS[0], 12, eos=None, bad=[ban]) != want
        outs = await collect(engine, req("odd", PROMPTS[0], bad=[odd]))
        assert outs[0].error_code == 400 and outs[0].error_field == "bad_words"
    finally:
        await engine.close()


@pytest.mark.parametrize("release", RELEASES + MIN_TOKENS)
async def test_min_new_tokens_holds_back_the_end_id_or_is_refused(
    trt, monkeypatch, model_dir, reference, release, tmp_path
):
    """On a model whose EOS is the first token it would write: the sequence ends at once, unless min_new_tokens
    holds the EOS back; TensorRT-LLM holds back its one end id only, so a model with more EOS ids is refused."""
    from tinymodels import with_eos

    monkeypatch.setattr(trt, "__version__", release)
    first = reference(PROMPTS[0], 1, eos=None)[0]
    eos_dir = with_eos(model_dir, first, tmp_path / "eos")
    engine = await started(eos_dir, eos_token_ids=[first])
    try:
        assert tokens_of(await collect(engine, req("plain", PROMPTS[0]))) == []
        outs = await collect(engine, req("min", PROMPTS[0], min_new_tokens=4))
        if release in (*REFUSING, MIN_TOKENS[0]):
            assert refused(outs, "min_new_tokens", release), outs
        else:
            assert len(tokens_of(outs)) >= 4 and first not in tokens_of(outs)[:4]
    finally:
        await engine.close()
    engine = await started(eos_dir, eos_token_ids=[first, 2])
    try:
        outs = await collect(engine, req("two", PROMPTS[0], min_new_tokens=4))
        assert outs[0].error_code == 400 and outs[0].error_field == "min_new_tokens"
    finally:
        await engine.close()


async def test_stats_are_read_only_once_a_request_was_submitted(trt, model_dir, capfd):
    """Before the first request the executor has no stats and prints so on every get_stats_async call
    (tensorrt_llm/executor/executor.py aget_stats)."""
    engine = await started(model_dir)
    try:
        for _ in range(10):
            await asyncio.sleep(0)
        assert "Iteration statistics are not available yet" not in capfd.readouterr().out
        await collect(engine, req("first", PROMPTS[0], max_new_tokens=4))
        stats = await wait_for_stats(engine)
        assert stats.extra["kv_cache_max_blocks"] > 0
        assert "Iteration statistics are not available yet" not in capfd.readouterr().out
    finally:
        await engine.close()


@pytest.mark.parametrize("policy", [None, "max_utilization", "guaranteed_no_evict"])
async def test_kv_cache_config_and_scheduler_policy_reach_the_llm(trt, model_dir, policy, caplog):
    """64 KV tokens = 2 blocks of 32: GUARANTEED_NO_EVICT, TensorRT-LLM's default, admits a request only with room
    for its prompt + max_tokens (the second waits); MAX_UTILIZATION, DJL's, on the prompt alone (both run). Unset,
    the policy is the release's, and the start-up log says so."""
    runtime = {"max_tokens_in_paged_kv_cache": 64} | ({"batch_scheduler_policy": policy} if policy else {})
    with caplog.at_level("INFO", logger="lmi_trt.engines.llmapi"):
        engine = await started(model_dir, settings(**runtime))
    try:
        done: list[str] = []

        async def run(rid: str, prompt: list[int], n: int) -> None:
            # one output each (not streamed): the order they are read in is the order they were produced
            await collect(engine, req(rid, prompt, streaming=False, max_new_tokens=n, ignore_eos=True))
            done.append(rid)

        # "a" takes 100 steps: "b" (4) ends first unless it waits for "a"'s KV room
        await asyncio.wait_for(asyncio.gather(run("a", PROMPTS[0], 100), run("b", PROMPTS[1], 4)), 120)
        assert done == (["b", "a"] if policy == "max_utilization" else ["a", "b"])
        stats = await wait_for_stats(engine)
        assert stats.extra["kv_cache_max_blocks"] == 2.0
        report = next(r.getMessage() for r in caplog.records if "LLM: sampler" in r.getMessage())
        if policy is None:
            defaults = report.split("'s defaults: ")[1]
            assert "scheduler_config.capacity_scheduler_policy='GUARANTEED_NO_EVICT'" in defaults
            keys = [item.split("=")[0] for item in defaults.split(", ")]
            assert "kv_cache_config.enable_block_reuse=True" in defaults and "max_batch_size" not in keys  # ours: 4
        else:
            assert f"capacity_scheduler_policy='{policy.upper()}' (option.batch_scheduler_policy)" in report
        assert "kv_cache_config.max_tokens=64 (option.max_tokens_in_paged_kv_cache)" in report
        assert "enable_iter_perf_stats=True (/metrics" in report
    finally:
        await engine.close()


async def wait_for_stats(engine: LlmApiEngine):
    for _ in range(600):  # a generous bound: the stats pass ends after its 2 s timeout at the latest
        stats = engine.stats()
        if "kv_cache_max_blocks" in stats.extra:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError("no iteration stats arrived")


async def test_close_ends_inflight_requests(trt, model_dir):
    engine = await started(model_dir)
    stream = engine.submit(req("inflight", PROMPTS[0], max_new_tokens=150, ignore_eos=True))
    await stream.__anext__()
    await asyncio.wait_for(engine.close(), 60)
    rest = [out async for out in stream]
    assert rest[-1].finished and rest[-1].error_code in (503, None)
    assert rest[-1].error_code == 503 or rest[-1].finish_reason is FinishReason.CANCELLED
    assert not engine.healthy
    after = await collect(engine, req("late", PROMPTS[1]))
    assert after[0].error_code == 503
    await engine.close()  # idempotent


async def test_an_executor_failure_fails_the_request_and_health(trt, model_dir, monkeypatch):
    from tensorrt_llm.llmapi.llm import RequestOutput

    engine = await started(model_dir)
    try:
        stream = engine.submit(req("victim", PROMPTS[0], max_new_tokens=150, ignore_eos=True))
        await stream.__anext__()

        async def broken(self):
            raise RuntimeError("[TensorRT-LLM][ERROR] CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(RequestOutput, "__anext__", broken)
        rest = [out async for out in stream]
        assert rest[-1].error_code == 424 and "illegal memory access" in rest[-1].error
        assert not engine.healthy
    finally:
        monkeypatch.undo()
        await engine.close()


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0", "1.2.1", "1.3.0"])
async def test_releases_from_1_0_serve(trt, monkeypatch, model_dir, reference, release):
    monkeypatch.setattr(trt, "__version__", release)
    engine = await started(model_dir)
    try:
        assert engine.tensorrt_llm_version == release
        outs = await collect(engine, req("r", PROMPTS[2], max_new_tokens=8, logprobs=True))
        assert tokens_of(outs) == reference(PROMPTS[2], 8)
        assert all(lp <= 0.0 for o in outs for lp in o.logprobs)
    finally:
        await engine.close()


async def test_release_012_is_refused_naming_the_backend_key(trt, monkeypatch, model_dir):
    monkeypatch.setattr(trt, "__version__", "0.12.0")
    engine = LlmApiEngine(model_dir, settings(), eos_token_ids=[2], gpu_available=lambda: True)
    with pytest.raises(EngineError, match="option.backend=tensorrt") as err:
        await engine.start()
    assert err.value.code == 503 and not engine.healthy


async def test_options_the_backend_cannot_honour_name_the_key(trt, model_dir):
    with pytest.raises(EngineError, match="option.multi_block_mode=true"):
        LlmApiEngine(model_dir, settings(multi_block_mode=True), eos_token_ids=[2])
    with pytest.raises(EngineError, match="option.enable_trt_overlap"):
        LlmApiEngine(model_dir, settings(enable_trt_overlap=True), eos_token_ids=[2])
    with pytest.raises(EngineError, match="no EOS token id"):
        LlmApiEngine(model_dir, settings(), eos_token_ids=[])
    engine = LlmApiEngine(model_dir, settings(), eos_token_ids=[2], gpu_available=lambda: False)
    with pytest.raises(EngineError, match="no CUDA GPU is visible"):
        await engine.start()


@pytest.mark.parametrize(
    "release, top, prompt_lps, bias",
    [
        ("1.0.0", 0, False, False),  # top-1 only (PR 6097); no prompt log probs; no embedding bias on PyTorch
        ("1.1.0", 0, False, True),  # top-1 (PR 7756 was reverted before the 1.1 cut); bias (PR 6464)
        ("1.2.1", 20, False, True),  # top k (PR 7976); prompt entries are top k only (PR 7580)
        ("1.3.0rc10", 20, False, True),  # entries hold a prompt token, the wrong one (PR 11235)
        ("1.3.0rc11", 20, True, True),  # ... the right one (PR 12499)
        ("1.3.0", 20, True, True),
    ],
)
async def test_what_each_release_serves_is_in_its_capabilities(
    trt, monkeypatch, model_dir, release, top, prompt_lps, bias
):
    monkeypatch.setattr(trt, "__version__", release)
    engine = await started(model_dir)
    try:
        caps = engine.capabilities
        alternatives = caps.top_logprobs.most if caps.top_logprobs.honoured else 0
        assert (alternatives, caps.prompt_logprobs.honoured, caps.logit_bias.honoured) == (
            top,
            prompt_lps,
            bias,
        )
    finally:
        await engine.close()


@pytest.mark.parametrize("streaming", [True, False])
async def test_prompt_logprobs_on_13_are_the_models(trt, monkeypatch, model_dir, hf_model, streaming):
    """Each prompt token's log prob given the ones before it (None for the first), on the first output only."""
    import torch

    monkeypatch.setattr(trt, "__version__", "1.3.0")
    engine = await started(model_dir)
    try:
        prompt = PROMPTS[2]
        outs = await collect(engine, req("p", prompt, streaming=streaming, max_new_tokens=3, prompt_logprobs=True))
        assert outs[0].prompt_logprobs is not None and all(o.prompt_logprobs is None for o in outs[1:])
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt])).logits[0].float()
        want = [float(torch.log_softmax(logits[i - 1], -1)[t]) for i, t in enumerate(prompt) if i]
        assert outs[0].prompt_logprobs[0] is None
        assert outs[0].prompt_logprobs[1:] == pytest.approx(want, abs=1e-4)
    finally:
        await engine.close()


async def test_logit_bias_is_the_samplers_embedding_bias(trt, monkeypatch, model_dir, reference):
    monkeypatch.setattr(trt, "__version__", "1.2.1")
    engine = await started(model_dir)
    try:
        pushed = await collect(
            engine, req("b", PROMPTS[0], max_new_tokens=5, ignore_eos=True, logit_bias=((42, 100.0),))
        )
        assert tokens_of(pushed) == [42] * 5
        first = reference(PROMPTS[0], 1)[0]
        away = await collect(engine, req("a", PROMPTS[0], max_new_tokens=1, logit_bias=((first, -100.0),)))
        assert tokens_of(away) != [first]
    finally:
        await engine.close()


@pytest.mark.parametrize("release", RELEASES)
async def test_beam_search_runs_on_the_sampler_that_does_it(trt, monkeypatch, model_dir, hf_model, release, caplog):
    """option.max_beam_width > 1: 1.0 and 1.1/1.2 run every request on the TRTLLMSampler (1.0's without the overlap
    scheduler and CUDA graphs, as its docs ask), main on its TorchSampler; what that sampler lacks is refused, and so
    is every request whose beam width is not max_beam_width, which the executor would fail (or, on 1.0 and 1.1, die
    of: an assert in its request loop)."""
    import torch

    monkeypatch.setattr(trt, "__version__", release)
    with caplog.at_level("INFO", logger="lmi_trt.engines.llmapi"):
        engine = await started(model_dir, settings(max_beam_width=2))
    try:
        report = next(r.getMessage() for r in caplog.records if "LLM: sampler" in r.getMessage())
        assert "max_beam_width=2 (option.max_beam_width)" in report
        # 1.1/1.2: the TRTLLMSampler asked for by name (which one 1.2's sampler_type='auto' builds was not read)
        assert ("sampler_type='TRTLLMSampler' (beam search on the TRTLLMSampler" in report) is (
            release in ("1.1.0", "1.2.1")
        )
        forced = "cuda_graph_config=None (beam search on 1.0's TRTLLMSampler" in report
        assert forced is (release == "1.0.0")
        assert ("disable_overlap_scheduler=True (beam search on 1.0's TRTLLMSampler" in report) is forced
        outs = await collect(engine, req("beam", PROMPTS[0], streaming=False, max_new_tokens=6, beam_width=2))
        with torch.no_grad():
            want = hf_model.generate(torch.tensor([PROMPTS[0]]), num_beams=2, max_new_tokens=6, do_sample=False)
        assert tokens_of(outs) == want[0, len(PROMPTS[0]) :].tolist()
        plain = await collect(engine, req("plain", PROMPTS[0], streaming=False, max_new_tokens=4))
        assert refused(plain, "beam_width", release) and "max_beam_width" in plain[0].error, plain
        # n beams back, with the request's length_penalty and early_stopping (SamplingParams' best_of, n and
        # those fields: tensorrt_llm/sampling_params.py, 1.0-1.2)
        both = await collect(
            engine,
            req(
                "beams",
                PROMPTS[0],
                False,
                max_new_tokens=6,
                beam_width=2,
                num_return_sequences=2,
                length_penalty=0.5,
                early_stopping=True,
            ),
        )
        rows, _ = beam_reference(
            hf_model, PROMPTS[0], beams=2, returned=2, max_new=6, length_penalty=0.5, early_stopping=True
        )
        assert [b.token_ids for b in both[-1].beams] == rows
        assert capabilities_beams(engine) == 2
        # the worker builds the C++ SamplingConfig, whose constructor asserts lengthPenalty >= 0 (samplingConfig.cpp)
        neg = await collect(engine, req("neg", PROMPTS[0], False, max_new_tokens=4, beam_width=2, length_penalty=-1.0))
        assert (neg[0].error_code, neg[0].error_field) == (400, "length_penalty"), neg
        pen = await collect(engine, req("pen", PROMPTS[0], False, max_new_tokens=4, beam_width=2, presence_penalty=1.0))
        if release == "1.3.0":  # PR 16485: no penalties with the TorchSampler's beams
            assert (
                pen[0].error_field == "presence_penalty" and pen[0].error_code == 400 and "beam_width" in pen[0].error
            )
        else:
            assert pen[-1].error is None
        lps = await collect(engine, req("lp", PROMPTS[0], False, max_new_tokens=4, beam_width=2, logprobs=True))
        assert lps[0].error_code == 400 and lps[0].error_field == "logprobs" and release in lps[0].error
        # test_beam_search.py (1.2-era): "Beam search on TRTLLMSampler does not correctly handle stop_token_ids"
        last = int(want[0, -1])
        stop = await collect(engine, req("stop", PROMPTS[0], False, max_new_tokens=6, beam_width=2, stop=[[last]]))
        if release == "1.3.0":
            assert stop[-1].error is None
        else:
            assert refused(stop, "stop", release), stop
        top = engine.capabilities.top_logprobs
        assert top.honoured is (release == "1.3.0")  # the TRTLLMSampler's: the sampled token's only
        assert engine.healthy
    finally:
        await engine.close()


@pytest.mark.parametrize("release", ["1.1.0", "1.2.1"])
async def test_beams_on_11_and_12_keep_the_overlap_scheduler_and_cuda_graphs(
    trt, monkeypatch, model_dir, release, caplog
):
    """From 1.1 the TRTLLMSampler's beam search runs beside both (PRs 6223 and 6217; PR 7326's tests): the options
    are the user's, and unset the release's."""
    monkeypatch.setattr(trt, "__version__", release)
    config = settings(max_beam_width=2).model_copy(update={"enable_overlap_scheduler": True, "use_cuda_graph": True})
    with caplog.at_level("INFO", logger="lmi_trt.engines.llmapi"):
        engine = await started(model_dir, config)
    try:
        report = next(r.getMessage() for r in caplog.records if "LLM: sampler" in r.getMessage())
        assert "disable_overlap_scheduler=False (option.enable_overlap_scheduler)" in report
        assert "cuda_graph_config={} (option.use_cuda_graph)" in report
        outs = await collect(engine, req("beam", PROMPTS[0], streaming=False, max_new_tokens=4, beam_width=2))
        assert outs[-1].error is None and len(tokens_of(outs)) == 4
    finally:
        await engine.close()


async def test_beams_before_13rc26_are_refused_at_startup(trt, monkeypatch, model_dir):
    """Which sampler 'auto' runs beams on before PR 18232 (1.3.0rc26) was not pinned down: refused, naming the key."""
    monkeypatch.setattr(trt, "__version__", "1.3.0rc25")
    with pytest.raises(EngineError, match="option.max_beam_width=2") as err:
        await started(model_dir, settings(max_beam_width=2))
    assert "1.3.0rc26" in str(err.value)
    monkeypatch.setattr(trt, "__version__", "1.3.0rc26")
    engine = await started(model_dir, settings(max_beam_width=2))
    try:
        outs = await collect(engine, req("beam", PROMPTS[0], streaming=False, max_new_tokens=4, beam_width=2))
        assert outs[-1].error is None
    finally:
        await engine.close()


async def test_the_sequence_limit_is_the_releases_unless_given(trt, model_dir, caplog):
    """No max_seq_len keyword unless option.max_seq_len: TensorRT-LLM then takes the checkpoint's positions (512
    here), which the server's limits follow; a larger option.max_seq_len, which TensorRT-LLM would silently lower,
    is a startup error naming the key."""
    unset = settings().model_copy(update={"max_seq_len": None})
    with caplog.at_level("INFO", logger="lmi_trt.engines.llmapi"):
        engine = await started(model_dir, unset)
    try:
        assert engine.limits.max_seq_len == 512
        report = next(r.getMessage() for r in caplog.records if "LLM: sampler" in r.getMessage())
        assert "max_seq_len=" not in report.split("'s defaults: ")[0]  # not sent
        assert "max_seq_len=512 (" in report.split("'s defaults: ")[1]
    finally:
        await engine.close()
    with pytest.raises(EngineError, match="option.max_seq_len=600") as err:
        LlmApiEngine(model_dir, settings().model_copy(update={"max_seq_len": 600}), eos_token_ids=[2])
    assert "512" in str(err.value)


async def test_the_sequence_limit_reads_the_checkpoint_as_transformers_does(trt, caplog):
    """GPT-2 states its positions as n_positions, which transformers' GPT2Config maps onto max_position_embeddings
    (attribute_map): TensorRT-LLM reads the config through AutoConfig, so its worker takes 512, not the 2048 fallback.
    The start-up log says the limit is an estimate and that the prompt cap is lmi-trt's default."""
    unset = settings().model_copy(update={"max_seq_len": None})
    with caplog.at_level("INFO", logger="lmi_trt.engines.llmapi"):
        engine = await started(tiny_model("gpt2"), unset)
    try:
        assert engine.limits.max_seq_len == 512
        report = next(r.getMessage() for r in caplog.records if "LLM: sampler" in r.getMessage())
        assert "max_seq_len=512 (an estimate from the checkpoint" in report
        assert "max_input_len=64 (the longest prompt the server takes, lmi-trt's default" in report
        outs = await collect(engine, req("long", PROMPTS[0], max_new_tokens=4))
        assert outs[-1].error is None
    finally:
        await engine.close()
