"""Issue 16's request features on the torch engine, with real clients.

Log-probs (part 1):
The server runs as a process (``lmi-trt serve --engine torch``) on the tiny Llama, on both torch
decode paths: the built-in decode loop and transformers' own. Every top log-prob a client gets
must equal ``log_softmax`` of the model's logits at that position, computed here with a plain
forward pass over the prompt and the generated tokens; the chosen token's log-prob is among them.
"""

from __future__ import annotations

import json

import pytest
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

PROMPT = "Once upon a time there was a"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module", params=["builtin", "transformers"])
def srv(request, llama, tmp_path_factory):
    with serve(
        [
            "--engine",
            "torch",
            "--model-id",
            str(llama),
            "--model-name",
            "tiny-llama",
            "-o",
            "option.max_input_len=128",
            "-o",
            "option.max_output_len=64",
            "-o",
            f"option.torch_decode_loop={request.param}",
        ],
        tmp_path_factory.mktemp(f"logprobs-{request.param}"),
    ) as server:
        yield server


@pytest.fixture(scope="module")
def reference(llama):
    """Top-k (id, log-prob) per generated position, from the model's own logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()

    def top(ids: list[int], generated: int, k: int) -> list[list[tuple[int, float]]]:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lps = logits.log_softmax(-1)[len(ids) - generated - 1 : len(ids) - 1]
        values, idx = lps.topk(k, dim=-1)
        return [list(zip(i.tolist(), v.tolist())) for i, v in zip(idx, values)]

    return top


def _assert_close(got: list[list[tuple[int, float]]], want: list[list[tuple[int, float]]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        # Ties at the k-th place may order differently; the values must agree position by position.
        assert [round(v, 3) for _, v in g] == pytest.approx([round(v, 3) for _, v in w], abs=2e-3)
        assert {i for i, _ in g[:3]} == {i for i, _ in w[:3]} or len({round(v, 4) for _, v in w[:4]}) < 4


def test_tgi_top_n_tokens_equal_log_softmax_of_the_logits(srv, reference, hf_online):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=srv.url)
    out = client.text_generation(PROMPT, max_new_tokens=8, details=True, top_n_tokens=5)
    tokens = out.details.tokens
    ids = _prompt_ids(srv) + [t.id for t in tokens]
    want = reference(ids, len(tokens), 5)
    got = [[_pair(a) for a in step] for step in out.details.top_tokens]
    _assert_close(got, want)
    for t, step in zip(tokens, want):  # greedy: the chosen token is the most likely one
        assert t.id == step[0][0] and t.logprob == pytest.approx(step[0][1], abs=2e-3)
    streamed = list(client.text_generation(PROMPT, max_new_tokens=8, details=True, top_n_tokens=5, stream=True))
    assert [[_pair(a)[0] for a in e.top_tokens] for e in streamed] == [[i for i, _ in step] for step in got]


def _pair(a) -> tuple[int, float]:
    """huggingface_hub leaves some nested token lists as plain dicts."""
    return (a["id"], a["logprob"]) if isinstance(a, dict) else (a.id, a.logprob)


def _prompt_ids(srv) -> list[int]:
    """The prompt's ids as the server tokenizes them (its usage count checks the local tokenizer)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_model("llama"))(PROMPT)["input_ids"]
    r = srv.post("/v1/completions", {"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == len(ids)
    return ids


def test_openai_top_logprobs_chat_and_completions(srv, reference):
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    c = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3)
    lp = c.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 6
    for chosen, alternatives in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(alternatives) <= 3 and max(alternatives.values()) == pytest.approx(chosen, abs=1e-5)
    chat = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=20,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 20 for t in content)
    for t in content:
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] == pytest.approx(t.logprob, abs=1e-5)
    streamed = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    )
    tops = [
        t.top_logprobs
        for ch in streamed
        if ch.choices and ch.choices[0].logprobs
        for t in ch.choices[0].logprobs.content
    ]
    assert len(tops) == 6 and all(len(t) == 2 for t in tops)
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="top_logprobs"):
        client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "x"}], logprobs=True, top_logprobs=21
        )


