"""Speculative decoding: its configuration (DJL's keys, TensorRT-LLM's and vLLM's JSON, merged and
checked; which engine runs what), the built-in decode loop's n-gram drafts and drafting policy, the
verification of drafts on the device and its output distribution, and its figures on /metrics."""

from __future__ import annotations

import json

import pytest
import torch

from lmi_trt import stages
from lmi_trt.config import ConfigError, load_config, speculation, with_draft_model
from lmi_trt.engines.base import SamplingParams
from lmi_trt.engines.registry import PYTORCH, TENSORRT, TORCH
from lmi_trt.engines.torch.gpu_sampler import Mode, SamplerState, sample
from lmi_trt.engines.torch.speculation import (
    MAX_BACKOFF,
    MISSES,
    Drafting,
    NgramIndex,
    accepted_counts,
    position_rows,
    verify,
)
from lmi_trt.speculative import SpeculationError

ENV = {"HF_MODEL_ID": "m"}


def config(**options):
    return load_config(overrides={f"option.{k}": v for k, v in options.items()}, env=ENV)


def spec_of(**options):
    return speculation(config(**options))


# -- configuration -------------------------------------------------------------------------------


def test_the_three_vocabularies_say_the_same_thing():
    trtllm = spec_of(
        speculative_config=json.dumps(
            {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4, "max_concurrency": 8}
        )
    )
    vllm = spec_of(
        speculative_config=json.dumps(
            {
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 1,
                "disable_by_batch_size": 8,
            }
        )
    )
    flat = spec_of(
        speculative_decoding_mode="ngram",
        speculative_length="3",  # DJL lmi-dist's name for option.max_draft_len
        prompt_lookup_max="4",
        speculative_disable_by_batch_size="8",
    )
    for spec in (trtllm, vllm, flat):
        assert (spec.method, spec.max_draft_len, spec.max_matching_ngram_size, spec.max_concurrency) == (
            "ngram",
            3,
            4,
            8,
        )
        assert spec.min_matching_ngram_size == 1 and spec.use_oldest is None and spec.options == {}
    assert trtllm.key("method") == "option.speculative_config.decoding_type"
    assert flat.key("max_draft_len") == "option.max_draft_len"
    # The environment works as for every key (DJL's OPTION_* rule).
    from_env = load_config(env=ENV | {"OPTION_SPECULATIVE_CONFIG": '{"method": "ngram", "num_speculative_tokens": 2}'})
    assert speculation(from_env).max_draft_len == 2
    assert speculation(config()) is None


def test_draft_models_djl_style_and_json_style():
    # DJL: option.speculative_draft_model alone turns it on, option.speculative_length defaults to 5
    # (djl-serving lmi_dist_rb_properties.py and tnx_properties.py: speculative_length: int = 5).
    djl = spec_of(speculative_draft_model="s3://bucket/draft")
    assert (djl.method, djl.max_draft_len, djl.draft_model) == ("draft_model", 5, "s3://bucket/draft")
    assert spec_of(draft_model_id="org/small", spec_length="2").max_draft_len == 2  # DJL properties.py names
    trt = spec_of(
        speculative_config='{"decoding_type": "Draft_Target", "max_draft_len": 5, "speculative_model_dir": "/d"}'
    )
    vllm = spec_of(speculative_config='{"method": "draft_model", "num_speculative_tokens": 5, "model": "/d"}')
    assert trt.model_dump(exclude={"keys"}) == vllm.model_dump(exclude={"keys"})
    assert (trt.method, trt.draft_model) == ("draft_model", "/d")
    # The loader replaces the id by the folder it resolved to, wherever it was set.
    cfg = config(speculative_config='{"method": "draft_model", "num_speculative_tokens": 5, "model": "org/d"}')
    resolved = with_draft_model(cfg, __import__("pathlib").Path("/cache/d"))
    assert speculation(resolved).draft_model == "/cache/d" and not resolved.is_given("speculative_config")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"speculative_config": '{"method": "ngram"}'},
            "option.speculative_config.method='ngram': needs a draft length",
        ),
        ({"max_draft_len": "3"}, "option.max_draft_len=3: sets up speculative decoding without saying how to draft"),
        (
            {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2, "max_draft_len": 2}'},
            "sets the same thing as option.speculative_config.num_speculative_tokens",
        ),
        (
            {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}', "max_draft_len": "3"},
            "option.max_draft_len=3: disagrees with option.speculative_config.num_speculative_tokens=2",
        ),
        (
            {"speculative_decoding_mode": "ngram", "speculative_draft_model": "x"},
            "which n-gram speculation does not use",
        ),
        ({"speculative_decoding_mode": "draft_model"}, "needs the draft model"),
        ({"speculative_draft_model": "x", "prompt_lookup_max": "3"}, "configures n-gram drafting, not draft_model"),
        (
            {"speculative_decoding_mode": "ngram", "prompt_lookup_min": "3", "max_matching_ngram_size": "2"},
            "option.prompt_lookup_min=3: is above the largest n-gram",
        ),
        (
            {"speculative_config": '{"method": "ngramz", "num_speculative_tokens": 2}'},
            "not a speculative-decoding method",
        ),
        ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": 0}'}, "is not a positive integer"),
        ({"speculative_config": "[1, 2]"}, "is not a JSON object"),
        ({"speculative_config": "{nope"}, "is not JSON"),
        ({"speculative_decoding_mode": "warp"}, "is not one of: ngram, draft_model"),
    ],
)
def test_what_cannot_work_is_refused_at_load_naming_the_key(options, message):
    with pytest.raises(ConfigError, match=__import__("re").escape(message)):
        config(**options)


