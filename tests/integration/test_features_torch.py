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
    with serve(["--engine", "torch", "--model-id", str(llama), "--model-name", "tiny-llama",
                "-o", "option.max_input_len=128", "-o", "option.max_output_len=32",
                "-o", f"option.torch_decode_loop={request.param}"],
               tmp_path_factory.mktemp(f"logprobs-{request.param}")) as server:
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


@pytest.fixture
def hf_online(monkeypatch):
    """HF_HUB_OFFLINE=1 (conftest) makes huggingface_hub refuse every request, even to loopback."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


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
    chat = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=6, temperature=0, logprobs=True, top_logprobs=20)
    content = chat.choices[0].logprobs.content
    assert len(content) == 6 and all(len(t.top_logprobs) == 20 for t in content)
    for t in content:
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and values[0] == pytest.approx(t.logprob, abs=1e-5)
    streamed = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": PROMPT}],
                                              max_tokens=6, temperature=0, logprobs=True, top_logprobs=2, stream=True)
    tops = [t.top_logprobs for ch in streamed if ch.choices and ch.choices[0].logprobs
            for t in ch.choices[0].logprobs.content]
    assert len(tops) == 6 and all(len(t) == 2 for t in tops)
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                       logprobs=True, top_logprobs=21)


def test_prompt_logprobs_refused_naming_the_field_and_engine(srv):
    r = srv.post("/generate", {"inputs": PROMPT, "parameters": {"decoder_input_details": True, "details": True}})
    assert r.status_code == 400
    assert "decoder_input_details" in r.json()["error"] and "torch engine" in r.json()["error"]
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"decoder_input_details": True}})
    assert r.status_code == 400 and "torch engine" in r.json()["error"]


def test_lmi_streams_carry_every_tokens_log_prob_and_top_n_tokens(srv):
    """DJL's jsonlines and sse formatters write each token's log_prob whether or not details is set."""
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 5}, "stream": True}, stream=True)
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert len(lines) == 5 and all(isinstance(x["token"]["log_prob"], float) for x in lines)
    r = srv.post("/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": 4, "details": True,
                                                                   "top_n_tokens": 3}})
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
