"""A full server answers 503 before reading a request body (an overload burst of large bodies
is not buffered only to be refused)."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestServer
from serverproc import SyntheticApp, wait_until

from lmi_trt.config import LmiConfig


async def test_busy_server_refuses_before_the_body_arrives():
    sa = SyntheticApp(LmiConfig(max_input_len=64, max_output_len=256, job_queue_size=1), tokens_per_second=20)
    async with TestServer(sa.app) as server, aiohttp.ClientSession(str(server.make_url(""))) as s:

        async def ready() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        assert await wait_until(ready)
        body = {"inputs": "hello", "parameters": {"max_new_tokens": 200}, "stream": True}
        async with s.post("/invocations", json=body) as busy:
            assert busy.status == 200
            await busy.content.readline()  # the one admitted request is now in the system
            reader, writer = await asyncio.open_connection(server.host, server.port)
            # Headers promise 10 MB; only a few bytes follow. The answer must not wait for the rest.
            writer.write(
                b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 10000000\r\n\r\n{"inputs": '
            )
            await writer.drain()
            try:
                status_line = await asyncio.wait_for(reader.readline(), timeout=5)
            finally:
                writer.close()  # without this a server still waiting for the body would hang teardown
            assert status_line.split()[1] == b"503", status_line