def torch_view(**options):
    return stages.torch_settings(stages.settle(config(**options), "torch"))


@pytest.mark.parametrize(
    ("options", "where"),
    [
        (
            {"speculative_config": '{"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "e"}'},
            "eagle3 runs on TensorRT-LLM's pytorch backend (option.rolling_batch=trtllm, option.backend=pytorch)",
        ),
        (
            {"speculative_config": '{"decoding_type": "MTP", "max_draft_len": 1}'},
            "mtp runs on TensorRT-LLM's pytorch backend, for models with MTP heads",
        ),
        (
            {"speculative_decoding_mode": "medusa", "max_draft_len": "4"},
            "medusa runs on lmi-trt's tensorrt backend (option.rolling_batch=trtllm, option.backend=tensorrt",
        ),
        ({"speculative_decoding_mode": "lookahead_decoding", "max_draft_len": "4"}, "lookahead runs on"),
    ],
)
def test_the_torch_engine_refuses_the_methods_it_does_not_run_saying_where_they_run(options, where):
    with pytest.raises(SpeculationError) as err:
        torch_view(**options)
    assert err.value.key in ("option.speculative_config.decoding_type", "option.speculative_decoding_mode")
    assert "the torch engine does not run" in str(err.value) and where in str(err.value)


def test_the_torch_engine_reads_what_it_honours_and_refuses_the_rest():
    ok = torch_view(
        speculative_config='{"decoding_type": "NGram", "max_draft_len": 3, "is_use_oldest": true, '
        '"is_keep_all": true, "is_public_pool": false}'
    )
    assert ok.speculative.use_oldest and ok.speculative.max_draft_len == 3
    with pytest.raises(SpeculationError, match=r"option.speculative_config.is_public_pool=True: .*set false"):
        torch_view(speculative_config='{"decoding_type": "NGram", "max_draft_len": 3, "is_public_pool": true}')
    with pytest.raises(SpeculationError, match="option.speculative_config.acceptance_rate_threshold=0.5"):
        torch_view(
            speculative_config='{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate_threshold": 0.5}'
        )
    # The options it reads count as honoured by the torch engine and by the LLM API (which plans them per release:
    # tests/unit/test_llmapi_speculative_plan.py) and by the Executor over TensorRT engines (n-gram draft tokens:
    # lmi_trt.engines.trtllm_drafts), which refuses a draft model, saying where it runs.
    cfg = stages.settle(config(speculative_config='{"method": "ngram", "num_speculative_tokens": 3}'), "torch")
    assert {"speculative_config", "speculative_decoding_mode", "speculative_draft_model"} <= stages.honoured(TORCH, cfg)
    stages.refuse_ignored(TORCH, cfg)
    llm = stages.settle(cfg.model_copy(update={"backend": "pytorch"}), "trtllm")
    stages.refuse_ignored(PYTORCH, llm)
    engines = stages.settle(cfg.model_copy(update={"backend": "tensorrt"}), "trtllm")
    stages.refuse_ignored(TENSORRT, engines)
    mtp = engines.model_copy(update={"speculative_config": {"method": "mtp", "num_speculative_tokens": 1}})
    with pytest.raises(SpeculationError, match=r"option.speculative_config.method='mtp': .*tensorrt backend.*pytorch"):
        stages.refuse_ignored(TENSORRT, mtp)


