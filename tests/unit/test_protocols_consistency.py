"""One core, many schemas: the same request means the same thing in every schema.

Parametrized over LMI, TGI, OpenAI completions and chat, Triton, Truss and the SageMaker runtime
emulation: bad words never appear, stop strings end the output, multi-byte text is intact in
every streaming shape, and limits / validation errors are the same, each in its schema's shape.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from botocore.eventstream import EventStreamBuffer
from serverproc import SyntheticApp, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import Capabilities, can
from lmi_trt.engines.synthetic import CAPABILITIES, SyntheticEngine
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


class BadWordsEcho(SyntheticEngine):
    """The echo engine honouring bad_words_ids the way a real engine's ban does (never emits a
    banned sequence's last token), recording what it was asked to ban."""

    requests: list[Any] = []

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(CAPABILITIES, bad_words=can())

    def submit(self, request):
        it = super().submit(request)
        type(self).requests.append(request)
        seq = self._by_id.get(request.request_id)
        banned = {b[-1] for b in request.bad_words_ids}
        if seq is not None and banned:
            seq.cycle = [t for t in seq.cycle if t not in banned] or self._fallback_cycle
        return it


@dataclass(frozen=True)
class Schema:
    name: str
    body: Callable[..., tuple[str, dict[str, Any]]]
    output: Callable[[bytes, str], tuple[str, list[str]]]  # (text, pieces as streamed)
    error: Callable[[bytes], str]  # the message, after checking the shape


def _sse(raw: bytes) -> list[Any]:
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), events[:3]
    return [orjson.loads(e[6:]) for e in events if e != b"data: [DONE]"]


def _lines(raw: bytes) -> list[Any]:
    return [orjson.loads(x) for x in raw.splitlines() if x.strip()]


def _lmi_err(raw: bytes) -> str:
    body = orjson.loads(raw)
    assert set(body) == {"error", "code", "type"}
    return body["error"]


def _openai_err(raw: bytes) -> str:
    body = orjson.loads(raw)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["message"]


def _tgi_err(raw: bytes) -> str:
    body = orjson.loads(raw)
    assert set(body) == {"error", "error_type"}
    return body["error"]


def _triton_err(raw: bytes) -> str:
    body = orjson.loads(raw)
    assert set(body) == {"error"}
    return body["error"]


def _sagemaker_err(raw: bytes) -> str:
    body = orjson.loads(raw)
    assert body["ErrorCode"] == "CLIENT_ERROR_FROM_MODEL" and body["OriginalStatusCode"] == 400
    return body["OriginalMessage"]


