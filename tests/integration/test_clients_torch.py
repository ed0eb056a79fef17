"""A chat round-trip and bad words on a real engine: `lmi-trt serve --engine torch` on the tiny Llama.

Greedy decoding makes the answer a function of the prompt ids, so the chat answer must equal a
plain completion of the rendered chat template (token ids, no extra BOS) — which checks the
template rendering and the tokenization of chat prompts end to end. Bad words are banned by the
engine itself (token-level bad_words_ids), in every schema.
"""

from __future__ import annotations

import json

import pytest
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def srv(llama, tmp_path_factory):
    with serve(
        [
            "--engine",
            "torch",
            "--model-id",
            str(llama),
            "--model-name",
            "tiny-llama",
            "-o",
            "option.max_input_len=256",
            "-o",
            "option.max_output_len=64",
        ],
        tmp_path_factory.mktemp("torch-clients"),
    ) as server:
        yield server


def test_openai_chat_round_trip_on_the_torch_engine(srv, llama):
    from openai import OpenAI
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama)
    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "The quick brown fox"}]
    chat = client.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=12, temperature=0)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # a BatchEncoding in newer transformers
    plain = client.completions.create(model="tiny-llama", prompt=list(ids), max_tokens=12, temperature=0)
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == len(ids) and chat.usage.completion_tokens == plain.usage.completion_tokens
    streamed = client.chat.completions.create(
        model="tiny-llama", messages=messages, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content


def test_openai_n_streamed_with_the_real_client(srv):
    """n=3 streamed through openai's client: its chunks name their choice, each choice reassembles to the
    non-streamed choice of the same index (greedy: every choice is the prompt's one continuation)."""
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    ask = {"model": "tiny-llama", "prompt": "The quick brown fox", "max_tokens": 10, "temperature": 0, "n": 3}
    plain = client.completions.create(**ask)
    texts = {0: "", 1: "", 2: ""}
    usage = None
    for chunk in client.completions.create(**ask, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
        usage = chunk.usage or usage
    assert texts == {c.index: c.text for c in plain.choices} and len(set(texts.values())) == 1
    assert usage.completion_tokens == plain.usage.completion_tokens


def _word_to_ban(srv) -> tuple[str, str]:
    prompt = "Once upon a time there was a"
    r = srv.post("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 24, "details": True}})
    tokens = [t["text"].strip() for t in r.json()["details"]["tokens"]]
    word = next(t for t in tokens if len(t) >= 2 and t.isalpha())
    return prompt, word


def test_bad_words_never_appear_in_any_schema_on_a_real_engine(srv):
    prompt, word = _word_to_ban(srv)
    outputs = {
        "lmi": srv.post(
            "/invocations", {"inputs": prompt, "parameters": {"max_new_tokens": 24, "bad_words": [word]}}
        ).json()["generated_text"],
        "tgi": srv.post(
            "/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 24, "bad_words": [word]}}
        ).json()["generated_text"],
        "openai": srv.post(
            "/v1/completions", {"model": "tiny-llama", "prompt": prompt, "max_tokens": 24, "bad_words": [word]}
        ).json()["choices"][0]["text"],
        "triton": srv.post(
            "/v2/models/ensemble/generate", {"text_input": prompt, "max_tokens": 24, "bad_words": word}
        ).json()["text_output"],
        "truss": srv.post(
            "/invocations", {"prompt": prompt, "max_tokens": 24, "bad_words_list": [word], "stream": False}
        ).json()["text"],
    }
    assert word not in outputs["lmi"], (word, outputs)
    assert len(set(outputs.values())) == 1, outputs  # the same request in every schema
    r = srv.post("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 24}})
    assert word in r.json()["generated_text"]  # and without the ban it was there


def test_stop_strings_on_a_real_engine(srv):
    prompt = "Once upon a time there was a"
    full = srv.post("/generate", {"inputs": prompt, "parameters": {"max_new_tokens": 24}}).json()["generated_text"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full
    r = srv.post(
        "/v1/completions",
        {"model": "tiny-llama", "prompt": prompt, "max_tokens": 24, "stop": stop, "stream": True},
        stream=True,
    )
    events = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith(b"data: ") and x != b"data: [DONE]"]
    text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert text == full[: full.index(stop)] and events[-1]["choices"][0]["finish_reason"] == "stop"