def test_tgi_prompt_log_probs_equal_log_softmax_of_the_logits(srv, llama, hf_online):
    """decoder_input_details: each prompt token's log-prob given the ones before it, from the model's own
    logits (the first has none), on both torch paths; through huggingface_hub's client."""
    import torch
    from huggingface_hub import InferenceClient
    from transformers import AutoModelForCausalLM

    out = InferenceClient(model=srv.url).text_generation(
        PROMPT, max_new_tokens=4, details=True, decoder_input_details=True
    )
    prefill = out.details.prefill
    ids = _prompt_ids(srv)
    assert [t.id for t in prefill] == ids and prefill[0].logprob is None
    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()
    with torch.no_grad():
        want = (
            model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])
        )
    assert [t.logprob for t in prefill[1:]] == pytest.approx(want[:, 0].tolist(), abs=1e-3)
    r = srv.post("/generate_stream", {"inputs": PROMPT, "parameters": {"decoder_input_details": True}})
    assert r.status_code == 400 and "decoder_input_details" in r.json()["error"]  # as TGI: not when streaming


def test_openai_echo_with_logprobs_carries_the_prompt_tokens_log_probs(srv, llama):
    """OpenAI completions echo + logprobs: the prompt's tokens come first in logprobs, each with its log-prob
    given the ones before it (the first null), from the model's own logits; streamed the same."""
    import torch
    from openai import OpenAI
    from transformers import AutoModelForCausalLM

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    ids = _prompt_ids(srv)
    out = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=2
    )
    lp = out.choices[0].logprobs
    assert out.choices[0].text.startswith(PROMPT) and len(lp.tokens) == len(ids) + 4
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    model = AutoModelForCausalLM.from_pretrained(llama, dtype=torch.float32).eval()
    with torch.no_grad():
        want = (
            model(torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])
        )
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(want[:, 0].tolist(), abs=1e-3)
    assert all(len(top) == 2 for top in lp.top_logprobs[len(ids) :])  # generated tokens: the alternatives asked for
    chunks = list(
        client.completions.create(
            model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0, echo=True, logprobs=2, stream=True
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert len(streamed) == len(lp.token_logprobs) and streamed[0] is None
    assert streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == out.choices[0].text


def test_lmi_streams_carry_every_tokens_log_prob_and_top_n_tokens(srv):
    """DJL's jsonlines and sse formatters write each token's log_prob whether or not details is set."""
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5}, "stream": True}, stream=True)
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert len(lines) == 5 and all(isinstance(x["token"]["log_prob"], float) for x in lines)
    r = srv.post(
        "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True, "top_n_tokens": 3}}
    )
    details = r.json()["details"]
    assert len(details["top_tokens"]) == 4 and all(len(step) == 3 for step in details["top_tokens"])
    assert [s[0]["id"] for s in details["top_tokens"]] == [t["id"] for t in details["tokens"]]


def test_djl_top_k_minus_one_means_no_top_k(srv):
    """DJL's vLLM parameters default top_k to -1, "no top-k"; sampling with it equals sampling without."""
    base = {"max_new_tokens": 8, "do_sample": True, "seed": 7, "temperature": 0.9}
    with_minus_one = srv.post("/invocations", {"inputs": PROMPT, "parameters": {**base, "top_k": -1}})
    assert with_minus_one.status_code == 200, with_minus_one.text
    without = srv.post("/invocations", {"inputs": PROMPT, "parameters": base})
    assert with_minus_one.json()["generated_text"] == without.json()["generated_text"]
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"top_k": -2}})
    assert r.status_code == 400 and "top_k" in r.text


# --- constrained decoding (part 3) ---
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "size": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "ok", "size"],
    "additionalProperties": False,
}


