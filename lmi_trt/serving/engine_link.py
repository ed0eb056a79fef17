"""The channel between the engine's process and its front ends (``option.api_server_count`` > 1): one Unix stream
socket per front end, on each side's event loop (asyncio), each message its length and then its bytes.

The engine side (``EngineServer``, listening) runs the engine and forwards every request's outputs; the front end
side (``RemoteEngine``, connected) is an ``Engine`` to the serving layer, which sees no difference. A message costs
one write on one side and one read on the other, on the event loops' own threads. ZeroMQ, this link's first
transport, hands every message to an I/O thread of its own on each side and wakes it: the engine's process took a
fifth more CPU per token over it (benchmarks/README.md, "The engine link over Unix sockets"). A side learns at once
that the other has gone: when a process ends, the kernel closes its sockets.

Outputs are coalesced per front end: all that the engine delivers in one turn of the event loop (one engine step)
leave as one message of plain tuples, not one message per token per request; an engine that can
(``BatchedEngine``) hands a step's outputs over in one call, with no task per request in this process. Front ends
send a request (its ``GenerationRequest``) once and a cancel when its client leaves.

Flow control: a front end acknowledges each outputs message once its streams have taken them, and at most
``WINDOW`` are unacknowledged; what the engine produces meanwhile waits here and leaves as one message, and the
front end merges a request's deltas. A front end that falls behind thus gets fewer, larger deltas (as one process
does) rather than a queue growing in the socket, whose delay every new request's first token would wait behind.
One that stops reading (stopped, hung: alive, so not replaced) is sent no heartbeat or figures while what was sent
before still waits (a later state says all an earlier one did), so what waits for it here stays bounded.

Messages are pickled tuples: ``("hello", name)``, ``("submit", request)``, ``("cancel", request_id)``,
``("ack", n)`` and ``("call", id, method, args)`` (the LoRA registry) to the engine; ``("reply", id, result,
error)`` and ``("state", EngineState)`` back. Outputs go back as ``b"o"`` and marshal's bytes of ``([output tuple,
...], pickled EngineStats | None)`` (the engine's figures with the outputs that ended a request, and to every other
front end alone): marshal writes and reads plain tuples several times faster than pickle, and both ends run one
Python (marshal's format may differ between versions: docs.python.org/3/library/marshal.html). Outputs marshal
cannot write (a beam search's ``Beam``) go as a pickled ``("outs", outputs, stats)``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import marshal
import os
import pickle
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Hashable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from lmi_trt.engines import base
from lmi_trt.engines.base import (
    AdapterHost,
    AdapterInfo,
    BatchedEngine,
    Engine,
    EngineError,
    EngineOutput,
    FinishReason,
    GenerationRequest,
    OutputChannel,
    TokenDelta,
    error_output,
)

log = logging.getLogger(__name__)

# Front ends hear the engine's health and statistics this often (for /ping and /metrics).
HEARTBEAT_S = 0.25
# Outputs messages in flight to one front end (sent, not yet acknowledged): two, so that the next is on its way
# while the front end handles one.
WINDOW = 2
_PICKLE = pickle.HIGHEST_PROTOCOL
_OUTS = b"o"  # an outputs message's first byte (a pickle's is b"\x80")
_LENGTH = struct.Struct("!I")  # each message on a socket: its length, then its bytes


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
    model_config: Mapping[str, Any] | None = None  # the model's sizes (Triton's lora_weights rows are read by them)


# What a front end may ask the engine to do besides generating: the LoRA registry (engines/base.py AdapterHost).
_CALLS = ("register_adapter", "unregister_adapter")


def _adapters(engine: Engine) -> tuple[AdapterInfo, ...]:
    return tuple(engine.adapters()) if isinstance(engine, AdapterHost) else ()


_REASON = [f.name for f in fields(EngineOutput)].index("finish_reason")


def _wire(out: EngineOutput) -> tuple:
    """An output as a plain tuple (which marshal can write, and pickle several times faster than the dataclass and
    its enum): a plain delta (tokens and their log-probs, the rest unset: nearly every output) as its first three
    fields (``TokenDelta``), else every field in order with the finish reason by value."""
    if out.finished or out.queue_time_s is not None or out.top_logprobs is not None or out.prompt_logprobs is not None:
        t = tuple(vars(out).values())  # a dataclass's attributes, in its fields' order
        reason = out.finish_reason
        return (*t[:_REASON], reason.value if reason is not None else None, *t[_REASON + 1 :])
    return (out.request_id, out.token_ids, out.logprobs)


def _encode_outputs(outs: list[tuple], stats: base.EngineStats | None) -> bytes:
    try:
        return _OUTS + marshal.dumps((outs, None if stats is None else pickle.dumps(stats, _PICKLE)))
    except ValueError:  # "unmarshallable object": a beam search's final output
        return pickle.dumps(("outs", outs, stats), _PICKLE)


def read_message(payload: bytes) -> tuple:
    """A message from the engine as its tuple (``("outs", outputs, EngineStats | None)`` for outputs)."""
    if payload[:1] == _OUTS:
        outs, stats = marshal.loads(memoryview(payload)[1:])
        return ("outs", outs, None if stats is None else pickle.loads(stats))
    return pickle.loads(payload)


def _unwire(t: tuple) -> EngineOutput:
    out = EngineOutput(*t)
    if out.finish_reason is not None:
        out.finish_reason = FinishReason(out.finish_reason)
    return out


def _merge(items: collections.deque[EngineOutput]) -> EngineOutput:
    """The deltas waiting for one stream as one (as an engine gives a consumer that fell behind): tokens and their
    log-probs in order; the first's prompt log-probs and queue time; the last's end. An error is never merged
    into: it stays an output of its own."""
    out = items.popleft()
    while items and not out.finished and items[0].error is None:
        nxt = items.popleft()
        out.token_ids = out.token_ids + nxt.token_ids
        if out.logprobs is not None or nxt.logprobs is not None:
            out.logprobs = (out.logprobs or []) + (nxt.logprobs or [])
        if out.top_logprobs is not None or nxt.top_logprobs is not None:
            out.top_logprobs = (out.top_logprobs or []) + (nxt.top_logprobs or [])
        out.prompt_logprobs = out.prompt_logprobs if out.prompt_logprobs is not None else nxt.prompt_logprobs
        out.queue_time_s = out.queue_time_s if out.queue_time_s is not None else nxt.queue_time_s
        out.finished, out.finish_reason, out.beams = nxt.finished, nxt.finish_reason, nxt.beams
    return out


class _Inbox(OutputChannel):
    """One stream's outputs as they arrive from the link (which would otherwise fill and empty an asyncio.Queue once
    per token); what arrived since the last read is read as one."""

    __slots__ = ()

    async def get(self) -> EngineOutput:
        await self.ready()
        return self.items.popleft() if len(self.items) == 1 else _merge(self.items)


def frame(payload: bytes) -> bytes:
    """A message as it goes on the socket."""
    return _LENGTH.pack(len(payload)) + payload


class Frames:
    """The messages of a byte stream, as its reads bring them."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The messages ``data`` completes (none, or several: one read takes what has arrived)."""
        buffer = self._buffer
        buffer += data
        messages, start, end = [], 0, len(buffer)
        while end - start >= 4:
            stop = start + 4 + _LENGTH.unpack_from(buffer, start)[0]
            if stop > end:
                break
            messages.append(bytes(buffer[start + 4 : stop]))
            start = stop
        del buffer[:start]
        return messages


