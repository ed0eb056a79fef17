"""The channel between the engine's process and its front ends (``option.api_server_count`` > 1), over ZeroMQ.

The engine side (``EngineServer``, a ROUTER socket) runs the engine and forwards every request's outputs; the
front end side (``RemoteEngine``, a DEALER socket) is an ``Engine`` to the serving layer, which sees no
difference. Outputs are coalesced per front end: all that the engine delivers in one turn of the event loop (one
engine step) leave as one message of plain tuples, not one message per token per request. Front ends send a
request (its ``GenerationRequest``) once and a cancel when its client leaves.

Messages are pickled tuples: ``("hello",)``, ``("submit", request)``, ``("cancel", request_id)`` and
``("call", id, method, args)`` (the LoRA registry) to the engine; ``("reply", id, result, error)``,
``("state", EngineState)`` and ``("outs", [output tuple, ...], EngineStats | None)`` back (the engine's figures
with the outputs of a step that ended a request, to every front end).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import os
import pickle
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from lmi_trt.engines import base
from lmi_trt.engines.base import (
    AdapterHost,
    AdapterInfo,
    Engine,
    EngineError,
    EngineOutput,
    FinishReason,
    GenerationRequest,
    error_output,
)

log = logging.getLogger(__name__)

# Front ends hear the engine's health and statistics this often (for /ping and /metrics).
HEARTBEAT_S = 0.25
_PICKLE = pickle.HIGHEST_PROTOCOL


@dataclass(frozen=True)
class EngineState:
    """What a front end knows of the engine: loading, ready (with what the serving layer reads of it) or failed."""

    phase: str = "loading"  # loading | ready | failed
    error: str | None = None
    name: str = ""
    limits: base.EngineLimits | None = None
    capabilities: base.Capabilities | None = None
    tokenizer_dir: Path | None = None
    healthy: bool = True
    stats: base.EngineStats = field(default_factory=base.EngineStats)
    adapters: tuple[AdapterInfo, ...] = ()  # the LoRA adapters registered (an AdapterHost's)


# What a front end may ask the engine to do besides generating: the LoRA registry (engines/base.py AdapterHost).
_CALLS = ("register_adapter", "unregister_adapter")


def _adapters(engine: Engine) -> tuple[AdapterInfo, ...]:
    return tuple(engine.adapters()) if isinstance(engine, AdapterHost) else ()


_REASON = [f.name for f in fields(EngineOutput)].index("finish_reason")


def _wire(out: EngineOutput) -> tuple:
    """An output as a plain tuple (its fields in order; the finish reason by value): pickles several times faster
    than the dataclass and its enum."""
    t = tuple(vars(out).values())  # a dataclass's attributes, in its fields' order
    reason = out.finish_reason
    return (*t[:_REASON], reason.value if reason is not None else None, *t[_REASON + 1 :])


def _unwire(t: tuple) -> EngineOutput:
    out = EngineOutput(*t)
    if out.finish_reason is not None:
        out.finish_reason = FinishReason(out.finish_reason)
    return out


class _Inbox:
    """One stream's outputs as they arrive, and the stream waiting for them (lighter than an asyncio.Queue, which
    the link would otherwise fill and empty once per token)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque[EngineOutput] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def put(self, out: EngineOutput) -> None:
        self.items.append(out)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> EngineOutput:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.items.popleft()


def _socket(context: zmq.asyncio.Context, kind: int) -> zmq.asyncio.Socket:
    sock = context.socket(kind)
    # No high-water mark: a ROUTER drops what is over it silently; the engine's outputs are bounded by its batch.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


