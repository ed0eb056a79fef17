"""Real clients, called as their users call them, against `lmi-trt serve` as a real process.

The synthetic engine (echoes the prompt's tokens) with the tiny Llama's tokenizer and chat
template: outputs are known text, so each client's reassembly is checked exactly. The torch
engine round-trip is in test_clients_torch.py.
"""

from __future__ import annotations

import json
import os

import boto3
import pytest
import requests
from botocore.config import Config
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def tok(llama):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(llama)


@pytest.fixture(scope="module")
def srv(llama, tmp_path_factory):
    with serve(
        [
            "--engine",
            "synthetic",
            "--model-id",
            str(llama),
            "--model-name",
            "tiny-llama",
            "-o",
            "option.max_input_len=256",
            "-o",
            "option.max_output_len=256",
        ],
        tmp_path_factory.mktemp("clients"),
    ) as server:
        yield server


def echo_len(tok, text: str) -> int:
    return len(tok.encode(text))  # the engine echoes the prompt ids, incl. <s>, which decodes to ""


def chat_echo(tok, messages) -> tuple[str, int]:
    """What the echo engine answers to a chat: the rendered template without its special tokens."""
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    return tok.decode(ids, skip_special_tokens=True), len(ids)


# --- OpenAI ---
@pytest.fixture(scope="module")
def oai(srv):
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_openai_chat_plain_and_streamed(oai, tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": MULTI}]
    text, n = chat_echo(tok, messages)
    r = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=n)
    assert r.choices[0].message.content == text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == n and r.usage.prompt_tokens == n and r.model == "tiny-llama"
    chunks = list(
        oai.chat.completions.create(
            model="tiny-llama",
            messages=messages,
            max_completion_tokens=n,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == 2 * n
    r = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=4, logprobs=True, top_logprobs=0)
    assert [lp.logprob < 0 for lp in r.choices[0].logprobs.content] == [True] * 4


def test_openai_completions_plain_streamed_and_errors(oai, tok):
    import openai

    n = echo_len(tok, MULTI)
    r = oai.completions.create(model="tiny-llama", prompt=MULTI, max_tokens=2 * n, stop=["🔥"])
    assert r.choices[0].text == MULTI.split("🔥")[0] and r.choices[0].finish_reason == "stop"
    pieces = [
        c.choices[0].text
        for c in oai.completions.create(
            model="tiny-llama", prompt=MULTI, max_tokens=2 * n, stream=True, seed=3, temperature=0.0
        )
    ]
    assert "".join(pieces) == MULTI * 2 and not any("\ufffd" in p for p in pieces)
    r = oai.completions.create(model="tiny-llama", prompt="ab", max_tokens=2, logprobs=0)
    assert len(r.choices[0].logprobs.token_logprobs) == 2
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="tiny-llama", prompt=["x", "y"], n=2)
    assert e.value.param == "n" and "n=2 with a list of 2 prompts is not supported" in e.value.message
    with pytest.raises(openai.BadRequestError, match="max_output_len=256"):
        oai.completions.create(model="tiny-llama", prompt="x", max_tokens=1000)
    assert [m.id for m in oai.models.list()] == ["tiny-llama"]


# --- huggingface_hub (TGI) ---
def test_huggingface_hub_text_generation_stream_with_details(srv, tok, hf_online):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=srv.url)
    n = echo_len(tok, MULTI)
    events = list(client.text_generation(MULTI, max_new_tokens=2 * n, stream=True, details=True))
    assert "".join(e.token.text for e in events) == MULTI * 2
    assert events[-1].generated_text == MULTI * 2
    assert events[-1].details.finish_reason == "length" and events[-1].details.generated_tokens == 2 * n
    out = client.text_generation(MULTI, max_new_tokens=2 * n, details=True, stop=["🚀"])
    assert out.generated_text == MULTI.split("🚀")[0] and out.details.finish_reason == "stop_sequence"
    assert client.text_generation("ab", max_new_tokens=echo_len(tok, "ab")) == "ab"


