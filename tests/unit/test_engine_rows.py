"""The synthetic engine: one request whose step fails ends with an error alone; the engine and the
other requests go on (on 4dccd9d the exception killed the engine loop and failed everyone)."""

from __future__ import annotations

import asyncio

import pytest

from lmi_trt.engines import synthetic
from lmi_trt.engines.base import FinishReason, GenerationRequest, SamplingParams

pytestmark = pytest.mark.asyncio


async def test_a_failing_request_fails_alone(monkeypatch):
    plan = synthetic._Sequence.plan

    def broken_for_one(self, eos):
        if self.request.request_id == "bad":
            raise FloatingPointError("injected: this row's arithmetic failed")
        plan(self, eos)

    monkeypatch.setattr(synthetic._Sequence, "plan", broken_for_one)
    engine = synthetic.SyntheticEngine(100, max_batch_size=4)
    await engine.start()
    try:

        async def run(rid: str, prompt: list[int]):
            return [o async for o in engine.submit(GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=6)))]

        good1, bad, good2 = await asyncio.wait_for(  # on 4dccd9d nobody ever got an answer
            asyncio.gather(run("g1", [5, 6]), run("bad", [7]), run("g2", [8, 9, 10])), 30
        )
        assert bad[-1].finish_reason is FinishReason.ERROR and "injected" in bad[-1].error
        assert [t for o in good1 for t in o.token_ids] == [5, 6, 5, 6, 5, 6]
        assert [t for o in good2 for t in o.token_ids] == [8, 9, 10, 8, 9, 10]
        assert engine.healthy
    finally:
        await engine.close()
