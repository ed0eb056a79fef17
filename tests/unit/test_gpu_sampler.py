"""The built-in decode loop's batched sampler against transformers' own logits processors (CPU).

Each row of one batch carries different settings; every row must come out as transformers'
processors would make it for that request alone.
"""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from lmi_trt.engines.base import SamplingParams
from lmi_trt.engines.torch.backend import banned_next_tokens
from lmi_trt.engines.torch.gpu_sampler import Mode, SamplerState, process, row_mode, sample, uniforms, warp

VOCAB = 97
EOS = [2, 5]
CPU = torch.device("cpu")


def state_for(rows: list[dict]) -> SamplerState:
    """A SamplerState whose slot i is admitted with rows[i] (params, prompt, generated, bad words)."""
    state = SamplerState(len(rows), VOCAB, CPU, EOS)
    state.admit(
        list(range(len(rows))),
        [r["params"] for r in rows],
        [r.get("seed", 0) for r in rows],
        [not r["params"].ignore_eos for r in rows],
        [r["prompt"] for r in rows],
        [[w[0] for w in r.get("bad", []) if len(w) == 1] for r in rows],
    )
    for i, r in enumerate(rows):
        for t in r["generated"]:
            state.counts[i, t] += 1
        context = r["prompt"] + r["generated"]
        multi = [w for w in r.get("bad", []) if len(w) > 1]
        state.mark(state.banned_now, [i], [banned_next_tokens(context, multi)], True)
    return state


def hf_scores(logits: torch.Tensor, r: dict) -> torch.Tensor:
    """transformers' generate() pipeline for one request: processors, then (sampling) warpers."""
    p: SamplingParams = r["params"]
    ids = torch.tensor([r["prompt"] + r["generated"]])
    scores = logits.clone().unsqueeze(0)
    if p.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, scores)
    if r.get("bad"):
        scores = NoBadWordsLogitsProcessor(r["bad"], eos_token_id=EOS)(ids, scores)
    if p.min_new_tokens and not p.ignore_eos:  # with ignore_eos, EOS is an ordinary token
        scores = MinNewTokensLengthLogitsProcessor(len(r["prompt"]), p.min_new_tokens, EOS)(ids, scores)
    if p.do_sample:
        scores = TemperatureLogitsWarper(p.temperature)(ids, scores)
        if p.top_k:
            scores = TopKLogitsWarper(p.top_k)(ids, scores)
        if p.top_p < 1.0:
            scores = TopPLogitsWarper(p.top_p)(ids, scores)
    return scores[0]


ROWS = [
    {"params": SamplingParams(repetition_penalty=1.7), "prompt": [3, 9, 11], "generated": [40, 41]},
    {"params": SamplingParams(min_new_tokens=4), "prompt": [7, 8], "generated": [12, 13]},
    {
        "params": SamplingParams(),
        "prompt": [7, 8, 30],
        "generated": [31, 12],
        "bad": [[50], [61], [31, 12, 44], [12, 45], [8, 46]],
    },
    {"params": SamplingParams(do_sample=True, temperature=0.7, top_k=10), "prompt": [1], "generated": []},
    {"params": SamplingParams(do_sample=True, temperature=1.3, top_p=0.6), "prompt": [1, 4], "generated": [6]},
    {
        "params": SamplingParams(
            do_sample=True, temperature=0.9, top_k=20, top_p=0.8, repetition_penalty=0.8, min_new_tokens=3
        ),
        "prompt": [20, 21],
        "generated": [22],
        "bad": [[70]],
    },
    {"params": SamplingParams(min_new_tokens=3, ignore_eos=True), "prompt": [1], "generated": []},
]


