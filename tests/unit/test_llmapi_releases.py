"""The LLM API's parameter × release table (lmi_trt/engines/llmapi_releases.py): what it refuses per release and
sampler, how a request's features are read, and README.md's copy of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from lmi_trt.engines.base import SAMPLING_FEATURES, Capabilities, SamplingParams
from lmi_trt.engines.llmapi import (
    llm_api_release,
    llm_end_id,
    release_capabilities,
    release_max_seq_len,
    release_refusals,
)
from lmi_trt.engines.llmapi_releases import (
    TORCH,
    TRTLLM,
    beam_width_rule,
    beams_refused,
    first_unsupported,
    llm_sampler,
    not_applied,
    render_table,
    replace_table,
    requested,
)
from lmi_trt.engines.trtllm import TrtllmUnavailable

README = Path(__file__).resolve().parents[2] / "README.md"
IGNORED_BY_TORCH_SAMPLER = {"seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "min_new_tokens"}


def test_readme_has_the_table():
    text = README.read_text()
    assert replace_table(text) == text, "README.md is stale: run python -m lmi_trt.engines.llmapi_releases"
    assert render_table() in text


def V(v: str) -> Version:  # noqa: N802 — reads as the version it is
    return Version(v)


def test_the_sampler_per_release():
    assert llm_sampler(V("1.0.0"), 1) == TRTLLM  # built with enable_trtllm_sampler: 1.0's TorchSampler is greedy
    assert [llm_sampler(V(s), 1) for s in ("1.1.0", "1.2.1", "1.3.0rc4", "1.3.0", "1.4.0")] == [TORCH] * 5
    assert [llm_sampler(V(s), 4) for s in ("1.1.0", "1.2.1", "1.3.0rc26")] == [TRTLLM, TRTLLM, TORCH]  # auto: beams
    # which sampler 'auto' picks for beams on the candidates before PR 18232 was not pinned down: refused
    assert beams_refused(V("1.3.0rc25")) and not beams_refused(V("1.3.0rc26")) and not beams_refused(V("1.2.1"))


def test_versions_compare_in_full():
    """The 1.3.0 candidates differ one from the next; the pre-releases of 1.0-1.2 were not read."""
    assert llm_api_release("1.3.0rc4") < llm_api_release("1.3.0rc25") < llm_api_release("1.3.0")
    assert llm_api_release("1.2.0.post1") > llm_api_release("1.2.0")
    for unread in ("1.1.0rc1", "1.2.0rc2", "1.0.0.dev20250701"):
        with pytest.raises(TrtllmUnavailable, match="pre-release"):
            llm_api_release(unread)
    with pytest.raises(TrtllmUnavailable, match="no PyTorch LLM API"):
        llm_api_release("0.21.0")
    with pytest.raises(TrtllmUnavailable, match="cannot read"):
        llm_api_release("main")
    # a line after 1.3 (PR 11938: the TRTLLMSampler goes in 1.4) was not read
    assert llm_api_release("1.3.5") > llm_api_release("1.3.0")
    for unread in ("1.4.0rc0", "1.4.0", "2.0.0"):
        with pytest.raises(TrtllmUnavailable, match=rf"TensorRT-LLM {unread} is newer .*1\.3"):
            llm_api_release(unread)


def test_every_request_must_be_at_max_beam_width():
    assert beam_width_rule(V("1.2.1"), 1) is None  # a wider beam is refused as exceeding it (map_request)
    for release in ("1.0.0", "1.1.0", "1.2.1", "1.3.0"):
        rule = beam_width_rule(V(release), 4)
        assert rule and release in rule and "beam_width=4" in rule and "option.max_beam_width=1" in rule


BEAMS_ON_TORCH = {"beam_width", "beam_width+logprobs", "beam_width+stop"}
# From 1.2 the TorchSampler's log probs are the top k only, without the sampled token (PR 7976; PR 9374 unmerged)
SAMPLED_LOGPROBS = {"sampling+logprobs", "sampling+top_logprobs"}


@pytest.mark.parametrize(
    "version, sampler, expected",
    [
        (
            "1.0.0",
            TRTLLM,
            {"top_logprobs", "prompt_logprobs", "logit_bias", "beam_width+logprobs", "beam_width+stop"}
            | {"sampling+top_logprobs"},
        ),
        (
            "1.1.0",
            TORCH,
            IGNORED_BY_TORCH_SAMPLER
            | BEAMS_ON_TORCH
            | {"bad_words", "prompt_logprobs", "top_logprobs"}
            | {"sampling+top_logprobs"},
        ),
        (
            "1.2.1",
            TORCH,
            IGNORED_BY_TORCH_SAMPLER
            | BEAMS_ON_TORCH
            | SAMPLED_LOGPROBS
            | {"bad_words", "stop_token_ids", "prompt_logprobs"},
        ),
        # main's fixes, one by one: min_tokens and prompt log probs (rc11), bad words (rc23), seed and penalties
        # (rc25), beams on the TorchSampler (rc26)
        (
            "1.3.0rc10",
            TORCH,
            IGNORED_BY_TORCH_SAMPLER
            | BEAMS_ON_TORCH
            | SAMPLED_LOGPROBS
            | {"bad_words", "stop_token_ids", "prompt_logprobs"},
        ),
        (
            "1.3.0rc11",
            TORCH,
            IGNORED_BY_TORCH_SAMPLER - {"min_new_tokens"}
            | BEAMS_ON_TORCH
            | SAMPLED_LOGPROBS
            | {"bad_words", "stop_token_ids"},
        ),
        (
            "1.3.0rc23",
            TORCH,
            IGNORED_BY_TORCH_SAMPLER - {"min_new_tokens"} | BEAMS_ON_TORCH | SAMPLED_LOGPROBS | {"stop_token_ids"},
        ),
        ("1.3.0rc25", TORCH, BEAMS_ON_TORCH | SAMPLED_LOGPROBS | {"stop_token_ids"}),
        ("1.3.0rc26", TORCH, SAMPLED_LOGPROBS | {"stop_token_ids", "beam_width+logprobs"}),
        ("1.3.0", TORCH, SAMPLED_LOGPROBS | {"stop_token_ids", "beam_width+logprobs"}),
    ],
)
def test_what_each_release_refuses(version, sampler, expected):
    why = not_applied(V(version), sampler)
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
    assert requested(plain, bad_words=False, stop_token_ids=True, stop=False) == frozenset()  # with ignore_eos only
    hot = SamplingParams(do_sample=True, seed=3, repetition_penalty=1.1, min_new_tokens=2, beam_width=2, logprobs=True)
    used = requested(hot, bad_words=True, stop_token_ids=False, stop=True)
    assert used == {
        "sampling",
        "seed",
        "repetition_penalty",
        "min_new_tokens",
        "bad_words",
        "stop",
        "beam_width",
        "logprobs",
    }
    assert "seed" not in requested(SamplingParams(seed=3), bad_words=False, stop_token_ids=False, stop=False)
    rules = {"top_logprobs": "a", "beam_width+logprobs": "b", "seed": "c"}
    assert first_unsupported(rules, used) == ("logprobs", "with beam_width: b")
    assert first_unsupported({"seed": "c"}, used) == ("seed", "c")
    assert first_unsupported({"top_logprobs": "a"}, used) is None


def test_the_sequence_limit_is_what_the_release_infers_from_the_checkpoint():
    """model_engine.py _infer_max_seq_len_from_config: max_position_embeddings (text_config's; else 2048), times the
    RoPE factor except for su/longrope/llama3/yarn."""
    assert release_max_seq_len({"max_position_embeddings": 4096}) == 4096
    assert (
        release_max_seq_len({"max_position_embeddings": 512, "rope_scaling": {"type": "linear", "factor": 4.0}}) == 2048
    )
    assert (
        release_max_seq_len(
            {"max_position_embeddings": 512, "rope_parameters": {"rope_type": "dynamic", "factor": 1.5}}
        )
        == 768
    )
    for kind in ("yarn", "llama3", "longrope", "su"):
        config = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": kind, "factor": 8.0}}
        assert release_max_seq_len(config) == 131072
    assert release_max_seq_len({"text_config": {"max_position_embeddings": 8192}}) == 8192
    assert release_max_seq_len({}) == 2048
    # The release reads the transformers config (ModelConfig.from_pretrained: AutoConfig): GPT-2's n_positions is its
    # max_position_embeddings (attribute_map), which config.json does not spell out
    from transformers import GPT2Config

    assert release_max_seq_len(GPT2Config(n_positions=1024)) == 1024
    # a multimodal model's pretrained config is its text config: its rope scaling counts
    mm = {"text_config": {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}}
    assert release_max_seq_len(mm) == 8192


def test_kimi_k2_ends_on_its_generation_configs_eos_from_11():
    """SamplingParams._setup (PR 7120, in 1.1): a kimi_k2 model's end id is generation_config.json's single one."""
    kimi, generation = {"model_type": "kimi_k2"}, {"eos_token_id": 163586}
    assert llm_end_id(V("1.1.0"), 163585, kimi, generation) == 163586
    assert llm_end_id(V("1.0.0"), 163585, kimi, generation) == 163585  # 1.0's _setup has no such rule
    assert llm_end_id(V("1.3.0"), 163585, kimi, {"eos_token_id": [163585, 163586]}) == 163585  # not one id
    assert llm_end_id(V("1.3.0"), 2, {"model_type": "llama"}, generation) == 2
