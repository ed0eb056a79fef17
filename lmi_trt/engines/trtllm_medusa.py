"""Medusa on TensorRT-LLM's Executor over TensorRT engines: the tree of draft paths the Executor gets and what a
request cannot ask beside it. Pure; the heads' conversion into the checkpoint is ``lmi_trt.compile.medusa``'s.

What was read (NVIDIA/TensorRT-LLM; crawl copies, not tags, dated by content):

* tensorrt_llm/llmapi/llm_args.py ``MedusaDecodingConfig`` (every copy read, from the one whose
  ``DecodingBaseConfig.from_dict`` knows MTP, Medusa, Eagle and Lookahead only, to 1.x ones with
  ``supports_backend``): members ``medusa_choices`` (a list of paths) and ``num_medusa_heads`` ("defaults to the
  'medusa_num_heads' value from the Medusa model's config.json"), beside the base ``max_draft_len`` and
  ``speculative_model``; ``supports_backend`` is ``backend not in ("pytorch", "_autodeploy")``. Its documented use
  passes ``max_draft_len=63`` with the 63 paths of ``mc_sim_7b_63``: the engine's draft tokens hold the whole tree.
* cpp/tensorrt_llm/executor/decodingConfig.cpp: Medusa choices need ``DecodingMode::Medusa()`` (the fake's
  ``DecodingConfig`` models that check).
* cpp/tensorrt_llm/layers/medusaDecodingLayer.cpp (crawl copy 015884d): the target's tokens are drawn by
  ``invokeBatchTopKSampling`` with the request's top-k (default 1) and the longest draft path equal to them is
  accepted; each head's candidates are its top-k, k per path position. Every copy read (ids 6261962781, 5793101461,
  2610806528, 6028558653, 589685345) runs samplePrimeHeadTokens (TopKSamplingKernelParams), acceptDraftTokens,
  sampleNewDraftTokens in that order; the newest (id 589685345) still says "TODO add typical acceptance": acceptance
  is by token id, for greedy requests the greedy output. Log-probs: every one of those copies passes no log-prob
  outputs to that sampling ("outputLogProbs are not supported" is a comment there, not a check that fires), so a
  request's log-probs are not computed beside Medusa; lmi-trt refuses them with a 400.
* the tree's checks at the Executor's start: cpp/tensorrt_llm/runtime/utils/speculativeChoicesUtils.cpp
  ``initTensorsFromChoices`` (1.x copy id 182244635; an older runtime/medusaModule.cpp ``initMedusaTensorsFromChoices``,
  id 2784996723, has the same checks with the message "Medusa choices require more Medusa heads than the engine was
  built with."): ``TLLM_CHECK(numChoices <= getMaxDecodingDraftTokens())``; paths sorted by depth, then each new
  depth ``TLLM_CHECK(depth + 1 == curDepth)`` and "Choices require larger maxPathLen than the engine was built with."
  past the heads; ``computePrefix``: "Provided choices have too large node degree" for a rank above
  ``PREFIX_MAX_VALUE = 16`` and a depth above 64 / ``PREFIX_CHUNK_SIZE_BITS`` (4) = 16 (``MAX_RANK``: lmi-trt stops
  at 15, the most 4 bits hold); each depth's top-k is its
  largest rank + 1. A path whose parent is missing at an existing depth is hung under the root there
  (``prevPrefixToLinearIdxMap[parentPrefix]`` default-inserts 0), which lmi-trt refuses rather than run another
  tree than asked. The tree fills ``getMaxDecodingTokens()`` slots ("Fixed sequence length currently"), the rest -1:
  how a tree of fewer paths than the engine's max_draft_len runs was not read through, so lmi-trt builds the engine
  with max_draft_len = the tree's paths and refuses another count on a precompiled engine.
* the engine (llm_args.py ``validate_speculative_config``, 1.0 id 1520735490 and 1.1 id 1090804222, the LLM API's
  TensorRT backend): ``build_config.speculative_decoding_mode = SpeculativeDecodingMode.MEDUSA``, ``build_config.
  max_draft_len = max_draft_len`` and ``DecodingConfig(decoding_mode=DecodingMode.Medusa(), medusa_choices=...)``,
  the keyword form every executor binding copy read takes (pybind: a 0.x one without pickling, 1.x ones with
  ``eagle_config``; the nanobind copy). The 1.1 copy's ``max_total_draft_tokens = self.max_draft_len  # Current
  Medusa only support linear tree`` sets a field its DecodingBaseConfig documents for the PyTorch flow's draft trees
  ("If it's a linear tree, ... max_draft_len == max_total_draft_tokens"), and ``supports_backend`` keeps Medusa off
  that backend; the TensorRT path above reads max_draft_len and medusa_choices only, so the engine decodes the whole
  tree. Medusa is refused on the pytorch backend (``RUNS_ON``).
* releases: that TensorRT-backend path is read in the 1.0 and 1.1 copies, and the executor binding in every copy.
  The other facts above come from the newest copies in the index (crawl copies dated by content: gptJsonConfig.cpp,
  model.py, builder.py, speculativeChoicesUtils.cpp are 1.x-line copies); no copy of those files was pinned to 1.2.x,
  which very likely reads them unchanged (no 1.x change to their Medusa parts was found). 0.12 is refused because
  lmi-trt has not checked its Medusa path, not because 0.12 lacks one: model_runner_cpp.py copies from either side
  of 0.12 pass ``decoding_config.medusa_choices`` to the Executor, but its builder forced the Medusa mode and the
  model's draft length (builder.py 0.x copy id 3063623504), medusaModule.cpp's checks differ, and the LLM API's
  ``MedusaDecodingConfig`` (the source of these key names) is not in it.
* vLLM's form (``method: medusa``, ``num_speculative_tokens: k``): vLLM's MedusaProposer (vllm/v1/spec_decode/
  medusa.py, id 59227200836) drafts one token per head (each head's argmax, ``[batch_size, num_heads]``), and its
  SpeculativeConfig (vllm/config/speculative.py, id 276679616) makes the default token tree the chain
  ``[(i + 1) * (0,) for i in range(num_speculative_tokens)]``; lmi-trt gives the Executor that chain,
  ``[[0], [0, 0], ...]`` k deep, which needs k heads.
* the default tree ``mc_sim_7b_63``: FasterDecoding/Medusa medusa/model/medusa_choices.py (commit 5e98053, as
  vllm-project/vllm's tree-attention tests cite it): 63 paths, depth up to 4, ranks up to 9. Every prefix of its
  list is itself a tree (each path's parent comes before it), so lmi-trt cuts it to the engine's draft length and
  the heads' depth when no choices are given: its own choice, said in the start-up log.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmi_trt.engines.base import SAMPLING_FEATURES
from lmi_trt.errors import as_written
from lmi_trt.speculative import JSON_KEY, Speculation, SpeculationError, refuse_other_members

MEDUSA_MODE = 4  # config.json's speculative_decoding_mode for medusa (modeling_utils.py SpeculativeDecodingMode)
MEDUSA_SINCE = (1, 0)
MEDUSA_MEMBERS = ("medusa_choices", "num_medusa_heads")
# speculativeChoicesUtils.cpp computePrefix packs each rank into PREFIX_CHUNK_SIZE_BITS = 4 bits of a 64-bit prefix,
# so paths are at most 16 deep, and checks ``val <= PREFIX_MAX_VALUE`` (16); a rank of 16 passes that check but
# spills into its neighbour's chunk ([0, 16] gets [1, 0]'s prefix, and the tree is built wrong without an error), so
# lmi-trt takes ranks up to 15, the most a chunk holds.
MAX_RANK = 15
PREFIX_MAX_DEPTH = 16

MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0), (0, 5),
    (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0), (0, 9), (8,), (9,),
    (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5), (0, 0, 0, 0), (0, 1, 1),
    (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9), (6, 0), (0, 4, 0), (1, 4), (7, 0),
    (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5), (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0),
    (0, 0, 0, 1), (1, 6), (0, 7, 0),
)  # fmt: skip


@dataclass(frozen=True)
class Medusa:
    """What the Executor runs: the heads checkpoint, the tree of draft paths and the engine's draft length."""

    heads_model: str | None  # None: a precompiled engine's own (the compile stage needs them: plan.py _check_medusa)
    choices: tuple[tuple[int, ...], ...]
    num_heads: int | None  # None: the heads' config.json decides (llm_args.py)
    draft_len: int  # the configuration's max_draft_len: the most paths the tree may have
    key: str
    chosen: bool = True  # False: mc_sim_7b_63 cut here (``for_engine`` cuts it to the engine's heads too)
    tree_key: str = f"{JSON_KEY}.medusa_choices"  # the key that chose the tree, for messages
    length_key: str = f"{JSON_KEY}.max_draft_len"  # the key that set draft_len, for messages

    def describe(self) -> str:
        depth = max(len(path) for path in self.choices)
        return f"Medusa ({len(self.choices)} draft paths up to {depth} deep; {len(self.choices)} draft tokens a step)"