class EngineServer:
    """The engine's end: serves ``hello``/``submit``/``cancel`` from every front end at ``address``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._context = zmq.asyncio.Context()
        self._sock = _socket(self._context, zmq.ROUTER)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a gone front end is an error to drop, not a silent loss
        self._sock.bind(address)
        self.engine: Engine | None = None
        self.state = EngineState()
        self._peers: set[bytes] = set()
        self._owner: dict[str, bytes] = {}  # request id → the front end that sent it
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pending: dict[bytes, list[tuple]] = {}
        self._flushing = False
        self._background: set[asyncio.Task[None]] = set()
        self._receiver: asyncio.Task[None] | None = None
        self._heart: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._receiver = loop.create_task(self._receive(), name="lmi-engine-link")
        self._heart = loop.create_task(self._heartbeat(), name="lmi-engine-heartbeat")

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def ready(self, engine: Engine, tokenizer_dir: Path | None) -> None:
        self.engine = engine
        self.state = EngineState(
            "ready",
            name=engine.name,
            limits=engine.limits,
            capabilities=engine.capabilities,
            tokenizer_dir=tokenizer_dir,
            healthy=engine.healthy,
            stats=engine.stats(),
            adapters=_adapters(engine),
        )
        self._broadcast()

    def failed(self, error: str) -> None:
        self.state = EngineState("failed", error=error, healthy=False)
        self._broadcast()

    def frontend_gone(self, identity: bytes) -> None:
        """A front end died: its requests are cancelled (their engine slots freed), nobody else's."""
        self._peers.discard(identity)
        self._pending.pop(identity, None)
        gone = [rid for rid, owner in self._owner.items() if owner == identity]
        if gone:
            log.warning("front end %s is gone: cancelling its %d requests", identity.decode(), len(gone))
        for rid in gone:
            self._cancel(rid)

    async def close(self) -> None:
        for task in (self._receiver, self._heart, *self._tasks.values()):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._receiver, self._heart) if t is not None), return_exceptions=True)
        self._sock.close(0)
        self._context.term()

    # --- receiving
    async def _receive(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            message = pickle.loads(payload)
            kind = message[0]
            if kind == "submit":
                self._submit(identity, message[1])
            elif kind == "cancel":
                self._cancel(message[1])
            elif kind == "call":
                self._spawn(self._call(identity, *message[1:]))
            elif kind == "hello":
                self._peers.add(identity)
                self._send(identity, ("state", self.state))

    def _submit(self, identity: bytes, request: GenerationRequest) -> None:
        rid = request.request_id
        if self.engine is None:  # a front end only submits once it heard "ready"; a late one after a failure
            self._deliver(identity, error_output(rid, "the engine is not running", 503))
            return
        self._owner[rid] = identity
        self._tasks[rid] = asyncio.get_running_loop().create_task(self._forward(identity, request))

    async def _forward(self, identity: bytes, request: GenerationRequest) -> None:
        assert self.engine is not None
        rid = request.request_id
        try:
            async for out in self.engine.submit(request):
                self._deliver(identity, out)
        finally:
            self._owner.pop(rid, None)
            self._tasks.pop(rid, None)

    def _cancel(self, rid: str) -> None:
        if self.engine is not None and rid in self._tasks:
            self._spawn(self.engine.cancel(rid))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _call(self, identity: bytes, call_id: int, method: str, args: tuple) -> None:
        """A front end's call on the engine (one of ``_CALLS``); every front end hears the new adapter list before
        the caller hears the answer, so the caller's next request sees it."""
        result, error = None, None
        try:
            if self.engine is None or method not in _CALLS or not isinstance(self.engine, AdapterHost):
                raise EngineError(f"the engine does not serve {method}", 400)
            result = await getattr(self.engine, method)(*args)
        except EngineError as e:
            error = (str(e), e.code, e.field)
        except Exception as e:  # the engine's own failure: the caller answers it as the engine's error
            log.exception("%s%r failed in the engine", method, args)
            error = (f"{type(e).__name__}: {e}", 424, None)
        if self.engine is not None:
            self.state = replace(self.state, adapters=_adapters(self.engine))
            self._broadcast()
        self._send(identity, ("reply", call_id, result, error))

    # --- sending
    def _deliver(self, identity: bytes, out: EngineOutput) -> None:
        self._pending.setdefault(identity, []).append(_wire(out))
        if not self._flushing:  # the other outputs of this engine step arrive in this turn of the loop
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self.engine is not None and self.engine.healthy != self.state.healthy:
            # A dead engine's last outputs (errors) reach the front ends after the news: /ping FAILED by then.
            self.state = replace(self.state, healthy=self.engine.healthy, stats=self.engine.stats())
            self._broadcast()
        pending, self._pending = self._pending, {}
        stats = None
        if self.engine is not None and any(t[5] for outs in pending.values() for t in outs):
            # A request ended: every front end hears the engine's figures with it, so /metrics, wherever it is
            # scraped, counts it gone as soon as its client has its last token (as with one process).
            stats = self.engine.stats()
            self.state = replace(self.state, stats=stats)
            for identity in self._peers - pending.keys():
                self._send(identity, ("outs", [], stats))
        for identity, outs in pending.items():
            self._send(identity, ("outs", outs, stats))

    def _send(self, identity: bytes, message: tuple) -> None:
        try:
            self._sock.send_multipart([identity, pickle.dumps(message, _PICKLE)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # EHOSTUNREACH: that front end has gone (its supervisor cancels its requests)
            log.debug("front end %s unreachable: %s", identity.decode(errors="replace"), e)

    def _broadcast(self) -> None:
        for identity in list(self._peers):
            self._send(identity, ("state", self.state))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self.engine is not None:
                self.state = replace(self.state, healthy=self.engine.healthy, stats=self.engine.stats())
            self._broadcast()


class RemoteEngine:
    """The engine of another process, as the serving layer's ``Engine`` (engines/base.py's contract: ``submit``
    never raises; a request the engine cannot reach ends with a 503 final output)."""

    def __init__(self, address: str, identity: str, parent_pid: int) -> None:
        self._address = address
        self._identity = identity.encode()
        # Request ids are unique within a front end (X-Request-Id and a count); the engine sees them with the front
        # end's identity added, unique across front ends.
        self._suffix = "@" + identity
        self._parent_pid = parent_pid
        self._context: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._streams: dict[str, _Inbox] = {}
        self.state = EngineState()
        self._changed = asyncio.Event()
        self._receiver: asyncio.Task[None] | None = None
        self._lost: str | None = None  # why the engine is unreachable
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()

    # --- the Engine protocol
    @property
    def name(self) -> str:  # type: ignore[override]
        return self.state.name

    @property
    def limits(self) -> base.EngineLimits:
        assert self.state.limits is not None
        return self.state.limits

    @property
    def capabilities(self) -> base.Capabilities:
        assert self.state.capabilities is not None
        return self.state.capabilities

    @property
    def healthy(self) -> bool:
        return self._lost is None and self.state.healthy and os.getppid() == self._parent_pid

    async def start(self) -> None:
        """Nothing: the engine started in its own process (``connect`` waits for it)."""

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        rid = request.request_id
        if self._sock is None or not self.healthy:
            return _one(error_output(rid, f"the engine is not reachable: {self._lost or 'its process is gone'}", 503))
        inbox = _Inbox()
        wire = replace(request, request_id=rid + self._suffix)
        self._streams[wire.request_id] = inbox
        self._sock.send(pickle.dumps(("submit", wire), _PICKLE), flags=zmq.NOBLOCK)
        return self._stream(rid, inbox)

    async def _stream(self, rid: str, inbox: _Inbox) -> AsyncIterator[EngineOutput]:
        finished = False
        try:
            while not finished:
                out = await inbox.get()
                out.request_id = rid
                finished = out.finished
                yield out
        finally:
            self._streams.pop(rid + self._suffix, None)
            if not finished:
                await self.cancel(rid)  # the client left before the end: the engine frees its slot

    async def cancel(self, request_id: str) -> None:
        if self._sock is not None and self._lost is None:
            self._sock.send(pickle.dumps(("cancel", request_id + self._suffix), _PICKLE), flags=zmq.NOBLOCK)

    def stats(self) -> base.EngineStats:
        return self.state.stats

    # --- the LoRA registry (AdapterHost), held by the engine's process for every front end
    def adapters(self) -> list[AdapterInfo]:
        return list(self.state.adapters)

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo:
        return await self._call("register_adapter", name, src, folder)

    async def unregister_adapter(self, name: str) -> None:
        await self._call("unregister_adapter", name)

    async def _call(self, method: str, *args: Any) -> Any:
        if self._sock is None or self._lost is not None:
            raise EngineError(f"the engine is not reachable: {self._lost or 'not connected'}", 503)
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._sock.send(pickle.dumps(("call", call_id, method, args), _PICKLE), flags=zmq.NOBLOCK)
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
        if self._sock is not None:
            self._sock.close(0)
        if self._context is not None:
            self._context.term()

    # --- the link
    async def connect(self) -> EngineState:
        """Connect and wait until the engine is ready or has failed; its state."""
        self._context = zmq.asyncio.Context()
        self._sock = _socket(self._context, zmq.DEALER)
        self._sock.setsockopt(zmq.IDENTITY, self._identity)
        self._sock.connect(self._address)
        self._receiver = asyncio.get_running_loop().create_task(self._receive(), name="lmi-engine-link")
        await self._sock.send(pickle.dumps(("hello",), _PICKLE))
        while self.state.phase == "loading":
            self._changed.clear()
            await self._changed.wait()
        return self.state

    async def _receive(self) -> None:
        assert self._sock is not None
        try:
            while True:
                if not await self._sock.poll(HEARTBEAT_S * 4 * 1000):
                    if os.getppid() != self._parent_pid:
                        self._engine_lost("the engine's process has exited")
                        return
                    continue
                message = pickle.loads(await self._sock.recv())
                if message[0] == "outs":
                    _, outs, stats = message
                    if stats is not None:
                        self.state = replace(self.state, stats=stats)
                    streams = self._streams
                    for t in outs:
                        inbox = streams.get(t[0])
                        if inbox is not None:  # else the client left and a cancel is on its way
                            inbox.put(_unwire(t))
                elif message[0] == "state":
                    self.state = message[1]
                    self._changed.set()
                elif message[0] == "reply":
                    _, call_id, result, error = message
                    future = self._calls.get(call_id)
                    if future is not None and not future.done():
                        if error is None:
                            future.set_result(result)
                        else:
                            future.set_exception(EngineError(error[0], error[1], error[2]))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a broken link: every open stream ends, /ping turns FAILED
            log.exception("the link to the engine failed")
            self._engine_lost(f"{type(e).__name__}: {e}")

    def _engine_lost(self, why: str) -> None:
        self._lost = why
        log.error("%s; failing %d open requests", why, len(self._streams))
        for rid, inbox in list(self._streams.items()):
            inbox.put(error_output(rid, f"the engine is not reachable: {why}", 503))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineError(f"the engine is not reachable: {why}", 503))
        self.state = replace(self.state, healthy=False, phase="failed" if self.state.phase == "loading" else "ready")
        self._changed.set()


async def _one(out: EngineOutput) -> AsyncIterator[EngineOutput]:
    yield out
