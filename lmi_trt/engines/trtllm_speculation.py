"""Speculative decoding on TensorRT-LLM's Executor over TensorRT engines: lookahead decoding on 1.0-1.2 (the tensorrt
backend serves 0.12 and 1.0-1.2; 0.12 predates lookahead); draft tokens (n-gram, draft model) are
``lmi_trt.engines.trtllm_drafts``'s and Medusa ``lmi_trt.engines.trtllm_medusa``'s; every other method is refused at
start-up, naming the key and why. Pure: the
trtllm engine (``lmi_trt.engines.trtllm``) and the wiring (``lmi_trt.stages``) call these.

What was read (NVIDIA/TensorRT-LLM; the index keeps crawl copies, not tags, dated here by content):

* the engine: trtllm-build's ``--speculative_decoding_mode lookahead_decoding`` and ``--max_draft_len``
  (tensorrt_llm/commands/build.py, a late-0.x copy with ``auto_parallel``; the flags are the same in DJL's
  serving/docker/partition/trt_llm_partition.py, which forwards ``option.speculative_decoding_mode`` and
  ``option.max_draft_len`` to that parser), and ``max_draft_len = f(W, N, G)``, which "must equal" the Executor's
  (examples/lookahead/README.md; ``lmi_trt.speculative.lookahead_draft_len``) -- or exceed, as the Executor itself
  allows (``DRAFT_LEN_CHECK``). builder.py ``build`` (a 1.x copy with
  NVFP4) raises the recorded ``max_seq_len`` by ``max_draft_len`` ("Maximum number of generated tokens remains the
  same") and ``max_num_tokens`` to ``max_batch_size * (max_draft_len + 1)``; config.json keeps the mode's integer
  (cpp/tensorrt_llm/runtime/gptJsonConfig.cpp reads ``speculative_decoding_mode`` as
  ``SpeculativeDecodingMode::UnderlyingType``; tensorrt_llm/models/modeling_utils.py's IntFlag: NONE 1, ...,
  LOOKAHEAD_DECODING 8).
* the Executor: ``ExecutorConfig(decoding_config=DecodingConfig(decoding_mode=DecodingMode.Lookahead(),
  lookahead_decoding_config=LookaheadDecodingConfig(W, N, G)))`` -- the LLM API's TensorRT backend builds exactly
  this (tensorrt_llm/llmapi/llm_args.py ``validate_speculative_config``, every copy read), and
  cpp/tensorrt_llm/executor/decodingConfig.cpp refuses a lookahead config without the Lookahead mode.
* the decoder: cpp/tensorrt_llm/layers/lookaheadDecodingLayer.cpp (crawl copy 05cc2c1) checks "Beam width must be 1
  in Lookahead decoding." and that the engine's decoding tokens equal ``calculateSpeculativeResource``'s for (W, N,
  G); it picks tokens with top-k sampling of ``maxTopK = 1`` -- greedy whatever a request's sampling says -- and
  "outputLogProbs are not supported".
* releases: lookahead decoding is announced in 0.13.0 ("Supported lookahead decoding (experimental)", release notes,
  NVIDIA/TensorRT-LLM PR 2269); 0.12 is refused, and 0.13-0.21 are outside the trtllm engine's releases. Stopping at
  the end id: an early cpp/include/tensorrt_llm/executor/types.h copy (no Eagle mode) has ``Lookahead() = kLookahead |
  kUseMinLength | kUseMaxLengthStop`` with no EOS stop; the NVIDIA copy with ``CacheSaltIDType`` (after PR 7106,
  September 2025) and an older renamed fork copy of it (Eagle and ExternalDraftTokens modes, no SpecDecodingStats)
  both have ``kLookahead | kUseMinLength | kUseStandardStopCriteria | kUseExplicitEosStop`` (kStandardStopCriteria in
  the fork), so the explicit EOS stop predates the 1.x releases lmi-trt runs lookahead on; no copy is a release tag.
* accepted drafts: ``Result.decoding_iter`` (``counts_accepted_drafts``) where the binding has it.
* per request: ``Request(lookahead_config=...)`` may lower (w, n, g) below the Executor's (README: "Ensure the
  Lookahead configuration for each request satisfies w <= W, n <= N, g <= G"); no client field maps onto it, so
  lmi-trt leaves it unset and every request runs the Executor's (W, N, G).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmi_trt.engines.base import SAMPLING_FEATURES
from lmi_trt.engines.trtllm_medusa import MEDUSA_MODE
from lmi_trt.speculative import (
    JSON_KEY,
    LOOKAHEAD_MEMBERS,
    RUNS_ON,
    Speculation,
    SpeculationError,
    lookahead_draft_len,
    refuse_other_members,
)

LOOKAHEAD_SINCE = (0, 13)
# The Executor takes an engine built with more draft tokens than (W, N, G) needs, and shrinks the decoder to them:
# cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp createBuffers/setupSpeculativeDecodingModule
# checks only ``maxDraftTokens <= mModelConfig.getMaxDecodingDraftTokens()`` then ``setMaxDraftTokens(maxDraftTokens)``
# (every crawl copy read, from one with the "FIXME(nkorobov) choose defaults" lookahead start to 1.x ones), and the
# LLM API's TensorRT path builds with ``max(build_config.max_draft_len, max_draft_len)`` (llmapi/llm_args.py
# ``validate_speculative_config``). examples/lookahead/README.md's "must equal" is stricter than the code.
DRAFT_LEN_CHECK = (
    "trtGptModelInflightBatching.cpp: TLLM_CHECK(maxDraftTokens <= mModelConfig.getMaxDecodingDraftTokens())"
)
# config.json's speculative_decoding_mode integers (SpeculativeDecodingMode's auto() members), by trtllm-build name.
BUILT_MODES = {
    1: None,
    2: "draft_tokens_external",
    4: "medusa",
    8: "lookahead_decoding",
    16: "explicit_draft_tokens",
    32: "eagle",
}
LOOKAHEAD_MODE = 8
# Why the tensorrt backend does not run the others (the method's own RUNS_ON says where it does run).
_NOT_ON_ENGINES = {
    "eagle": "EAGLE heads must be converted into the checkpoint with TensorRT-LLM's examples/eagle converter, which "
    "lmi-trt's compile stage does not run",
    "explicit_draft_tokens": "ReDrafter's drafter must be converted into the checkpoint with TensorRT-LLM's "
    "examples/redrafter converter, which lmi-trt's compile stage does not run",
    "eagle3": "EAGLE-3 runs on TensorRT-LLM's pytorch backend only",
    "mtp": "MTP runs on TensorRT-LLM's pytorch backend only",
}


@dataclass(frozen=True)
class Lookahead:
    """The Executor's lookahead configuration (W, N, G) and the draft length the engine must be built with."""

    window: int
    ngram: int
    verification_set: int
    key: str  # the key that turned it on, for messages

    @property
    def draft_len(self) -> int:
        return lookahead_draft_len(self.window, self.ngram, self.verification_set)

    def describe(self) -> str:
        return (
            f"lookahead decoding (max_window_size={self.window}, max_ngram_size={self.ngram}, "
            f"max_verification_set_size={self.verification_set}; {self.draft_len} draft tokens per step)"
        )