def check_choices(raw: Any, key: str) -> tuple[tuple[int, ...], ...]:
    """Pure: ``raw`` as a tree of paths (non-empty lists of ranks >= 0, each parent listed), else a SpeculationError."""
    fix = "give a list of paths such as [[0], [0, 0], [1]], or leave it out for mc_sim_7b_63"
    if not isinstance(raw, list | tuple) or not raw:
        raise SpeculationError(key, raw, "must be a non-empty list of paths", fix)
    tree: list[tuple[int, ...]] = []
    for path in raw:
        ok = isinstance(path, list | tuple) and path
        if not ok or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in path):
            raise SpeculationError(key, raw, f"path {path!r} is not a non-empty list of ranks >= 0", fix)
        tree.append(tuple(path))
    for path in tree:
        if max(path) > MAX_RANK or len(path) > PREFIX_MAX_DEPTH:
            raise SpeculationError(
                key,
                raw,
                f"path {list(path)} has a rank above {MAX_RANK} or is deeper than {PREFIX_MAX_DEPTH}: TensorRT-LLM "
                "packs each rank in 4 bits (speculativeChoicesUtils.cpp computePrefix; 'Provided choices have too "
                "large node degree' above 16, and 16 overlaps the next rank)",
                fix,
            )
    seen = set(tree)
    if len(seen) != len(tree):
        raise SpeculationError(key, raw, "repeats a path", fix)
    for path in tree:
        if len(path) > 1 and path[:-1] not in seen:
            raise SpeculationError(key, raw, f"path {list(path)} lacks its parent {list(path[:-1])}", fix)
    return tuple(tree)