# -- n-gram drafts and the drafting policy --------------------------------------------------------


def test_ngram_lookup_takes_the_longest_match_and_its_latest_or_first_occurrence():
    seq = [1, 2, 3, 9, 2, 3, 8, 5, 2, 3]
    latest, oldest = NgramIndex(1, 3, oldest=False), NgramIndex(1, 3, oldest=True)
    for index in (latest, oldest):
        index.extend(seq[:4])
        index.extend(seq[4:])  # incrementally, as tokens come
    assert latest.propose(3) == [8, 5, 2]  # [2, 3] last seen before 8
    assert oldest.propose(3) == [9, 2, 3]  # [2, 3] first seen before 9
    long = NgramIndex(1, 3, oldest=False)
    long.extend([7, 2, 3, 4, 1, 2, 3, 6, 7, 2, 3])  # [7, 2, 3] (3 tokens) beats [2, 3]'s later match
    assert long.propose(2) == [4, 1]
    short = NgramIndex(2, 3, oldest=False)
    short.extend([5, 6, 7, 8])
    assert short.propose(4) == []  # no repeated 2-gram: nothing to propose
    short.extend([7, 8])
    assert short.propose(4) == [7, 8]  # the continuation runs up to the end of the sequence


def test_drafting_backs_off_when_it_does_not_pay_and_comes_back():
    state = Drafting()
    for _ in range(MISSES):
        assert state.eligible
        state.missed()
    pauses = [state.pause]
    for _ in range(pauses[0]):
        state.stepped()
    assert state.eligible
    for _ in range(8):  # every draft rejected: pauses that double, up to MAX_BACKOFF
        while not state.eligible:
            state.stepped()
        state.verified(4, 0)
        if state.pause:
            pauses.append(state.pause)
    assert pauses[:3] == [1, 2, 4] and max(pauses) <= MAX_BACKOFF
    while not state.eligible:
        state.stepped()
    state.verified(4, 4)  # accepted again: the next pause starts short
    assert state.eligible and state.backoff == 1


# -- verification on the device ---------------------------------------------------------------------


VOCAB = 8


def one_row_state(params: SamplingParams, seed: int) -> SamplerState:
    state = SamplerState(1, VOCAB, torch.device("cpu"), [7])
    state.admit([0], [params], [seed], [True], [[1]], [[]])
    return state


def test_accepted_counts_is_the_matching_prefix_within_the_proposed_drafts():
    targets = torch.tensor([[4, 5, 6, 1], [4, 9, 6, 1], [4, 5, 6, 1], [3, 3, 3, 3]])
    drafts = torch.tensor([[4, 5, 6], [4, 5, 6], [4, 5, 6], [3, 3, 3]])
    assert accepted_counts(targets, drafts, torch.tensor([3, 3, 1, -1])).tolist() == [3, 1, 1, 0]


def test_greedy_verification_equals_decoding_one_token_at_a_time_with_penalties():
    """Each position is chosen with the counts decoding would have had there: a repetition penalty that
    bans a repeat changes the target's token right after the draft that introduced it."""
    params = SamplingParams(max_new_tokens=8, repetition_penalty=50.0)
    state = one_row_state(params, 0)
    logits = torch.zeros(3, VOCAB)
    logits[:, 3] = 5.0  # every position prefers 3 ...
    logits[:, 4] = 4.0  # ... then 4
    drafts, proposed = torch.tensor([[3, 3]]), torch.tensor([2])
    rows = position_rows(state.rows(torch.zeros(3, dtype=torch.long)), drafts, proposed)
    tokens, _, status, emitted = verify(
        logits, rows, drafts, proposed, torch.tensor([0, 1, 2]), state.eos, Mode.PROCESSED
    )
    # Position 0: 3 (nothing generated yet); position 1 has seen the draft 3, penalised: 4, so the second draft fails.
    assert tokens.tolist()[0][:2] == [3, 4] and emitted.tolist() == [2] and status.abs().sum() == 0


