"""TrtllmEngine end to end against the fake TensorRT-LLM, which really generates with a tiny Llama."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from sinks import RecordingSink
from tinymodels import tiny_model
from trtllm_testing import FAKES, fake_tensorrt_llm, make_engine_dir

from lmi_trt.compat import dtype_kwargs
from lmi_trt.engines.base import Engine, EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings

MAX_INPUT = 32
PROMPTS = [[1, 45, 67, 89, 100], [1, 300, 22], [1, 7, 8, 9, 10, 11, 12], [1, 250], [1, 99, 98, 97], [1, 5]]
BUILD = dict(max_batch_size=4, max_input_len=MAX_INPUT, max_seq_len=160, max_beam_width=2)


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


@pytest.fixture(scope="module")
def engine_dir(trt, tmp_path_factory):
    return make_engine_dir(tiny_model("llama"), tmp_path_factory.mktemp("trt") / "engine", **BUILD)


@pytest.fixture(scope="module")
def reference():
    """Greedy continuations from transformers' own generate (what the torch engine would give)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model("llama")), **dtype_kwargs(torch.float32)).eval()

    def generate(prompt: list[int], max_new_tokens: int, eos: int | None = 2) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=0
            )[0, len(prompt) :].tolist()
        return out[: out.index(eos)] if eos in out else out

    return generate


# The beam width these engines are built for, as option.max_beam_width serves it (the settings' default is the
# key's, 1).
BEAMS = TrtllmSettings(max_beam_width=BUILD["max_beam_width"])


async def started(engine_dir, settings: TrtllmSettings | None = None, **kwargs) -> TrtllmEngine:
    kwargs.setdefault("eos_token_ids", [2])
    engine = TrtllmEngine(
        engine_dir, settings or TrtllmSettings(), pad_token_id=0, gpu_available=lambda: True, **kwargs
    )
    await asyncio.wait_for(engine.start(), 60)
    return engine


def req(rid: str, prompt: list[int], streaming: bool = True, **sampling) -> GenerationRequest:
    sampling.setdefault("max_new_tokens", 20)
    return GenerationRequest(rid, prompt, SamplingParams(**sampling), streaming=streaming)


async def collect(engine: TrtllmEngine, request: GenerationRequest) -> list:
    async def run():
        return [out async for out in engine.submit(request)]

    return await asyncio.wait_for(run(), 60)


def tokens_of(outputs) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


async def test_greedy_tokens_equal_transformers_generate(engine_dir, reference):
    engine = await started(engine_dir)
    try:
        assert isinstance(engine, Engine) and engine.healthy and engine.is_leader
        assert engine.limits.max_input_len == MAX_INPUT and engine.limits.max_batch_size == 4
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


async def test_concurrent_streams_carry_only_new_tokens(engine_dir, reference):
    engine = await started(engine_dir)
    try:
        requests = [req(f"c{i}", p, max_new_tokens=8 + 3 * i, ignore_eos=True) for i, p in enumerate(PROMPTS)]
        results = await asyncio.gather(*(collect(engine, r) for r in requests))
        for r, outs in zip(requests, results):
            assert tokens_of(outs) == reference(r.prompt_token_ids, r.sampling.max_new_tokens, eos=None)
            # Only new tokens: the deltas reassemble to the reference above; each carries at least one (a slow
            # consumer gets the steps it missed merged into one delta, by design: test_engine_delivery.py).
            assert all(o.token_ids for o in outs[:-1])
            assert outs[-1].finish_reason is FinishReason.LENGTH
        stats = engine.stats()
        assert stats.total_requests == len(PROMPTS) and stats.active_requests == 0
        assert stats.total_generated_tokens == sum(r.sampling.max_new_tokens for r in requests)
    finally:
        await engine.close()


async def _cancel_mid_stream(engine: TrtllmEngine, reference) -> None:
    long = req("long", PROMPTS[0], max_new_tokens=120, ignore_eos=True)
    outputs, agen = [], engine.submit(long)
    async for out in agen:
        outputs.append(out)
        if len(outputs) == 3:
            await engine.cancel("long")
        if out.finished:
            break
    assert outputs[-1].finished and outputs[-1].finish_reason is FinishReason.CANCELLED
    assert 3 <= len(tokens_of(outputs)) < 120
    assert engine.stats().active_requests == 0
    # max_batch_size is 1: the next request runs only if the slot was freed.
    after = await collect(engine, req("after", PROMPTS[1], max_new_tokens=6, ignore_eos=True))
    assert tokens_of(after) == reference(PROMPTS[1], 6, eos=None)


