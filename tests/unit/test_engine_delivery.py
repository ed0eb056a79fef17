"""How engines hand tokens to consumers: the synthetic engine's steps and clock, the TensorRT-LLM adapter's merging
of outputs queued for a consumer that fell behind, and the torch engine's hand-over to its sink."""

from __future__ import annotations

import asyncio
import time

import pytest
from sinks import RecordingSink
from tinymodels import tiny_model

from lmi_trt.engines.base import (
    EngineOutput,
    FinishReason,
    GenerationRequest,
    OutputChannel,
    SamplingParams,
    error_output,
)
from lmi_trt.engines.synthetic import SyntheticEngine
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.engines.torch.backend import Slot


def _req(rid: str, n: int, prompt: list[int] | None = None, **sampling) -> GenerationRequest:
    return GenerationRequest(rid, prompt or [10, 11, 12], SamplingParams(max_new_tokens=n, **sampling))


async def _drain(it) -> list[EngineOutput]:
    return [out async for out in it]


async def test_as_fast_as_possible_is_one_token_per_sequence_per_step_in_lock_step():
    """No rate: every step gives each active sequence one token, and consumers that keep up
    read each token as its own delta (the engine never runs ahead of them)."""
    engine = SyntheticEngine(64)
    await engine.start()
    try:
        outs = await asyncio.gather(*(_drain(engine.submit(_req(f"r{i}", 50))) for i in range(8)))
        for seq in outs:
            assert [len(o.token_ids) for o in seq[:-1]] == [1] * 49  # one token per delta
            assert sum(len(o.token_ids) for o in seq) == 50 and seq[-1].finish_reason is FinishReason.LENGTH
            assert [o.logprobs for o in seq[:4]] == [[-0.25], [-0.5], [-0.75], [-1.0]]
        assert engine.stats().total_generated_tokens == 400
    finally:
        await engine.close()


@pytest.mark.parametrize("rate", [1e6, 1e9])
async def test_absurd_rates_mean_as_fast_as_possible(rate):
    engine = SyntheticEngine(64, tokens_per_second=rate)
    await engine.start()
    try:
        outs = await _drain(engine.submit(_req("r", 20)))
        assert [len(o.token_ids) for o in outs[:-1]] == [1] * 19
    finally:
        await engine.close()


async def test_rate_is_per_sequence_and_a_late_consumer_gets_the_due_tokens_at_once():
    engine = SyntheticEngine(64, tokens_per_second=200)
    await engine.start()
    try:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(_drain(engine.submit(_req(f"r{i}", 20))) for i in range(16)))
        elapsed = time.perf_counter() - t0
        # 16 sequences x 20 tokens at 200 tokens/s each: ~0.1 s (a shared rate would need 1.6 s).
        assert 0.08 < elapsed < 1.0, elapsed
        assert all(sum(len(o.token_ids) for o in seq) == 20 for seq in outs)

        it = engine.submit(_req("late", 100))
        first = await it.__anext__()
        assert len(first.token_ids) == 1
        await asyncio.sleep(0.2)  # the consumer stalls; the engine keeps its clock (~40 steps)
        second = await it.__anext__()
        assert 20 <= len(second.token_ids) <= 60, len(second.token_ids)
        assert second.token_ids == ([10, 11, 12] * 40)[1 : 1 + len(second.token_ids)]
        time.sleep(0.1)  # the event loop itself stalls: the steps that came due (~20) happen at once
        third = await it.__anext__()
        assert len(third.token_ids) >= 10, len(third.token_ids)
        rest = await _drain(it)
        assert 1 + len(second.token_ids) + len(third.token_ids) + sum(len(o.token_ids) for o in rest) == 100
    finally:
        await engine.close()


async def test_eos_stop_ids_and_min_new_tokens_end_where_the_echo_says():
    engine = SyntheticEngine(64, eos_token_id=5)
    await engine.start()
    try:
        outs = await _drain(engine.submit(_req("eos", 30, [7, 8, 5])))
        ids = [t for o in outs for t in o.token_ids]
        assert ids == [7, 8, 5] and outs[-1].finish_reason is FinishReason.EOS
        outs = await _drain(engine.submit(_req("min", 30, [7, 8, 5], min_new_tokens=4)))
        assert [t for o in outs for t in o.token_ids] == [7, 8, 5, 7, 8, 5] and outs[
            -1
        ].finish_reason is FinishReason.EOS
        outs = await _drain(engine.submit(_req("ign", 7, [7, 8, 5], ignore_eos=True)))
        assert [t for o in outs for t in o.token_ids] == [7, 8, 5, 7, 8, 5, 7]
        assert outs[-1].finish_reason is FinishReason.LENGTH
        request = GenerationRequest("stop", [1, 2, 3, 4], SamplingParams(max_new_tokens=30), stop_token_ids=[[3, 4, 1]])
        outs = await _drain(engine.submit(request))
        assert [t for o in outs for t in o.token_ids] == [1, 2, 3, 4, 1] and outs[
            -1
        ].finish_reason is FinishReason.STOP_SEQUENCE
    finally:
        await engine.close()


