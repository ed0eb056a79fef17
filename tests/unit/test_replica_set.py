"""ReplicaSet over synthetic engines: routing, eager errors, early close, failed start."""

from __future__ import annotations

import asyncio

import pytest

from lmi_trt.engines.base import EngineStats, GenerationRequest, SamplingParams
from lmi_trt.engines.replicas import ReplicaSet, least_loaded, merged_extra
from lmi_trt.engines.synthetic import SyntheticEngine


def _engine(**kw) -> SyntheticEngine:
    return SyntheticEngine(512, tokens_per_second=200, max_batch_size=8, max_input_len=32, max_new_tokens=64, **kw)


def _req(i: int, n: int = 40) -> GenerationRequest:
    return GenerationRequest(f"r{i}", [10, 11, 12], SamplingParams(max_new_tokens=n))


def test_least_loaded_counts_queued_and_breaks_ties_low():
    stats = [
        EngineStats(active_requests=2, queued_requests=1),
        EngineStats(active_requests=1, queued_requests=2),
        EngineStats(active_requests=1),
    ]
    assert least_loaded(stats) == 2
    assert least_loaded([EngineStats(), EngineStats()]) == 0


def test_the_copies_kv_cache_and_counters_add_up():
    def copy(used: float, preempted: float) -> EngineStats:
        extra = {"kv_cache_max_blocks": 100.0, "kv_cache_used_blocks": used, "kv_cache_block_size": 16.0}
        return EngineStats(extra=extra | {"num_preemptions": preempted, "sampled_rows": 7.0})

    merged = merged_extra([copy(10, 1), copy(30, 2)])
    assert merged == {
        "kv_cache_max_blocks": 200.0,
        "kv_cache_used_blocks": 40.0,
        "num_preemptions": 3.0,
        "kv_cache_block_size": 16.0,
    }
    assert merged_extra([copy(1, 0), EngineStats()]) == {}  # a copy that does not report: nothing to add up


async def test_requests_spread_over_copies_and_early_close_cancels_inside_the_copy():
    replicas = ReplicaSet([_engine(), _engine()])
    await replicas.start()
    try:
        streams = [replicas.submit(_req(i)) for i in range(4)]
        firsts = await asyncio.gather(*(s.__anext__() for s in streams))
        assert all(f.token_ids for f in firsts)
        assert [e.stats().active_requests for e in replicas.engines] == [2, 2]
        for s in streams:
            await s.aclose()
        for _ in range(100):
            if replicas.stats().active_requests == 0:
                break
            await asyncio.sleep(0.01)
        assert replicas.stats().active_requests == 0
    finally:
        await replicas.close()


async def test_a_copys_refusal_is_the_requests_final_output():
    replicas = ReplicaSet([_engine(), _engine()])
    await replicas.start()
    try:
        replicas.submit(_req(1))
        # A duplicate id is refused by the copy itself: as from a single engine, the refusal is the
        # request's one, final output (engines/base.py's contract), never a raise.
        target = replicas.engines[0] if replicas.engines[0].stats().total_requests else replicas.engines[1]
        other = replicas.engines[1] if target is replicas.engines[0] else replicas.engines[0]
        other.submit(_req(2))  # make the copy that holds r1 the least loaded one
        refusal = [out async for out in replicas.submit(_req(1))]
        assert len(refusal) == 1 and refusal[0].error_code == 400 and "already in use" in refusal[0].error
    finally:
        await replicas.close()


async def test_failed_start_closes_the_copies_that_started():
    class Broken(SyntheticEngine):
        async def start(self) -> None:
            raise RuntimeError("no GPU 1")

    good = _engine()
    replicas = ReplicaSet([good, Broken(512)])
    with pytest.raises(RuntimeError, match="no GPU 1"):
        await replicas.start()
    refusal = [out async for out in good.submit(_req(1))]
    assert refusal[0].error_code == 503 and "not running" in refusal[0].error


@pytest.mark.parametrize("parallel", [True, False])
async def test_parallel_loading_starts_the_copies_at_once_or_one_after_another(parallel):
    """option.parallel_loading (DJL's key): true loads every copy at once, false one after another (a copy's load
    in host memory at a time); a failed start stops there and closes what started."""
    loading: list[int] = []
    most = 0

    class Slow(SyntheticEngine):
        async def start(self) -> None:
            nonlocal most
            loading.append(1)
            most = max(most, len(loading))
            await asyncio.sleep(0.05)  # an await inside the load: another copy's start may run now
            loading.pop()
            await super().start()

    replicas = ReplicaSet([Slow(512), Slow(512), Slow(512)], parallel=parallel)
    await replicas.start()
    try:
        assert most == (3 if parallel else 1)
        assert all(e.healthy for e in replicas.engines)
    finally:
        await replicas.close()