class _Connection(asyncio.Protocol):
    """One end of one front end's socket: each whole message to ``on_message``, then ``on_drained`` once a read's
    are handled; ``on_lost`` when the other end has closed it (its process ended, or it closed the link)."""

    def __init__(
        self,
        on_message: Callable[[_Connection, bytes], None],
        on_lost: Callable[[_Connection], None],
        on_drained: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_drained = on_drained
        self._frames = Frames()
        self.transport: asyncio.Transport | None = None
        self.name: str | None = None  # on the engine's side: the front end's, from its hello

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a Unix stream socket's

    def data_received(self, data: bytes) -> None:
        for payload in self._frames.feed(data):
            self._on_message(self, payload)
        self._on_drained()

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_lost(self)

    def send(self, payload: bytes) -> None:
        """Writes at once (what the socket does not take now, asyncio's transport keeps and writes as it can);
        nothing once the link is closed."""
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(frame(payload))

    def backed_up(self) -> bool:
        """Whether what was written before still waits here: the other end is not reading (stopped, or hung)."""
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Peer:
    """A front end, as the engine's end sees it: its socket, outputs waiting to go, and messages it has not
    acknowledged."""

    __slots__ = ("connection", "ended", "pending", "unacked")

    def __init__(self, connection: _Connection) -> None:
        self.connection = connection
        self.pending: list[tuple] = []
        self.unacked = 0
        self.ended = False  # a pending output ends its request: the engine's figures go with them


class EngineServer:
    """The engine's end: serves ``hello``/``submit``/``cancel`` from every front end at ``address`` (a Unix socket's
    path, listening from here on: front ends may connect before ``start``); the ``OutputSink`` of a
    ``BatchedEngine``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(address)
        self._sock.listen(256)
        self._server: asyncio.AbstractServer | None = None
        self.engine: Engine | None = None
        self.state = EngineState()
        self._peers: dict[str, _Peer] = {}  # by the front end's name (its hello's)
        self._owner: dict[str, str] = {}  # request id → the front end that sent it, until its final output
        self._tasks: dict[str, asyncio.Task[None]] = {}  # a request no BatchedEngine sinks: a task relays it
        self._flushing = False
        self._ended = False  # a request ended since the last flush
        self._room = asyncio.Event()  # a front end's waiting outputs left (``taken``)
        self._background: set[asyncio.Task[None]] = set()
        self._heart: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(
            lambda: _Connection(self._receive, self._connection_lost), sock=self._sock
        )
        self._heart = loop.create_task(self._heartbeat(), name="lmi-engine-heartbeat")

    @property
    def in_flight(self) -> int:
        return len(self._owner)

    def ready(self, engine: Engine, tokenizer_dir: Path | None, model_config: Mapping[str, Any] | None = None) -> None:
        self.engine = engine
        if isinstance(engine, BatchedEngine):
            engine.attach(self)
        self.state = EngineState(
            "ready",
            name=engine.name,
            limits=engine.limits,
            capabilities=engine.capabilities,
            tokenizer_dir=tokenizer_dir,
            healthy=engine.healthy,
            stats=engine.stats(),
            adapters=_adapters(engine),
            model_config=model_config,
        )
        self._broadcast()

    def failed(self, error: str) -> None:
        self.state = EngineState("failed", error=error, healthy=False)
        self._broadcast()

    def frontend_gone(self, name: str) -> None:
        """A front end died (its supervisor says, or its socket closed): its requests are cancelled (their engine
        slots freed), nobody else's."""
        peer = self._peers.pop(name, None)
        if peer is not None:
            peer.connection.name = None  # its socket's closing is this death, not another
            peer.connection.close()
        self._room.set()  # what waited for it is no longer waited for (``taken`` looks again)
        gone = [rid for rid, owner in self._owner.items() if owner == name]
        if gone:
            log.warning("front end %s is gone: cancelling its %d requests", name, len(gone))
        for rid in gone:
            self._cancel(rid)

    def _connection_lost(self, connection: _Connection) -> None:
        name, connection.name = connection.name, None
        if name is not None:
            self.frontend_gone(name)

    async def close(self) -> None:
        for task in (self._heart, *self._tasks.values()):
            if task is not None:
                task.cancel()
        if self._heart is not None:
            await asyncio.gather(self._heart, return_exceptions=True)
        for peer in self._peers.values():
            peer.connection.name = None  # closing its socket is not a front end's death: nothing to cancel
            peer.connection.close()
        if self._server is not None:
            self._server.close()
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.address)

    # --- receiving
    def _receive(self, connection: _Connection, payload: bytes) -> None:
        name = connection.name
        try:
            message = pickle.loads(payload)
            kind = message[0]
            if kind == "hello":
                name = connection.name = message[1]
                self._peers[name] = _Peer(connection)
                self._send(name, ("state", self.state))
            elif name is None:  # nothing before its hello
                raise ValueError(f"a {kind!r} message before the front end's hello")
            elif kind == "submit":
                self._submit(name, message[1])
            elif kind == "ack":
                peer = self._peers.get(name)
                if peer is not None:
                    peer.unacked -= message[1]
                    if peer.pending:
                        self._schedule_flush()
            elif kind == "cancel":
                self._cancel(message[1])
            elif kind == "call":
                self._spawn(self._call(name, *message[1:]))
        except Exception:  # one front end's bad message is that message's loss, not the link's
            log.exception("a message from front end %s failed", name)

    def _submit(self, name: str, request: GenerationRequest) -> None:
        rid = request.request_id
        self._owner[rid] = name
        if self.engine is None:  # a front end only submits once it heard "ready"; a late one after a failure
            self.put([error_output(rid, "the engine is not running", 503)])
        elif isinstance(self.engine, BatchedEngine) and self.engine.sinks(request):
            self.engine.submit_to_sink(request)
        else:
            self._tasks[rid] = asyncio.get_running_loop().create_task(self._forward(request))

    async def _forward(self, request: GenerationRequest) -> None:
        assert self.engine is not None
        try:
            async for out in self.engine.submit(request):
                self.put([out])
        finally:
            self._tasks.pop(request.request_id, None)

    def _cancel(self, rid: str) -> None:
        if self.engine is not None and rid in self._owner:
            self._spawn(self.engine.cancel(rid))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _call(self, name: str, call_id: int, method: str, args: tuple) -> None:
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
        self._send(name, ("reply", call_id, result, error))

    # --- sending (OutputSink)
    def put(self, outputs: list[EngineOutput]) -> None:
        owner, peers = self._owner, self._peers
        for out in outputs:
            rid = out.request_id
            name = owner.pop(rid, None) if out.finished else owner.get(rid)
            peer = peers.get(name) if name is not None else None
            if peer is None:  # its front end has gone (its requests are being cancelled)
                continue
            peer.pending.append(_wire(out))
            if out.finished:
                peer.ended = self._ended = True
        self._schedule_flush()

    def put_deltas(self, deltas: list[TokenDelta]) -> None:
        owner, peers = self._owner, self._peers
        for delta in deltas:
            peer = peers.get(owner.get(delta[0]))  # type: ignore[arg-type]  # None: its front end has gone
            if peer is not None:
                peer.pending.append(delta)  # a plain delta is its own wire tuple (``_wire``)
        self._schedule_flush()

    def consumer(self, request_id: str) -> str | None:
        return self._owner.get(request_id)

    def backlogged(self, consumer: Hashable) -> bool:
        peer = self._peers.get(consumer)  # type: ignore[arg-type]  # a front end's name (``consumer``)
        return peer is not None and bool(peer.pending)

    def taken(self) -> Awaitable[None]:
        # Per front end, not all of them: an engine paced by the slowest of N front ends would make each wait for the
        # others' acknowledgements, and N front ends would serve no more than one. Cleared here, when the caller
        # found its requests backlogged, not once awaited: a flush in between (an acknowledgement) must wake it.
        self._room.clear()
        return self._room_made()

    async def _room_made(self) -> None:
        await asyncio.sleep(0)  # this step's flush first (scheduled before)
        if any(peer.pending for peer in self._peers.values()):
            await self._room.wait()

    def _schedule_flush(self) -> None:
        if not self._flushing:  # the other outputs of this engine step arrive in this turn of the loop
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self.engine is not None and self.engine.healthy != self.state.healthy:
            # A dead engine's last outputs (errors) reach the front ends after the news: /ping FAILED by then.
            self.state = replace(self.state, healthy=self.engine.healthy, stats=self.engine.stats())
            self._broadcast()
        stats = None
        if self._ended and self.engine is not None:
            # A request ended: every front end hears the engine's figures, its own with the last output, so
            # /metrics, wherever it is scraped, counts it gone as soon as its client has its last token (as with one
            # process).
            self._ended = False
            stats = self.engine.stats()
            self.state = replace(self.state, stats=stats)
        for peer in self._peers.values():
            if peer.pending and peer.unacked < WINDOW:
                ended, peer.ended = peer.ended, False
                outs, peer.pending = peer.pending, []
                peer.unacked += 1
                peer.connection.send(_encode_outputs(outs, self.state.stats if ended else None))
                self._room.set()
            elif stats is not None and not peer.connection.backed_up():  # else its next state brings them
                peer.connection.send(_encode_outputs([], stats))

    def _send(self, name: str, message: tuple) -> None:
        peer = self._peers.get(name)
        if peer is not None:  # else that front end has gone
            peer.connection.send(pickle.dumps(message, _PICKLE))

    def _broadcast(self, superseded: bool = False) -> None:
        """The state to every front end; ``superseded`` (a heartbeat's: a later one says all it does) not to one that
        is not reading, for which asyncio's transport would keep every heartbeat until it reads again."""
        payload = pickle.dumps(("state", self.state), _PICKLE)
        for peer in self._peers.values():
            if not (superseded and peer.connection.backed_up()):
                peer.connection.send(payload)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            if self.engine is not None:
                self.state = replace(self.state, healthy=self.engine.healthy, stats=self.engine.stats())
            self._broadcast(superseded=True)


