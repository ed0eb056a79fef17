"""Clients that drop mid-generation, through the production serving path (``serving.app.serve``:
handler cancellation on, every protocol adapter) on loopback, with the synthetic engine.

* 100 streams of every schema dropped at once mid-generation: every engine slot frees, the
  admission count is back to zero and no dropped stream runs on to its end.
* 1,000 drops in waves, at every phase (before headers, mid-stream, during a non-streamed
  request): nothing is left behind — no engine sequence, admission slot, background task,
  asyncio task, GenerationStream object or file descriptor.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from serverproc import SyntheticApp, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.serving.app import serve as serve_app
from lmi_trt.serving.core import GenerationStream
from lmi_trt.serving.http import CONTEXT
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

pytestmark = pytest.mark.slow

STEPS_PER_S = 200  # a step every 5 ms: "a few steps" is a few tens of ms
MAX_NEW = 400  # ~2 s: no stream can finish before it is dropped
LONG_NEW = 100_000  # ~8 min: no stream ends before it is dropped, however loaded the machine
BOUND_S = 120  # how long a guaranteed condition may take to hold on a loaded machine


def streams(max_new: int) -> list[tuple[str, dict[str, Any], bool]]:
    """(path, body, streamed) for every streaming schema, plus one non-streamed request."""
    return [
        ("/invocations", {"inputs": "drop me", "parameters": {"max_new_tokens": max_new}, "stream": True}, True),
        ("/generate_stream", {"inputs": "drop me", "parameters": {"max_new_tokens": max_new}}, True),
        ("/v1/completions", {"prompt": "drop me", "max_tokens": max_new, "stream": True}, True),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "drop me"}], "max_tokens": max_new, "stream": True},
            True,
        ),
        ("/v2/models/tiny/generate_stream", {"text_input": "drop me", "max_tokens": max_new}, True),
        ("/invocations", {"prompt": "drop me", "max_tokens": max_new}, True),  # Truss: a text/plain stream
        ("/invocations", {"inputs": "drop me", "parameters": {"max_new_tokens": max_new}}, False),  # not streamed
    ]


STREAMS = streams(MAX_NEW)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def running(config: LmiConfig, **engine: Any) -> AsyncIterator[tuple[SyntheticApp, int]]:
    sa = SyntheticApp(config, adapters=DEFAULT_ADAPTERS, **engine)
    port = _free_port()
    stop = asyncio.Event()
    task = asyncio.ensure_future(serve_app(sa.app, "127.0.0.1", port, shutdown_timeout=5, stop=stop))
    try:
        assert await wait_until(lambda: _ping(port), timeout=30), "server never became healthy"
        yield sa, port
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


async def _ping(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await reader.read()
    writer.close()
    return data.startswith(b"HTTP/1.1 200")


async def _open(port: int, path: str, body: dict[str, Any], wait_for_bytes: bool) -> asyncio.StreamWriter:
    """Send the request; for a stream wait for the first body bytes; return the writer to drop."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = orjson.dumps(body)
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    await writer.drain()
    if wait_for_bytes:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert await asyncio.wait_for(reader.read(1), BOUND_S)  # the first token is on the wire
    return writer


def _drop(writer: asyncio.StreamWriter) -> None:
    """Abort the connection (RST), as a killed client does."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    writer.transport.abort()


def _leftovers(sa: SyntheticApp) -> dict[str, int]:
    engine = sa.engine
    service = sa.app[CONTEXT].service
    return {
        "engine_active": engine.stats().active_requests,
        "engine_queued": engine.stats().queued_requests,
        "engine_sequences": len(engine._by_id),
        "in_system": service.in_system,
        "background": len(service._background),
    }


async def test_hundred_streams_dropped_free_every_slot():
    """What is guaranteed, whatever the machine's load: every slot frees, nothing is left behind
    and no dropped stream runs on to its end. Streams are long enough (LONG_NEW steps, minutes at
    STEPS_PER_S) that none can end before all are open and dropped; the waits are bounds, not speeds."""
    long_streams = streams(LONG_NEW)
    async with running(LmiConfig(max_output_len=LONG_NEW), tokens_per_second=STEPS_PER_S) as (sa, port):
        opened = []
        for i in range(100):
            path, body, streamed = long_streams[i % len(long_streams)]
            opened.append(_open(port, path, body, wait_for_bytes=streamed))
        writers = await asyncio.gather(*opened)
        assert await wait_until(lambda: sa.engine.stats().active_requests == 100, timeout=BOUND_S)
        tokens_at_drop = sa.engine.stats().total_generated_tokens
        t0 = time.monotonic()
        for w in writers:
            _drop(w)
        assert await wait_until(lambda: sa.engine.stats().active_requests == 0, timeout=BOUND_S, interval=0.002)
        freed_after = time.monotonic() - t0
        steps_after = (sa.engine.stats().total_generated_tokens - tokens_at_drop) / 100
        assert await wait_until(lambda: _leftovers(sa) == dict.fromkeys(_leftovers(sa), 0), timeout=BOUND_S), (
            _leftovers(sa)
        )
        assert sa.engine.stats().total_generated_tokens < 100 * LONG_NEW  # none ran on to its end
        print(f"disconnects: 100 dropped, slots free after {freed_after * 1000:.0f} ms ({steps_after:.1f} steps)")


async def test_a_thousand_drops_leave_nothing_behind():
    config = LmiConfig(max_output_len=MAX_NEW, job_queue_size=64)
    async with running(config, tokens_per_second=STEPS_PER_S, max_batch_size=64) as (sa, port):

        async def one_wave(wave: int, size: int) -> None:
            opened = []
            for i in range(size):
                path, body, streamed = STREAMS[(wave + i) % len(STREAMS)]
                # every 5th waits for no byte at all: dropped before headers / while queued
                opened.append(_open(port, path, body, wait_for_bytes=streamed and i % 5 != 0))
            writers = await asyncio.gather(*opened)
            await asyncio.sleep(0.01 * (wave % 3))  # vary how far generation got
            for w in writers:
                _drop(w)

        await one_wave(0, 20)  # warm-up: caches, lazily created objects
        assert await wait_until(lambda: _leftovers(sa) == dict.fromkeys(_leftovers(sa), 0), timeout=60)
        gc.collect()
        fds_before = len(os.listdir("/proc/self/fd"))
        tasks_before = len(asyncio.all_tasks())
        t0 = time.monotonic()
        dropped = 0
        for wave in range(1, 21):
            await one_wave(wave, 50)
            dropped += 50
        assert dropped == 1000
        assert await wait_until(lambda: _leftovers(sa) == dict.fromkeys(_leftovers(sa), 0), timeout=60), _leftovers(sa)
        # aiohttp finishes closing the aborted transports (their handler tasks) in its own time: a bound
        # that holds under load, not a speed
        assert await wait_until(lambda: len(asyncio.all_tasks()) <= tasks_before, timeout=60), [
            t.get_name() for t in asyncio.all_tasks()
        ]
        gc.collect()
        assert await wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds_before + 2, timeout=60)
        assert not [o for o in gc.get_objects() if type(o) is GenerationStream]
        # and it still serves
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = orjson.dumps({"inputs": "ok", "parameters": {"max_new_tokens": 2}})
        writer.write(
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        response = await reader.read()
        writer.close()
        assert response.startswith(b"HTTP/1.1 200") and b'"generated_text":"ok' in response
        print(f"disconnects: 1000 dropped in {time.monotonic() - t0:.1f} s; engine totals {sa.engine.stats()}")