async def test_cancellation_ends_with_cancelled_and_frees_the_slot(engine_dir, reference):
    engine = await started(
        engine_dir, TrtllmSettings(max_batch_size=1, max_batch_size_key="option.max_rolling_batch_size")
    )
    try:
        await _cancel_mid_stream(engine, reference)
        # A consumer that goes away (client disconnect) cancels too.
        before = engine.stats().total_generated_tokens
        agen = engine.submit(req("gone", PROMPTS[2], max_new_tokens=120, ignore_eos=True))
        await agen.__anext__()
        await agen.aclose()
        after = await collect(engine, req("after2", PROMPTS[3], max_new_tokens=4, ignore_eos=True))
        assert after[-1].finish_reason is FinishReason.LENGTH
        # "after2" waited for the one slot, so "gone" has ended by now: cancelled, not run to 120.
        assert engine.stats().total_generated_tokens - before - 4 < 120
        assert engine.stats().active_requests == 0
    finally:
        await engine.close()


async def test_one_bad_request_fails_alone_with_424(engine_dir, reference):
    engine = await started(engine_dir)
    try:
        good = [req(f"g{i}", p, max_new_tokens=10, ignore_eos=True) for i, p in enumerate(PROMPTS[:3])]
        # The runtime's input limit, not the build's max_input_len: with context FMHA and packed input it is
        # min(max_seq_len - 1, max_num_tokens) (trtGptModel.h, NVIDIA/TensorRT-LLM; the fake's _runtime_max_input_len)
        limit = BUILD["max_seq_len"] - 1
        bad = req("too-long", [1 + i % 200 for i in range(limit + 8)])
        results = await asyncio.gather(*(collect(engine, r) for r in [good[0], bad, *good[1:]]))
        bad_out = results[1]
        assert len(bad_out) == 1 and bad_out[0].error_code == 424
        assert bad_out[0].finish_reason is FinishReason.ERROR
        assert f"Prompt length ({limit + 8}) exceeds maximum input length ({limit})" in bad_out[0].error
        for r, outs in zip(good, [results[0], *results[2:]]):
            assert tokens_of(outs) == reference(r.prompt_token_ids, 10, eos=None)
            assert outs[-1].error is None
        assert engine.healthy
    finally:
        await engine.close()


async def test_unservable_requests_answer_400_without_reaching_the_executor(engine_dir):
    engine = await started(engine_dir)
    try:
        out = await collect(engine, req("beam-stream", PROMPTS[0], beam_width=2))
        assert out[0].error_code == 400 and "non-streaming" in out[0].error
        dup_stream = engine.submit(req("dup", PROMPTS[0], max_new_tokens=50, ignore_eos=True))
        await dup_stream.__anext__()
        out = await collect(engine, req("dup", PROMPTS[1]))
        assert out[0].error_code == 400 and "already in flight" in out[0].error
        await dup_stream.aclose()
    finally:
        await engine.close()


async def test_beam_search_and_logprobs(engine_dir, reference):
    engine = await started(engine_dir, BEAMS)
    try:
        beams = await collect(
            engine, req("beam", PROMPTS[0], streaming=False, beam_width=2, max_new_tokens=6, ignore_eos=True)
        )
        assert beams[-1].finished and len(beams[-1].token_ids) == 6 and beams[-1].error is None
        outs = await collect(engine, req("lp", PROMPTS[1], max_new_tokens=5, logprobs=True, ignore_eos=True))
        assert [len(o.logprobs) for o in outs] == [len(o.token_ids) for o in outs]
        assert all(lp <= 0.0 for o in outs for lp in o.logprobs)
    finally:
        await engine.close()


