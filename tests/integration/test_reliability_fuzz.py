"""Bad input against the real server (`lmi-trt serve`, synthetic engine, every protocol adapter).

1. Schemathesis generates requests from the server's OpenAPI description (``/openapi.json``,
   built from the adapters' pydantic models) — valid ones and, in negative mode, ones that break
   the schema — and sends them to the server process: nothing may answer 5xx, the process must
   not crash, and every rejection must be a JSON 4xx whose message names a field.
2. Explicit cases the generator reaches rarely: bodies over ``max_request_size`` (with and without
   Content-Length), deeply nested JSON, invalid UTF-8, lone surrogates, huge ``max_new_tokens``,
   negative / NaN / infinite temperatures, empty prompts, prompts of exactly ``max_input_len``
   tokens and one over.

``LMI_FUZZ_EXAMPLES`` (default 200) and ``LMI_FUZZ_SEED`` (default: derandomized) widen a local run.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest
import requests
from cliserver import Server, serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

MAX_INPUT = 32
MAX_OUTPUT = 48
MAX_REQUEST = 64 * 1024
EXAMPLES = int(os.environ.get("LMI_FUZZ_EXAMPLES", "200"))
GENERIC = ("request body", "JSON", "UTF-8", "payload", "text/plain", "Content-Type")


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    args = [
        "--model-id",
        str(tiny_model("llama")),
        "--engine",
        "synthetic",
        "-o",
        f"option.max_input_len={MAX_INPUT}",
        "-o",
        f"option.max_output_len={MAX_OUTPUT}",
        "-o",
        f"max_request_size={MAX_REQUEST}",
    ]
    with serve(args, tmp_path_factory.mktemp("fuzz")) as srv:
        yield srv
        assert srv.proc.poll() is None, f"the server died:\n{srv.log()[-3000:]}"
    log = srv.log()
    assert "Traceback" not in log and "unhandled error" not in log, log[-5000:]


def spec_of(server: Server) -> dict[str, Any]:
    """The server's own /openapi.json when it serves one; else the same document built here from
    an app with the same adapters (until the lead adds openapi.install to DEFAULT_ADAPTERS)."""
    r = server.get("/openapi.json")
    if r.status_code == 200:
        return r.json()
    from lmi_trt.config import LmiConfig
    from lmi_trt.serving import openapi
    from lmi_trt.serving.app import build_app
    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

    async def never() -> Any:  # the app is only described, never started
        raise AssertionError

    adapters = DEFAULT_ADAPTERS if openapi.install in DEFAULT_ADAPTERS else (*DEFAULT_ADAPTERS, openapi.install)
    return openapi.build_spec(build_app(never, LmiConfig(), model_name="llama", adapters=adapters))


def property_names(node: Any) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                out.update(value)
            out |= property_names(value)
    elif isinstance(node, list):
        for item in node:
            out |= property_names(item)
    return out


def error_message(r: Any) -> str:
    """The message of a JSON error body (LMI, OpenAI, TGI, Triton or SageMaker shape); ``r`` is a
    requests or schemathesis response."""
    ctype = r.headers.get("content-type") or r.headers.get("Content-Type") or ""
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    assert ctype.startswith("application/json"), (r.status_code, r.headers, r.text[:300])
    body = json.loads(r.text)
    assert isinstance(body, dict), body
    err = body.get("error", body.get("Message"))
    if isinstance(err, dict):  # OpenAI
        err = err.get("message")
    assert isinstance(err, str) and err, body
    return err


def assert_stream_ended_cleanly(r: Any, where: str) -> None:
    """A 200 stream (jsonlines or SSE) must not end in an error record: every request error is known
    before the first byte, so one after it would be a server-side failure."""
    ctype = r.headers.get("content-type") or [""]
    ctype = ctype[0] if isinstance(ctype, list) else ctype
    if not ctype.startswith(("application/jsonlines", "text/event-stream")):
        return
    records = [line.removeprefix(b"data: ") for line in r.content.splitlines() if line.strip()]
    records = [x for x in records if x != b"[DONE]"]
    assert records, f"an empty stream: {where}"
    last = json.loads(records[-1])
    assert not (isinstance(last, dict) and last.get("error")), f"the stream ended with an error: {where}"


def names_token(msg: str, token: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(token)}(?![A-Za-z0-9_])", msg) is not None


def healthy_and_idle(server: Server) -> None:
    assert server.proc.poll() is None, server.log()[-3000:]
    assert server.get("/ping").status_code == 200
    metrics = server.get("/metrics").text
    assert re.search(r"^lmi_requests_in_system 0\.0$", metrics, re.M), metrics
    assert re.search(r"^lmi_engine_active_requests 0\.0$", metrics, re.M), metrics


# --- 1. generated -------------------------------------------------------------------------------
def test_openapi_document_describes_every_route(server):
    spec = spec_of(server)
    ops = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    for must in [
        ("GET", "/ping"),
        ("POST", "/invocations"),
        ("POST", "/predictions/{model}"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/generate"),
        ("POST", "/v2/models/{model}/generate"),
        ("POST", "/endpoints/{endpoint}/invocations"),
        ("GET", "/openapi.json"),
    ]:
        assert must in ops, must
    for path, item in spec["paths"].items():
        if "post" in item:
            schema = item["post"]["requestBody"]["content"]["application/json"]["schema"]
            assert schema != {"type": "object"}, f"POST {path} has no request model (lmi_trt.serving.http.add_post)"
    invocations = spec["paths"]["/invocations"]["post"]["requestBody"]["content"]
    refs = {ref["$ref"].rsplit("/", 1)[1] for ref in invocations["application/json"]["schema"]["anyOf"]}
    assert refs == {"LmiRequest", "ChatRequest", "CompletionRequest", "TrussRequest"} and "text/plain" in invocations
    lmi = spec["components"]["schemas"]["LmiParameters"]["properties"]
    assert lmi["temperature"]["anyOf"][0]["minimum"] == 0 and lmi["max_new_tokens"]["anyOf"][0]["minimum"] == 1


async def test_openapi_json_is_served_by_the_adapter():
    import asyncio

    import aiohttp
    from aiohttp.test_utils import TestServer

    from lmi_trt.config import LmiConfig
    from lmi_trt.serving import openapi
    from lmi_trt.serving.app import build_app
    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

    async def loading_for_ever() -> Any:
        await asyncio.Event().wait()

    adapters = DEFAULT_ADAPTERS if openapi.install in DEFAULT_ADAPTERS else (*DEFAULT_ADAPTERS, openapi.install)
    app = build_app(loading_for_ever, LmiConfig(), model_name="m", adapters=adapters)
    async with TestServer(app) as ts, aiohttp.ClientSession() as session:
        async with session.get(ts.make_url("/openapi.json")) as r:
            assert r.status == 200 and r.content_type == "application/json"
            doc = await r.json()
    assert doc["openapi"] == "3.1.0" and "/invocations" in doc["paths"] and "/openapi.json" in doc["paths"]
    ref = doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert doc["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]["max_tokens"]


def test_generated_requests_never_get_5xx_and_rejections_name_the_field(server):
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    spec = spec_of(server)
    schema = schemathesis.openapi.from_dict(spec)
    names = property_names(spec) | {"model", "endpoint", "version"}
    fixed = {"model": "llama", "version": "1", "endpoint": "fuzz-endpoint"}
    strategy = st.one_of(
        schema.as_strategy(GenerationMode.POSITIVE),
        schema.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed),
        schema.as_strategy(GenerationMode.NEGATIVE, path_parameters=fixed),
        schema.as_strategy(GenerationMode.NEGATIVE),
    )
    seen: dict[int, int] = {}
    session = requests.Session()
    seed = os.environ.get("LMI_FUZZ_SEED")

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=seed is None,
        phases=[Phase.explicit, Phase.generate],
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def check(case) -> None:
        r = case.call(base_url=server.url, session=session, timeout=30)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        where = (
            f"{case.method} {case.formatted_path} body={str(case.body)[:300]!r} -> {r.status_code} {r.content[:300]!r}"
        )
        assert r.status_code < 500, where
        if r.status_code == 200:
            assert_stream_ended_cleanly(r, where)
        if r.status_code >= 400:
            msg = error_message(r)
            values = [str(v) for v in (case.path_parameters or {}).values()]
            tokens = names | set(values) | {unquote(v) for v in values} | set(GENERIC)
            assert any(names_token(msg, t) for t in tokens if t), f"the error names no field: {where}"

    if seed is not None:
        check = __import__("hypothesis").seed(int(seed))(check)
    check()
    assert sum(seen.values()) >= EXAMPLES * 0.9
    assert any(200 <= s < 300 for s in seen), seen
    assert any(400 <= s < 500 for s in seen), seen
    print(f"fuzz: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}")
    healthy_and_idle(server)


# --- 2. explicit --------------------------------------------------------------------------------
ROUTES = [  # (path, body maker, the prompt field's name)
    ("/invocations", lambda p, **kw: {"inputs": p, "parameters": kw}, "inputs"),
    ("/generate", lambda p, **kw: {"inputs": p, "parameters": kw}, "inputs"),
    ("/v1/completions", lambda p, **kw: {"prompt": p, **_oai(kw)}, "prompt"),
    ("/v1/chat/completions", lambda p, **kw: {"messages": [{"role": "user", "content": p}], **_oai(kw)}, "messages"),
    ("/v2/models/llama/generate", lambda p, **kw: {"text_input": p, **_triton(kw)}, "text_input"),
    ("/invocations", lambda p, **kw: {"prompt": p, "stream": False, **_oai(kw, truss=True)}, "prompt"),
]


def _oai(kw: dict[str, Any], truss: bool = False) -> dict[str, Any]:
    out = dict(kw)
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out


def _triton(kw: dict[str, Any]) -> dict[str, Any]:
    return _oai(kw)


def _route_id(route) -> str:
    return route[0] + (" (truss)" if route[2] == "prompt" and route[0] == "/invocations" else "")


def _post_raw(
    server: Server, path: str, data: bytes, content_type: str = "application/json", **kw
) -> requests.Response:
    return requests.post(
        server.url + path, data=data, headers={"Content-Type": content_type, **kw.pop("headers", {})}, timeout=30, **kw
    )


@pytest.mark.parametrize(
    "path",
    [
        "/invocations",
        "/predictions/llama",
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v2/models/llama/generate",
        "/endpoints/e/invocations",
    ],
)
def test_bodies_over_max_request_size_are_413_naming_the_limit(server, path):
    big = json.dumps({"inputs": "x" * MAX_REQUEST, "prompt": "x", "text_input": "x"}).encode()
    r = _post_raw(server, path, big)
    want = 400 if path.startswith("/endpoints/") else 413  # the SageMaker runtime answers ValidationError
    assert r.status_code == want, (r.status_code, r.text[:300])
    assert str(MAX_REQUEST) in r.text and "max_request_size" in r.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit must hold while reading
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192]

    r = _post_raw(server, path, chunks())  # type: ignore[arg-type]
    assert r.status_code == want, (r.status_code, r.text[:300])
    assert "max_request_size" in r.text
    healthy_and_idle(server)


def test_a_client_that_stops_sending_mid_body_does_not_hold_a_slot(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(
            b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"inputs": "abc'
        )
    healthy_and_idle(server)


@pytest.mark.parametrize(
    "path", ["/invocations", "/generate", "/v1/completions", "/v2/models/llama/generate", "/endpoints/e/invocations"]
)
@pytest.mark.parametrize("depth", [1100, 8000])
def test_deeply_nested_json_is_400(server, path, depth):
    for body in (b"[" * depth + b"]" * depth, b'{"inputs": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"):
        r = _post_raw(server, path, body)
        if path.startswith("/endpoints/"):  # the runtime wraps the container's 400 in a ModelError
            assert r.status_code == 424 and "(400)" in r.text and "nested" in r.text, r.text[:300]
        else:
            assert r.status_code == 400, (r.status_code, r.text[:300])
            assert "nested" in error_message(r)
    healthy_and_idle(server)


@pytest.mark.parametrize(
    "path", ["/invocations", "/generate", "/v1/completions", "/v1/chat/completions", "/v2/models/llama/generate"]
)
def test_invalid_utf8_and_lone_surrogates_are_400(server, path):
    field = {
        "/invocations": "inputs",
        "/generate": "inputs",
        "/v1/completions": "prompt",
        "/v1/chat/completions": "messages",
        "/v2/models/llama/generate": "text_input",
    }[path]
    raw = {"/v1/chat/completions": b'{"messages": [{"role": "user", "content": "%s"}]}'}.get(
        path, b'{"' + field.encode() + b'": "%s"}'
    )
    r = _post_raw(server, path, raw % b"ab\xff\xfe cd")
    assert r.status_code == 400 and "UTF-8" in error_message(r), r.text[:300]
    r = _post_raw(server, path, raw % rb"ab\ud800 cd")
    assert r.status_code == 400, r.text[:300]
    assert field in error_message(r) and "surrogate" in error_message(r)
    # in a word list that is tokenized separately
    lists = {
        "/invocations": b'{"inputs": "x", "parameters": {"bad_words": ["\\udfff"]}}',
        "/generate": b'{"inputs": "x", "parameters": {"bad_words": ["\\udfff"]}}',
        "/v1/completions": b'{"prompt": "x", "bad_words": ["\\udfff"]}',
        "/v1/chat/completions": b'{"messages": [{"role": "user", "content": "x"}], "bad_words": ["\\udfff"]}',
        "/v2/models/llama/generate": b'{"text_input": "x", "bad_words": "\\udfff"}',
    }
    r = _post_raw(server, path, lists[path])
    assert r.status_code == 400 and "bad_words" in error_message(r), r.text[:300]
    r = _post_raw(
        server,
        path.replace("/generate", "/generate") if path != "/invocations" else path,
        b"\xff\xfe",
        content_type="text/plain",
    )
    assert 400 <= r.status_code < 500
    healthy_and_idle(server)


@pytest.mark.parametrize("route", ROUTES, ids=_route_id)
def test_generation_settings_out_of_range_are_400_naming_them(server, route):
    path, body, prompt_field = route
    truss = prompt_field == "prompt" and path == "/invocations"
    limit_field = "max_tokens" if path not in ("/invocations", "/generate") or truss else "max_new_tokens"
    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"max_new_tokens": 10**6}, [limit_field, str(MAX_OUTPUT)]),
        ({"max_new_tokens": 10**30}, [limit_field]),
        ({"max_new_tokens": 0}, [limit_field]),
        ({"max_new_tokens": -5}, [limit_field]),
        ({"max_new_tokens": MAX_OUTPUT + 1}, [limit_field, str(MAX_OUTPUT)]),
    ]
    if not truss:
        cases += [({"temperature": -0.5}, ["temperature"]), ({"temperature": -1e308}, ["temperature"])]
    for params, fragments in cases:
        r = requests.post(server.url + path, json=body("hello", **params), timeout=30)
        assert r.status_code == 400, (params, r.status_code, r.text[:300])
        msg = error_message(r)
        assert all(f in msg for f in fragments), (params, msg)
    if not truss:
        for literal in (b"NaN", b"Infinity", b"-Infinity"):
            raw = json.dumps(body("hello", temperature=12345.5)).encode().replace(b"12345.5", literal)
            r = _post_raw(server, path, raw)
            assert r.status_code == 400 and "temperature" in error_message(r), (literal, r.text[:300])
    ok = requests.post(server.url + path, json=body("hello", max_new_tokens=MAX_OUTPUT), timeout=30)
    assert ok.status_code == 200, ok.text[:300]
    healthy_and_idle(server)


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    from tokenizers import Tokenizer  # the server's fast tokenizer, without importing transformers/torch

    return Tokenizer.from_file(str(tiny_model("llama") / "tokenizer.json"))


def _tokens(text: str) -> int:
    return len(_tokenizer().encode(text).ids)


@pytest.mark.parametrize("route", ROUTES, ids=_route_id)
def test_empty_prompt_and_prompt_length_limit(server, route):
    path, body, field = route
    r = requests.post(server.url + path, json=body(""), timeout=30)
    if field != "messages":  # a chat with an empty message still has the template's tokens
        assert r.status_code == 400, r.text[:300]
        msg = error_message(r)
        assert field in msg and "empty" in msg, msg
    unit = " the"
    assert _tokens(unit * MAX_INPUT) == MAX_INPUT and _tokens(unit * (MAX_INPUT + 1)) == MAX_INPUT + 1
    if field == "messages":
        template = _tokens("<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n")
        n_ok = MAX_INPUT - template
        assert _tokens(f"<|im_start|>user\n{unit * n_ok}<|im_end|>\n<|im_start|>assistant\n") == MAX_INPUT
    else:
        n_ok = MAX_INPUT
    r = requests.post(server.url + path, json=body(unit * n_ok, max_new_tokens=4), timeout=30)
    assert r.status_code == 200, r.text[:300]
    r = requests.post(server.url + path, json=body(unit * (n_ok + 1), max_new_tokens=4), timeout=30)
    assert r.status_code == 400, r.text[:300]
    msg = error_message(r)
    assert f"{MAX_INPUT + 1} tokens" in msg and f"max_input_len={MAX_INPUT}" in msg and field in msg, msg
    healthy_and_idle(server)


def test_token_id_prompts_at_and_over_the_limit(server):
    ok = requests.post(server.url + "/v1/completions", json={"prompt": [300] * MAX_INPUT, "max_tokens": 2}, timeout=30)
    assert ok.status_code == 200, ok.text[:300]
    for prompt, fragment in (
        ([300] * (MAX_INPUT + 1), f"max_input_len={MAX_INPUT}"),
        ([10**9], "token id"),
        ([-1], "token id"),
        ([], "prompt"),
    ):
        r = requests.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=30)
        assert r.status_code == 400 and fragment in error_message(r), r.text[:300]
    healthy_and_idle(server)


def test_comma_separated_word_lists_with_line_breaks_are_400(server):
    """Found by the fuzzer: a bare CR in a Triton/Truss word string made the CSV parser raise (500)."""
    for path, body, field in [
        ("/v2/models/llama/generate", {"text_input": "x", "stop_words": "a\rb"}, "stop_words"),
        ("/v2/models/llama/generate_stream", {"text_input": "x", "bad_words": "a\r\nb,c"}, "bad_words"),
        ("/invocations", {"prompt": "x", "stop_words_list": "a\rb", "stream": False}, "stop_words_list"),
    ]:
        r = requests.post(server.url + path, json=body, timeout=30)
        assert r.status_code == 400 and field in error_message(r), (path, r.status_code, r.text[:300])
    healthy_and_idle(server)
