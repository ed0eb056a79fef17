"""What each TensorRT-LLM release's LLM API (PyTorch backend) does with a request: the one table the LLM API
engine refuses from, and the parameter × release table in README.md (``python -m lmi_trt.engines.llmapi_releases``
rewrites it; tests/unit/test_llmapi_releases.py fails when the README is stale).

Releases compare as full PEP 440 versions: the 1.3.0 release candidates ship for months (1.3.0rc1 by 2026-01,
1.3.0rc29 by 2026-09-23) and each holds a different part of main's sampler fixes. A fix merged on main before the
"Bump version to 1.3.0rcN" commit is in rcN and later (the candidate is tagged at or after its bump: v1.3.0rc10's
tag 628bb56 is the commit after its bump b837c63), so each row names the first candidate *verified* to hold it, from
main's commit log and NVIDIA's weekly change reports and release notes (dates in ``source``); an earlier candidate may
hold it too, but a field is refused on every candidate below the verified one. Pre-releases of 1.0–1.2 (1.1.0rc1,
1.2.0rc2, ...) were not read and are refused at start-up (``lmi_trt.engines.llmapi.llm_api_release``).

Which sampler runs a request decides most of it; the LLM has one for every request:

* 1.0: the default ``TorchSampler`` takes the argmax for the whole batch unless ``enable_mixed_sampler`` (then
  top-p *or* top-k, never a temperature) and asserts ``max_beam_width == 1`` at construction
  (tensorrt_llm/_torch/pyexecutor/sampler.py of the 1.0 line: ``fast_path = not self.enable_mixed_sampler ...``,
  ``request_strategy``). Sampling on 1.0 is its ``TRTLLMSampler``, the C++ decoder, with
  ``enable_trtllm_sampler=True`` (the 1.0.0 docs, features/sampling.md: "To use the feature: Enable the
  enable_trtllm_sampler option in the LLM class"), which this engine sets there. 1.0's ``TorchLlmArgs`` marks that
  knob ``status="prototype"``, so TensorRT-LLM logs "The 'enable_trtllm_sampler' knob is a 'prototype' feature. It
  is not recommended for production use" (``warn_on_unstable_feature_usage``): 1.0 samples only through it.
* 1.1 and 1.2: ``sampler_type="auto"`` (PR 6831): the ``TorchSampler`` without beam search; with
  ``max_beam_width > 1`` the 1.1 line's _util.py ``instantiate_sampler`` builds the ``TRTLLMSampler``
  (``sampler_type == TRTLLMSampler or (sampler_type == auto and decoding_mode.isBeamSearch())``, read_file id
  843526953), but no 1.2 ``instantiate_sampler`` was read (PR 8509, on the 1.2 line, gave the TorchSampler beam
  search), so with ``max_beam_width > 1`` this engine sends ``sampler_type="TRTLLMSampler"`` on both
  (``llm_plan``): the beam column below holds by construction.
* the 1.3.0 candidates: the ``TorchSampler`` for every request without beam search. Which sampler ``auto`` picks for
  beams there was not pinned down (the docs said the TRTLLMSampler until PR 14487, 2026-05, which says main's
  ``auto`` picks the TorchSampler), so beam search is refused before 1.3.0rc26, the first candidate with PR 18232
  (merged 2026-08-29, before the rc26 bump of 2026-08-31), which removed the TRTLLMSampler.

On every release up to 1.2 a speculative-decoding config or star attention replaces the sampler
(``instantiate_sampler`` checks them first); this engine passes neither.

The ``TRTLLMSampler`` applies temperature, top-k/top-p, a request's seed, the repetition/presence/frequency
penalties, min length, bad words and beam search (the C++ decoder set up from each request's ``SamplingConfig``,
``TRTLLMSampler.setup_sampler_step``, whose batch config keeps ``randomSeed``, the penalties and ``minLength`` per
request: cpp/include/tensorrt_llm/runtime/samplingConfig.h; docs features/sampling.md of 1.0.0: "temperature,
top-k and top-p sampling, beam search, stop words, bad words, penalty, ... log probability, guided decoding"; PR
8127's thread: "Only trtllm sampler in torch path supports these penalties"). Whether it adds ``embedding_bias``
or reports more than the sampled token's log prob was not read: refused until someone reads it.

Beam search: every request's beam width must equal ``max_beam_width`` (``beam_width_rule``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.version import Version

from lmi_trt.engines.base import SamplingParams

Sampler = Literal["TorchSampler", "TRTLLMSampler"]
TORCH: Sampler = "TorchSampler"
TRTLLM: Sampler = "TRTLLMSampler"

V1_0, V1_1, V1_2 = Version("1.0.0"), Version("1.1.0"), Version("1.2.0")
LINE_1_3 = Version("1.3.0.dev0")  # the first version of the line after 1.2 (every 1.3.0 candidate is above it)
# the first version past the last line read: PR 11938 (v1.3.0rc11's notes) announces the TRTLLMSampler's removal "in
# release 1.4", so a later line's sampler and fields are not this table's
AFTER_LAST_READ = Version("1.4.0.dev0")
# PR 18232 (TorchSampler only) and PR 16620 (TorchSampler beam search completed), both before the rc26 bump
TORCH_BEAMS = Version("1.3.0rc26")


def series(release: Version) -> tuple[int, int]:
    return release.major, release.minor


def llm_sampler(release: Version, max_beam_width: int, speculative: bool = False) -> Sampler:
    """Pure: the sampler that runs every request of the LLM this engine builds (module docstring). With speculative
    decoding, the TorchSampler (or the spec decoder, a TorchSampler subclass) on every release: lmi-trt asks for no
    TRTLLMSampler beside drafts (lmi_trt.engines.llmapi_speculation: no enable_trtllm_sampler, no beams)."""
    if speculative:
        return TORCH
    if series(release) == (1, 0):
        return TRTLLM
    if series(release) <= (1, 2) and max_beam_width > 1:
        return TRTLLM
    return TORCH


def beams_refused(release: Version) -> str | None:
    """Pure: why ``option.max_beam_width > 1`` cannot be served on ``release``, or None."""
    if LINE_1_3 <= release < TORCH_BEAMS:
        return (
            f"which sampler TensorRT-LLM {release} runs beam search on was not pinned down (sampler_type='auto' picked "
            "the TRTLLMSampler for beams up to some 1.3.0 candidate; PR 18232, first in 1.3.0rc26, left the "
            "TorchSampler only)"
        )
    return None


def beam_width_rule(release: Version, max_beam_width: int) -> str | None:
    """Pure: why a request whose beam width is not ``max_beam_width`` is refused, or None where every request has it
    (``max_beam_width`` 1: a wider beam is refused as exceeding it). Up to PR 16620 the executor takes only requests
    at exactly ``max_beam_width`` ("Request beam width 1 is not equal to max_beam_width 8. This is not supported!",
    NVIDIA/TensorRT-LLM#7368 on 1.1.0rc1): on 1.0 and 1.1 an ``assert`` in its request loop, which ends the loop for
    every request (executor_request_queue.py ``_validate_and_filter_requests`` on the 1.1 line); from 1.2
    ``PyExecutor._validate_request``'s ValueError (1.2-era test_beam_search.py ``test_smaller_beam_width``). PR 16620
    lets the TorchSampler take a smaller width, but its review leaves one open: "ModelEngine asserts that all requests
    [of a batch share one beam width]. How can we make sure all requests are correctly scheduled?": not relaxed."""
    if max_beam_width <= 1:
        return None
    return (
        f"TensorRT-LLM {release} runs every request of this LLM at its max_beam_width ({max_beam_width}; the executor "
        f"fails any other, PyExecutor's beam-width check); send beam_width={max_beam_width}, or serve with "
        "option.max_beam_width=1"
    )


Span = tuple[Version, Version | None]  # the first version that applies it, and the first that no longer does


@dataclass(frozen=True)
class Support:
    """One request feature (``lmi_trt.engines.base.features_used``'s name; ``a+b``: the two together) and the
    releases whose sampler applies it."""

    feature: str
    label: str  # the README row
    torch: Span | None  # the releases whose TorchSampler applies it
    trtllm: Span | None  # the releases whose TRTLLMSampler applies it (it serves this engine up to 1.2)
    source: str  # why, cited

    def honoured(self, release: Version, sampler: Sampler) -> bool:
        span = self.torch if sampler == TORCH else self.trtllm
        return span is not None and span[0] <= release and (span[1] is None or release < span[1])


ALL: Span = (V1_0, None)
SAMPLING: Span = (V1_1, None)  # 1.0's TorchSampler is never built here


def from_rc(n: int) -> Span:
    return Version(f"1.3.0rc{n}"), None


TABLE: tuple[Support, ...] = (
    Support(
        "sampling",
        "temperature, top_k, top_p",
        SAMPLING,
        ALL,
        "TorchSampler: PR 7294 (1.1), batched strategies with temperature; 1.0's is greedy, so lmi-trt builds 1.0 "
        "with enable_trtllm_sampler (a 'prototype' knob on 1.0)",
    ),
    Support(
        "seed",
        "seed",
        from_rc(25),
        ALL,
        "the TorchSampler draws every request from one generator seeded 42 until PR 17172 (main 2026-08-04; the "
        "1.3.0rc25 bump 2026-08-11)",
    ),
    *(
        Support(
            name,
            name,
            from_rc(25),
            ALL,
            "the TorchSampler ignores the penalties until PR 16485 (main 2026-07-30, 'accepted by SamplingParams but "
            "silently ignored'; the 1.3.0rc24 bump is dated 2026-07-31, so probably in rc24; verified from rc25)",
        )
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")
    ),
    Support(
        "min_new_tokens",
        "min_new_tokens (min_tokens)",
        from_rc(11),
        ALL,
        "the TorchSampler compares the prompt plus the generated tokens with min_tokens (PR 7808's "
        "_apply_min_length_penalty) until PR 12166 (main 2026-03-16, in 1.3.0rc9), and under ignore_eos bans the "
        "last vocabulary entry until PR 12358 (1.3.0rc11's release notes)",
    ),
    Support(
        "bad_words",
        "bad words (bad_words_ids)",
        from_rc(23),
        ALL,
        "the TorchSampler ignores bad_words/bad_token_ids until PR 16052 (main 2026-07-20; the 1.3.0rc23 bump "
        "2026-07-22)",
    ),
    Support(
        "stop_token_ids",
        "stop_token_ids with ignore_eos",
        (V1_0, V1_2),
        (V1_0, V1_2),
        "the worker drops every stop word of an ignore_eos request on main (executor/base_worker.py "
        "`stop_words=[] if ...ignore_eos`, with the generation config's EOS ids as stop words, PRs 9514/10389, "
        "2025-12/2026-01); 1.2 was not read, so it is refused there too",
    ),
    Support("logprobs", "logprobs (the chosen token's)", ALL, ALL, "PR 6097: top-1 log prob on PyTorch (1.0)"),
    # From 1.2 the TorchSampler's per-step dict is the top k of log_softmax(raw logits) only (handle_logprobs reads
    # py_topk_logprobs_indices/vals, PR 7976; sampler.py of the 1.2 line, read_file ids 440197692 and 9889077999);
    # a sampled token outside them has no log prob (PR 9374, "Change PyT to always include sampled logprob", was
    # closed unmerged). Later main copies keep it apart (LogProbsStore.sampled_log_prob_indices), in a 1.3.0
    # candidate not yet pinned down: refused on every 1.3.0 candidate until one is verified.
    Support(
        "sampling+logprobs",
        "logprobs of a sampled request",
        (V1_0, V1_2),
        ALL,
        "the TorchSampler reports the top k of the raw log-softmax from 1.2 (PR 7976), without the sampled token "
        "(PR 9374 closed unmerged); which 1.3.0 candidate adds it was not verified; greedy requests are served",
    ),
    Support(
        "sampling+top_logprobs",
        "top_logprobs of a sampled request",
        None,
        None,
        "the TorchSampler's top k leave out a sampled token outside them (PR 7976; PR 9374 closed unmerged)",
    ),
    Support(
        "top_logprobs",
        "top_logprobs (alternatives)",
        (V1_2, None),
        None,
        "TorchSampler: PR 7976 (main 2025-09-30, after the 1.2.0rc0 bump that cut 1.1; PR 7756 was reverted by PR "
        "7969 before it); the TRTLLMSampler's log probs: the sampled token's (not read further)",
    ),
    Support(
        "prompt_logprobs",
        "prompt log probs",
        from_rc(11),
        None,
        "PR 7580 (1.1) gives the top k of each prompt position, which can leave the prompt token out; PR 11235 "
        "(1.3.0rc8) adds one, the wrong one (the token the position read), and PR 12499 (1.3.0rc11's release notes) "
        "the one it predicts",
    ),
    Support(
        "logit_bias",
        "logit_bias",
        SAMPLING,
        None,
        "TorchSampler: SamplingParams.embedding_bias from PR 6464 (1.1); the TRTLLMSampler's: not read",
    ),
    # _torch/pyexecutor/py_executor.py's executor loops: guided_decoder.execute(batch_outputs['logits']) before
    # _sample_async, so the mask holds whichever sampler then runs (copies of the 1.0-1.2 line and main)
    Support(
        "guided",
        "constrained decoding",
        ALL,
        ALL,
        "xgrammar beside the overlap scheduler: PR 6000 (1.0); the PyExecutor masks the logits before any sampler",
    ),
    Support(
        "lora",
        "LoRA adapter per request (option.enable_lora)",
        ALL,
        ALL,
        "LoraConfig + LoRARequest (docs features/lora.md); CUDA graphs off beside adapters before 1.3.0rc2 (PR 5480; "
        "PR 8279 merged after the 1.3.0rc1 bump); refused with speculative decoding and beam search, and on 1.0 "
        "with a quantized checkpoint (PR 7014, FP8 with LoRA, after the 1.1.0rc0 bump)",
    ),
    Support(
        "beam_width",
        "beam search (every request at option.max_beam_width)",
        (TORCH_BEAMS, None),
        ALL,
        "1.0's TorchSampler asserts beam width 1; 1.1/1.2 run beams on the TRTLLMSampler; the 1.3.0 candidates from "
        "rc26 on the TorchSampler (PR 18232), before it start-up refuses option.max_beam_width > 1",
    ),
    Support(
        "beam_width+repetition_penalty",
        "beam search with penalties",
        None,
        ALL,
        "PR 16485 (main) refuses penalties with beam search in the TorchSampler",
    ),
    Support(
        "beam_width+logprobs",
        "beam search with log probs",
        None,
        None,
        "the TRTLLMSampler raises 'Beam search is not supported for multiple prompts and logprobs' (sampler.py); "
        "main's TorchSampler returns the sampled token's only (PR 11584) and not below max_beam_width (PR 16620)",
    ),
    Support(
        "beam_width+stop",
        "beam search with stop sequences (and a model's further EOS ids)",
        (TORCH_BEAMS, None),
        None,
        "1.2-era tests/unittest/_torch/sampler/test_beam_search.py skips 'Beam search on TRTLLMSampler does not "
        "correctly handle stop_token_ids' and runs them on the TorchSampler",
    ),
)
_BY_FEATURE = {s.feature: s for s in TABLE}
# Refused with the penalty row of beam search: presence/frequency share repetition's rule (PR 16485).
_ALIASES = {
    "beam_width+presence_penalty": "beam_width+repetition_penalty",
    "beam_width+frequency_penalty": "beam_width+repetition_penalty",
}


def not_applied(release: Version, sampler: Sampler) -> dict[str, str]:
    """Pure: feature → why, for every feature the release's ``sampler`` does not apply, why naming the release."""
    out = {}
    for feature in (*_BY_FEATURE, *_ALIASES):
        support = _BY_FEATURE[_ALIASES.get(feature, feature)]
        if not support.honoured(release, sampler):
            out[feature] = f"TensorRT-LLM {release}'s {sampler} does not support it ({support.source}); leave it out"
    return out


def requested(sampling: SamplingParams, *, bad_words: bool, stop_token_ids: bool, stop: bool) -> frozenset[str]:
    """Pure: the table's features an engine request uses (set to something other than their no-op value);
    ``stop``: the request sends the LLM stop sequences (its own, or the model's further EOS ids)."""
    s = sampling
    used = {
        "sampling": s.do_sample,
        "seed": s.do_sample and s.seed is not None,
        "repetition_penalty": s.repetition_penalty != 1.0,
        "presence_penalty": s.presence_penalty != 0.0,
        "frequency_penalty": s.frequency_penalty != 0.0,
        "min_new_tokens": s.min_new_tokens > 0,
        "bad_words": bad_words,
        "stop_token_ids": stop_token_ids and s.ignore_eos,
        "stop": stop,
        "logprobs": s.logprobs,
        "top_logprobs": s.top_logprobs > 0,
        "prompt_logprobs": s.prompt_logprobs,
        "logit_bias": bool(s.logit_bias),
        "guided": s.guided is not None,
        "beam_width": s.beam_width > 1,
    }
    return frozenset(name for name, on in used.items() if on)


def first_unsupported(unsupported: Mapping[str, str], used: frozenset[str]) -> tuple[str, str] | None:
    """Pure: the first (feature, why) of ``unsupported`` a request using ``used`` asks for; ``a+b`` is the two
    together, reported as the last (``beam_width+logprobs``: logprobs, with beam search)."""
    for name, why in unsupported.items():
        parts = name.split("+")
        if all(part in used for part in parts):
            return parts[-1], why if len(parts) == 1 else f"with {' and '.join(parts[:-1])}: {why}"
    return None


# ------------------------------------------------------------------------------------------ README table

README_START = "<!-- llmapi-parameters:start -->"
README_END = "<!-- llmapi-parameters:end -->"
COLUMNS: tuple[tuple[str, Version, Sampler], ...] = (
    ("1.0 (TRTLLMSampler)", V1_0, TRTLLM),
    ("1.1 (TorchSampler)", V1_1, TORCH),
    ("1.2 (TorchSampler)", V1_2, TORCH),
)
# 1.1 and 1.2 with option.max_beam_width > 1 run every request on the TRTLLMSampler, which llm_plan asks for by name
BEAMS = ("1.1, 1.2 with `option.max_beam_width` > 1 (sampler_type=TRTLLMSampler)", (V1_1, V1_2), TRTLLM)
MAIN_COLUMN = "1.3.0rcN / main (TorchSampler)"


def render_table() -> str:
    """The parameter × release table: "yes" where the release applies the parameter, "400" where a request that
    sets it is refused, naming the field and the release; on the 1.3.0 candidates, from which one."""
    titles = [title for title, _, _ in COLUMNS] + [MAIN_COLUMN, BEAMS[0]]
    rows = ["| Parameter | " + " | ".join(titles) + " | Why |", "|" + "---|" * (len(titles) + 2)]

    def cell(s: Support, release: Version, sampler: Sampler) -> str:
        return "yes" if s.honoured(release, sampler) else "400"

    def main_cell(s: Support) -> str:
        if s.torch is None or s.torch[1] is not None and s.torch[1] <= LINE_1_3:
            return "400"
        return "yes" if s.torch[0] <= LINE_1_3 else f"from {s.torch[0]}"

    for s in TABLE:
        cells = [cell(s, release, sampler) for _, release, sampler in COLUMNS] + [main_cell(s)]
        beams = {f"{v.major}.{v.minor}": cell(s, v, BEAMS[2]) for v in BEAMS[1]}
        cells.append(
            next(iter(beams.values()))
            if len(set(beams.values())) == 1
            else ", ".join(f"{k}: {v}" for k, v in beams.items())
        )
        rows.append(f"| {s.label} | " + " | ".join(cells) + f" | {s.source.replace('|', '/')} |")
    return "\n".join(rows)


def replace_table(readme: str) -> str:
    """README text with the table between its markers rendered anew."""
    head, rest = readme.split(README_START, 1)
    return f"{head}{README_START}\n{render_table()}\n{README_END}{rest.split(README_END, 1)[1]}"


if __name__ == "__main__":
    # python -m lmi_trt.engines.llmapi_releases  → rewrites README.md's parameter × release table.
    readme = Path(__file__).resolve().parents[2] / "README.md"
    readme.write_text(replace_table(readme.read_text()))
