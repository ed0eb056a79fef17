"""Issue 16 features on the trtllm engine (fake TensorRT-LLM, in process as the GPU seam needs): what the
Executor cannot report is refused with a 400 naming the field and the engine; constrained decoding runs
through the Executor's GuidedDecodingConfig where the release has it (1.x), and is refused on 0.12."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestServer
from tinymodels import tiny_model
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.config import LmiConfig
from lmi_trt.loader import load_model
from lmi_trt.serving.app import build_app
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

pytestmark = pytest.mark.slow


# A release leg of CI checks its own release; the default run one without guided decoding and one with.
RELEASES = [os.environ["LMI_TRT_FAKE_RELEASE"]] if os.environ.get("LMI_TRT_FAKE_RELEASE") else ["0.12.0", "1.0.0"]


# Renders the tool names, so that tools can be sent; a tool's call comes back as its arguments.
TOOLS_TEMPLATE = (
    "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant: "
)


@pytest.fixture(params=RELEASES)
async def server(request, monkeypatch, tmp_path):
    with fake_tensorrt_llm(request.param):
        import lmi_trt.engines.trtllm as trt

        monkeypatch.setattr(trt, "cuda_available", lambda: True)  # the fake Executor needs no GPU
        hf_dir = tiny_model("llama")
        engine_dir = make_engine_dir(hf_dir, tmp_path / "engine", max_batch_size=2, max_input_len=64, max_seq_len=96)
        config = LmiConfig(
            model_id=str(engine_dir),
            tokenizer_id=str(hf_dir),
            rolling_batch="trtllm",
            max_input_len=64,
            max_output_len=32,
            max_rolling_batch_size=2,
            download_dir=tmp_path / "dl",
            chat_template=TOOLS_TEMPLATE,
        )
        srv = TestServer(
            build_app(lambda: load_model(config, "trtllm"), config, model_name="tiny", adapters=DEFAULT_ADAPTERS),
            host="127.0.0.1",
        )
        await srv.start_server()
        try:
            async with ClientSession(timeout=ClientTimeout(total=60)) as s:
                for _ in range(6000):  # readiness, bounded generously
                    async with s.get(srv.make_url("/ping")) as r:
                        if r.status == 200:
                            break
                    await asyncio.sleep(0.05)
                yield srv, s
        finally:
            await srv.close()


async def test_what_the_executor_engine_cannot_do_is_refused_naming_field_and_engine(server):
    srv, s = server
    cases = [
        ("/generate", {"inputs": "Hi", "parameters": {"top_n_tokens": 2, "details": True}}, "parameters.top_n_tokens"),
        (
            "/generate",
            {"inputs": "Hi", "parameters": {"decoder_input_details": True}},
            "parameters.decoder_input_details",
        ),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 2}, "logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 2},
            "top_logprobs",
        ),
        ("/invocations", {"inputs": "Hi", "parameters": {"top_n_tokens": 2}}, "parameters.top_n_tokens"),
    ]
    for path, body, field in cases:
        async with s.post(srv.make_url(path), json=body) as r:
            text = await r.text()
            assert r.status == 400 and field in text and "trtllm engine" in text, (path, text)
    # The chosen token's log-prob is what the Executor gives (OutputConfig.return_log_probs); streams carry it.
    async with s.post(
        srv.make_url("/invocations"), json={"inputs": "Hi", "parameters": {"max_new_tokens": 3}, "stream": True}
    ) as r:
        import json

        lines = [json.loads(line) async for line in r.content if line.strip()]
    assert lines and all(isinstance(x["token"]["log_prob"], float) for x in lines)


SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
GUIDED = [
    (
        "/generate",
        {
            "inputs": "Hi",
            "parameters": {"max_new_tokens": 8, "grammar": {"type": "regex", "value": "(yes|no)[0-9]{2}"}},
        },
        "parameters.grammar",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Pick."}],
            "max_tokens": 30,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        },
        "response_format",
    ),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Paint."}],
            "max_tokens": 30,
            "tools": [{"type": "function", "function": {"name": "paint", "parameters": SCHEMA}}],
            "tool_choice": {"type": "function", "function": {"name": "paint"}},
        },
        "tool_choice",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "Yes?"}], "max_tokens": 8, "guided_regex": "(yes|no)[0-9]{2}"},
        "guided_regex",
    ),
]


async def test_constrained_decoding_through_the_executor_where_the_release_has_it(server):
    """The tiny model is random: only the Executor's grammar makes its output match (1.x); 0.12's Executor has
    no guided decoding, so the same requests are refused naming the field and the engine."""
    import json
    import re

    import jsonschema
    import tensorrt_llm

    srv, s = server
    has_guides = hasattr(tensorrt_llm.bindings.executor, "GuidedDecodingConfig")
    outputs = []
    for path, body, field in GUIDED:
        async with s.post(srv.make_url(path), json=body) as r:
            text = await r.text()
        if not has_guides:
            assert r.status == 400 and field in text and "trtllm engine" in text, (path, text)
            continue
        assert r.status == 200, text
        outputs.append(json.loads(text))
    if has_guides:
        assert re.fullmatch("(yes|no)[0-9]{2}", outputs[0]["generated_text"]), outputs[0]
        choice = outputs[1]["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)
        (call,) = outputs[2]["choices"][0]["message"]["tool_calls"]
        assert call["function"]["name"] == "paint" and outputs[2]["choices"][0]["finish_reason"] == "tool_calls"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
        assert re.fullmatch("(yes|no)[0-9]{2}", outputs[3]["choices"][0]["message"]["content"]), outputs[3]


async def test_logit_bias_is_the_requests_embedding_bias(server):
    """OpenAI logit_bias reaches the Executor as the request's embedding bias ([vocab_size] float32, every
    release): +100 on one token makes greedy decoding pick it at every step."""
    import json

    from transformers import AutoTokenizer

    srv, s = server
    token = AutoTokenizer.from_pretrained(tiny_model("llama")).decode([42])
    body = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 0}
    async with s.post(srv.make_url("/v1/completions"), json=body) as r:
        plain = json.loads(await r.text())["choices"][0]
    async with s.post(srv.make_url("/v1/completions"), json={**body, "logit_bias": {"42": 100}}) as r:
        text = await r.text()
    assert r.status == 200, text
    biased = json.loads(text)["choices"][0]
    assert biased["logprobs"]["tokens"] == [token] * 5 != plain["logprobs"]["tokens"]