def executor_lookahead(spec: Speculation | None, max_beam_width: int) -> Lookahead | None:
    """Pure: the lookahead decoding ``spec`` asks of the Executor, or None; any other method, member or setting it
    cannot run beside it is refused, naming the key."""
    if spec is None or spec.method == "medusa":  # trtllm_medusa.executor_medusa's
        return None
    if spec.method != "lookahead":
        raise SpeculationError(
            spec.key("method"),
            spec.method,
            "lmi-trt's tensorrt backend (TensorRT-LLM's Executor over TensorRT engines) runs lookahead decoding, "
            "Medusa and draft tokens (n-gram, draft model) only: " + _NOT_ON_ENGINES[spec.method],
            f"{spec.method} runs on {RUNS_ON[spec.method]}; or use lookahead decoding "
            f'({JSON_KEY}={{"decoding_type": "Lookahead"}} or option.speculative_decoding_mode=lookahead_decoding)',
        )
    for field, value in (("draft_model", spec.draft_model), ("max_concurrency", spec.max_concurrency)):
        if value is not None:
            raise SpeculationError(
                spec.key(field),
                value,
                "is not something lookahead decoding on TensorRT engines has (llm_args.py: LookaheadDecodingConfig's "
                "members are max_window_size, max_ngram_size and max_verification_set_size; max_concurrency is the "
                "pytorch backend's)",
                "leave it out",
            )
    refuse_other_members(spec, LOOKAHEAD_MEMBERS, "lookahead decoding's configuration")
    sizes = {**LOOKAHEAD_MEMBERS, **spec.options}
    lookahead = Lookahead(
        sizes["max_window_size"], sizes["max_ngram_size"], sizes["max_verification_set_size"], spec.key("method")
    )
    if spec.max_draft_len < lookahead.draft_len:
        raise SpeculationError(
            spec.key("max_draft_len"),
            spec.max_draft_len,
            f"the engine's max_draft_len must be at least the {lookahead.draft_len} draft tokens of "
            f"{lookahead.describe()} ({DRAFT_LEN_CHECK})",
            f"set it to {lookahead.draft_len} or more, or leave it out (it is derived from the window, n-gram and "
            "verification set sizes)",
        )
    if max_beam_width != 1:
        raise SpeculationError(
            "option.max_beam_width",
            max_beam_width,
            "lookahead decoding runs one beam (lookaheadDecodingLayer.cpp: 'Beam width must be 1 in Lookahead "
            "decoding.')",
            "set option.max_beam_width=1, or leave speculative decoding out",
        )
    return lookahead