# --- TensorRT-LLM adapter: outputs queued for one request ---


def _stream_with(outs: list[EngineOutput]):
    from lmi_trt.engines.trtllm import _Stream

    stream = _Stream(
        request_id="r", exec_id=1, max_new_tokens=100, end_id=2, extra_eos=frozenset(), logprobs=True, beam_width=1
    )
    stream.pending = list(outs)
    return stream


def test_trtllm_queued_outputs_merge_into_one_delta():
    from lmi_trt.engines.trtllm import _take

    stream = _stream_with(
        [
            EngineOutput("r", [1], [-0.1]),
            EngineOutput("r", [2, 3], [-0.2, -0.3]),
            EngineOutput("r", [4], [-0.4], finished=True, finish_reason=FinishReason.LENGTH),
        ]
    )
    out = _take(stream)
    assert (out.token_ids, out.logprobs, out.finished, out.finish_reason) == (
        [1, 2, 3, 4],
        [-0.1, -0.2, -0.3, -0.4],
        True,
        FinishReason.LENGTH,
    )
    assert stream.pending == []


def test_trtllm_an_error_is_never_merged_and_tokens_before_it_come_first():
    from lmi_trt.engines.base import error_output
    from lmi_trt.engines.trtllm import _take

    error = error_output("r", "boom", 424)
    stream = _stream_with([EngineOutput("r", [1], [-0.1]), EngineOutput("r", [2], [-0.2]), error])
    first = _take(stream)
    assert first.token_ids == [1, 2] and not first.finished
    assert _take(stream) is error and stream.pending == []


def test_trtllm_outputs_with_and_without_logprobs_are_not_mixed():
    from lmi_trt.engines.trtllm import _take

    stream = _stream_with([EngineOutput("r", [1], None), EngineOutput("r", [2], None), EngineOutput("r", [3], [-0.3])])
    assert _take(stream).token_ids == [1, 2]
    assert _take(stream).logprobs == [-0.3]


async def test_trtllm_consumer_wakes_for_each_push():
    from lmi_trt.engines.trtllm import _push

    stream = _stream_with([])
    loop = asyncio.get_running_loop()
    stream.waiter = waiter = loop.create_future()
    _push(stream, EngineOutput("r", [1]))
    assert waiter.done() and stream.waiter is None and len(stream.pending) == 1
    _push(stream, EngineOutput("r", [2]))  # nobody waiting: queued only
    assert len(stream.pending) == 2


async def test_torch_sunk_outputs_reach_the_sink_in_order_each_run_in_one_call():
    """The torch engine's outputs for its sink (TorchEngine._push_handed, _put_sunk): what one turn of the event loop
    takes, over several hand-overs from the engine thread, reaches the sink in order, each run of plain deltas in one
    put_deltas and each run of outputs in one put; nothing of a request after its end; its tokens counted and its
    first output starting it, as ``_push`` does for outputs."""
    engine = TorchEngine(tiny_model("llama"))
    engine._loop = asyncio.get_running_loop()
    sink = RecordingSink()
    engine.attach(sink)
    a, b = (Slot(GenerationRequest(rid, [1]), rid, (), None, OutputChannel(), frozenset(), sunk=True) for rid in "ab")
    for slot in (a, b):
        engine._slots[slot.request.request_id] = slot
    first_a, first_b = EngineOutput("a", [1], queue_time_s=0.5), EngineOutput("b", [1], queue_time_s=0.25)
    failed = error_output("b", "the model produced NaN/inf logits", 424)
    last_a = EngineOutput("a", [6], finished=True, finish_reason=FinishReason.LENGTH)
    engine.deliver([(a, first_a), (b, first_b), (a, ("a", [2], None)), (b, ("b", [3], [-0.5]))])
    await asyncio.sleep(0)  # the hand-over's push: the sink not called yet (the turn's outputs go together)
    assert sink.calls == [] and a.started and b.started
    engine._handed = [(a, ("a", [4], None)), (b, ("b", [5], [-1.0])), (b, failed), (b, ("b", [7], None))]
    engine._push_handed()  # a second hand-over in the same turn
    engine._handed = [(a, last_a), (a, ("a", [8], None))]
    engine._push_handed()
    await asyncio.sleep(0)
    assert sink.calls == [
        ("put", [first_a, first_b]),
        ("deltas", [("a", [2], None), ("b", [3], [-0.5]), ("a", [4], None), ("b", [5], [-1.0])]),
        ("put", [failed, last_a]),
    ]
    stats = engine.stats()
    assert stats.total_generated_tokens == 7 and stats.active_requests == stats.queued_requests == 0
