"""Medusa on the Executor over TensorRT engines, as planned (lmi_trt.engines.trtllm_medusa): trtllm-serve's and
vLLM's keys → the tree of draft paths, mc_sim_7b_63 cut to the engine's draft length when none is given, and the
refusals, each naming the key."""

from __future__ import annotations

import re

import pytest
from trtllm_testing import fake_tensorrt_llm

from lmi_trt.engines.trtllm_medusa import (
    MC_SIM_7B_63,
    built_draft_len,
    check_choices,
    decoding_config,
    deepest_path_error,
    default_choices,
    executor_medusa,
    for_engine,
    medusa_refusals,
)
from lmi_trt.speculative import SpeculationError, resolve

KEY = "option.speculative_config"


def medusa(beams=1, **members):
    return executor_medusa(
        resolve({"decoding_type": "Medusa", "speculative_model_dir": "/heads", **members}, {}), beams
    )


def test_trtllm_serve_s_form():
    plan = medusa(max_draft_len=3, num_medusa_heads=2, medusa_choices=[[0], [0, 0], [1]])
    assert (plan.heads_model, plan.choices, plan.num_heads, plan.draft_len) == ("/heads", ((0,), (0, 0), (1,)), 2, 3)
    assert plan.describe() == "Medusa (3 draft paths up to 2 deep; 3 draft tokens a step)"


def test_vllm_s_form_is_its_chain_of_one_token_per_head():
    """vLLM's MedusaProposer drafts each head's argmax, and its default token tree is the chain (module docstring)."""
    spec = resolve({"method": "medusa", "model": "/heads", "num_speculative_tokens": 3}, {})
    plan = executor_medusa(spec, 1)
    assert plan.choices == ((0,), (0, 0), (0, 0, 0)) and plan.chosen
    assert plan.tree_key == f"{KEY}.num_speculative_tokens"
    with pytest.raises(SpeculationError, match=r"num_speculative_tokens=3: asks for paths 3 deep .* has 2 heads"):
        built_draft_len(spec, 2)  # more tokens than heads: refused before the build
    assert built_draft_len(spec, 3) == 3
    both = {"method": "medusa", "model": "/heads", "num_speculative_tokens": 2, "medusa_choices": [[0], [1]]}
    with pytest.raises(SpeculationError, match="vLLM's chain of one token per head"):
        executor_medusa(resolve(both, {}), 1)


def test_the_engine_is_built_with_the_tree_s_path_count():
    """mc_sim_7b_63 cut to one head's paths holds 10, so a max_draft_len of 63 builds a 10-token engine; a chosen
    tree builds its own count."""
    spec = resolve({"decoding_type": "Medusa", "speculative_model_dir": "/heads", "max_draft_len": 63}, {})
    assert built_draft_len(spec, 1) == len(default_choices(63, 1)) == 10
    assert built_draft_len(spec, 4) == 63
    chosen = {"decoding_type": "Medusa", "speculative_model_dir": "/heads", "max_draft_len": 8}
    assert built_draft_len(resolve({**chosen, "medusa_choices": [[0], [1]]}, {}), 4) == 2


def test_the_default_tree_is_mc_sim_7b_63():
    assert len(MC_SIM_7B_63) == 63 and max(map(len, MC_SIM_7B_63)) == 4
    assert default_choices(63, None) == MC_SIM_7B_63
    # every prefix is a tree, and a head count keeps the paths it can draft
    assert all(check_choices([list(p) for p in MC_SIM_7B_63[:n]], "k") for n in range(1, 64))
    assert max(map(len, default_choices(63, 2))) == 2


def test_another_method_is_not_medusa():
    assert executor_medusa(resolve({"decoding_type": "Lookahead"}, {}), 1) is None
    assert executor_medusa(None, 1) is None