async def test_streamed_logprobs_are_the_deltas_positions(engine_dir):
    """TensorRT-LLM streams token deltas with cumulative log-probs (LlmRequest::createResult): each
    delta's log-probs are the ones at its positions, equal to the non-streaming request's; a consumer
    that fell behind gets merged deltas whose log-probs still line up one per token."""
    engine = await started(engine_dir)
    try:
        whole = await collect(
            engine, req("lp-whole", PROMPTS[1], streaming=False, max_new_tokens=12, logprobs=True, ignore_eos=True)
        )
        want = whole[0].logprobs
        assert len(want) == 12
        streamed = await collect(
            engine, req("lp-stream", PROMPTS[1], max_new_tokens=12, logprobs=True, ignore_eos=True)
        )
        assert [len(o.logprobs) for o in streamed] == [len(o.token_ids) for o in streamed]
        assert [lp for o in streamed for lp in o.logprobs] == pytest.approx(want)

        slow, agen = [], engine.submit(req("lp-slow", PROMPTS[1], max_new_tokens=12, logprobs=True, ignore_eos=True))
        slow.append(await asyncio.wait_for(agen.__anext__(), 60))
        while engine.stats().active_requests:  # let the rest queue up unread: it is read as merged deltas
            await asyncio.sleep(0.01)
        slow += [out async for out in agen]
        assert len(slow) < 12 and [len(o.logprobs) for o in slow] == [len(o.token_ids) for o in slow]
        assert [lp for o in slow for lp in o.logprobs] == pytest.approx(want)
    finally:
        await engine.close()


async def test_another_beam_width_does_not_hold_back_the_others(engine_dir):
    """TensorRT-LLM's executor does not dequeue a request whose beam width differs from the running ones
    (getLeaderNewReqWithIds), nor anything behind it: the engine holds such a request back itself, so a
    later request of the running width runs at once, and the held one runs when the running batch drains."""
    engine = await started(engine_dir, BEAMS)
    try:
        long = asyncio.create_task(collect(engine, req("long", PROMPTS[0], max_new_tokens=120, ignore_eos=True)))
        while engine.stats().total_generated_tokens == 0:  # "long" is running
            await asyncio.sleep(0.01)
        beam = asyncio.create_task(
            collect(engine, req("beam", PROMPTS[1], streaming=False, beam_width=2, max_new_tokens=4, ignore_eos=True))
        )
        while engine.stats().total_requests < 2:  # "beam" is submitted before "short"
            await asyncio.sleep(0.01)
        short = await collect(engine, req("short", PROMPTS[2], max_new_tokens=4, ignore_eos=True))
        assert short[-1].finish_reason is FinishReason.LENGTH and len(tokens_of(short)) == 4
        assert not long.done() and not beam.done()  # ran alongside "long", ahead of the held beam request
        beams = await beam
        assert beams[-1].error is None and len(beams[-1].token_ids) == 4
        assert long.done() and (await long)[-1].finish_reason is FinishReason.LENGTH
    finally:
        await engine.close()


async def test_a_held_beam_width_gets_its_turn_after_a_batch_of_later_arrivals(engine_dir, monkeypatch):
    """No starvation: once a request of another width waits, at most max_batch_size (4) later requests of
    the running width go ahead of it; the rest wait for its group to finish."""
    from tensorrt_llm import _runtime

    # The scenario needs "long" running while every later request arrives: the fake steps at a pace (2 ms a
    # sequence's step, the GIL released) that the arrivals below outrun on a loaded machine too (at full speed
    # a 40-token "long" could end before them, and then the beam had nothing to wait for).
    step = _runtime.ExecutorImpl._step

    def paced(self, *args):
        time.sleep(0.002)
        return step(self, *args)

    monkeypatch.setattr(_runtime.ExecutorImpl, "_step", paced)
    engine = await started(engine_dir, BEAMS)
    try:
        done: list[str] = []

        async def run(rid: str, **kw):
            outs = await collect(engine, req(rid, PROMPTS[0], ignore_eos=True, **kw))
            assert outs[-1].error is None, outs[-1]
            done.append(rid)

        long = asyncio.create_task(run("long", max_new_tokens=BUILD["max_seq_len"] - len(PROMPTS[0])))
        while engine.stats().total_generated_tokens == 0:
            await asyncio.sleep(0.01)
        tasks = [asyncio.create_task(run("beam", streaming=False, beam_width=2, max_new_tokens=4))]
        while engine.stats().total_requests < 2:
            await asyncio.sleep(0.01)
        for i in range(6):
            tasks.append(asyncio.create_task(run(f"later{i}", max_new_tokens=4)))
            while engine.stats().total_requests < 3 + i:
                await asyncio.sleep(0.01)
        assert "long" not in done, f"the scenario's premise: every later request arrived while long ran ({done})"
        await asyncio.gather(long, *tasks)
        assert done.index("beam") < done.index("later4") and done.index("beam") < done.index("later5"), done
        assert max(done.index(f"later{i}") for i in range(3)) < done.index("beam"), done  # these went ahead
    finally:
        await engine.close()