def test_sampled_verification_keeps_the_target_distribution():
    """Rejection sampling with deterministic drafts (q one-hot): with a draft that is often wrong, the
    first token is still distributed as p0, and the second, given the first draft was accepted, as p1;
    and per seed the first token is the one decoding without drafts draws. 20,000 requests with fixed
    seeds, verified in one batch: the same draws every run."""
    n = 20_000
    p0 = torch.tensor([0.05, 0.3, 0.1, 0.2, 0.05, 0.15, 0.1, 0.05])
    p1 = torch.tensor([0.4, 0.05, 0.05, 0.1, 0.1, 0.1, 0.15, 0.05])
    params = SamplingParams(max_new_tokens=8, do_sample=True, temperature=1.0, ignore_eos=True)
    state = SamplerState(n, VOCAB, torch.device("cpu"), [7])
    state.admit(list(range(n)), [params] * n, list(range(n)), [False] * n, [[1]] * n, [[]] * n)
    logits = torch.stack([p0.log(), p1.log()]).repeat(n, 1)  # [n · 2, vocab], sequence-major
    drafts, proposed = torch.full((n, 1), 3), torch.ones(n, dtype=torch.long)
    rows = position_rows(state.rows(torch.arange(n).repeat_interleave(2)), drafts, proposed)
    generated = torch.tensor([0, 1]).repeat(n)
    tokens, _, _, emitted = verify(logits, rows, drafts, proposed, generated, state.eos, Mode.SAMPLED)
    first = torch.bincount(tokens[:, 0], minlength=VOCAB).float()
    accepted = emitted == 2
    assert bool((tokens[accepted, 0] == 3).all()) and bool((tokens[~accepted, 0] != 3).all())
    second = torch.bincount(tokens[accepted, 1], minlength=VOCAB).float()
    plain, _, _ = sample(
        logits[::2], state.rows(slice(0, n)), torch.zeros(n, dtype=torch.long), state.eos, Mode.SAMPLED
    )
    assert torch.equal(plain, tokens[:, 0])  # the same draw as decoding one token at a time
    tv_first = 0.5 * (first / n - p0).abs().sum()
    tv_second = 0.5 * (second / second.sum() - p1).abs().sum()
    # ~4,000 second tokens (p0[3] = 0.2): a TV distance's sampling noise is about 0.02 at that size.
    assert second.sum() > 3_000 and tv_first < 0.02 and tv_second < 0.04, (tv_first, tv_second)


def test_vllm_ngram_bounds_and_model_ngram_follow_vllm():
    """vllm/config/speculative.py SpeculativeConfig.__post_init__: neither prompt_lookup bound given, both 5; one
    given, the other copies it; ``model: "ngram"`` without a method is the n-gram method, not a draft model id."""

    def bounds(**member):
        spec = spec_of(speculative_config=json.dumps({"num_speculative_tokens": 3, **member}))
        return spec.method, spec.draft_model, spec.min_matching_ngram_size, spec.max_matching_ngram_size

    assert bounds(method="ngram") == ("ngram", None, 5, 5)
    assert bounds(method="ngram", prompt_lookup_max=4) == ("ngram", None, 4, 4)
    assert bounds(method="ngram", prompt_lookup_min=3) == ("ngram", None, 3, 3)
    assert bounds(model="ngram", prompt_lookup_min=1, prompt_lookup_max=3) == ("ngram", None, 1, 3)
    assert bounds(model="[ngram]") == ("ngram", None, 5, 5)
    # TensorRT-LLM's form keeps its own default (max_matching_ngram_size 2, down to one token)
    trt = spec_of(speculative_config=json.dumps({"decoding_type": "NGram", "max_draft_len": 3}))
    assert (trt.min_matching_ngram_size, trt.max_matching_ngram_size) == (1, 2)