def default_choices(draft_len: int, num_heads: int | None) -> tuple[tuple[int, ...], ...]:
    """``mc_sim_7b_63``'s first paths that fit ``draft_len`` tokens and ``num_heads`` heads (every prefix is a tree)."""
    fitting = [path for path in MC_SIM_7B_63 if num_heads is None or len(path) <= num_heads]
    return tuple(fitting[:draft_len])


def linear_chain(depth: int) -> tuple[tuple[int, ...], ...]:
    """vLLM's default token tree for ``depth`` speculative tokens: ``[[0], [0, 0], ...]`` (module docstring)."""
    return tuple((0,) * (i + 1) for i in range(depth))


def medusa_of(spec: Speculation | None) -> Medusa | None:
    """Pure: the Medusa configuration ``spec`` asks for (its tree, heads and draft length), or None for another
    method; beam width aside (``executor_medusa``)."""
    if spec is None or spec.method != "medusa":
        return None
    key = spec.key("method")
    if spec.max_concurrency is not None:
        raise SpeculationError(
            spec.key("max_concurrency"),
            spec.max_concurrency,
            "is not a member of MedusaDecodingConfig (llm_args.py); it is the pytorch backend's",
            "leave it out",
        )
    refuse_other_members(spec, MEDUSA_MEMBERS, "Medusa's configuration (llm_args.py MedusaDecodingConfig)")
    num_heads = spec.options.get("num_medusa_heads")
    if num_heads is not None and (not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1):
        raise SpeculationError(f"{JSON_KEY}.num_medusa_heads", num_heads, "must be an integer >= 1", "fix or omit it")
    length_key = spec.key("max_draft_len")
    if length_key.endswith(".num_speculative_tokens"):  # vLLM's form: a chain, one token per head
        if "medusa_choices" in spec.options:
            raise SpeculationError(
                f"{JSON_KEY}.medusa_choices",
                spec.options["medusa_choices"],
                "is TensorRT-LLM's tree, and num_speculative_tokens is vLLM's chain of one token per head",
                "give max_draft_len with medusa_choices, or num_speculative_tokens alone",
            )
        choices, tree_key, chosen = linear_chain(spec.max_draft_len), length_key, True
    elif "medusa_choices" in spec.options:
        tree_key, chosen = f"{JSON_KEY}.medusa_choices", True
        choices = check_choices(spec.options["medusa_choices"], tree_key)
        if len(choices) > spec.max_draft_len:
            raise SpeculationError(
                length_key,
                spec.max_draft_len,
                f"the engine's draft tokens must hold every one of medusa_choices' {len(choices)} paths "
                "(llm_args.py's example: max_draft_len=63 for mc_sim_7b_63's 63 paths)",
                f"set max_draft_len to {len(choices)} or more",
            )
    else:
        choices, tree_key, chosen = default_choices(spec.max_draft_len, num_heads), length_key, False
    medusa = Medusa(spec.draft_model, choices, num_heads, spec.max_draft_len, key, chosen, tree_key, length_key)
    if num_heads is not None and (too_deep := deepest_path_error(medusa, num_heads, "num_medusa_heads")) is not None:
        raise SpeculationError(tree_key, *too_deep)
    return medusa