async def test_extra_eos_ids_stop_like_eos(engine_dir, reference):
    want = reference(PROMPTS[0], 20, eos=None)
    extra = want[3]  # a token the model will produce: declared a second EOS id
    engine = await started(engine_dir, eos_token_ids=[2, extra])
    try:
        outs = await collect(engine, req("eos2", PROMPTS[0], max_new_tokens=20))
        assert tokens_of(outs) == want[: want.index(extra)]
        assert outs[-1].finish_reason is FinishReason.EOS
    finally:
        await engine.close()


async def test_beams_with_a_models_further_eos_ids_are_refused(engine_dir):
    """The beam kernels finish a beam on end_id only; the further EOS ids would go as stop words (map_request)."""
    engine = await started(engine_dir, eos_token_ids=[2, 5], settings=BEAMS)
    try:
        outs = await collect(engine, req("beam-eos2", PROMPTS[0], streaming=False, beam_width=2, max_new_tokens=4))
        assert outs[-1].error_code == 400 and outs[-1].error_field == "beam_width", outs[-1]
        assert "[5]" in outs[-1].error
    finally:
        await engine.close()


async def test_the_fake_executor_fails_beams_with_stop_words(engine_dir):
    """Never kinder than the real thing: a stop word does not put a beam among the finished candidates
    (beamSearchKernelsTemplate.h) and NVIDIA/TensorRT-LLM#7145 crashes on it; the fake fails the request."""
    from tensorrt_llm.bindings import executor as tle

    executor = tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig(max_beam_width=2))
    try:
        rid = executor.enqueue_request(
            tle.Request(
                input_token_ids=PROMPTS[0],
                max_tokens=4,
                end_id=2,
                stop_words=[[5]],
                sampling_config=tle.SamplingConfig(beam_width=2),
            )
        )
        responses = executor.await_responses(rid)
        assert responses[0].has_error() and "stop words" in responses[0].error_msg
    finally:
        executor.shutdown()


async def test_close_ends_inflight_requests_and_returns(engine_dir):
    engine = await started(engine_dir)
    stream = engine.submit(req("inflight", PROMPTS[0], max_new_tokens=150, ignore_eos=True))
    await stream.__anext__()
    await asyncio.wait_for(engine.close(), 60)  # does not wait for the 150 tokens; a bound load cannot break
    rest = [out async for out in stream]
    assert rest[-1].finished and rest[-1].error_code == 503
    assert not engine.healthy and not engine._pump.is_alive()
    after = await collect(engine, req("late", PROMPTS[1]))
    assert after[0].error_code == 503
    await engine.close()  # idempotent


async def test_a_dead_pump_fails_inflight_requests_and_health(engine_dir, monkeypatch):
    engine = await started(engine_dir)
    try:
        stream = engine.submit(req("victim", PROMPTS[0], max_new_tokens=150, ignore_eos=True))
        await stream.__anext__()

        def broken(*args, **kwargs):
            raise RuntimeError("[TensorRT-LLM][ERROR] CUDA error: an illegal memory access was encountered")

        monkeypatch.setattr(engine._executor, "await_responses", broken)
        rest = await asyncio.wait_for(_drain(stream), 10)
        assert rest[-1].error_code == 424 and "illegal memory access" in rest[-1].error
        assert not engine.healthy
    finally:
        monkeypatch.undo()
        await engine.close()


async def _drain(stream):
    return [out async for out in stream]


async def test_release_012_streams_and_cancels(trt, monkeypatch, tmp_path, reference):
    monkeypatch.setattr(trt, "__version__", "0.12.0")
    engine_dir = make_engine_dir(tiny_model("llama"), tmp_path / "e012", **BUILD)
    engine = await started(
        engine_dir, TrtllmSettings(max_batch_size=1, max_batch_size_key="option.max_rolling_batch_size")
    )
    try:
        assert engine.tensorrt_llm_version == "0.12.0"
        outs = await collect(engine, req("g", PROMPTS[2], max_new_tokens=12))
        assert tokens_of(outs) == reference(PROMPTS[2], 12)
        # 0.12 sends nothing for a cancelled request: the engine ends the stream itself.
        await _cancel_mid_stream(engine, reference)
    finally:
        await engine.close()