def lmi(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    p = {
        k: v
        for k, v in {
            "max_new_tokens": max_tokens,
            "stop_sequences": stop,
            "bad_words": bad,
            "temperature": temperature,
            "top_p": top_p,
        }.items()
        if v is not None
    }
    return "/invocations", {"inputs": prompt, "parameters": p, "stream": stream}


def lmi_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["generated_text"], []
    lines = _lines(raw)
    return lines[-1]["generated_text"], [x["token"]["text"] for x in lines]


def tgi(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    p = {
        k: v
        for k, v in {
            "max_new_tokens": max_tokens,
            "stop": stop,
            "bad_words": bad,
            "temperature": temperature,
            "top_p": top_p,
        }.items()
        if v is not None
    }
    return ("/generate_stream" if stream else "/generate"), {"inputs": prompt, "parameters": p}


def tgi_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["generated_text"], []
    events = _sse(raw)
    return events[-1]["generated_text"], [e["token"]["text"] for e in events]


def _oai(prompt, max_tokens, stop, bad, temperature, top_p, stream) -> dict[str, Any]:
    body = {
        k: v
        for k, v in {
            "max_tokens": max_tokens,
            "stop": stop,
            "bad_words": bad,
            "temperature": temperature,
            "top_p": top_p,
        }.items()
        if v is not None
    }
    return {"model": "tiny", "stream": stream, **body}


def completions(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    return "/v1/completions", {"prompt": prompt, **_oai(prompt, max_tokens, stop, bad, temperature, top_p, stream)}


def completions_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["choices"][0]["text"], []
    pieces = [e["choices"][0]["text"] for e in _sse(raw) if e["choices"]]
    return "".join(pieces), pieces


def chat_(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    return "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}],
        **_oai(prompt, max_tokens, stop, bad, temperature, top_p, stream),
    }


def chat_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["choices"][0]["message"]["content"], []
    pieces = [e["choices"][0]["delta"].get("content", "") for e in _sse(raw) if e["choices"]]
    return "".join(pieces), pieces


def chat_invocations(prompt, **kw):
    return "/invocations", chat_(prompt, **kw)[1]


def chat_lines_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["choices"][0]["message"]["content"], []
    pieces = [x["choices"][0]["delta"].get("content", "") for x in _lines(raw)]
    return "".join(pieces), pieces


def triton(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    body = {
        k: v
        for k, v in {
            "max_tokens": max_tokens,
            "stop_words": stop,
            "bad_words": bad,
            "temperature": temperature,
            "top_p": top_p,
        }.items()
        if v is not None
    }
    return f"/v2/models/ensemble/generate{'_stream' if stream else ''}", {"text_input": prompt, **body}


def triton_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["text_output"], []
    pieces = [e["text_output"] for e in _sse(raw)]
    return "".join(pieces), pieces


def truss(prompt, *, max_tokens=None, stop=None, bad=None, temperature=None, top_p=None, stream=False):
    body = {
        k: v
        for k, v in {"max_tokens": max_tokens, "stop_words_list": stop, "bad_words_list": bad}.items()
        if v is not None
    }
    assert temperature is None and top_p is None  # not Truss fields
    return "/invocations", {"prompt": prompt, "stream": stream, **body}


def truss_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype == "application/json":
        return orjson.loads(raw)["text"], []
    return raw.decode(), []  # chunks are checked as they arrive, see _post


def sagemaker(prompt, **kw):
    path, body = lmi(prompt, **kw)
    return f"/endpoints/ep/invocations{'-response-stream' if kw.get('stream') else ''}", body


def sagemaker_out(raw: bytes, ctype: str) -> tuple[str, list[str]]:
    if ctype != "application/vnd.amazon.eventstream":
        return lmi_out(raw, ctype)
    buf = EventStreamBuffer()
    buf.add_data(raw)
    parts = [m.payload for m in buf]
    for p in parts:
        p.decode()  # every part is whole characters
    return lmi_out(b"".join(parts), "application/jsonlines")


SCHEMAS = [
    Schema("lmi", lmi, lmi_out, _lmi_err),
    Schema("tgi", tgi, tgi_out, _tgi_err),
    Schema("openai-completions", completions, completions_out, _openai_err),
    Schema("openai-chat", chat_, chat_out, _openai_err),
    Schema("chat-at-invocations", chat_invocations, chat_lines_out, _lmi_err),
    Schema("triton", triton, triton_out, _triton_err),
    Schema("truss", truss, truss_out, _lmi_err),
    Schema("sagemaker", sagemaker, sagemaker_out, _sagemaker_err),
]
IDS = [s.name for s in SCHEMAS]


@contextlib.asynccontextmanager
async def serve(config: LmiConfig | None = None):
    sa = SyntheticApp(config or LmiConfig(max_input_len=64, max_output_len=256), adapters=DEFAULT_ADAPTERS)
    # swap in the ban-honouring echo engine with the same limits
    eng = sa.engine
    sa.engine = BadWordsEcho(
        eng.vocab_size,
        eos_token_id=eng.eos_token_id,
        max_input_len=eng.limits.max_input_len,
        max_new_tokens=eng._max_new_tokens,
        special_token_ids=sa.tokenizer.all_special_ids,
    )
    async with TestServer(sa.app, host="127.0.0.1") as server, aiohttp.ClientSession(str(server.make_url(""))) as s:

        async def ready() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        assert await wait_until(ready)
        yield s


async def _post(s: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> tuple[int, str, bytes]:
    async with s.post(path, json=body) as r:
        chunks = [c async for c in r.content.iter_any()]
        if r.content_type == "text/plain":
            for c in chunks:
                c.decode()  # a Truss text chunk never ends inside a character
        return r.status, r.content_type, b"".join(chunks)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("schema", SCHEMAS, ids=IDS)
async def test_stop_strings_end_the_output(schema: Schema, stream: bool):
    async with serve() as s:
        path, body = schema.body("one two three four five", max_tokens=60, stop=["three"], stream=stream)
        status, ctype, raw = await _post(s, path, body)
        assert status == 200, raw
        text, _ = schema.output(raw, ctype)
        assert text.endswith("one two ") and "three" not in text, text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("schema", SCHEMAS, ids=IDS)
async def test_bad_words_never_appear(schema: Schema, stream: bool):
    BadWordsEcho.requests.clear()
    async with serve() as s:
        path, body = schema.body("one two three two one", max_tokens=30, bad=["two"], stream=stream)
        status, ctype, raw = await _post(s, path, body)
        assert status == 200, raw
        text, _ = schema.output(raw, ctype)
        assert "two" not in text and "one" in text and "three" in text, text
        (req,) = BadWordsEcho.requests
        assert req.bad_words_ids, "the schema's bad-words field did not reach the engine"


@pytest.mark.parametrize("schema", SCHEMAS, ids=IDS)
async def test_multibyte_text_is_intact_in_every_streaming_shape(schema: Schema):
    n = 2 * len(tiny_tokenizer().encode(MULTI))  # the echo engine: exactly the prompt twice, no cut character
    async with serve() as s:
        path, body = schema.body(MULTI, max_tokens=n)
        status, ctype, raw = await _post(s, path, body)
        whole, _ = schema.output(raw, ctype)
        path, body = schema.body(MULTI, max_tokens=n, stream=True)
        status, ctype, raw = await _post(s, path, body)
        assert status == 200 and ctype != "application/json", (status, ctype)
        text, pieces = schema.output(raw, ctype)
        assert text == whole and MULTI in text
        assert "\ufffd" not in text and not any("\ufffd" in p for p in pieces)


CASES = {
    "prompt-too-long": (dict(prompt="word " * 80), "more than option.max_input_len=64"),
    "too-many-tokens": (dict(max_tokens=257), "is more than option.max_output_len=256"),
    "zero-tokens": (dict(max_tokens=0), "greater than or equal to 1"),
    "negative-temperature": (dict(temperature=-1.0), "greater than or equal to 0"),
    "top-p-above-1": (dict(top_p=1.5), "less than or equal to 1"),
    "empty-stop": (dict(stop=[""]), "non-empty"),
    "too-many-stops": (dict(stop=[f"s{i}" for i in range(65)]), "at most 64 items"),
    "too-many-bad-words": (dict(bad=[f"b{i}" for i in range(65)]), "at most 64 items"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("schema", SCHEMAS, ids=IDS)
async def test_limits_and_validation_errors_are_the_same_everywhere(schema: Schema, case: str, request):
    kwargs, words = CASES[case]
    kwargs = dict(kwargs)
    prompt = kwargs.pop("prompt", "hello")
    if schema.name == "truss" and ("temperature" in kwargs or "top_p" in kwargs):
        pytest.skip("Truss payloads have no temperature/top_p")
    if schema.name in ("truss", "triton") and case == "empty-stop":
        pytest.skip('Triton/Truss word lists skip empty words: [""] is Truss\' own default for "none"')
    async with serve() as s:
        path, body = schema.body(prompt, **kwargs)
        status, ctype, raw = await _post(s, path, body)
        expected = 424 if schema.name == "sagemaker" else 400  # the runtime wraps the container's 400 in a ModelError
        assert status == expected and ctype == "application/json", (status, raw)
        assert words in schema.error(raw), raw
