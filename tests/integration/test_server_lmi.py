"""The LMI protocol through a real aiohttp server on loopback, with the synthetic engine.

The synthetic engine echoes the prompt's token ids cyclically, so a prompt of n tokens with
max_new_tokens=2n generates exactly the prompt twice — expected outputs are known text.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from serverproc import SyntheticApp, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.serving.http import CONTEXT

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


@contextlib.asynccontextmanager
async def serve(
    config: LmiConfig | None = None, *, ready: bool = True, **kwargs: Any
) -> AsyncIterator[tuple[aiohttp.ClientSession, SyntheticApp, TestServer]]:
    sa = SyntheticApp(config or LmiConfig(max_input_len=64, max_output_len=256), **kwargs)
    async with TestServer(sa.app) as server, aiohttp.ClientSession(str(server.make_url(""))) as session:
        if ready:
            assert await wait_until(lambda: _healthy(session)), "server never became healthy"
        yield session, sa, server


async def _healthy(session: aiohttp.ClientSession) -> bool:
    async with session.get("/ping") as r:
        return r.status == 200


def _n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


async def _post(session: aiohttp.ClientSession, body: Any, path: str = "/invocations") -> tuple[int, str, bytes]:
    async with session.post(path, json=body) as r:
        return r.status, r.content_type, await r.read()


def _jsonlines(raw: bytes) -> list[dict]:
    return [orjson.loads(line) for line in raw.splitlines() if line.strip()]


def _sse(raw: bytes) -> list[dict]:
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), events[:3]
    return [orjson.loads(e[len(b"data: ") :]) for e in events]


async def test_json_output_is_the_echoed_multibyte_text_with_details():
    async with serve() as (session, _, _):
        n = _n_tokens(MULTI)
        status, ctype, raw = await _post(
            session, {"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n, "details": True}}
        )
        assert (status, ctype) == (200, "application/json")
        out = orjson.loads(raw)
        assert out["generated_text"] == MULTI * 2
        d = out["details"]
        assert d["finish_reason"] == "length" and d["generated_tokens"] == 2 * n and d["inputs"] == MULTI
        assert len(d["tokens"]) == 2 * n
        assert "".join(t["text"] for t in d["tokens"]) == MULTI * 2
        assert all(set(t) >= {"id", "text", "log_prob"} and isinstance(t["log_prob"], float) for t in d["tokens"])
        # without details only generated_text; return_full_text prepends the prompt
        status, _, raw = await _post(
            session, {"inputs": MULTI, "parameters": {"max_new_tokens": n, "return_full_text": True}}
        )
        assert orjson.loads(raw) == {"generated_text": MULTI * 2}


async def test_jsonlines_stream_reassembles_to_the_json_text():
    async with serve() as (session, _, _):
        params = {"max_new_tokens": 37}
        _, _, raw = await _post(session, {"inputs": MULTI, "parameters": params})
        expected = orjson.loads(raw)["generated_text"]
        status, ctype, raw = await _post(session, {"inputs": MULTI, "parameters": params, "stream": True})
        assert (status, ctype) == (200, "application/jsonlines")
        lines = _jsonlines(raw)
        assert len(lines) == 37
        assert all("token" in line for line in lines)
        assert all("generated_text" not in line for line in lines[:-1])
        assert "".join(line["token"]["text"] for line in lines) == expected
        # 37 tokens may end inside a character: only the final flush may show U+FFFD, as decode() does
        assert not any("\ufffd" in line["token"]["text"] for line in lines[:-1])
        assert lines[-1]["generated_text"] == expected
        assert "details" not in lines[-1]
        _, _, raw = await _post(session, {"inputs": MULTI, "parameters": {**params, "details": True}, "stream": True})
        assert _jsonlines(raw)[-1]["details"] == {"finish_reason": "length", "generated_tokens": 37, "inputs": MULTI}


async def test_sse_output_formatter():
    async with serve(LmiConfig(output_formatter="sse")) as (session, _, _):
        status, ctype, raw = await _post(
            session, {"inputs": "hello world", "parameters": {"max_new_tokens": 6}, "stream": True}
        )
        assert (status, ctype) == (200, "text/event-stream")
        events = _sse(raw)
        assert len(events) == 6 and events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
        # an explicit formatter applies to non-streaming requests too (DJL semantics)
        status, ctype, raw = await _post(session, {"inputs": "hello world", "parameters": {"max_new_tokens": 2}})
        assert ctype == "text/event-stream" and len(_sse(raw)) == 2


async def test_tgi_compat_shapes():
    async with serve(LmiConfig(tgi_compat=True)) as (session, _, _):
        _, ctype, raw = await _post(session, {"inputs": "hello", "parameters": {"max_new_tokens": 3}})
        out = orjson.loads(raw)
        assert ctype == "application/json" and isinstance(out, list) and len(out) == 1
        assert out[0]["details"]["tokens"][0].keys() >= {"id", "text", "logprob"}
        _, ctype, raw = await _post(session, {"inputs": "hello", "parameters": {"max_new_tokens": 3}, "stream": True})
        events = _sse(raw)
        assert ctype == "text/event-stream"
        assert "logprob" in events[0]["token"] and events[-1]["details"]["finish_reason"] == "length"


async def test_list_inputs_text_plain_and_predictions_route():
    async with serve() as (session, _, _):
        status, _, raw = await _post(
            session, {"inputs": ["ab", "日本"], "parameters": {"max_new_tokens": 2 * _n_tokens("日本")}}
        )
        out = orjson.loads(raw)
        assert status == 200 and [o["generated_text"] for o in out][1] == "日本日本"
        assert out[0]["generated_text"].startswith("ab")
        async with session.post("/invocations", data="Straße ".encode(), headers={"Content-Type": "text/plain"}) as r:
            assert r.status == 200 and (await r.json())["generated_text"].startswith("Straße Straße")
        status, _, raw = await _post(session, {"inputs": "x y"}, path="/predictions/tiny")
        assert status == 200 and orjson.loads(raw)["generated_text"].startswith("x yx y")
        status, _, raw = await _post(session, {"inputs": "x"}, path="/predictions/other")
        assert status == 404 and "'other'" in orjson.loads(raw)["error"]
        status, _, raw = await _post(session, {"inputs": ["a", "b"], "stream": True})
        assert status == 400 and "inputs" in orjson.loads(raw)["error"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("key", ["stop", "stop_sequences"])
async def test_stop_sequences_end_the_output(key, stream):
    async with serve() as (session, sa, _):
        body = {
            "inputs": "Grüße 日本 und 東京 danach",
            "parameters": {"max_new_tokens": 100, key: ["東京"], "details": True},
            "stream": stream,
        }
        status, _, raw = await _post(session, body)
        assert status == 200
        if stream:
            last = _jsonlines(raw)[-1]
            text, reason = last["generated_text"], last["details"]["finish_reason"]
        else:
            out = orjson.loads(raw)
            text, reason = out["generated_text"], out["details"]["finish_reason"]
        assert text == "Grüße 日本 und "
        assert reason == "stop_sequence"
        assert await wait_until(lambda: sa.engine.stats().active_requests == 0)
        assert sa.engine.stats().total_generated_tokens < 100


async def test_eos_in_the_output_finishes_with_eos_token():
    # The prompt's "</s>" must be the eos token for the echoing engine to emit it: allowed by option.
    async with serve(LmiConfig(max_input_len=64, max_output_len=256, parse_special_tokens=True)) as (session, _, _):
        _, _, raw = await _post(session, {"inputs": "done</s>", "parameters": {"max_new_tokens": 50, "details": True}})
        out = orjson.loads(raw)
        assert out["generated_text"] == "done" and out["details"]["finish_reason"] == "eos_token"
        assert out["details"]["tokens"][-1].get("special_token") is True


async def test_bad_inputs_get_a_4xx_naming_the_field_and_the_server_keeps_serving():
    cfg = LmiConfig(max_input_len=16, max_output_len=64, max_request_size=4096)
    long_prompt = "Grüße aus München! " * 10
    cases: list[tuple[bytes | dict, dict[str, str], int, list[str]]] = [
        (b'{"inputs": "x",', {}, 400, ["not valid JSON"]),
        (b"", {}, 400, ["empty"]),
        (b"[1, 2]", {}, 400, ["JSON object"]),
        ({"parameters": {}}, {}, 400, ["inputs"]),
        ({"inputs": 5}, {}, 400, ["inputs", "string"]),
        ({"inputs": "x", "parameters": {"max_new_tokens": "5"}}, {}, 400, ["parameters.max_new_tokens"]),
        ({"inputs": "x", "stream": "yes"}, {}, 400, ["stream"]),
        ({"inputs": long_prompt}, {}, 400, ["option.max_input_len=16", f"{_n_tokens(long_prompt)} tokens"]),
        ({"inputs": "x", "parameters": {"temperature": -1}}, {}, 400, ["parameters.temperature"]),
        (b'{"inputs": "x", "parameters": {"temperature": NaN}}', {}, 400, ["parameters.temperature"]),
        ({"inputs": "x", "parameters": {"top_p": 0}}, {}, 400, ["parameters.top_p"]),
        (
            {"inputs": "x", "parameters": {"max_new_tokens": 10**6}},
            {},
            400,
            ["max_new_tokens=1000000", "option.max_output_len=64"],
        ),
        ({"inputs": "x", "parameters": {"num_beams": 3}}, {}, 400, ["parameters.num_beams"]),
        ({"inputs": "x" * 5000}, {}, 413, ["max_request_size=4096"]),
        (b"\xff\xfe", {"Content-Type": "text/plain"}, 400, ["UTF-8"]),
    ]
    async with serve(cfg) as (session, _, _):
        for body, headers, want_status, fragments in cases:
            kw: dict[str, Any] = {"data": body, "headers": headers} if isinstance(body, bytes) else {"json": body}
            async with session.post("/invocations", **kw) as r:
                payload = await r.json()
                assert r.status == want_status, (body, payload)
                assert payload["code"] == want_status
                for f in fragments:
                    assert f in payload["error"], (body, payload)
            status, _, raw = await _post(
                session, {"inputs": "ok", "parameters": {"max_new_tokens": 2 * _n_tokens("ok")}}
            )
            assert status == 200 and orjson.loads(raw)["generated_text"] == "okok"


async def test_queue_over_job_queue_size_is_503():
    async with serve(LmiConfig(job_queue_size=2), tokens_per_second=20) as (session, sa, _):
        body = {"inputs": "slow", "parameters": {"max_new_tokens": 200}, "stream": True}
        held = [await session.post("/invocations", json=body) for _ in range(2)]
        for r in held:
            assert r.status == 200
            await r.content.readline()
        async with session.post("/invocations", json={"inputs": "one more"}) as r:
            assert r.status == 503 and r.headers.get("Retry-After")
            assert "job_queue_size=2" in (await r.json())["error"]
        for r in held:
            r.close()
        assert await wait_until(lambda: sa.engine.stats().active_requests == 0)
        status, _, _ = await _post(session, {"inputs": "now", "parameters": {"max_new_tokens": 1}})
        assert status == 200


async def test_ping_pending_then_healthy_and_requests_wait_for_it():
    async with serve(gate_open=False, ready=False) as (session, sa, _):
        async with session.get("/ping") as r:
            assert r.status == 503 and await r.json() == {"tiny": {"status": "PENDING"}}
        status, _, raw = await _post(session, {"inputs": "x"})
        assert status == 503 and "loading" in orjson.loads(raw)["error"]
        sa.gate.set()
        assert await wait_until(lambda: _healthy(session))
        async with session.get("/ping") as r:
            assert await r.json() == {"tiny": {"status": "Healthy"}}


async def test_ping_failed_when_load_fails_or_engine_dies():
    async with serve(fail_load="no weights here", ready=False) as (session, _, _):

        async def failed() -> bool:
            async with session.get("/ping") as r:
                return r.status == 503 and (await r.json())["tiny"]["status"] == "FAILED"

        assert await wait_until(failed)
        status, _, raw = await _post(session, {"inputs": "x"})
        assert status == 503 and "no weights here" in orjson.loads(raw)["error"]
    async with serve() as (session, sa, _):
        sa.engine.fail("GPU lost")
        async with session.get("/ping") as r:
            assert r.status == 503 and (await r.json())["tiny"]["status"] == "FAILED"


async def test_mid_stream_error_ends_with_an_error_record():
    async with serve(tokens_per_second=50) as (session, sa, _):
        async with session.post(
            "/invocations", json={"inputs": "abc", "parameters": {"max_new_tokens": 200}, "stream": True}
        ) as r:
            assert r.status == 200
            first = orjson.loads(await r.content.readline())
            assert first["token"]["id"] >= 0
            sa.engine.fail("CUDA error: device lost")
            rest = _jsonlines(await r.read())
        last = rest[-1]
        assert last["token"]["id"] == -1 and last["token"]["special_token"] is True
        assert last["details"]["finish_reason"] == "error"
        assert "device lost" in last["error"]


async def test_client_disconnect_mid_stream_cancels_the_engine_request():
    async with serve(tokens_per_second=50) as (session, sa, _):
        r = await session.post(
            "/invocations", json={"inputs": "abc", "parameters": {"max_new_tokens": 250}, "stream": True}
        )
        await r.content.readline()
        assert sa.engine.stats().active_requests == 1
        r.close()  # drops the connection
        assert await wait_until(lambda: sa.engine.stats().active_requests == 0, timeout=3)
        service = sa.app[CONTEXT].service
        assert await wait_until(lambda: service.in_system == 0)
        assert sa.engine.stats().total_generated_tokens < 250


async def test_client_disconnect_during_a_non_streamed_request_cancels_too():
    async with serve(tokens_per_second=50) as (session, sa, _):
        task = asyncio.ensure_future(
            session.post("/invocations", json={"inputs": "abc", "parameters": {"max_new_tokens": 250}})
        )
        assert await wait_until(lambda: sa.engine.stats().active_requests == 1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert await wait_until(lambda: sa.engine.stats().active_requests == 0, timeout=3)


async def test_unknown_routes_and_methods_are_json():
    async with serve() as (session, _, _):
        async with session.get("/nope") as r:
            assert r.status == 404 and (await r.json())["code"] == 404
        async with session.get("/invocations") as r:
            body = await r.json()
            assert r.status == 405 and "POST" in body["error"]


async def test_metrics():
    async with serve() as (session, _, _):
        await _post(session, {"inputs": "hi", "parameters": {"max_new_tokens": 4}})
        await _post(session, {"inputs": 5})
        async with session.get("/metrics") as r:
            text = await r.text()
            assert r.status == 200 and r.content_type == "text/plain"
        assert 'lmi_http_requests_total{route="/invocations",status="200"} 1.0' in text
        assert 'lmi_http_requests_total{route="/invocations",status="400"} 1.0' in text
        assert 'lmi_time_to_first_token_seconds_count{model_name="tiny"} 1.0' in text
        assert 'lmi_generation_tokens_total{model_name="tiny"} 4.0' in text
        assert "lmi_engine_queue_depth 0.0" in text and "lmi_requests_in_system 0.0" in text


async def test_graceful_shutdown_lets_in_flight_streams_finish():
    import socket

    from lmi_trt.serving.app import serve as serve_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sa = SyntheticApp(LmiConfig(), tokens_per_second=100)
    stop = asyncio.Event()
    server = asyncio.ensure_future(serve_app(sa.app, "127.0.0.1", port, shutdown_timeout=10, stop=stop))

    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:

        async def healthy() -> bool:
            try:
                return await _healthy(session)
            except aiohttp.ClientConnectionError:
                return False

        assert await wait_until(healthy)
        async with session.post(
            "/invocations", json={"inputs": "abc", "parameters": {"max_new_tokens": 40}, "stream": True}
        ) as r:
            await r.content.readline()
            stop.set()  # what SIGTERM does
            rest = _jsonlines(await r.read())
        assert len(rest) == 39 and rest[-1]["generated_text"].startswith("abcabc")
        await asyncio.wait_for(server, 5)
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get("/ping")
    assert sa.engine.stats().active_requests == 0 and not sa.engine.healthy  # closed on cleanup


async def test_disconnect_is_noticed_by_a_failing_write_when_handlers_are_not_cancelled(caplog):
    from aiohttp import web

    sa = SyntheticApp(LmiConfig(), tokens_per_second=50)
    runner = web.AppRunner(sa.app, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as session:
            assert await wait_until(lambda: _healthy(session))
            r = await session.post(
                "/invocations", json={"inputs": "abc", "parameters": {"max_new_tokens": 250}, "stream": True}
            )
            await r.content.readline()
            r.close()
            assert await wait_until(lambda: sa.engine.stats().active_requests == 0, timeout=3)
            assert await wait_until(lambda: sa.app[CONTEXT].service.in_system == 0)
    finally:
        await runner.cleanup()
    assert not [rec for rec in caplog.records if rec.levelname == "ERROR"], caplog.text


async def test_adapter_api_adds_routes_and_takes_other_bodies_at_invocations():
    """What a TGI/OpenAI adapter does: its own routes on the shared core, plus /invocations dispatch."""
    from aiohttp import web

    from lmi_trt.serving.core import GenerateParams
    from lmi_trt.serving.http import ServingContext, json_response, parse_json, read_body, request_properties
    from lmi_trt.serving.protocols import lmi

    async def complete(ctx: ServingContext, prompt: str, max_tokens: int) -> dict:
        async with await ctx.require_service().start(
            prompt, GenerateParams(max_new_tokens=max_tokens), field_name="prompt"
        ) as s:
            c = await s.collect()
        return {"text": c.text, "finish_reason": c.finish_reason.value, "usage": [c.prompt_tokens, c.generated_tokens]}

    def install_toy(app: web.Application, ctx: ServingContext) -> None:
        async def toy_route(request: web.Request) -> web.Response:
            body = parse_json(await read_body(request))
            return json_response({**await complete(ctx, body["prompt"], 4), "props": request_properties(request)})

        async def toy_invocation(request: web.Request, body: dict) -> web.Response:
            return json_response(await complete(ctx, body["prompt"], 2))

        app.router.add_post("/v1/toy", toy_route)
        ctx.invocation_handlers["prompt"] = toy_invocation

    async with serve(adapters=[lmi.install, install_toy]) as (session, _, _):
        headers = {"X-Amzn-SageMaker-Custom-Attributes": "a=1; b=two"}
        async with session.post("/v1/toy", json={"prompt": "ab"}, headers=headers) as r:
            out = await r.json()
        assert (
            out["text"].startswith("ab") and out["finish_reason"] == "length" and out["props"] == {"a": "1", "b": "two"}
        )
        status, _, raw = await _post(session, {"prompt": "xy"})
        assert status == 200 and orjson.loads(raw)["usage"][1] == 2
        status, _, raw = await _post(session, {"prompt": "x" * 100, "nothing": 1}, path="/v1/toy")
        assert status == 400 and "prompt has" in orjson.loads(raw)["error"]  # core errors name the adapter's field
        status, _, raw = await _post(session, {"messages": []})
        assert status == 400 and "'inputs', 'prompt'" in orjson.loads(raw)["error"]


async def test_serve_exits_with_1_once_the_model_failed():
    from lmi_trt.serving.app import serve as serve_app

    sa = SyntheticApp(LmiConfig(), fail_load="bad checkpoint")
    code = await asyncio.wait_for(serve_app(sa.app, "127.0.0.1", 0, exit_on_failure_after=0.1), 5)
    assert code == 1