class RemoteEngine:
    """The engine of another process, as the serving layer's ``Engine`` (engines/base.py's contract: ``submit``
    never raises; a request the engine cannot reach ends with a 503 final output)."""

    def __init__(self, address: str, name: str, parent_pid: int) -> None:
        self._address = address
        self._name = name
        # Request ids are unique within a front end (X-Request-Id and a count); the engine sees them with the front
        # end's name added, unique across front ends.
        self._suffix = "@" + name
        self._parent_pid = parent_pid
        self._link: _Connection | None = None
        self._closing = False
        self._streams: dict[str, _Inbox] = {}
        self.state = EngineState()
        self._changed = asyncio.Event()
        self._lost: str | None = None  # why the engine is unreachable
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._taken = 0  # outputs messages handled and not yet acknowledged

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
        if self._link is None or not self.healthy:
            return _one(error_output(rid, f"the engine is not reachable: {self._lost or 'its process is gone'}", 503))
        inbox = _Inbox()
        wire = replace(request, request_id=rid + self._suffix)
        self._streams[wire.request_id] = inbox
        self._send(("submit", wire))
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
        if self._link is not None and self._lost is None:
            self._send(("cancel", request_id + self._suffix))

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
        if self._link is None or self._lost is not None:
            raise EngineError(f"the engine is not reachable: {self._lost or 'not connected'}", 503)
        call_id = next(self._call_ids)
        future = self._calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self._send(("call", call_id, method, args))
            return await future
        finally:
            self._calls.pop(call_id, None)

    async def close(self) -> None:
        self._closing = True
        if self._link is not None:
            self._link.close()

    # --- the link
    async def connect(self) -> EngineState:
        """Connect and wait until the engine is ready or has failed; its state."""
        _, self._link = await asyncio.get_running_loop().create_unix_connection(
            lambda: _Connection(self._receive, self._link_closed, self._drained), self._address
        )
        self._send(("hello", self._name))
        while self.state.phase == "loading":
            self._changed.clear()
            await self._changed.wait()
        return self.state

    def _send(self, message: tuple) -> None:
        assert self._link is not None
        self._link.send(pickle.dumps(message, _PICKLE))

    def _drained(self) -> None:
        # One acknowledgement for the outputs messages just read, once the streams they woke have had their turn
        # (those run first); a second call in the turn finds nothing left to acknowledge.
        if self._taken:
            asyncio.get_running_loop().call_soon(self._ack)

    def _ack(self) -> None:
        taken, self._taken = self._taken, 0
        if taken and self._link is not None and self._lost is None:
            self._send(("ack", taken))

    def _link_closed(self, connection: _Connection) -> None:
        """The engine's process closed the link: it has exited (a front end outlives it only when it was killed), so
        every open stream ends and /ping turns FAILED."""
        if not self._closing and self._lost is None:
            self._engine_lost("the engine's process has exited")

    def _receive(self, connection: _Connection, payload: bytes) -> None:
        if self._lost is not None:
            return
        try:
            self._handle(read_message(payload))
        except Exception as e:  # a broken link: every open stream ends, /ping turns FAILED
            log.exception("the link to the engine failed")
            self._engine_lost(f"{type(e).__name__}: {e}")

    def _handle(self, message: tuple) -> None:
        if message[0] == "outs":
            _, outs, stats = message
            if stats is not None:
                self.state = replace(self.state, stats=stats)
            streams = self._streams
            for t in outs:
                inbox = streams.get(t[0])
                if inbox is not None:  # else the client left and a cancel is on its way
                    out = _unwire(t)
                    inbox.put_nowait(out)
                    if out.finished:  # nothing follows: forgotten here too, for a stream closed before its first
                        del streams[t[0]]  # read (a generator closed unstarted runs no ``finally``)
            self._taken += bool(outs)
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

    def _engine_lost(self, why: str) -> None:
        self._lost = why
        log.error("%s; failing %d open requests", why, len(self._streams))
        for rid, inbox in list(self._streams.items()):
            inbox.put_nowait(error_output(rid, f"the engine is not reachable: {why}", 503))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineError(f"the engine is not reachable: {why}", 503))
        self.state = replace(self.state, healthy=False, phase="failed" if self.state.phase == "loading" else "ready")
        self._changed.set()


async def _one(out: EngineOutput) -> AsyncIterator[EngineOutput]:
    yield out