@pytest.mark.parametrize(
    ("members", "beams", "key", "why"),
    [
        ({"medusa_choices": [[0, 0]]}, 1, f"{KEY}.medusa_choices", "lacks its parent [0]"),
        ({"medusa_choices": [[0], [0]]}, 1, f"{KEY}.medusa_choices", "repeats a path"),
        ({"medusa_choices": [[-1]]}, 1, f"{KEY}.medusa_choices", "ranks >= 0"),
        ({"medusa_choices": []}, 1, f"{KEY}.medusa_choices", "non-empty list"),
        ({"medusa_choices": [[0], [1]], "max_draft_len": 1}, 1, f"{KEY}.max_draft_len", "every one of"),
        ({"medusa_choices": [[0], [0, 0]], "num_medusa_heads": 1}, 1, f"{KEY}.medusa_choices", "2 deep"),
        # speculativeChoicesUtils.cpp computePrefix: ranks in 4 bits, 16 deep
        ({"medusa_choices": [[0], [17]], "max_draft_len": 2}, 1, f"{KEY}.medusa_choices", "too large node degree"),
        ({"medusa_choices": [[0] * n for n in range(1, 18)], "max_draft_len": 17}, 1, f"{KEY}.medusa_choices", "16"),
        ({"num_medusa_heads": 0}, 1, f"{KEY}.num_medusa_heads", ">= 1"),
        ({"eagle_choices": [[0]]}, 1, f"{KEY}.eagle_choices", "not a member of Medusa"),
        ({}, 2, "option.max_beam_width", "one draft path per request"),
    ],
)
def test_refusals_name_the_key(members, beams, key, why):
    with pytest.raises(SpeculationError, match=re.escape(why)) as caught:
        medusa(beams, **{"max_draft_len": 4, **members})
    assert caught.value.key == key


def test_medusa_without_heads_decodes_with_a_precompiled_engine_s_own():
    """No heads named: the Executor's tree for an engine that carries its heads; the compile stage, which builds them
    in, refuses to plan without them (plan.py _check_medusa), and a precompiled engine refuses named ones
    (stages._refuse_unused_heads; both in test_trtllm_medusa_decoding.py)."""
    plan = executor_medusa(resolve({"decoding_type": "Medusa", "max_draft_len": 4}, {}), 1)
    assert plan is not None and plan.heads_model is None and plan.choices == default_choices(4, None)


def test_conversion_keys_beside_a_precompiled_engine_are_the_engine_s_or_refused():
    """num_medusa_heads and max_draft_len are read when TensorRT-LLM builds an engine (model.py, llm_args.py); beside
    a precompiled one (no heads named) a value other than its config.json's would be ignored, so it is refused,
    naming the key, the value and the engine's; the engine's own values, or num_medusa_heads left out, serve."""
    from lmi_trt.engines.trtllm_medusa import engine_medusa_errors

    def precompiled(**members):
        return executor_medusa(resolve({"decoding_type": "Medusa", **members}, {}), 1)

    tree = [[0], [0, 0], [1], [0, 1]]
    assert engine_medusa_errors(precompiled(max_draft_len=4, medusa_choices=tree), 4, 4, 2) == []
    assert engine_medusa_errors(precompiled(max_draft_len=4, medusa_choices=tree, num_medusa_heads=2), 4, 4, 2) == []
    (heads,) = engine_medusa_errors(precompiled(max_draft_len=4, medusa_choices=tree, num_medusa_heads=3), 4, 4, 2)
    assert heads.startswith(f"{KEY}.num_medusa_heads=3: option.model_id is a precompiled TensorRT engine")
    assert "pretrained_config.num_medusa_heads=2; leave it out, or set it to 2" in heads
    (length,) = engine_medusa_errors(precompiled(max_draft_len=63, medusa_choices=tree), 4, 4, 2)
    assert length.startswith(f"{KEY}.max_draft_len=63: option.model_id is a precompiled TensorRT engine")
    assert "pretrained_config.max_draft_len=4 (what the Executor runs: gptJsonConfig.cpp); set it to 4" in length
    # the default tree follows max_draft_len (cut to the engine's heads, as TrtllmEngine does): one error, on the key
    # that set both
    (default,) = engine_medusa_errors(for_engine(precompiled(max_draft_len=63), 2), 4, 4, 2)
    assert default.startswith(f"{KEY}.max_draft_len=63:")
    # an engine lmi-trt builds has the tree's paths as draft tokens, fewer than a larger max_draft_len (heads named)
    jit = for_engine(medusa(max_draft_len=63), 1)
    assert len(jit.choices) < 63 and engine_medusa_errors(jit, 4, len(jit.choices), 1) == []


def test_ranks_are_what_a_4_bit_chunk_holds():
    """computePrefix lets 16 through, but [0, 16] then gets [1, 0]'s prefix: 15 is the last rank taken."""
    assert check_choices([[0], [15]], "k") == ((0,), (15,))
    with pytest.raises(SpeculationError, match="16 overlaps the next rank"):
        check_choices([[0], [1], [0, 16]], "k")


def test_a_path_deeper_than_the_heads_checkpoint():
    plan = medusa(max_draft_len=4, medusa_choices=[[0], [0, 0], [0, 0, 0]])
    assert "paths 3 deep and the heads checkpoint /heads has 2 heads" in deepest_path_error(plan, 2, "x")[1]
    assert deepest_path_error(plan, 3, "x") is None