def engine_speculation_errors(lookahead: Lookahead | None, built_mode: int | None, built_draft_len: int) -> list[str]:
    """Pure: why an engine built with ``built_mode`` (config.json's integer; None or 1: none) and
    ``built_draft_len`` cannot serve ``lookahead`` (None: no speculation asked)."""
    mode = BUILT_MODES.get(built_mode or 1, f"mode {built_mode}")
    if lookahead is None:
        if mode is None:
            return []
        return [
            f"the engine was built with --speculative_decoding_mode {mode} and no speculation option is set; "
            + (
                "set option.speculative_decoding_mode=lookahead_decoding with the (W, N, G) it was built for"
                if built_mode == LOOKAHEAD_MODE
                else f"set {JSON_KEY} with decoding_type Medusa, max_draft_len equal to the engine's "
                "(config.json pretrained_config.max_draft_len) and medusa_choices of that many paths; "
                "name no heads (the engine carries its own)"
                if built_mode == MEDUSA_MODE
                else "lmi-trt runs lookahead decoding and Medusa on such engines: rebuild the engine without it"
            )
        ]
    if built_mode != LOOKAHEAD_MODE:
        return [
            f"{lookahead.key}=lookahead needs an engine built with --speculative_decoding_mode lookahead_decoding, and "
            f"this one was built with {mode or 'none'}; rebuild it (lmi-trt's compile stage does, from the Hugging "
            "Face checkpoint)"
        ]
    if built_draft_len < lookahead.draft_len:
        return [
            f"{lookahead.key}=lookahead: the engine was built with max_draft_len={built_draft_len} and "
            f"{lookahead.describe()} needs at least {lookahead.draft_len} ({DRAFT_LEN_CHECK}); choose a (W, N, G) "
            "within it, or rebuild"
        ]
    return []


