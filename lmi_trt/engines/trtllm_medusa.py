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
  ``invokeBatchTopKSampling`` with the request's top-k (default 1) -- "outputLogProbs are not supported" -- and the
  longest draft path equal to them is accepted; each head's candidates are its top-k, k per path position. Every
  copy read (ids 6261962781, 5793101461, 2610806528, 6028558653, 589685345) runs samplePrimeHeadTokens
  (TopKSamplingKernelParams), acceptDraftTokens, sampleNewDraftTokens in that order; the newest (id 589685345)
  still says "TODO add typical acceptance": acceptance is by token id, for greedy requests the greedy output.
* cpp/tensorrt_llm/runtime/medusaModule.cpp ``initMedusaTensorsFromChoices`` (crawl copy id 2784996723):
  ``TLLM_CHECK(numChoices <= getMaxDecodingDraftTokens())`` -- the tree fits the engine's draft tokens -- and "Medusa
  choices require more Medusa heads than the engine was built with." for a path deeper than the heads; each depth's
  top-k is its largest rank + 1.
* the engine (llm_args.py ``validate_speculative_config``, 1.0 id 1520735490 and 1.1 id 1090804222, the LLM API's
  TensorRT backend): ``build_config.speculative_decoding_mode = SpeculativeDecodingMode.MEDUSA``, ``build_config.
  max_draft_len = max_draft_len`` and ``DecodingConfig(decoding_mode=DecodingMode.Medusa(), medusa_choices=...)``,
  the keyword form every executor binding copy read takes (pybind: a 0.x one without pickling, 1.x ones with
  ``eagle_config``; the nanobind copy). The 1.1 copy's ``max_total_draft_tokens = self.max_draft_len  # Current
  Medusa only support linear tree`` sets a field its DecodingBaseConfig documents for the PyTorch flow's draft trees
  ("If it's a linear tree, ... max_draft_len == max_total_draft_tokens"), and ``supports_backend`` keeps Medusa off
  that backend; the TensorRT path above reads max_draft_len and medusa_choices only, so the engine decodes the whole
  tree. Medusa is refused on the pytorch backend (``RUNS_ON``).
* releases: that TensorRT-backend path is read in the 1.0 and 1.1 copies, and the executor binding in every copy;
  which 0.x release's Executor decoded Medusa with these bindings was not pinned, so 0.12 is refused, as for draft
  tokens.
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
from lmi_trt.speculative import JSON_KEY, Speculation, SpeculationError, refuse_other_members

MEDUSA_MODE = 4  # config.json's speculative_decoding_mode for medusa (modeling_utils.py SpeculativeDecodingMode)
MEDUSA_SINCE = (1, 0)
MEDUSA_MEMBERS = ("medusa_choices", "num_medusa_heads")

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

    heads_model: str
    choices: tuple[tuple[int, ...], ...]
    num_heads: int | None  # None: the heads' config.json decides (llm_args.py)
    draft_len: int
    key: str
    chosen: bool = True  # False: mc_sim_7b_63 cut here (``for_engine`` cuts it to the engine's heads too)

    def describe(self) -> str:
        depth = max(len(path) for path in self.choices)
        return f"Medusa ({len(self.choices)} draft paths up to {depth} deep; {self.draft_len} draft tokens a step)"


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