async def test_plans_with_legacy_names_are_linked(engine_dir, tmp_path, reference):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_bytes((engine_dir / "config.json").read_bytes())
    (legacy / "llama_float16_tp1_rank0.engine").write_bytes((engine_dir / "rank0.engine").read_bytes())
    engine = await started(legacy, scratch_dir=tmp_path / "scratch")
    try:
        outs = await collect(engine, req("l", PROMPTS[0], max_new_tokens=8))
        assert tokens_of(outs) == reference(PROMPTS[0], 8)
        assert os.path.islink(tmp_path / "scratch" / "engine" / "rank0.engine")
    finally:
        await engine.close()


async def test_engine_from_another_release_fails_to_load(engine_dir, trt, monkeypatch):
    monkeypatch.setattr(trt, "__version__", "1.1.0" if trt.__version__ != "1.1.0" else "1.0.0")
    engine = TrtllmEngine(engine_dir, eos_token_ids=[2], gpu_available=lambda: True)
    with pytest.raises(EngineError, match="Version tag does not match") as err:
        await engine.start()
    assert err.value.code == 424 and not engine.healthy


def test_settings_the_engine_cannot_honour_fail_at_construction(engine_dir):
    with pytest.raises(EngineError, match="option.max_num_sequences=8 exceeds the engine's built max_batch_size=4"):
        TrtllmEngine(
            engine_dir,
            TrtllmSettings(max_batch_size=8, max_batch_size_key="option.max_num_sequences"),
            eos_token_ids=[2],
        )
    with pytest.raises(EngineError, match="no EOS token id"):
        TrtllmEngine(engine_dir, eos_token_ids=[])


async def test_leader_mode_followers_wait_for_the_leader(trt, monkeypatch, tmp_path):
    """A simulated 2-rank world in one process: rank 1 serves nothing and returns when rank 0 shuts down."""
    from tensorrt_llm import _runtime

    engine_dir = make_engine_dir(tiny_model("llama"), tmp_path / "tp2", tp_size=2, **BUILD)
    settings = TrtllmSettings(tensor_parallel_degree=2)
    monkeypatch.setattr(_runtime, "current_world", lambda: _runtime.World(1, 2))
    follower = await started(engine_dir, settings)
    monkeypatch.setattr(_runtime, "current_world", lambda: _runtime.World(0, 2))
    leader = await started(engine_dir, settings)
    assert leader.is_leader and not follower.is_leader
    out = await collect(follower, req("nope", PROMPTS[0]))
    assert out[0].error_code == 503
    waiter = threading.Thread(target=follower.wait_for_shutdown)
    waiter.start()
    outs = await collect(leader, req("yes", PROMPTS[0], max_new_tokens=4, ignore_eos=True))
    assert len(tokens_of(outs)) == 4 and waiter.is_alive()
    await leader.close()
    await asyncio.to_thread(waiter.join, 10)
    assert not waiter.is_alive()
    with pytest.raises(RuntimeError, match="follower ranks"):
        leader.wait_for_shutdown()


def test_selftest_goes_through_lmi_trt_compile_and_exits_by_its_result(trt, tmp_path, monkeypatch):
    """``lmi-trt selftest`` builds through lmi_trt.compile (plan → build → cache) as serve does, then serves:
    exit 0 when every step passes, 1 when one fails (it printed FAILED and exited 0 before)."""
    import lmi_trt.compile.jit as jit
    import lmi_trt.engines.trtllm as engine_module
    import lmi_trt.selftest as selftest
    from lmi_trt.cli import main
    from lmi_trt.compile.plan import GpuFacts

    # The hardware seams: this machine has no GPU; the fake builds and runs without one.
    monkeypatch.setattr(jit, "_host_gpu", lambda: GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1))
    monkeypatch.setattr(engine_module, "cuda_available", lambda: True)
    monkeypatch.syspath_prepend(str(FAKES))  # the spawned build workers import the fake too
    lines: list[str] = []
    assert selftest.run_selftest(tmp_path / "ok", out=lines.append, backend="tensorrt"), lines
    assert [line.split()[0] for line in lines[:-1]] == ["PASS"] * 8 and lines[-1] == "selftest PASSED"
    assert any("lmi_trt.compile" in line for line in lines)
    built = json.loads(next((tmp_path / "ok" / "engine-cache").rglob("build_plan.json")).read_text())
    assert built["trtllm_version"] == trt.__version__ and built["max_batch_size"] == 4

    monkeypatch.setattr(selftest, "run_selftest", lambda backend: True)
    assert main(["selftest"]) == 0
    monkeypatch.setattr(selftest, "run_selftest", lambda backend: False)
    assert main(["selftest", "--backend", "tensorrt"]) == 1


