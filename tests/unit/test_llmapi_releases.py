"""The LLM API's parameter × release table (lmi_trt/engines/llmapi_releases.py): what it refuses per release and
sampler, how a request's features are read, and README.md's copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_trt.engines.base import SamplingParams, features_used, refusal
from lmi_trt.engines.llmapi_releases import TORCH, TRTLLM, llm_sampler, refused, render_table, replace_table

README = Path(__file__).resolve().parents[2] / "README.md"
IGNORED_BY_TORCH_SAMPLER = {"seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_new_tokens"}


def test_readme_has_the_table():
    text = README.read_text()
    assert replace_table(text) == text, "README.md is stale: run python -m lmi_trt.engines.llmapi_releases"
    assert render_table() in text


def test_the_sampler_per_release():
    assert llm_sampler((1, 0), 1) == TRTLLM  # built with enable_trtllm_sampler: 1.0's TorchSampler is greedy
    assert [llm_sampler(s, 1) for s in ((1, 1), (1, 2), (1, 3), (1, 4))] == [TORCH] * 4
    assert [llm_sampler(s, 4) for s in ((1, 1), (1, 2), (1, 3))] == [TRTLLM, TRTLLM, TORCH]  # auto picks it for beams


@pytest.mark.parametrize(
    "version, series, sampler, expected",
    [
        ("1.0.0", (1, 0), TRTLLM, {"top_logprobs", "prompt_logprobs", "logit_bias", "beam_width+logprobs"}),
        (
            "1.1.0",
            (1, 1),
            TORCH,
            IGNORED_BY_TORCH_SAMPLER | {"bad_words", "prompt_logprobs", "beam_width", "beam_width+logprobs"},
        ),
        (
            "1.2.1",
            (1, 2),
            TORCH,
            IGNORED_BY_TORCH_SAMPLER
            | {"bad_words", "stop_token_ids", "prompt_logprobs", "beam_width", "beam_width+logprobs"},
        ),
        ("1.3.0", (1, 3), TORCH, {"stop_token_ids", "beam_width+logprobs"}),
    ],
)
def test_what_each_release_refuses(version, series, sampler, expected):
    why = dict(refused(version, series, sampler))
    penalties_with_beams = {f"beam_width+{p}" for p in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
    assert set(why) - penalties_with_beams == expected
    assert (penalties_with_beams <= set(why)) is (sampler == TORCH)
    assert all(f"TensorRT-LLM {version}'s {sampler}" in reason for reason in why.values())


def test_a_requests_features_and_the_first_refusal():
    plain = SamplingParams()
    assert features_used(plain, bad_words=False, stop_token_ids=True) == frozenset()  # stops count with ignore_eos
    hot = SamplingParams(do_sample=True, seed=3, repetition_penalty=1.1, min_new_tokens=2, beam_width=2, logprobs=True)
    used = features_used(hot, bad_words=True, stop_token_ids=False)
    assert used == {"sampling", "seed", "repetition_penalty", "min_new_tokens", "bad_words", "beam_width", "logprobs"}
    assert "seed" not in features_used(SamplingParams(seed=3), bad_words=False, stop_token_ids=False)  # greedy
    rules = (("top_logprobs", "a"), ("beam_width+logprobs", "b"), ("seed", "c"))
    assert refusal(rules, used) == ("logprobs", "with beam_width: b")
    assert refusal(rules[2:], used) == ("seed", "c")
    assert refusal(rules[:1], used) is None