def executor_medusa(spec: Speculation | None, max_beam_width: int) -> Medusa | None:
    """Pure: the Medusa configuration ``spec`` asks of the Executor, or None when it asks for another method."""
    medusa = medusa_of(spec)
    if medusa is not None and max_beam_width != 1:
        raise SpeculationError(
            "option.max_beam_width",
            max_beam_width,
            "Medusa accepts one draft path per request (medusaDecodingLayer.cpp acceptDraftTokens: the longest "
            "accepted path); beam search does not run beside it",
            "set option.max_beam_width=1, or leave speculative decoding out",
        )
    return medusa


def built_draft_len(spec: Speculation, heads: int) -> int:
    """Pure: the max_draft_len lmi-trt builds a Medusa engine with for ``heads`` heads: the tree's path count
    (after the default tree's cut to the heads), so the engine and the tree always agree (module docstring); a tree
    deeper than the heads is refused here, before the build."""
    medusa = for_engine(medusa_of(spec), heads)
    assert medusa is not None
    too_deep = deepest_path_error(medusa, heads, "config.json medusa_num_heads, or num_medusa_heads")
    if too_deep is not None:
        raise SpeculationError(medusa.tree_key, *too_deep)
    return len(medusa.choices)


def for_engine(medusa: Medusa | None, built_heads: int) -> Medusa | None:
    """Pure: ``medusa`` with the default tree cut to the heads the engine was built with as well, where the
    configuration named neither a tree nor num_medusa_heads (the heads' config.json then decides: llm_args.py)."""
    if medusa is None or medusa.chosen or medusa.num_heads is not None or not built_heads:
        return medusa
    return dataclasses.replace(medusa, choices=default_choices(medusa.draft_len, built_heads))


def deepest_path_error(medusa: Medusa, heads: int, source: str) -> tuple[Any, str, str] | None:
    """(value, problem, fix) where the heads checkpoint (``heads`` heads, as ``source`` says) cannot draft
    ``medusa``'s tree: a path deeper than its heads (each step of a path is one head's)."""
    deepest = max(len(path) for path in medusa.choices)
    if deepest <= heads:
        return None
    holder = f"the heads checkpoint {medusa.heads_model}" if medusa.heads_model else "the engine"
    value = medusa.draft_len if medusa.tree_key.endswith("tokens") else [list(p) for p in medusa.choices]
    return (
        value,
        f"asks for paths {deepest} deep and {holder} has {heads} heads ({source}); each step of a path is one head's",
        f"use at most {heads} ({'num_speculative_tokens' if medusa.tree_key.endswith('tokens') else 'deep paths'})",
    )


def decoding_config(tle: Any, medusa: Medusa) -> Any:
    """The ExecutorConfig's ``decoding_config`` for ``medusa`` (decodingConfig.cpp: choices need the Medusa mode)."""
    return tle.DecodingConfig(
        decoding_mode=tle.DecodingMode.Medusa(), medusa_choices=[list(path) for path in medusa.choices]
    )


def medusa_refusals() -> dict[str, str]:
    """Pure: request feature → why, for what the Executor does not do (or lmi-trt has not read) beside Medusa."""
    unread = (
        "not read beside Medusa in TensorRT-LLM's decoder (medusaDecodingLayer.cpp draws the target's tokens by top-k "
        "only), so lmi-trt refuses it rather than assume; leave it out, or serve without speculation"
    )
    return {
        **dict.fromkeys(("guided", "logit_bias", *SAMPLING_FEATURES), unread),
        "sampling": "Medusa here serves greedy requests only: medusaDecodingLayer.cpp draws the target's tokens by "
        "top-k sampling alone and accepts draft paths by id, which lmi-trt has not shown to keep a sampled request's "
        "distribution; send a greedy request (temperature 0), or serve without speculation",
        "logprobs": "Medusa does not compute log-probs (medusaDecodingLayer.cpp passes no log-prob outputs to its "
        "sampling: 'outputLogProbs are not supported'); leave them out, or serve without speculation",
        "beam_search": "Medusa accepts one path per request, no beams; ask for 1 beam",
    }