@pytest.mark.parametrize("with_trtllm", [True, False])
def test_selftest_on_a_host_without_a_gpu_or_tensorrt_llm_says_what_it_needs_in_one_line(tmp_path, with_trtllm):
    """Through the command as a process, on this machine (no GPU), with the fake TensorRT-LLM or none: one line
    naming what is missing and what to run instead, exit status 2 (it printed a FAIL step before)."""
    path = [str(FAKES)] if with_trtllm else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "lmi_trt", "selftest"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and "\n" not in out, out
    missing = "no CUDA GPU is visible" if with_trtllm else "TensorRT-LLM is not installed"
    assert out.startswith("error: lmi-trt selftest checks TensorRT-LLM on an NVIDIA GPU") and missing in out, out
    assert "lmi-trt:trtllm lmi-trt selftest" in out and "Quick start" in out, out


async def test_behind_a_sink_a_batch_of_responses_is_one_put_and_no_task_per_request(engine_dir, reference):
    from lmi_trt.engines.base import BatchedEngine

    engine = await started(engine_dir, BEAMS)
    try:
        assert isinstance(engine, BatchedEngine)
        sink = RecordingSink()
        engine.attach(sink)
        tasks_before = len(asyncio.all_tasks())
        requests = [req(f"b{i}", p, max_new_tokens=10, ignore_eos=True) for i, p in enumerate(PROMPTS[:4])]
        requests.append(req("lp", PROMPTS[4], max_new_tokens=5, logprobs=True, ignore_eos=True))
        requests.append(req("beams", PROMPTS[5], streaming=False, max_new_tokens=5, beam_width=2))
        requests.append(req("bad", [1, 2], max_new_tokens=5, beam_width=9))  # over max_beam_width: 400 alone
        for r in requests:
            engine.submit_to_sink(r)
        assert len(asyncio.all_tasks()) == tasks_before  # no task, iterator or queue per request
        await sink.wait(*(r.request_id for r in requests))
        for r in requests[:4]:
            outs = sink.outputs_of(r.request_id)
            assert tokens_of(outs) == reference(r.prompt_token_ids, 10, eos=None)
            assert outs[-1].finish_reason is FinishReason.LENGTH and sum(o.finished for o in outs) == 1
        lps = sink.outputs_of("lp")
        assert len([lp for o in lps for lp in o.logprobs]) == len(tokens_of(lps)) == 5
        assert sink.outputs_of("beams")[-1].beams  # a beam search, through the same path
        assert sink.outputs_of("bad")[-1].error is not None and sink.outputs_of("bad")[-1].error_code == 400
        # One await_responses batch is one put: the concurrent streams' steps share calls.
        assert any(len({out.request_id for out in call}) > 1 for _, call in sink.calls)
        assert engine.stats().active_requests == 0
    finally:
        await engine.close()


async def test_behind_a_sink_cancel_cancels_exactly_that_executor_request(engine_dir, reference):
    engine = await started(engine_dir)
    try:
        sink = RecordingSink()
        engine.attach(sink)
        cancelled: list[int] = []
        cancel_request = engine._executor.cancel_request

        def spy(exec_id):
            cancelled.append(exec_id)
            cancel_request(exec_id)

        engine._executor.cancel_request = spy
        engine.submit_to_sink(req("stay", PROMPTS[0], max_new_tokens=40, ignore_eos=True))
        engine.submit_to_sink(req("go", PROMPTS[1], max_new_tokens=120, ignore_eos=True))
        exec_id = engine._by_request_id["go"].exec_id
        while not sink.outputs_of("go"):
            await asyncio.sleep(0.01)
        await engine.cancel("go")
        await sink.wait("stay", "go")
        assert cancelled == [exec_id]
        assert sink.outputs_of("go")[-1].finish_reason is FinishReason.CANCELLED
        assert len(tokens_of(sink.outputs_of("go"))) < 120
        assert tokens_of(sink.outputs_of("stay")) == reference(PROMPTS[0], 40, eos=None)
    finally:
        await engine.close()