def test_openai_json_schema_output_validates_from_a_random_model(srv):
    """The tiny model is random; only the grammar makes its output valid JSON of the schema."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA, "strict": True}}
    for seed in (1, 2, 3):
        chat = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "Pick."}],
            max_tokens=64,
            temperature=1.0,
            seed=seed,
            response_format=fmt,
        )
        jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)
        assert chat.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "Pick."}],
        max_tokens=64,
        response_format=fmt,
        stream=True,
    )
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in streamed if c.choices)), SCHEMA)
    obj = client.chat.completions.create(
        model="tiny-llama",
        messages=[{"role": "user", "content": "JSON"}],
        max_tokens=48,
        response_format={"type": "json_object"},
    )
    if obj.choices[0].finish_reason == "stop":  # an open-ended object may run past max_tokens; when it ends it is one
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    assert obj.choices[0].message.content.startswith("{")


def test_tgi_grammar_and_lmi_guided_parameters(srv, hf_online):
    import re

    from huggingface_hub import InferenceClient

    client = InferenceClient(model=srv.url)
    out = client.text_generation(PROMPT, max_new_tokens=12, grammar={"type": "regex", "value": "(yes|no)[0-9]{2}"})
    assert re.fullmatch("(yes|no)[0-9]{2}", out), out
    out = client.text_generation(PROMPT, max_new_tokens=64, grammar={"type": "json", "value": SCHEMA})
    assert set(json.loads(out)) == {"color", "ok", "size"}
    r = srv.post(
        "/invocations",
        {"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "guided_grammar": 'root ::= "a" ("b" | "c")+ "d"'}},
    )
    assert re.fullmatch("a[bc]+d", r.json()["generated_text"]) or len(r.json()["generated_text"]) == 12, r.text
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"guided_regex": "(unclosed"}})
    assert r.status_code == 400 and "regex" in r.text
    r = srv.post(
        "/generate", {"inputs": PROMPT, "parameters": {"grammar": {"type": "regex", "value": "a+"}, "ignore_eos": True}}
    )
    assert r.status_code == 400 and "ignore_eos" in r.text


# --- logit_bias (part 5) ---
def test_openai_logit_bias_moves_the_choice(srv):
    from openai import BadRequestError, OpenAI
    from transformers import AutoTokenizer

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    plain = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    pushed = client.completions.create(
        model="tiny-llama", prompt=PROMPT, max_tokens=4, temperature=0, logit_bias={"42": 100}
    )
    assert pushed.choices[0].text == AutoTokenizer.from_pretrained(tiny_model("llama")).decode([42] * 4)
    first = srv.post("/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 1, "details": True}})
    away = client.completions.create(
        model="tiny-llama",
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        logprobs=1,
        logit_bias={str(first.json()["details"]["tokens"][0]["id"]): -100},
    )
    assert away.choices[0].logprobs.tokens[0] != plain.choices[0].logprobs.tokens[0]
    with pytest.raises(BadRequestError, match="logit_bias"):
        client.completions.create(model="tiny-llama", prompt=PROMPT, logit_bias={"x": 1})


# --- n (part 5) ---
def test_openai_n_gives_several_choices(srv):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": PROMPT}], max_tokens=8, n=3, temperature=0.9, seed=5
    )
    assert [c.index for c in chat.choices] == [0, 1, 2]
    assert len({c.message.content for c in chat.choices}) > 1  # seeds 5, 6, 7: sampled choices differ
    assert chat.usage.completion_tokens == sum(
        client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=8,
            temperature=0.9,
            seed=5 + i,
        ).usage.completion_tokens
        for i in range(3)
    )
    again = client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": PROMPT}], max_tokens=8, n=3, temperature=0.9, seed=5
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in chat.choices]
    done = client.completions.create(model="tiny-llama", prompt=PROMPT, max_tokens=4, n=2, temperature=0)
    assert len(done.choices) == 2 and done.choices[0].text == done.choices[1].text  # greedy: the same twice
    with pytest.raises(BadRequestError, match="n=2"):  # n streamed works (test_clients_torch); n × prompts does not
        client.completions.create(model="tiny-llama", prompt=[PROMPT, PROMPT], n=2)
