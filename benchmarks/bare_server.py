#!/usr/bin/env python
"""The bare baseline: an aiohttp server that streams pre-encoded token events, nothing else.

Same routes and the same bytes on the wire as lmi-trt (LMI jsonlines on /invocations, TGI SSE
on /generate_stream, OpenAI SSE on /v1/completions and /v1/chat/completions), N tokens per
request (the request's max_new_tokens / max_tokens, else --tokens), as fast as possible: no
engine, no tokenizer, no detokenization, no validation, no metrics, no access log. Every event
is encoded once at start-up (or once per new N); a request costs one JSON read of its body and
one ``resp.write`` per token.

Like a real server multiplexing many streams, each stream yields to the event loop after every
token (``--yield-every 1``, the default), so concurrent streams interleave token by token;
``--yield-every 0`` writes each stream to the end in one go (a ceiling, not a like-for-like
baseline). Run it pinned to one core (``taskset -c 0``) to compare with a server pinned the same.

    python benchmarks/bare_server.py --port 8081
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import orjson
from aiohttp import web

TOKEN_ID = 22172
TOKEN_TEXT = " hello"
LOG_PROB = -0.25
MODEL = "bare"
CREATED = int(time.time())


class Events:
    """Pre-encoded event bytes per wire format; lists of N events are cached per N."""

    def __init__(self) -> None:
        self.lmi_line = orjson.dumps({"token": {"id": TOKEN_ID, "text": TOKEN_TEXT, "log_prob": LOG_PROB}}) + b"\n"
        self._cache: dict[tuple[str, int, bool], list[bytes]] = {}
        self._tgi_events: list[bytes] = []

    def get(self, kind: str, n: int, flag: bool = False) -> list[bytes]:
        key = (kind, n, flag)
        ev = self._cache.get(key)
        if ev is None:
            ev = getattr(self, "_" + kind)(n, flag)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = ev
        return ev

    # LMI: {"token":{...}} per line, the last adds generated_text (and details when asked).
    def _lmi(self, n: int, details: bool) -> list[bytes]:
        last: dict = {
            "token": {"id": TOKEN_ID, "text": TOKEN_TEXT, "log_prob": LOG_PROB},
            "generated_text": TOKEN_TEXT * n,
        }
        if details:
            last["details"] = {"finish_reason": "length", "generated_tokens": n, "inputs": None}
        return [self.lmi_line] * (n - 1) + [orjson.dumps(last) + b"\n"]

    # TGI: data:{"index":i,"token":{...},"generated_text":null,"details":null}
    def _tgi_event(self, i: int, final: dict | None = None) -> bytes:
        ev = {
            "index": i,
            "token": {"id": TOKEN_ID, "text": TOKEN_TEXT, "logprob": LOG_PROB, "special": False},
            "generated_text": None,
            "details": None,
        }
        if final:
            ev.update(final)
        return b"data:" + orjson.dumps(ev) + b"\n\n"

    def _tgi(self, n: int, details: bool) -> list[bytes]:
        while len(self._tgi_events) < n:
            self._tgi_events.append(self._tgi_event(len(self._tgi_events)))
        final = {"generated_text": TOKEN_TEXT * n}
        if details:
            final["details"] = {"finish_reason": "length", "generated_tokens": n, "seed": None}
        return self._tgi_events[: n - 1] + [self._tgi_event(n - 1, final)]

    # OpenAI completions / chat chunks, then a usage chunk when asked for, then [DONE].
    def _openai(self, n: int, usage: bool, chat: bool) -> list[bytes]:
        if chat:
            base = {"id": "chatcmpl-bare", "object": "chat.completion.chunk", "created": CREATED, "model": MODEL}

            def chunk(content, finish=None, role=False):
                delta = {"role": "assistant", "content": ""} if role else {"content": content}
                return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        else:
            base = {"id": "cmpl-bare", "object": "text_completion", "created": CREATED, "model": MODEL}

            def chunk(content, finish=None, role=False):
                return {**base, "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": finish}]}

        def sse(obj) -> bytes:
            return b"data: " + orjson.dumps(obj) + b"\n\n"

        out = [sse(chunk("", role=True))] if chat else []
        out += [sse(chunk(TOKEN_TEXT))] * (n - 1) + [sse(chunk(TOKEN_TEXT, "length"))]
        if usage:
            out.append(
                sse({**base, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}})
            )
        out.append(b"data: [DONE]\n\n")
        return out

    def _completions(self, n: int, usage: bool) -> list[bytes]:
        return self._openai(n, usage, chat=False)

    def _chat(self, n: int, usage: bool) -> list[bytes]:
        return self._openai(n, usage, chat=True)


def build_app(default_tokens: int = 128, yield_every: int = 1) -> web.Application:
    events = Events()
    sleep = asyncio.sleep
    jsonlines = {"Content-Type": "application/jsonlines"}
    sse = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}

    async def stream(request: web.Request, evs: list[bytes], headers: dict) -> web.StreamResponse:
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        write = resp.write
        if yield_every <= 0:
            for ev in evs:
                await write(ev)
        elif yield_every == 1:
            for ev in evs:
                await write(ev)
                await sleep(0)
        else:
            for i, ev in enumerate(evs, 1):
                await write(ev)
                if i % yield_every == 0:
                    await sleep(0)
        await resp.write_eof()
        return resp

    async def body_of(request: web.Request) -> dict:
        try:
            obj = orjson.loads(await request.read())
            return obj if isinstance(obj, dict) else {}
        except orjson.JSONDecodeError:
            return {}

    def n_from(obj: dict, key: str, params: bool) -> int:
        src = obj.get("parameters") if params else obj
        try:
            n = int((src or {}).get(key) or default_tokens)
        except (TypeError, ValueError):
            n = default_tokens
        return max(1, n)

    async def invocations(request: web.Request) -> web.StreamResponse:
        obj = await body_of(request)
        details = bool((obj.get("parameters") or {}).get("details"))
        return await stream(request, events.get("lmi", n_from(obj, "max_new_tokens", True), details), jsonlines)

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        obj = await body_of(request)
        details = bool((obj.get("parameters") or {}).get("details"))
        return await stream(request, events.get("tgi", n_from(obj, "max_new_tokens", True), details), sse)

    def openai(kind: str):
        async def handler(request: web.Request) -> web.StreamResponse:
            obj = await body_of(request)
            n = n_from(obj, "max_completion_tokens" if "max_completion_tokens" in obj else "max_tokens", False)
            usage = bool((obj.get("stream_options") or {}).get("include_usage"))
            return await stream(request, events.get(kind, n, usage), sse)

        return handler

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bare"}]})

    app = web.Application()
    app.router.add_get("/ping", ping)
    app.router.add_get("/health", ping)
    app.router.add_post("/invocations", invocations)
    app.router.add_post("/generate_stream", generate_stream)
    app.router.add_post("/v1/completions", openai("completions"))
    app.router.add_post("/v1/chat/completions", openai("chat"))
    app.router.add_get("/v1/models", models)
    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per request when the request names none")
    ap.add_argument(
        "--yield-every", type=int, default=1, help="yield to the event loop after every K tokens (default 1; 0 = never)"
    )
    ap.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop (use the one the server under test uses)",
    )
    args = ap.parse_args(argv)
    if args.loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    app = build_app(args.tokens, args.yield_every)
    print(
        f"bare server on http://{args.host}:{args.port} (yield every {args.yield_every}, {args.loop})",
        file=sys.stderr,
        flush=True,
    )
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, handle_signals=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
