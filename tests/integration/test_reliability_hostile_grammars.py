"""One client cannot hurt another with a grammar (issue 23): constrained requests against `lmi-trt serve` on the
torch engine, beside victims whose answers are checked exactly (greedy on the tiny Llama, one torch thread: a
row's tokens do not depend on its batch) and /ping polled every 20 ms (``test_reliability_hostile``'s pattern).

On the first pass a few KB of deeply nested JSON schema compiled on the event loop (/ping blocked 5-22 s), a
thousand optional properties took 15 s to compile, xgrammar's own cache grew without bound, and an ambiguous
grammar made every step of the batch cost up to 1.9 s until queued victims failed with a 424.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import psutil
import pytest
import requests
from cliserver import Server, serve
from test_reliability_hostile import PingWatch, _attack_with_victims
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

VICTIM_SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
# Ambiguous: every string has exponentially many parses, and the Earley chart a matcher keeps grows with the
# output (0.5 s a token after 70 tokens on the first pass).
AMBIGUOUS = 'root ::= s\ns ::= s s | [a-z ] | ""'


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _optional(n: int, tag: str) -> dict[str, Any]:
    """A schema of ``n`` optional properties: xgrammar's compile grows with about their cube (1,000: 15 s)."""
    return {"type": "object", "properties": {f"{tag}{i}": {"type": "integer"} for i in range(n)}}


def _server_args(decode_loop: str) -> list[str]:
    return [
        "--engine",
        "torch",
        "--model-id",
        str(tiny_model("llama")),
        "-o",
        "option.max_input_len=64",
        "-o",
        "option.max_output_len=128",
        "-o",
        "option.max_rolling_batch_size=4",
        "-o",
        "option.grammar_compile_timeout=3",
        "-o",
        f"option.torch_decode_loop={decode_loop}",
    ]


@pytest.fixture(scope="module", params=["builtin", "transformers"])
def srv(request, tmp_path_factory) -> Iterator[Server]:
    with serve(_server_args(request.param), tmp_path_factory.mktemp(f"grammars-{request.param}")) as server:
        yield server
        assert server.proc.poll() is None, f"the server died:\n{server.log()[-3000:]}"
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _chat(srv: Server, fmt: dict[str, Any] | None = None, **extra: Any) -> requests.Response:
    body = {"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 24, **extra}
    if fmt is not None:
        body["response_format"] = fmt
    return srv.post("/v1/chat/completions", body, timeout=300)


def _schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}


def _victims(srv: Server) -> tuple[str, str]:
    """A plain request and a constrained one whose grammar is compiled already: both exact, neither lost."""
    plain = srv.post("/invocations", {"inputs": "victim one two ", "parameters": {"max_new_tokens": 24}})
    guided = _chat(srv, _schema_format(VICTIM_SCHEMA), max_tokens=40)
    assert plain.status_code == 200 and guided.status_code == 200, (plain.text, guided.text)
    content = guided.json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(content), VICTIM_SCHEMA)
    return plain.json()["generated_text"], content


def _param(r: requests.Response) -> str | None:
    return r.json()["error"]["param"] if r.headers.get("Content-Type", "").startswith("application/json") else None


# --- size and nesting: refused before any compile ---------------------------------------------------------------


def test_grammar_size_and_nesting_are_400_naming_the_field(srv):
    cases = [
        ("/v1/chat/completions", {"response_format": _schema_format(_deep(300))}, "response_format", "nests more"),
        ("/invocations", {"inputs": "hi", "parameters": {"guided_json": json.dumps(_deep(40))}}, None, "nests more"),
        ("/invocations", {"inputs": "hi", "parameters": {"guided_regex": "a" * 200_000}}, None, "characters"),
        ("/generate", {"inputs": "hi", "parameters": {"grammar": {"type": "json", "value": _deep(40)}}}, None, "nests"),
    ]
    fields = ["response_format", "parameters.guided_json", "parameters.guided_regex", "parameters.grammar"]

    def attack() -> list[requests.Response]:
        out = []
        for path, body, _, _ in cases:
            if path == "/v1/chat/completions":
                body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
            out.append(srv.post(path, body))
        return out

    for answers in _attack_with_victims(srv, attack, victim=_victims):
        for r, (_, _, param, why), field in zip(answers, cases, fields, strict=True):
            assert r.status_code == 400 and field in r.text and why in r.text, r.text[:300]
            assert param is None or _param(r) == param, r.text[:300]


# --- compile: off the event loop, within option.grammar_compile_timeout -------------------------------------------


