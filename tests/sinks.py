"""A recording ``OutputSink`` (lmi_trt/engines/base.py) for engines behind the engine link, as
serving/engine_link's ``EngineServer`` takes their outputs."""

from __future__ import annotations

import asyncio
from dataclasses import fields

from lmi_trt.engines.base import EngineOutput
from lmi_trt.serving.engine_link import _wire

_QUEUE_TIME = [f.name for f in fields(EngineOutput)].index("queue_time_s")


def on_the_wire(out: EngineOutput | tuple) -> tuple:
    """An output as the engine link sends it (``_wire``; a plain delta is its own wire tuple), its queue time only
    as whether it has one (it is measured, so it differs between runs)."""
    t = out if isinstance(out, tuple) else _wire(out)
    if len(t) > _QUEUE_TIME:
        t = (*t[:_QUEUE_TIME], t[_QUEUE_TIME] is not None, *t[_QUEUE_TIME + 1 :])
    return t


class RecordingSink:
    """Takes everything at once (as the link's sink does once acknowledged) and keeps each call in order:
    ``("put", outputs)`` or ``("deltas", plain deltas)``, to see how the engine hands its outputs over."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []
        self.ended: dict[str, asyncio.Event] = {}

    def put(self, outputs: list) -> None:
        self.calls.append(("put", list(outputs)))
        for out in outputs:
            if out.finished:
                self.ended.setdefault(out.request_id, asyncio.Event()).set()

    def put_deltas(self, deltas: list) -> None:
        self.calls.append(("deltas", list(deltas)))

    def consumer(self, request_id: str) -> None:
        return None

    def backlogged(self, consumer: object) -> bool:
        return False

    async def taken(self) -> None:
        return None

    def stream(self, rid: str) -> list[tuple[str, object]]:
        """The request's outputs and plain deltas in the order the sink took them, each with its call's kind."""
        return [
            (kind, out)
            for kind, outs in self.calls
            for out in outs
            if (out[0] if kind == "deltas" else out.request_id) == rid
        ]

    def wired(self, rid: str) -> list[tuple]:
        """The request's stream as the engine link would send it (``on_the_wire``)."""
        return [on_the_wire(out) for _, out in self.stream(rid)]

    def outputs_of(self, rid: str) -> list:
        """The request's ``EngineOutput``s (``put``'s), in order."""
        return [out for kind, out in self.stream(rid) if kind == "put"]

    async def wait(self, *rids: str) -> None:
        await asyncio.wait_for(asyncio.gather(*(self.ended.setdefault(r, asyncio.Event()).wait() for r in rids)), 60)
