"""The TGI adapter in-process on the synthetic engine; shapes checked with huggingface_hub's own parsers."""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from huggingface_hub import TextGenerationOutput
from huggingface_hub.errors import GenerationError, OverloadedError, ValidationError
from huggingface_hub.inference._common import _format_text_generation_stream_output
from serverproc import SyntheticApp, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

# huggingface_hub < 1.0 (every TensorRT-LLM image's) parses bytes lines, later releases str lines.
_HUB_PARSES_BYTES = "byte_payload" in inspect.signature(_format_text_generation_stream_output).parameters

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


@contextlib.asynccontextmanager
async def serve(config: LmiConfig | None = None, ready: bool = True, **kw: Any):
    sa = SyntheticApp(
        config or LmiConfig(max_input_len=128, max_output_len=256), adapters=DEFAULT_ADAPTERS, gate_open=ready, **kw
    )
    async with TestServer(sa.app) as server, aiohttp.ClientSession(str(server.make_url(""))) as s:

        async def healthy() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        if ready:
            assert await wait_until(healthy)
        yield s, sa


async def post(s: aiohttp.ClientSession, path: str, body: Any) -> tuple[int, str, bytes]:
    async with s.post(path, json=body) as r:
        return r.status, r.content_type, await r.read()


def n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


def hf_stream(raw: bytes, details: bool) -> list[Any]:
    """Parse SSE lines exactly as huggingface_hub's InferenceClient.text_generation(stream=True) does."""
    out = []
    for line in raw.decode().split("\n"):
        item = _format_text_generation_stream_output(line.encode() if _HUB_PARSES_BYTES else line, details)
        if item is not None:
            out.append(item)
    return out