def test_a_grammar_slow_to_compile_is_refused_at_the_time_bound_and_others_go_on(srv):
    """Distinct schemas of 2,000 optional properties (58 KB each; minutes to compile): each is refused with a
    400 naming response_format once the probe process has spent option.grammar_compile_timeout=3 s on it, and
    then again at once; a new small schema compiles right after."""
    _victims(srv)  # the victims' grammar compiled before the attack
    tags = iter(range(100))

    def attack() -> tuple[requests.Response, float]:
        t0 = time.monotonic()
        r = _chat(srv, _schema_format(_optional(2000, f"p{next(tags)}_")))
        return r, time.monotonic() - t0

    for r, _ in _attack_with_victims(srv, attack, victim=_victims):
        assert r.status_code == 400 and _param(r) == "response_format", r.text[:300]
        assert "option.grammar_compile_timeout=3 s" in r.text, r.text[:300]
    again = _chat(srv, _schema_format(_optional(2000, "p0_")))  # known slow: no second compile
    assert again.status_code == 400 and "grammar_compile_timeout" in again.text, again.text[:300]
    fresh = {**VICTIM_SCHEMA, "required": ["days", "city"]}
    r = _chat(srv, _schema_format(fresh), max_tokens=40)
    assert r.status_code == 200, r.text[:300]
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), fresh)


def test_compiled_grammars_take_bounded_memory(srv):
    """Distinct schemas, each compiled and kept: the cache is ours alone (xgrammar's own is off) and bounded by
    what xgrammar says each takes; on the first pass 800 small schemas grew the server by 1.5 GB for good."""
    proc = psutil.Process(srv.proc.pid)
    before = proc.memory_info().rss
    with PingWatch(srv) as ping:
        for i in range(200):
            schema = {"type": "string", "minLength": 1000 + i, "maxLength": 1000 + i}  # ~5 KB compiled each
            r = _chat(srv, _schema_format(schema), max_tokens=2)
            assert r.status_code == 200, r.text[:300]
    ping.check()
    grown = (proc.memory_info().rss - before) / 2**20
    print(f"200 distinct schemas: the server grew by {grown:.0f} MiB")
    assert grown < 200, grown


@pytest.mark.asyncio
async def test_the_grammar_cache_is_ours_alone_and_keeps_to_its_bound(monkeypatch):
    """The engine's Grammars with the real xgrammar, its bound lowered to 4 MiB: distinct schemas of about
    0.4 MiB each (xgrammar's measure) evict the oldest, and xgrammar's compiler keeps nothing of its own."""
    from lmi_trt.engines import guided
    from lmi_trt.engines.base import GuidedDecoding

    monkeypatch.setattr(guided, "CACHE_BYTES", 4 * 2**20)
    grammars = guided.Grammars(tiny_model("llama"), 512, [2], timeout_s=60)
    try:
        for i in range(30):
            schema = {"type": "string", "minLength": 1000 + i, "maxLength": 1000 + i}
            await grammars.guide(GuidedDecoding("json_schema", json.dumps(schema)))
        kept = grammars._compiled  # internals: what is kept is the point
        assert 0 < len(kept) < 30 and kept.size <= 4 * 2**20, (len(kept), kept.size)
        assert grammars._compiler.get_cache_size_bytes() == 0
    finally:
        grammars.close()


# --- per step: a matcher too slow fails its own request -------------------------------------------------------------


def test_an_ambiguous_grammar_fails_alone_and_never_holds_the_batch(srv):
    """Each matcher call has 50 ms of CPU (guided.STEP_CPU_S): past it the request gets a 400 naming its field;
    the queued victims (batch of 4) are all answered, exactly."""

    def attack() -> requests.Response:
        return srv.post(
            "/invocations", {"inputs": "hi", "parameters": {"guided_grammar": AMBIGUOUS, "max_new_tokens": 128}}
        )

    for r in _attack_with_victims(srv, attack, victims=6, victim=_victims):
        assert r.status_code == 400 and "parameters.guided_grammar" in r.text and "ms of CPU" in r.text, r.text[:300]


# --- every client error a 400 naming its field ---------------------------------------------------------------------


def test_refused_and_unmeetable_constraints_are_400_naming_the_field(srv):
    r = _chat(srv, _schema_format({"type": "nonsense"}))
    assert r.status_code == 400 and _param(r) == "response_format" and "nonsense" in r.text, r.text[:300]
    r = srv.post("/invocations", {"inputs": "hi", "parameters": {"guided_regex": "(unclosed"}})
    assert r.status_code == 400 and "parameters.guided_regex" in r.text and "not closed" in r.text, r.text[:300]
    r = srv.post("/generate", {"inputs": "hi", "parameters": {"grammar": {"type": "regex", "value": "(a"}}})
    assert r.status_code == 400 and "parameters.grammar" in r.text, r.text[:300]
    # "a" then only EOS, which min_new_tokens bans: nothing can come next (a 424 on the first pass)
    r = srv.post("/invocations", {"inputs": "hi", "parameters": {"guided_regex": "a", "min_new_tokens": 5}})
    assert r.status_code == 400 and "parameters.guided_regex" in r.text and "excluded" in r.text, r.text[:300]
