"""Beam search on the torch engine's built-in decode loop, against transformers' ``model.generate(num_beams=k,
num_return_sequences=n, length_penalty=..., early_stopping=..., do_sample=False)`` on the tiny Llama in fp32: the
engine with beam and greedy requests in one batch (beams take batch slots: more beams than slots wait), then
the server as a process with real clients (the openai client's ``use_beam_search`` through extra_body,
requests for LMI ``num_beams`` and Triton ``beam_width``).

The model's EOS is a token it produces after these prompts (tinymodels.with_eos), so that some beams end early
and are scored at their own length. Blocks of 4 positions: the beams share the prompt's blocks and copy the
partly written one when they first write into it.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
import requests
import torch
from cliserver import serve
from serverproc import wait_until
from test_torch_engine import assert_greedy, reference
from tinymodels import beam_reference, tiny_model, with_eos
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmi_trt.engines.base import FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine

pytestmark = pytest.mark.slow
in_module_loop = pytest.mark.asyncio(loop_scope="module")

EOS = 452  # the tiny Llama writes it within a few tokens of PROMPT
PROMPT = [1, 5, 6, 7, 8]
# (beams, returned, length_penalty, early_stopping, prompt, max_new_tokens)
CASES = [
    (4, 3, 0.5, True, PROMPT, 9),
    (2, 2, 1.0, "never", [1, 40, 41], 7),
    (3, 1, 2.0, False, PROMPT, 8),
    (3, 3, 0.0, "never", [1, 7, 7, 7], 6),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return with_eos(tiny_model("llama"), EOS, tmp_path_factory.mktemp("beams") / "llama-eos")


@pytest.fixture(scope="module")
def hf(model_dir):
    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def generated(hf, prompt, beams, returned, length_penalty, early_stopping, max_new):
    return beam_reference(
        hf,
        prompt,
        beams=beams,
        returned=returned,
        max_new=max_new,
        eos=EOS,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir):
    """6 batch slots: the beam requests of CASES (12 beams) and the greedy ones cannot all run at once."""
    e = TorchEngine(model_dir, max_batch_size=6, max_input_len=16, max_new_tokens=12, dtype="fp32", tokens_per_block=4)
    await e.start()
    yield e
    await e.close()


async def collect(engine, rid, prompt, sampling, streaming):
    return [o async for o in engine.submit(GenerationRequest(rid, prompt, sampling, streaming=streaming))]


@in_module_loop
async def test_beams_equal_generate_in_a_batch_with_greedy_requests(engine, hf):
    assert engine.batching == "decode_loop" and engine.capabilities.beam_search.most == 6
    beam_jobs = [
        collect(
            engine,
            f"beam{i}",
            prompt,
            SamplingParams(
                max_new_tokens=max_new,
                beam_width=k,
                num_return_sequences=n,
                length_penalty=lp,
                early_stopping=es,
            ),
            streaming=False,
        )
        for i, (k, n, lp, es, prompt, max_new) in enumerate(CASES)
    ]
    greedy = [([1, 9, 10, 11], 10), ([1] + list(range(100, 110)), 12), ([1, 3], 5)]
    greedy_jobs = [
        collect(engine, f"greedy{i}", p, SamplingParams(max_new_tokens=m, ignore_eos=True), streaming=True)
        for i, (p, m) in enumerate(greedy)
    ]
    results = await asyncio.gather(*beam_jobs, *greedy_jobs)
    for (k, n, lp, es, prompt, max_new), outs in zip(CASES, results, strict=False):
        assert len(outs) == 1 and outs[0].error is None, outs
        final = outs[0]
        rows, scores = generated(hf, prompt, k, n, lp, es, max_new)
        assert [b.token_ids for b in final.beams] == rows, (k, n, lp, es)
        assert [b.score for b in final.beams] == pytest.approx(scores, rel=1e-5)
        assert final.token_ids == rows[0]
        for beam in final.beams:
            assert beam.finish_reason == (FinishReason.EOS if beam.token_ids[-1] == EOS else FinishReason.LENGTH)
    assert any(b.finish_reason == FinishReason.EOS for outs in results[: len(CASES)] for b in outs[0].beams)
    for (prompt, max_new), outs in zip(greedy, results[len(CASES) :], strict=True):
        assert_greedy([t for o in outs for t in o.token_ids], reference(hf, prompt, max_new, eos_token_id=None))
    # every beam's slot and block came back
    stats = engine.stats().extra
    assert stats["kv_cache_used_blocks"] == 0 and stats["running_requests"] == 0


@in_module_loop
async def test_a_cancelled_beam_request_gives_its_slots_and_blocks_back(engine):
    """Cancelled while it runs (or, on a fast machine, just after it ended): nothing of it stays behind."""
    request = GenerationRequest("gone", PROMPT, SamplingParams(max_new_tokens=12, beam_width=4), streaming=False)
    agen = engine.submit(request)
    first = asyncio.ensure_future(agen.__anext__())
    await wait_until(lambda: engine.stats().active_requests > 0, timeout=60)
    await engine.cancel("gone")
    assert (await first).finished
    await agen.aclose()
    assert await wait_until(lambda: engine.stats().extra["kv_cache_used_blocks"] == 0, timeout=60)
    # its 4 slots are free again: a request as wide runs
    again = await collect(engine, "again", PROMPT, SamplingParams(max_new_tokens=3, beam_width=6), streaming=False)
    assert again[-1].error is None and len(again[-1].beams) == 1


@in_module_loop
async def test_what_the_engine_refuses_with_beams(engine):
    wide = await collect(engine, "w", PROMPT, SamplingParams(max_new_tokens=3, beam_width=7), streaming=False)
    assert wide[0].error_code == 400 and "has 6 (option.max_rolling_batch_size)" in wide[0].error
    streamed = await collect(engine, "s", PROMPT, SamplingParams(max_new_tokens=3, beam_width=2), streaming=True)
    assert streamed[0].error_code == 400 and "not streamed" in streamed[0].error
    request = GenerationRequest(
        "t", PROMPT, SamplingParams(max_new_tokens=3, beam_width=2), stop_token_ids=[[9]], streaming=False
    )
    stops = [o async for o in engine.submit(request)]
    assert stops[0].error_code == 400 and stops[0].error_field == "stop_token_ids"
    # a beam step runs the base model's layers: an adapter is refused, not ignored
    request = GenerationRequest(
        "a", PROMPT, SamplingParams(max_new_tokens=3, beam_width=2), streaming=False, adapter="sql"
    )
    adapted = [o async for o in engine.submit(request)]
    assert adapted[0].error_code == 400 and adapted[0].error_field == "adapter", adapted


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    args = ["--engine", "torch", "--model-id", str(model_dir), "--model-name", "tiny", "-o", "option.max_output_len=16"]
    with serve(args + ["-o", "option.tokens_per_block=8"], tmp_path_factory.mktemp("beams-srv")) as server:
        yield server


def texts(model_dir, rows):
    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok.decode(r, skip_special_tokens=True) for r in rows]


def test_openai_use_beam_search_returns_n_beams_as_choices(srv, model_dir, hf):
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    beams = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True}
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, n=3, extra_body=beams)
    rows, _ = generated(hf, PROMPT, 3, 3, 0.5, True, 9)
    assert [c.text for c in out.choices] == texts(model_dir, rows)
    assert [c.index for c in out.choices] == [0, 1, 2]
    # best_of beams searched, n of them returned (vLLM's width before 0.6.3)
    wider = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, n=2, best_of=4, extra_body=beams)
    rows, _ = generated(hf, PROMPT, 4, 2, 0.5, True, 9)
    assert [c.text for c in wider.choices] == texts(model_dir, rows)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=6, n=2, extra_body=beams
    )
    assert len(chat.choices) == 2 and chat.choices[0].message.content != chat.choices[1].message.content
    with pytest.raises(BadRequestError) as e:  # beams are returned whole
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, n=2, stream=True, extra_body=beams)
    assert e.value.body["param"] == "use_beam_search"
    with pytest.raises(BadRequestError) as e:  # scored by log-prob alone
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, n=2, temperature=0.8, extra_body=beams)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(BadRequestError) as e:  # no beams: it would change nothing, so it is refused
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, extra_body={"length_penalty": 0.5})
    assert e.value.body["param"] == "length_penalty"
    with pytest.raises(BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=9, extra_body={"min_p": 0.1})
    assert e.value.body["param"] == "min_p" and "torch engine" in e.value.body["message"]


def test_lmi_num_beams_and_triton_beam_width(srv, model_dir, hf):
    body = {"inputs": "", "parameters": {"max_new_tokens": 8, "num_beams": 3, "length_penalty": 2.0}}
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = "The quick brown fox"
    ids = tok(prompt)["input_ids"]
    body["inputs"] = prompt
    r = requests.post(srv.url + "/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    rows, _ = generated(hf, ids, 3, 1, 2.0, False, 8)
    assert r.json()["generated_text"] == texts(model_dir, rows)[0]
    streamed = requests.post(srv.url + "/invocations", json={**body, "stream": True}, timeout=60)
    assert streamed.status_code == 400 and "parameters.num_beams" in streamed.text
    triton = {"text_input": prompt, "max_tokens": 8, "beam_width": 3, "num_return_sequences": 2}
    r = requests.post(srv.url + "/v2/models/ensemble/generate", json=triton, timeout=60)
    assert r.status_code == 200, r.text
    rows, _ = generated(hf, ids, 3, 2, 1.0, False, 8)
    assert r.json()["text_output"] == texts(model_dir, rows)
    caps = requests.get(srv.url + "/v1/capabilities", timeout=10).json()["features"]["beam_search"]
    assert caps["honoured"] and caps["most"] >= 3
    assert caps["fields"]["openai.completions"] == "use_beam_search" and caps["fields"]["lmi"] == "parameters.num_beams"


@in_module_loop
async def test_beams_the_whole_cache_cannot_hold_fail_alone(model_dir):
    """A beam request whose beams could need more blocks than the cache has fails with a 400 (waiting would hold
    the queue behind it for ever); the requests after it are served."""
    small = TorchEngine(
        model_dir,
        max_batch_size=4,
        max_input_len=16,
        max_new_tokens=12,
        dtype="fp32",
        tokens_per_block=8,
        max_tokens_in_paged_kv_cache=32,
    )
    await small.start()
    try:
        wide = SamplingParams(max_new_tokens=12, beam_width=3)
        out = await collect(small, "too-wide", PROMPT, wide, streaming=False)
        assert out[-1].error_code == 400 and out[-1].error_field == "beam_search" and "KV blocks" in out[-1].error
        after = await collect(small, "after", PROMPT, SamplingParams(max_new_tokens=3), streaming=False)
        assert after[-1].error is None and len(after[-1].token_ids) == 3
    finally:
        await small.close()