def engine_medusa_errors(medusa: Medusa, built_mode: int | None, built_draft_len: int, built_heads: int) -> list[str]:
    """Pure: why an engine built with ``built_mode`` (config.json's integer), ``built_draft_len`` Medusa draft tokens
    and ``built_heads`` Medusa heads (pretrained_config's max_draft_len and num_medusa_heads, which
    gptJsonConfig.cpp reads for a Medusa engine: ``trtllm.EngineFacts``) cannot run ``medusa`` (module docstring)."""
    if built_mode != MEDUSA_MODE:
        return [
            f"{medusa.key}=medusa needs an engine built with --speculative_decoding_mode medusa and its heads, and "
            "this one was not; rebuild it (lmi-trt's compile stage does, from the Hugging Face checkpoint and the "
            "heads)"
        ]
    if not built_draft_len or not built_heads:
        # gptJsonConfig.cpp (id 809211714): TLLM_CHECK_WITH_INFO(medusaHeads.has_value() && maxDraftLen > 0, ...)
        return [
            f"{medusa.key}=medusa: the engine's config.json has pretrained_config.max_draft_len={built_draft_len} and "
            f"num_medusa_heads={built_heads}, and TensorRT-LLM refuses it ('Both num_medusa_heads and max_draft_len "
            "have to be provided for Medusa model'); rebuild it from a Medusa checkpoint (lmi-trt's compile stage "
            "does, from the Hugging Face checkpoint and the heads)"
        ]
    errors = [] if medusa.heads_model is not None else precompiled_errors(medusa, built_draft_len, built_heads)
    if len(medusa.choices) != built_draft_len and not (errors and medusa.tree_key == medusa.length_key):
        # more: speculativeChoicesUtils.cpp TLLM_CHECK(numChoices <= getMaxDecodingDraftTokens()); fewer: not read
        # through (module docstring), so refused rather than assumed
        errors.append(
            f"{medusa.tree_key}: the tree has {len(medusa.choices)} paths, and the engine's Medusa draft tokens are "
            f"pretrained_config.max_draft_len={built_draft_len}; lmi-trt runs a Medusa tree of exactly the engine's "
            "draft tokens (TensorRT-LLM refuses more: numChoices <= getMaxDecodingDraftTokens()); give "
            f"{built_draft_len} paths in medusa_choices, or rebuild the engine with max_draft_len equal to the tree's "
            "paths"
        )
    too_deep = deepest_path_error(medusa, built_heads, "the engine's num_medusa_heads")
    if too_deep is not None:
        errors.append(
            f"{medusa.tree_key}={as_written(too_deep[0])}: {too_deep[1]} (speculativeChoicesUtils.cpp: 'Choices "
            "require larger maxPathLen than the engine was built with.'; medusaModule.cpp: 'Medusa choices require "
            f"more Medusa heads than the engine was built with.'); {too_deep[2]}"
        )
    return errors


def precompiled_errors(medusa: Medusa, built_draft_len: int, built_heads: int) -> list[str]:
    """Pure: the keys TensorRT-LLM reads only when it converts heads into a checkpoint and builds the engine
    (model.py ``from_hugging_face``: ``speculative_config.num_medusa_heads``; llm_args.py: ``build_config.
    max_draft_len = max_draft_len``; the Executor gets the tree alone), set beside a precompiled engine (``medusa``
    without heads: ``stages._refuse_unused_heads``) to other values than the engine's: refused, not ignored."""
    engine = "option.model_id is a precompiled TensorRT engine, and TensorRT-LLM reads this only when it builds one"
    errors = []
    if medusa.draft_len != built_draft_len:
        errors.append(
            f"{medusa.length_key}={medusa.draft_len}: {engine}; this engine's config.json has "
            f"pretrained_config.max_draft_len={built_draft_len} (what the Executor runs: gptJsonConfig.cpp); set it "
            f"to {built_draft_len}"
        )
    if medusa.num_heads is not None and medusa.num_heads != built_heads:
        errors.append(
            f"{JSON_KEY}.num_medusa_heads={medusa.num_heads}: {engine}; this engine's config.json has "
            f"pretrained_config.num_medusa_heads={built_heads}; leave it out, or set it to {built_heads}"
        )
    return errors


def release_error(medusa: Medusa | None, version: str, series: tuple[int, int]) -> str | None:
    if medusa is None or series >= MEDUSA_SINCE:
        return None
    return (
        f"{medusa.key}=medusa: lmi-trt has not checked TensorRT-LLM {version}'s Medusa path (its facts were read in "
        "1.x copies of TensorRT-LLM; 0.x had Medusa, built and run differently in places: the module docstring); "
        "use a 1.x image, or leave speculative decoding out"
    )
