"""The LLM API's parameter × release table (lmi_trt/engines/llmapi_releases.py): what it refuses per release and
sampler, how a request's features are read, and README.md's copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmi_trt.engines.base import SAMPLING_FEATURES, Capabilities, SamplingParams
from lmi_trt.engines.llmapi import release_capabilities, release_refusals
from lmi_trt.engines.llmapi_releases import (
    TORCH,
    TRTLLM,
    first_unsupported,
    llm_sampler,
    not_applied,
    render_table,
    replace_table,
    requested,
)

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
    why = not_applied(version, series, sampler)
    penalties_with_beams = {f"beam_width+{p}" for p in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
    assert set(why) - penalties_with_beams == expected
    assert (penalties_with_beams <= set(why)) is (sampler == TORCH)
    assert all(f"TensorRT-LLM {version}'s {sampler}" in reason for reason in why.values())


def test_the_serving_layer_refuses_from_the_same_table():
    """The engine's Capabilities (what the server's 400s and /v1/capabilities show) are the table's, plus one
    rule of the model: min_tokens holds back one end id, so a model with several is refused on every release."""
    caps, no = release_capabilities("1.2.1", TORCH, 512, [2]), release_refusals("1.2.1", TORCH, 512, [2])
    assert isinstance(caps, Capabilities) and caps.release == "TensorRT-LLM 1.2.1 (pytorch backend, TorchSampler)"
    for feature, capability in caps.features().items():
        if feature == "min_p":  # no release's path passes it here
            assert not capability.honoured
            continue
        row = "beam_width" if feature == "beam_search" else feature  # the table's row for beams
        assert capability.honoured is (row not in no), feature
        assert capability.honoured or capability.reason == no[row]
    beams = release_capabilities("1.2.1", TRTLLM, 512, [2], max_beam_width=4).beam_search
    assert beams.honoured and beams.most == 4  # 1.2 runs beams on the TRTLLMSampler
    assert not release_capabilities("1.3.0", TORCH, 512, [2]).beam_search.honoured  # option.max_beam_width is 1
    assert {f for f in SAMPLING_FEATURES if not caps.features()[f].honoured} == set(SAMPLING_FEATURES)
    caps = release_capabilities("1.3.0", TORCH, None, [2, 7])
    assert not caps.min_new_tokens.honoured and "[7]" in caps.min_new_tokens.reason
    assert not caps.logit_bias.honoured and "vocab_size" in caps.logit_bias.reason  # no vocab_size in config.json
    assert caps.seed.honoured and caps.bad_words.honoured and caps.top_logprobs.most == 20


def test_a_requests_features_and_the_first_refusal():
    plain = SamplingParams()
    assert requested(plain, bad_words=False, stop_token_ids=True) == frozenset()  # stops count with ignore_eos
    hot = SamplingParams(do_sample=True, seed=3, repetition_penalty=1.1, min_new_tokens=2, beam_width=2, logprobs=True)
    used = requested(hot, bad_words=True, stop_token_ids=False)
    assert used == {"sampling", "seed", "repetition_penalty", "min_new_tokens", "bad_words", "beam_width", "logprobs"}
    assert "seed" not in requested(SamplingParams(seed=3), bad_words=False, stop_token_ids=False)  # greedy
    rules = {"top_logprobs": "a", "beam_width+logprobs": "b", "seed": "c"}
    assert first_unsupported(rules, used) == ("logprobs", "with beam_width: b")
    assert first_unsupported({"seed": "c"}, used) == ("seed", "c")
    assert first_unsupported({"top_logprobs": "a"}, used) is None