async def test_generate_with_details_parses_as_huggingface_hub_output():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        status, ctype, raw = await post(
            s,
            "/generate",
            {"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n, "details": True, "seed": 7, "do_sample": True}},
        )
        assert (status, ctype) == (200, "application/json")
        out = TextGenerationOutput.parse_obj_as_instance(orjson.loads(raw))
        assert out.generated_text == MULTI * 2
        assert out.details.finish_reason == "length" and out.details.generated_tokens == 2 * n and out.details.seed == 7
        assert len(out.details.tokens) == 2 * n and all(isinstance(t.logprob, float) for t in out.details.tokens)
        assert {t.special for t in out.details.tokens} == {False}
        status, _, raw = await post(
            s, "/generate", {"inputs": "ab", "parameters": {"max_new_tokens": 2, "return_full_text": True}}
        )
        assert orjson.loads(raw) == {"generated_text": "abab"}


async def test_compat_root_route_returns_a_list_or_streams():
    async with serve() as (s, _):
        status, _, raw = await post(s, "/", {"inputs": "ab", "parameters": {"max_new_tokens": 2}})
        assert status == 200 and orjson.loads(raw) == [{"generated_text": "ab"}]
        status, ctype, raw = await post(s, "/", {"inputs": "ab", "parameters": {"max_new_tokens": 2}, "stream": True})
        assert ctype == "text/event-stream" and hf_stream(raw, False) == ["a", "b"]


async def test_generate_stream_events_parse_and_reassemble():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        status, ctype, raw = await post(
            s, "/generate_stream", {"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}}
        )
        assert (status, ctype) == (200, "text/event-stream")
        events = hf_stream(raw, True)
        assert [e.index for e in events] == list(range(1, 2 * n + 1))
        assert "".join(e.token.text for e in events) == MULTI * 2
        assert not any("\ufffd" in e.token.text for e in events)
        assert all(e.generated_text is None and e.details is None for e in events[:-1])
        assert events[-1].generated_text == MULTI * 2
        assert events[-1].details.finish_reason == "length" and events[-1].details.generated_tokens == 2 * n
        assert hf_stream(raw, False) == [e.token.text for e in events]


async def test_stop_sequence_and_eos_finish_reasons():
    async with serve() as (s, _):
        status, _, raw = await post(
            s,
            "/generate",
            {"inputs": "one two three", "parameters": {"max_new_tokens": 50, "stop": ["three"], "details": True}},
        )
        out = orjson.loads(raw)
        assert out["generated_text"] == "one two " and out["details"]["finish_reason"] == "stop_sequence"
    # The prompt's "</s>" must be the eos token for the echoing engine to emit it: allowed by option.
    async with serve(LmiConfig(max_input_len=128, max_output_len=256, parse_special_tokens=True)) as (s, _):
        status, _, raw = await post(
            s, "/generate", {"inputs": "x</s>", "parameters": {"max_new_tokens": 50, "details": True}}
        )
        assert orjson.loads(raw)["details"]["finish_reason"] == "eos_token"


async def test_best_of_returns_the_best_and_the_others_in_details():
    """TGI's best_of: the sequence with the best log-prob per token is generated_text, the others are
    details.best_of_sequences; TGI's own refusals (router/src/validation.rs) otherwise."""
    async with serve() as (s, _):
        params = {"max_new_tokens": 5, "do_sample": True, "best_of": 3, "details": True}
        status, _, raw = await post(s, "/generate", {"inputs": "one two three", "parameters": params})
        out = orjson.loads(raw)
        assert status == 200, raw
        others = out["details"]["best_of_sequences"]
        assert len(others) == 2 and all(o["generated_tokens"] == 5 and len(o["tokens"]) == 5 for o in others)

        def per_token(d):
            return sum(t["logprob"] for t in d["tokens"]) / len(d["tokens"])

        assert all(per_token(out["details"]) >= per_token(o) for o in others)
        for bad, field, words in [
            ({"seed": 1}, "seed", "must not be set"),
            ({"do_sample": False}, "best_of", "sampling"),
        ]:
            status, _, raw = await post(s, "/generate", {"inputs": "x", "parameters": {**params, **bad}})
            assert status == 400 and field in orjson.loads(raw)["error"] and words in orjson.loads(raw)["error"], raw
        status, _, raw = await post(s, "/generate_stream", {"inputs": "x", "parameters": params})
        assert status == 400 and "streaming" in orjson.loads(raw)["error"]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"best_of": 2}, "best_of"),
        ({"top_n_tokens": 5}, "top_n_tokens"),
        ({"decoder_input_details": True}, "decoder_input_details"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"watermark": True}, "watermark"),
        ({"grammar": {"type": "json", "value": {}}}, "grammar"),
        ({"adapter_id": "x"}, "adapter_id"),
        ({"temperature": -1}, "temperature"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
async def test_refusals_are_validation_errors_huggingface_hub_recognises(params, field):
    from huggingface_hub.inference._common import _parse_text_generation_error

    async with serve() as (s, _):
        status, _, raw = await post(s, "/generate", {"inputs": "x", "parameters": params})
        body = orjson.loads(raw)
        assert status == 400 and set(body) == {"error", "error_type"} and field in body["error"]
        assert isinstance(_parse_text_generation_error(body["error"], body["error_type"]), ValidationError)


async def test_nulls_mean_not_given_and_limits_match_lmi():
    async with serve(LmiConfig(max_input_len=16, max_output_len=32)) as (s, _):
        status, _, raw = await post(
            s,
            "/generate",
            {"inputs": "ab", "parameters": {"max_new_tokens": 2, "temperature": None, "frequency_penalty": None}},
        )
        assert status == 200
        status, _, raw = await post(s, "/generate", {"inputs": "word " * 40})
        tgi = orjson.loads(raw)
        status2, _, raw = await post(s, "/invocations", {"inputs": "word " * 40})
        assert status == status2 == 400 and tgi["error"] == orjson.loads(raw)["error"]


async def test_mid_stream_engine_failure_is_an_error_event():
    async with serve(tokens_per_second=200) as (s, sa):
        async with s.post("/generate_stream", json={"inputs": "abc", "parameters": {"max_new_tokens": 200}}) as r:
            assert r.status == 200
            first = await r.content.readline()
            assert first.startswith(b"data:")
            sa.engine.fail("boom")
            raw = first + await r.read()
        with pytest.raises(GenerationError, match="boom"):
            hf_stream(raw, True)


async def test_info_health_and_overloaded():
    async with serve(ready=False) as (s, sa):
        async with s.get("/health") as r:
            assert r.status == 503 and (await r.json())["error_type"] == "healthcheck"
        status, _, raw = await post(s, "/generate", {"inputs": "x"})
        body = orjson.loads(raw)
        from huggingface_hub.inference._common import _parse_text_generation_error

        assert status == 503 and isinstance(
            _parse_text_generation_error(body["error"], body["error_type"]), OverloadedError
        )
        sa.gate.set()
    async with serve() as (s, _):
        async with s.get("/health") as r:
            assert r.status == 200
        async with s.get("/info") as r:
            info = await r.json()
        assert info["max_input_tokens"] == 128 and info["max_total_tokens"] == 128 + 256
        assert info["model_pipeline_tag"] == "text-generation"
        assert info["max_best_of"] == LmiConfig().max_prompts_per_request


async def test_lmi_tgi_compat_output_parses_with_huggingface_hub():
    """option.tgi_compat on /invocations (lmi.py) against the same client parsers."""
    async with serve(LmiConfig(tgi_compat=True, max_input_len=64, max_output_len=64)) as (s, _):
        status, _, raw = await post(s, "/invocations", {"inputs": "hello", "parameters": {"max_new_tokens": 3}})
        out = orjson.loads(raw)
        assert isinstance(out, list)
        parsed = TextGenerationOutput.parse_obj_as_instance(out[0])
        assert parsed.generated_text == "hel" or parsed.generated_text.startswith("h")
        status, _, raw = await post(
            s, "/invocations", {"inputs": "hello", "parameters": {"max_new_tokens": 3}, "stream": True}
        )
        events = hf_stream(raw, True)
        assert len(events) == 3 and events[-1].details.finish_reason == "length"