def release_error(lookahead: Lookahead | None, version: str, series: tuple[int, int]) -> str | None:
    if lookahead is None or series >= LOOKAHEAD_SINCE:
        return None
    return (
        f"{lookahead.key}=lookahead: TensorRT-LLM {version} predates lookahead decoding on the Executor (announced in "
        "0.13.0, NVIDIA/TensorRT-LLM PR 2269); use a 1.x image, or leave speculative decoding out"
    )


# Stop words beside lookahead: the copies of cpp/include/tensorrt_llm/executor/types.h read disagree on
# DecodingMode::Lookahead()'s flags (an older one: kLookahead | kUseMinLength | kUseMaxLengthStop, no stop criteria;
# later ones add kUseStandardStopCriteria | kUseExplicitEosStop), and which release has which was not pinned.
STOP_WORDS_UNREAD = (
    "whether TensorRT-LLM's lookahead decoding and Medusa apply stop words is not pinned per release (types.h copies "
    "differ on DecodingMode::Lookahead()'s and Medusa()'s stop criteria)"
)


def stop_words_error(key: str | None, method: str, eos_token_ids: list[int]) -> str | None:
    """Why a model whose further EOS ids go to the Executor as stop words cannot run lookahead decoding or Medusa here
    (``key``: the key that turned it on; None: neither runs). types.h gives DecodingMode::Medusa() the same flags as
    Lookahead() in every copy read (kUseMinLength plus the stop criteria above, or kUseMaxLengthStop in the older)."""
    if key is None or len(eos_token_ids) < 2:
        return None
    return (
        f"{key}={method}: this model also ends on {eos_token_ids[1:]} (generation_config.json), which the "
        f"Executor gets as stop words, and {STOP_WORDS_UNREAD}; serve it without speculative decoding"
    )


def counts_accepted_drafts(tle: Any) -> bool:
    """Whether this release's Result binds ``decoding_iter``, which the accepted-draft count is read from. The 1.x
    bindings do (pybind and nanobind executor bindings: ``def_readwrite("decoding_iter", &tle::Result::decodingIter)``),
    and a lookahead-era pybind copy (DecodingConfig with lookahead_decoding_config) binds no such field; the release
    that added it was not pinned, so the binding itself is asked (``Result()`` is default-constructible in both)."""
    return hasattr(tle.Result(), "decoding_iter")


UNCOUNTED_DRAFTS = (
    "spec_decode_num_accepted_tokens is not reported: TensorRT-LLM {version}'s Result has no decoding_iter to count "
    "accepted draft tokens from (speculative decoding itself runs)"
)


def decoding_config(tle: Any, lookahead: Lookahead) -> Any:
    """The ExecutorConfig's ``decoding_config`` for ``lookahead``, as llm_args.py builds it for the TensorRT backend."""
    return tle.DecodingConfig(
        decoding_mode=tle.DecodingMode.Lookahead(),
        lookahead_decoding_config=tle.LookaheadDecodingConfig(
            lookahead.window, lookahead.ngram, lookahead.verification_set
        ),
    )


def lookahead_refusals(lookahead: Lookahead) -> dict[str, str]:
    """Pure: request feature → why, for what the Executor does not do (or lmi-trt has not read) beside lookahead."""
    greedy = (
        "lookahead decoding on TensorRT engines picks every token greedily (lookaheadDecodingLayer.cpp: top-k "
        "sampling with maxTopK = 1); send a greedy request (temperature 0), or serve without speculation"
    )
    unread = (
        "not read beside lookahead decoding in TensorRT-LLM's decoder, so lmi-trt refuses it rather than assume; "
        "leave it out, or serve without speculation"
    )
    return {
        **dict.fromkeys(("guided", "logit_bias", *SAMPLING_FEATURES), unread),
        "sampling": greedy,
        "seed": greedy,
        "logprobs": "lookahead decoding does not return log-probs (lookaheadDecodingLayer.cpp: 'outputLogProbs are "
        "not supported'); leave them out, or serve without speculation",
        "beam_search": "lookahead decoding runs one beam ('Beam width must be 1 in Lookahead decoding.'); ask for 1 "
        "beam",
    }