def test_request_features_medusa_refuses():
    refusals = medusa_refusals()
    assert "passes no log-prob outputs" in refusals["logprobs"]
    assert {"sampling", "beam_search", "guided", "seed"} <= set(refusals)


def test_the_executor_gets_the_medusa_mode_and_choices():
    with fake_tensorrt_llm() as trt:
        tle = trt.bindings.executor
        config = decoding_config(tle, medusa(max_draft_len=2, medusa_choices=[[0], [1]]))
        assert config.medusa_choices == [[0], [1]]
        assert config.decoding_mode.isMedusa()


def test_an_engine_is_checked_as_medusa_module_checks_it():
    from lmi_trt.engines.trtllm_medusa import engine_medusa_errors

    plan = medusa(max_draft_len=3, medusa_choices=[[0], [0, 0], [1]])
    assert engine_medusa_errors(plan, 4, 3, 2) == []
    assert "needs an engine built with --speculative_decoding_mode medusa" in engine_medusa_errors(plan, 8, 3, 2)[0]
    more = engine_medusa_errors(plan, 4, 2, 2)[0]
    assert more.startswith(
        f"{KEY}.medusa_choices: the tree has 3 paths, and the engine's Medusa draft tokens are "
        "pretrained_config.max_draft_len=2"
    )
    # fewer paths than the engine's draft tokens: not read through in TensorRT-LLM, so refused (module docstring)
    assert "the tree has 3 paths, and the engine's Medusa draft tokens are " in engine_medusa_errors(plan, 4, 4, 2)[0]
    assert "require more Medusa heads" in engine_medusa_errors(plan, 4, 3, 1)[0]
    default = medusa(max_draft_len=63)
    assert engine_medusa_errors(default, 4, 62, 4)[0].startswith(f"{KEY}.max_draft_len: the tree has 63 paths")


def test_a_medusa_engine_s_draft_tokens_and_heads_are_its_pretrained_config_s():
    """gptJsonConfig.cpp (id 809211714) reads a Medusa engine's max_draft_len and num_medusa_heads from
    pretrained_config; build_config's max_draft_len (set by trtllm-build --max_draft_len) is what the builder added
    to max_seq_len, and both must be there ('Both num_medusa_heads and max_draft_len have to be provided')."""
    from lmi_trt.engines.trtllm import parse_engine_config
    from lmi_trt.engines.trtllm_medusa import engine_medusa_errors

    pretrained = {"architecture": "MedusaForCausalLM", "dtype": "float16", "max_draft_len": 3, "num_medusa_heads": 2}
    build = {"max_input_len": 64, "max_seq_len": 101, "max_batch_size": 4, "speculative_decoding_mode": 4}
    facts = parse_engine_config({"pretrained_config": pretrained, "build_config": {**build, "max_draft_len": 5}})
    assert (facts.max_seq_len, facts.max_draft_len, facts.medusa_draft_len, facts.num_medusa_heads) == (96, 5, 3, 2)
    plan = medusa(max_draft_len=3, medusa_choices=[[0], [0, 0], [1]])
    assert engine_medusa_errors(plan, 4, facts.medusa_draft_len, facts.num_medusa_heads) == []
    for missing in ("max_draft_len", "num_medusa_heads"):
        lacking = {k: v for k, v in pretrained.items() if k != missing}
        facts = parse_engine_config({"pretrained_config": lacking, "build_config": build})
        (error,) = engine_medusa_errors(plan, 4, facts.medusa_draft_len, facts.num_medusa_heads)
        assert "Both num_medusa_heads and max_draft_len have to be provided" in error


def test_the_default_tree_is_cut_to_the_engine_s_heads_only_when_nothing_chose_it():

    default = medusa(max_draft_len=6)
    assert max(map(len, default.choices)) == 3 and not default.chosen
    assert for_engine(default, 2).choices == default_choices(6, 2)
    chosen = medusa(max_draft_len=6, medusa_choices=[[0], [0, 0], [0, 0, 0]])
    assert for_engine(chosen, 2) is chosen  # refused at start-up instead (engine_medusa_errors)
    assert for_engine(medusa(max_draft_len=6, num_medusa_heads=3), 2).choices == default_choices(6, 3)


def test_012_is_not_verified():
    from lmi_trt.engines.trtllm_medusa import release_error

    plan = medusa(max_draft_len=3)
    assert "has not checked TensorRT-LLM 0.12.0's Medusa path" in release_error(plan, "0.12.0", (0, 12))
    assert release_error(plan, "1.0.0", (1, 0)) is None and release_error(None, "0.12.0", (0, 12)) is None