@pytest.mark.parametrize("path", ["", "/generate"])
def test_huggingface_hub_streams_from_the_root_or_generate_url(srv, tok, hf_online, path):
    """InferenceClient posts {"inputs", "parameters", "stream": true} to the URL it is given and reads SSE; at
    /generate that returned [] silently, as the route answered JSON (TGI's POST / follows "stream")."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=srv.url + path)
    n = echo_len(tok, "ab")
    assert "".join(client.text_generation("ab", max_new_tokens=n, stream=True)) == "ab"
    assert client.text_generation("ab", max_new_tokens=n) == "ab"


def test_huggingface_hub_errors_and_chat_completion(srv, tok, hf_online):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import ValidationError

    client = InferenceClient(model=srv.url)
    with pytest.raises(ValidationError, match="temperature"):
        client.text_generation("x", temperature=-1.0)
    messages = [{"role": "user", "content": "Straße 東京"}]
    text, n = chat_echo(tok, messages)
    chat = InferenceClient(base_url=srv.url)
    r = chat.chat_completion(messages, max_tokens=n)
    assert r.choices[0].message.content == text
    streamed = "".join(
        c.choices[0].delta.content or "" for c in chat.chat_completion(messages, max_tokens=n, stream=True)
    )
    assert streamed == text


# --- SageMaker runtime (boto3) and the SageMaker Python SDK ---
@pytest.fixture(scope="module")
def runtime(srv):
    return boto3.client(
        "sagemaker-runtime",
        endpoint_url=srv.url,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=Config(retries={"max_attempts": 1}),
    )


def test_boto3_invoke_endpoint_and_stream(runtime, tok):
    n = echo_len(tok, MULTI)
    r = runtime.invoke_endpoint(
        EndpointName="my-endpoint",
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps({"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}}),
    )
    assert json.loads(r["Body"].read()) == {"generated_text": MULTI * 2}
    r = runtime.invoke_endpoint_with_response_stream(
        EndpointName="my-endpoint",
        ContentType="application/json",
        Body=json.dumps({"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}, "stream": True}),
    )
    assert r["ContentType"] == "application/jsonlines"
    raw = b"".join(event["PayloadPart"]["Bytes"] for event in r["Body"])
    lines = [json.loads(x) for x in raw.splitlines()]
    assert "".join(x["token"]["text"] for x in lines) == MULTI * 2 == lines[-1]["generated_text"]
    with pytest.raises(runtime.exceptions.ModelError) as e:
        runtime.invoke_endpoint(
            EndpointName="my-endpoint",
            ContentType="application/json",
            Body=json.dumps({"inputs": "x", "parameters": {"max_new_tokens": 0}}),
        )
    assert e.value.response["OriginalStatusCode"] == 400 and "max_new_tokens" in str(e.value)


def test_sagemaker_sdk_predictor(runtime, tok):
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    import sagemaker
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.iterators import LineIterator
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer

    boto_session = boto3.Session(region_name="us-east-1", aws_access_key_id="local", aws_secret_access_key="local")
    session = sagemaker.Session(boto_session=boto_session, sagemaker_runtime_client=runtime)
    predictor = Predictor(
        "my-endpoint", sagemaker_session=session, serializer=JSONSerializer(), deserializer=JSONDeserializer()
    )
    n = echo_len(tok, MULTI)
    assert predictor.predict({"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}}) == {
        "generated_text": MULTI * 2
    }
    messages = [{"role": "user", "content": "hi"}]
    text, m = chat_echo(tok, messages)
    out = predictor.predict({"messages": messages, "max_tokens": m})
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == text
    lines = list(
        predictor.predict_stream(
            {"inputs": MULTI, "parameters": {"max_new_tokens": 2 * n}, "stream": True}, iterator=LineIterator
        )
    )
    assert json.loads(lines[-1])["generated_text"] == MULTI * 2


# --- plain HTTP: Triton generate and Truss ---
def test_triton_generate_over_http(srv, tok):
    n = echo_len(tok, MULTI)
    r = srv.post(
        "/v2/models/ensemble/generate", {"text_input": MULTI, "max_tokens": 2 * n, "bad_words": "", "stop_words": ""}
    )
    assert r.status_code == 200 and r.json() == {
        "model_name": "ensemble",
        "model_version": "1",
        "text_output": MULTI * 2,
    }
    with requests.post(
        srv.url + "/v2/models/tiny-llama/generate_stream",
        json={"text_input": MULTI, "max_tokens": 2 * n},
        stream=True,
        timeout=30,
    ) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith(b"data: ")]
    assert "".join(e["text_output"] for e in events) == MULTI * 2
    r = srv.post("/v2/models/ensemble/generate", {"text_input": "x", "beam_width": 2})
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_truss_payload_over_http(srv, tok):
    n = echo_len(tok, MULTI)
    with requests.post(
        srv.url + "/invocations", json={"prompt": MULTI, "max_tokens": 2 * n}, stream=True, timeout=30
    ) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        chunks = list(r.iter_content(chunk_size=None))
    assert b"".join(chunks).decode() == MULTI * 2
    r = srv.post(
        "/invocations", {"prompt": "one two three", "max_tokens": 20, "stream": False, "stop_words_list": ["three"]}
    )
    assert r.json() == {"text": "one two "}
