"""option.watchdog_timeout in-process: streams wait on an engine that stops producing tokens (the
synthetic engine with its step disabled, as a hung GPU would leave it) → /ping 503 FAILED with a log
line saying why; tokens flowing again → 200. Time nobody waits does not count, and requests cut by
option.predict_timeout do not hide the stall."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import ClientSession
from serverproc import serve_all_schemas, wait_until

from lmi_trt.config import LmiConfig


def served(**config):
    return serve_all_schemas(LmiConfig(max_input_len=128, max_output_len=4000, **config), tokens_per_second=50)


async def ping(s: ClientSession) -> int:
    async with s.get("/ping") as r:
        return r.status


def stall(engine) -> None:
    engine._step = lambda active: None  # the engine loop runs on; no sequence gets a token


def resume(engine) -> None:
    del engine._step


async def test_a_stalled_engine_with_requests_waiting_fails_ping_until_tokens_flow_again(caplog):
    async with served(watchdog_timeout=1) as (s, sa):
        body = {"inputs": "Hi there", "parameters": {"max_new_tokens": 60, "ignore_eos": True}, "stream": True}
        async with s.post("/invocations", json=body) as r:
            assert r.status == 200
            await r.content.readline()  # tokens are flowing
            stall(sa.engine)
            with caplog.at_level(logging.WARNING, logger="lmi_trt"):
                assert await wait_until(lambda: _failed(s), timeout=30)
                assert "watchdog: requests have waited" in caplog.text and "option.watchdog_timeout=1" in caplog.text
                resume(sa.engine)
                assert await wait_until(lambda: _healthy(s), timeout=30)
                assert "produces tokens again" in caplog.text
            lines = [line async for line in r.content if line.strip()]
        assert b'"generated_text"' in lines[-1] and not any(b'"error"' in line for line in lines)  # never cut


async def test_a_stalled_engine_nobody_waits_on_stays_healthy():
    async with served(watchdog_timeout=1) as (s, sa):
        stall(sa.engine)
        await asyncio.sleep(2)  # longer than the timeout, with no request waiting
        assert await ping(s) == 200


async def test_requests_cut_by_predict_timeout_do_not_hide_the_stall():
    async with served(watchdog_timeout=2, predict_timeout=1) as (s, sa):
        stall(sa.engine)
        body = {"inputs": "Hi there", "parameters": {"max_new_tokens": 60}}
        for _ in range(4):  # each waits 1 s and is cancelled; together they waited past the timeout
            async with s.post("/invocations", json=body) as r:
                assert r.status == 424 and "option.predict_timeout" in await r.text()
        assert await ping(s) == 503
        resume(sa.engine)
        async with s.post("/invocations", json={**body, "parameters": {"max_new_tokens": 3}}) as r:
            assert r.status == 200
        assert await wait_until(lambda: _healthy(s), timeout=30)


async def test_watchdog_timeout_0_is_off():
    async with served(watchdog_timeout=0, predict_timeout=1) as (s, sa):
        stall(sa.engine)
        for _ in range(3):
            async with s.post("/invocations", json={"inputs": "Hi", "parameters": {"max_new_tokens": 5}}) as r:
                assert r.status == 424
        assert await ping(s) == 200


async def _failed(s: ClientSession) -> bool:
    async with s.get("/ping") as r:
        return r.status == 503 and (await r.json()) == {"tiny": {"status": "FAILED"}}


async def _healthy(s: ClientSession) -> bool:
    return await ping(s) == 200
