"""Triton generate and the Truss payload (with the /invocations dispatch), in-process on the synthetic engine."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from serverproc import post, tiny_tokenizer
from serverproc import serve_all_schemas as serve

from lmi_trt.serving.errors import BadRequest
from lmi_trt.serving.protocols._common import word_list
from lmi_trt.serving.protocols.truss import is_openai_completion

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


def n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


def sse_events(raw: bytes) -> list[Any]:
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events)
    return [orjson.loads(e[6:]) for e in events]


@pytest.mark.parametrize(
    "value, words",
    [
        (None, []),
        ("", []),
        ("foo", ["foo"]),
        ("foo,bar", ["foo", "bar"]),
        ('"a,b",c', ["a,b", "c"]),
        ([""], []),
        (["x,y", "z"], ["x,y", "z"]),
    ],
)
def test_word_lists(value, words):
    assert word_list(value, "bad_words") == words


def test_word_list_rejects_other_shapes():
    with pytest.raises(BadRequest, match="stop_words must be"):
        word_list([1], "stop_words")


# --- Triton ---
async def test_triton_generate_shape_and_names():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        for path in (
            "/v2/models/tiny/generate",
            "/v2/models/ensemble/generate",
            "/v2/models/tensorrt_llm_bls/versions/3/generate",
        ):
            status, _, raw = await post(
                s, path, {"text_input": MULTI, "max_tokens": 2 * n, "bad_words": "", "stop_words": ""}
            )
            out = orjson.loads(raw)
            assert status == 200, raw
            assert out["text_output"] == MULTI * 2 and out["model_name"] == path.split("/")[3]
        assert out["model_version"] == "3"
        status, _, raw = await post(s, "/v2/models/other/generate", {"text_input": "x"})
        assert status == 404 and "unknown model" in orjson.loads(raw)["error"]


async def test_triton_fields_under_parameters_tensor_lists_and_input_echo():
    async with serve() as (s, _):
        status, _, raw = await post(
            s,
            "/v2/models/tiny/generate",
            {
                "text_input": ["ab"],
                "parameters": {"max_tokens": [2], "temperature": 0.0},
                "exclude_input_in_output": False,
                "return_log_probs": True,
            },
        )
        out = orjson.loads(raw)
        assert status == 200 and out["text_output"] == "abab"
        assert len(out["output_log_probs"]) == 2 and out["cum_log_probs"] == pytest.approx(sum(out["output_log_probs"]))
        status, _, raw = await post(
            s, "/v2/models/tiny/generate", {"text_input": "x", "max_tokens": 2, "parameters": {"max_tokens": 3}}
        )
        assert status == 400 and "both" in orjson.loads(raw)["error"]


async def test_triton_stream_events_and_stop_words():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        status, ctype, raw = await post(
            s, "/v2/models/tiny/generate_stream", {"text_input": MULTI, "max_tokens": 2 * n}
        )
        events = sse_events(raw)
        assert ctype == "text/event-stream" and len(events) > 1
        assert "".join(e["text_output"] for e in events) == MULTI * 2
        assert not any("\ufffd" in e["text_output"] for e in events)
        status, _, raw = await post(
            s,
            "/v2/models/tiny/generate",
            {"text_input": "Grüße 日本 und 東京 danach", "max_tokens": 100, "stop_words": ["東京"], "stream": True},
        )
        assert "".join(e["text_output"] for e in sse_events(raw)) == "Grüße 日本 und "


@pytest.mark.parametrize(
    "body, words",
    [
        ({"beam_width": 2}, "beam_width=2"),
        ({"num_return_sequences": 2}, "num_return_sequences"),
        ({"return_generation_logits": True}, "logits"),
        ({"lora_task_id": 1}, "lora_task_id"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"bad_words": [1]}, "bad_words"),
        ({"return_perf_metrics": True}, "return_perf_metrics"),
        ({"len_penalty": 0.5}, "length_penalty=0.5 applies to beam search only"),  # the old name, not ignored
        # tensorrt_llm/config.pbtxt's early_stopping (TYPE_BOOL) is read, and its beam_search_diversity_rate refused
        ({"early_stopping": True}, "early_stopping=True applies to beam search only"),
        ({"beam_search_diversity_rate": 0.3}, "beam_search_diversity_rate=0.3 is not supported"),
        ({"request_output_len": 3, "max_tokens": 4}, "request_output_len is max_tokens under another name"),
    ],
)
async def test_triton_refusals(body, words):
    async with serve() as (s, _):
        status, _, raw = await post(s, "/v2/models/tiny/generate", {"text_input": "x", **body})
        out = orjson.loads(raw)
        assert status == 400 and set(out) == {"error"} and words in out["error"]


async def test_the_older_ensemble_names_are_honoured():
    """tensorrtllm_backend's older inputs (request_output_len, streaming, runtime_top_k) mean what the ensemble's
    names mean: never accepted and ignored."""
    async with serve() as (s, _):
        body = {"text_input": "one two three four", "request_output_len": 2, "streaming": True}
        status, _, raw = await post(s, "/v2/models/tiny/generate", body)
        assert status == 200 and len(sse_events(raw)) >= 1
        status, _, raw = await post(s, "/v2/models/tiny/generate", {**body, "streaming": False})
        _, _, plain = await post(s, "/v2/models/tiny/generate", {"text_input": body["text_input"], "max_tokens": 2})
        assert status == 200 and orjson.loads(raw)["text_output"] == orjson.loads(plain)["text_output"]


async def test_triton_health_routes():
    async with serve() as (s, _):
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/ensemble/ready"):
            async with s.get(path) as r:
                assert r.status == 200, path


# --- Truss and the prompt dispatch ---
@pytest.mark.parametrize(
    "body, openai",
    [
        ({"prompt": "x"}, False),
        ({"prompt": "x", "max_tokens": 3, "stream": False, "repetition_penalty": 1.1}, False),
        ({"prompt": "x", "beam_width": 1, "bad_words_list": [""]}, False),
        ({"prompt": "x", "model": "m"}, True),
        ({"prompt": "x", "temperature": 0.5, "max_tokens": 3}, True),
        ({"prompt": "x", "stop": ["a"]}, True),
    ],
)
def test_prompt_dispatch(body, openai):
    assert is_openai_completion(body) is openai


def test_mixed_prompt_payload_is_refused():
    with pytest.raises(
        BadRequest, match=r"Truss fields \['stop_words_list'\] and OpenAI completions fields \['model'\]"
    ):
        is_openai_completion({"prompt": "x", "model": "m", "stop_words_list": ["a"]})


async def test_truss_streams_plain_text_by_default():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        async with s.post("/invocations", json={"prompt": MULTI, "max_tokens": 2 * n}) as r:
            assert r.status == 200 and r.content_type == "text/plain"
            chunks = [c async for c in r.content.iter_any()]
        text = b"".join(chunks).decode()
        assert text == MULTI * 2
        status, ctype, raw = await post(s, "/invocations", {"prompt": MULTI, "max_tokens": 2 * n, "stream": False})
        assert ctype == "application/json" and orjson.loads(raw) == {"text": MULTI * 2}


async def test_truss_words_lists_and_errors_in_lmi_shape():
    async with serve() as (s, _):
        status, _, raw = await post(
            s,
            "/invocations",
            {
                "prompt": "one two three four",
                "max_tokens": 40,
                "stream": False,
                "stop_words_list": ["three"],
                "bad_words_list": [""],
            },
        )
        assert orjson.loads(raw) == {"text": "one two "}
        status, _, raw = await post(s, "/invocations", {"prompt": "x", "beam_width": 4})
        out = orjson.loads(raw)
        assert status == 400 and out["code"] == 400 and "beam_width=4" in out["error"]
        status, _, raw = await post(s, "/invocations", {"prompt": "x", "model": "m", "stop_words_list": ["a"]})
        assert status == 400 and "ambiguous" in orjson.loads(raw)["error"]
        status, _, raw = await post(s, "/invocations", {"prompt": "x", "model": "m", "max_tokens": 2})
        assert status == 200 and orjson.loads(raw)["object"] == "text_completion"
        status, _, raw = await post(s, "/invocations", {"nothing": 1})
        err = orjson.loads(raw)["error"]
        assert status == 400 and "'inputs', 'messages', 'prompt'" in err


async def test_truss_mid_stream_failure_aborts_the_transfer():
    async with serve(tokens_per_second=200) as (s, sa):
        async with s.post("/invocations", json={"prompt": "abc", "max_tokens": 200}) as r:
            assert r.status == 200
            await r.content.readany()
            sa.engine.fail("boom")
            with pytest.raises(aiohttp.ClientPayloadError):
                await r.read()
