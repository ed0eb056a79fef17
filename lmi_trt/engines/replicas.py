"""Several model copies behind one front end: each request goes to the least-loaded copy.

A host with more GPUs than TP×PP runs GPUs ÷ (TP×PP) copies (DJL's worker count); the
copies share one HTTP server, admission queue and tokenizer.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from lmi_trt.engines.base import (
    ACCEPTED_PER_POSITION,
    ADDITIVE_STATS,
    SHARED_STATS,
    AdapterHost,
    AdapterInfo,
    Capabilities,
    Capability,
    Engine,
    EngineLimits,
    EngineOutput,
    EngineStats,
    GenerationRequest,
)


def least_loaded(stats: Sequence[EngineStats]) -> int:
    """Index of the copy with the fewest requests in flight (ties → lowest index)."""
    return min(range(len(stats)), key=lambda i: (stats[i].active_requests + stats[i].queued_requests, i))


def merged_extra(parts: Sequence[EngineStats]) -> dict[str, float]:
    """Pure: the copies' KV-cache and counter figures as one engine's (sums; shared settings once)."""
    additive = [*ADDITIVE_STATS, *(key for key in parts[0].extra if key.startswith(ACCEPTED_PER_POSITION))]
    out = {key: sum(p.extra[key] for p in parts) for key in additive if all(key in p.extra for p in parts)}
    for key in SHARED_STATS:
        values = {p.extra.get(key) for p in parts}
        if len(values) == 1 and None not in values:
            out[key] = values.pop()
    return out


def common_capabilities(copies: Sequence[Capabilities]) -> Capabilities:
    """Pure: what every copy honours (a request may go to any of them): a feature one copy refuses is
    refused with its reason; a counted one up to the smallest ``most``."""

    def common(name: str) -> Capability:
        caps = [getattr(c, name) for c in copies]
        refusing = next((c for c in caps if not c.honoured), None)
        if refusing is not None:
            return refusing
        counted = [c.most for c in caps if c.most is not None]
        return dataclasses.replace(caps[0], most=min(counted) if counted else None)

    return dataclasses.replace(copies[0], **{name: common(name) for name in copies[0].features()})


class ReplicaSet:
    name: str

    def __init__(self, engines: Sequence[Engine], *, parallel: bool = True) -> None:
        """``parallel``: start the copies at once (option.parallel_loading), else one after another, which holds
        one copy's load in host memory at a time (DJL's reason for the key, configurations.md)."""
        if not engines:
            raise ValueError("ReplicaSet needs at least one engine")
        self._engines = list(engines)
        self._parallel = parallel
        self.name = f"{self._engines[0].name}x{len(self._engines)}"
        self._owner: dict[str, Engine] = {}

    @property
    def copies(self) -> int:
        return len(self._engines)

    @property
    def engines(self) -> tuple[Engine, ...]:
        return tuple(self._engines)

    @property
    def limits(self) -> EngineLimits:
        first = self._engines[0].limits
        return EngineLimits(
            max_batch_size=sum(e.limits.max_batch_size for e in self._engines),
            max_input_len=min(e.limits.max_input_len for e in self._engines),
            max_seq_len=first.max_seq_len,
            max_new_tokens=first.max_new_tokens,
            max_beam_width=min(e.limits.max_beam_width for e in self._engines),
        )

    @property
    def capabilities(self) -> Capabilities:
        return common_capabilities([e.capabilities for e in self._engines])

    @property
    def healthy(self) -> bool:
        # One dead copy fails the process (DJL's fail-fast): the platform restarts it whole.
        return all(e.healthy for e in self._engines)

    async def start(self) -> None:
        if self._parallel:
            results = await asyncio.gather(*(e.start() for e in self._engines), return_exceptions=True)
        else:
            results = []
            for engine in self._engines:
                try:
                    results.append(await engine.start())
                except Exception as exc:  # noqa: BLE001 — the copies that did start are closed below
                    results.append(exc)
                    break
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            # Don't leave the copies that did start holding GPUs and threads.
            await self.close()
            raise failure

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        engine = self._engines[least_loaded([e.stats() for e in self._engines])]
        outputs = engine.submit(request)  # a copy's refusal is the request's final output (engines/base.py)
        self._owner[request.request_id] = engine
        return self._relay(request.request_id, outputs)

    async def _relay(self, request_id: str, outputs: AsyncIterator[EngineOutput]) -> AsyncIterator[EngineOutput]:
        try:
            async for out in outputs:
                yield out
        finally:
            self._owner.pop(request_id, None)
            aclose = getattr(outputs, "aclose", None)
            if aclose is not None:
                await aclose()  # an early close (client gone) cancels inside the copy

    async def cancel(self, request_id: str) -> None:
        engine = self._owner.get(request_id)
        if engine is not None:
            await engine.cancel(request_id)

    def stats(self) -> EngineStats:
        parts = [e.stats() for e in self._engines]
        total = EngineStats(
            active_requests=sum(p.active_requests for p in parts),
            queued_requests=sum(p.queued_requests for p in parts),
            max_batch_size=sum(p.max_batch_size for p in parts),
            total_requests=sum(p.total_requests for p in parts),
            total_generated_tokens=sum(p.total_generated_tokens for p in parts),
        )
        for i, p in enumerate(parts):
            total.extra[f"copy{i}_active"] = float(p.active_requests + p.queued_requests)
        total.extra |= merged_extra(parts)
        return total

    # LoRA adapters: every copy serves the same ones (a request may go to any).

    def _hosts(self) -> list[AdapterHost]:
        return [e for e in self._engines if isinstance(e, AdapterHost)]

    def adapters(self) -> list[AdapterInfo]:
        hosts = self._hosts()
        return hosts[0].adapters() if hosts else []

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo:
        done: list[AdapterHost] = []
        try:
            for host in self._hosts():
                info = await host.register_adapter(name, src, folder)
                done.append(host)
        except BaseException:
            for host in done:  # all copies or none
                await host.unregister_adapter(name)
            raise
        return info

    async def unregister_adapter(self, name: str) -> None:
        done: list[tuple[AdapterHost, AdapterInfo]] = []
        try:
            for host in self._hosts():
                info = next((a for a in host.adapters() if a.name == name), None)
                await host.unregister_adapter(name)
                done.append((host, info))
        except BaseException:
            for host, info in done:  # a copy still using it refused: the others serve it again
                await host.register_adapter(info.name, info.src, info.folder)
            raise

    async def close(self) -> None:
        await asyncio.gather(*(e.close() for e in self._engines), return_exceptions=True)