def test_mixed_batch_matches_transformers_processors_row_by_row():
    torch.manual_seed(0)
    logits = torch.randn(len(ROWS), VOCAB) * 3
    state = state_for(ROWS)
    rows = state.rows(slice(0, len(ROWS)))
    generated = torch.tensor([len(r["generated"]) for r in ROWS])
    processed = process(logits, rows, generated, state.eos)
    warped = warp(processed, rows)
    for i, r in enumerate(ROWS):
        expected = hf_scores(logits[i], r)
        ours = warped[i] if r["params"].do_sample else processed[i]
        # Same kept set, same distribution (top_p=1 may also drop tokens of probability 0).
        assert torch.equal(
            torch.isfinite(ours) & (ours.softmax(-1) > 0), torch.isfinite(expected) & (expected.softmax(-1) > 0)
        ), i
        torch.testing.assert_close(ours.softmax(-1), expected.softmax(-1), rtol=1e-5, atol=1e-6)
    # The ignore_eos row is not subject to min_new_tokens' EOS ban; the min_new row is.
    assert torch.isfinite(processed[6, EOS]).all() and torch.isinf(processed[1, EOS]).all()


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    state = state_for([{"params": params, "prompt": [10, 11], "generated": [10, 12, 12, 12]}])
    logits = torch.zeros(1, VOCAB)
    out = process(logits, state.rows(slice(0, 1)), torch.tensor([4]), state.eos)[0]
    assert out[10] == pytest.approx(-0.75) and out[12] == pytest.approx(-1.25)
    assert out[11] == 0 and out[13] == 0  # prompt-only and unseen tokens are untouched


def test_greedy_rows_take_the_argmax_and_report_raw_logprobs():
    torch.manual_seed(1)
    logits = torch.randn(3, VOCAB)
    state = state_for([{"params": SamplingParams(), "prompt": [1], "generated": []}] * 3)
    tokens, logprobs, status = sample(
        logits, state.rows(slice(0, 3)), torch.zeros(3, dtype=torch.long), state.eos, Mode.GREEDY
    )
    assert tokens.tolist() == logits.argmax(-1).tolist() and status.tolist() == [0, 0, 0]
    torch.testing.assert_close(logprobs, logits.log_softmax(-1).gather(1, tokens[:, None])[:, 0])


def test_failures_are_per_row():
    logits = torch.randn(3, VOCAB)
    logits[0, 4] = float("nan")
    everything = [[t] for t in range(VOCAB) if t not in EOS]
    rows = [
        {"params": SamplingParams(), "prompt": [1], "generated": []},
        {"params": SamplingParams(min_new_tokens=2), "prompt": [1], "generated": [], "bad": everything},
        {"params": SamplingParams(), "prompt": [1], "generated": []},
    ]
    state = state_for(rows)
    tokens, _, status = sample(
        logits, state.rows(slice(0, 3)), torch.zeros(3, dtype=torch.long), state.eos, Mode.PROCESSED
    )
    assert status.tolist() == [1, 2, 0]
    assert tokens[2] == logits[2].argmax()


def test_seeded_draws_depend_on_the_seed_and_step_only():
    torch.manual_seed(2)
    logits = torch.randn(4, VOCAB)
    sampled = {"params": SamplingParams(do_sample=True, top_k=30), "prompt": [1], "generated": []}
    other = {"params": SamplingParams(do_sample=True, temperature=2.0), "prompt": [3], "generated": []}
    alone = state_for([dict(sampled, seed=7)])
    crowd = state_for([dict(other, seed=1), dict(other, seed=2), dict(sampled, seed=7), dict(other, seed=3)])
    for step in range(5):
        a, _, _ = sample(logits[2:3], alone.rows(slice(0, 1)), torch.tensor([step]), alone.eos, Mode.SAMPLED)
        b, _, _ = sample(logits, crowd.rows(slice(0, 4)), torch.full((4,), step), crowd.eos, Mode.SAMPLED)
        assert a[0] == b[2]
        assert a[0] in logits[2].topk(30).indices  # top_k holds


def test_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 4000
    seeds = torch.arange(n) * 7919 + 11
    u = uniforms(seeds, torch.zeros(n, dtype=torch.long), 4)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert torch.equal(u, uniforms(seeds, torch.zeros(n, dtype=torch.long), 4))  # a pure function
    draws = (probs / -u.log()).argmax(-1)
    freq = torch.bincount(draws, minlength=4).float() / n
    assert (freq - probs).abs().max() < 0.03, freq


def test_row_mode():
    assert row_mode(SamplingParams(), 0, False) == Mode.GREEDY
    assert row_mode(SamplingParams(temperature=3.0, top_k=2), 0, False) == Mode.GREEDY  # do_sample=False
    assert row_mode(SamplingParams(min_new_tokens=2), 1, False) == Mode.PROCESSED
    assert row_mode(SamplingParams(min_new_tokens=2), 2, False) == Mode.GREEDY
    assert row_mode(SamplingParams(), 0, True) == Mode.PROCESSED
    assert row_mode(SamplingParams(do_sample=True), 0, False) == Mode.SAMPLED