def executor_medusa(spec: Speculation | None, max_beam_width: int) -> Medusa | None:
    """Pure: the Medusa configuration ``spec`` asks of the Executor, or None when it asks for another method."""
    if spec is None or spec.method != "medusa":
        return None
    key = spec.key("method")
    if spec.draft_model is None:
        raise SpeculationError(
            key,
            spec.method,
            "Medusa needs its heads checkpoint",
            f'name it: {JSON_KEY}.speculative_model_dir (or speculative_model, vLLM\'s "model", '
            "option.speculative_draft_model), a folder with FasterDecoding/Medusa's medusa_lm_head.safetensors or .pt",
        )
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
    if "medusa_choices" in spec.options:
        choices = check_choices(spec.options["medusa_choices"], f"{JSON_KEY}.medusa_choices")
        if len(choices) > spec.max_draft_len:
            raise SpeculationError(
                spec.key("max_draft_len"),
                spec.max_draft_len,
                f"the engine's draft tokens must hold every one of medusa_choices' {len(choices)} paths "
                "(llm_args.py's example: max_draft_len=63 for mc_sim_7b_63's 63 paths)",
                f"set max_draft_len to {len(choices)} or more",
            )
        if num_heads is not None and (deepest := max(map(len, choices))) > num_heads:
            raise SpeculationError(
                f"{JSON_KEY}.medusa_choices",
                spec.options["medusa_choices"],
                f"has a path {deepest} deep and num_medusa_heads={num_heads}: each step of a path is one head's",
                "raise num_medusa_heads to the heads checkpoint's, or use shallower paths",
            )
    else:
        choices = default_choices(spec.max_draft_len, num_heads)
    if max_beam_width != 1:
        raise SpeculationError(
            "option.max_beam_width",
            max_beam_width,
            "Medusa accepts one draft path per request (medusaDecodingLayer.cpp acceptDraftTokens: the longest "
            "accepted path); beam search does not run beside it",
            "set option.max_beam_width=1, or leave speculative decoding out",
        )
    return Medusa(spec.draft_model, choices, num_heads, spec.max_draft_len, key, "medusa_choices" in spec.options)


def for_engine(medusa: Medusa | None, built_heads: int) -> Medusa | None:
    """Pure: ``medusa`` with the default tree cut to the heads the engine was built with as well, where the
    configuration named neither a tree nor num_medusa_heads (the heads' config.json then decides: llm_args.py)."""
    if medusa is None or medusa.chosen or medusa.num_heads is not None or not built_heads:
        return medusa
    return dataclasses.replace(medusa, choices=default_choices(medusa.draft_len, built_heads))


def deepest_path_error(medusa: Medusa, heads: int) -> str | None:
    """Why the heads checkpoint (``heads`` heads) cannot draft ``medusa``'s tree: a path deeper than its heads."""
    deepest = max(len(path) for path in medusa.choices)
    if deepest <= heads:
        return None
    return (
        f"{JSON_KEY}.medusa_choices: a path is {deepest} deep and the heads checkpoint {medusa.heads_model} has "
        f"{heads} heads (config.json medusa_num_heads); use paths up to {heads} deep"
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
        "logprobs": "Medusa does not return log-probs (medusaDecodingLayer.cpp: 'outputLogProbs are not supported'); "
        "leave them out, or serve without speculation",
        "beam_search": "Medusa accepts one path per request, no beams; ask for 1 beam",
    }


def engine_medusa_errors(medusa: Medusa, built_mode: int | None, built_draft_len: int, built_heads: int) -> list[str]:
    """Pure: why an engine built with ``built_mode`` (config.json's integer), ``built_draft_len`` draft tokens and
    ``built_heads`` Medusa heads (pretrained_config.num_medusa_heads) cannot run ``medusa`` (medusaModule.cpp)."""
    if built_mode != MEDUSA_MODE:
        return [
            f"{medusa.key}=medusa needs an engine built with --speculative_decoding_mode medusa and its heads, and "
            "this one was not; rebuild it (lmi-trt's compile stage does, from the Hugging Face checkpoint and the "
            "heads)"
        ]
    errors = []
    if len(medusa.choices) > built_draft_len:
        errors.append(
            f"{JSON_KEY}.medusa_choices: {len(medusa.choices)} paths, and the engine was built with max_draft_len="
            f"{built_draft_len} (medusaModule.cpp: TLLM_CHECK(numChoices <= getMaxDecodingDraftTokens())); use at "
            "most that many paths, or rebuild"
        )
    too_deep = deepest_path_error(medusa, built_heads)
    if too_deep is not None:
        errors.append(f"{too_deep} ('Medusa choices require more Medusa heads than the engine was built with.')")
    return errors


def release_error(medusa: Medusa | None, version: str, series: tuple[int, int]) -> str | None:
    if medusa is None or series >= MEDUSA_SINCE:
        return None
    return (
        f"{medusa.key}=medusa: Medusa on TensorRT-LLM {version}'s Executor is not verified here (the module docstring: "
        "read in the 1.x releases' TensorRT backend); use a 1.x image, or leave speculative decoding out"
    )
