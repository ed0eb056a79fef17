"""What each TensorRT-LLM release's LLM API (PyTorch backend) does with a request: the one table the LLM API
engine refuses from, and the parameter × release table in README.md (``python -m lmi_trt.engines.llmapi_releases``
rewrites it; tests/unit/test_llmapi_releases.py fails when the README is stale).

Which sampler runs a request decides most of it; the LLM has one for every request:

* 1.0: the default ``TorchSampler`` takes the argmax for the whole batch unless ``enable_mixed_sampler`` (then
  top-p *or* top-k, never a temperature) and asserts ``max_beam_width == 1`` at construction
  (tensorrt_llm/_torch/pyexecutor/sampler.py of the 1.0 line: ``fast_path = not self.enable_mixed_sampler ...``,
  ``request_strategy``). Sampling on 1.0 is its ``TRTLLMSampler``, the C++ decoder, with
  ``enable_trtllm_sampler=True`` (the 1.0.0 docs, features/sampling.md: "To use the feature: Enable the
  enable_trtllm_sampler option in the LLM class"), which this engine sets there.
* 1.1 and 1.2: ``sampler_type="auto"`` (PR 6831): the ``TRTLLMSampler`` when ``max_beam_width > 1``, else the
  ``TorchSampler`` (_util.py ``instantiate_sampler``: ``sampler_type == TRTLLMSampler or (sampler_type == auto
  and decoding_mode.isBeamSearch())``). This engine leaves the choice to the release.
* main (1.3 release candidates): the ``TorchSampler`` only (PR 18232 removed the other).

The ``TRTLLMSampler`` applies temperature, top-k/top-p, a request's seed, the repetition/presence/frequency
penalties, min length, bad words and beam search (the C++ decoder set up from each request's ``SamplingConfig``,
``TRTLLMSampler.setup_sampler_step``, whose batch config keeps ``randomSeed``, the penalties and ``minLength`` per
request: cpp/include/tensorrt_llm/runtime/samplingConfig.h; docs features/sampling.md of 1.0.0: "temperature,
top-k and top-p sampling, beam search, stop words, bad words, penalty, ... log probability, guided decoding"; PR
8127's thread: "Only trtllm sampler in torch path supports these penalties"). Whether it adds ``embedding_bias``
or reports more than the sampled token's log prob was not read: refused until someone reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmi_trt.engines.base import SamplingParams

Sampler = Literal["TorchSampler", "TRTLLMSampler"]
TORCH: Sampler = "TorchSampler"
TRTLLM: Sampler = "TRTLLMSampler"
# The last series with the TRTLLMSampler (PR 18232 removed it on main, after 1.2).
LAST_TRTLLM_SAMPLER = (1, 2)
# The series this engine builds with enable_trtllm_sampler (the key exists on 1.0 only: PR 6831 replaced it).
ENABLE_TRTLLM_SAMPLER = (1, 0)

Series = tuple[int, int]
Span = tuple[Series, Series | None]  # first and last series (None: every later one)


def llm_sampler(series: Series, max_beam_width: int, speculative: bool = False) -> Sampler:
    """Pure: the sampler that runs every request of the LLM this engine builds (module docstring). With speculative
    decoding, the TorchSampler (or the spec decoder, a TorchSampler subclass) on every release: lmi-trt asks for no
    TRTLLMSampler beside drafts (lmi_trt.engines.llmapi_speculation: no enable_trtllm_sampler, no beams)."""
    if speculative:
        return TORCH
    if series == ENABLE_TRTLLM_SAMPLER:
        return TRTLLM
    if series <= LAST_TRTLLM_SAMPLER and max_beam_width > 1:
        return TRTLLM
    return TORCH


@dataclass(frozen=True)
class Support:
    """One request feature (``lmi_trt.engines.base.features_used``'s name; ``a+b``: the two together) and the
    releases whose sampler applies it."""

    feature: str
    label: str  # the README row
    torch: Span | None  # the releases whose TorchSampler applies it
    trtllm: Span | None  # the releases whose TRTLLMSampler applies it (it exists up to 1.2)
    source: str  # why, cited

    def honoured(self, series: Series, sampler: Sampler) -> bool:
        span = self.torch if sampler == TORCH else self.trtllm
        return span is not None and span[0] <= series and (span[1] is None or series <= span[1])


ALL: Span = ((1, 0), None)
SAMPLING: Span = ((1, 1), None)  # 1.0's TorchSampler is never built here
MAIN: Span = ((1, 3), None)

TABLE: tuple[Support, ...] = (
    Support(
        "sampling",
        "temperature, top_k, top_p",
        SAMPLING,
        ALL,
        "TorchSampler: PR 7294 (1.1), batched strategies with temperature; 1.0's is greedy, so lmi-trt builds 1.0 "
        "with enable_trtllm_sampler",
    ),
    Support(
        "seed",
        "seed",
        MAIN,
        ALL,
        "the TorchSampler draws every request from one generator seeded 42 until PR 17172 (2026-08, main)",
    ),
    *(
        Support(
            name,
            name,
            MAIN,
            ALL,
            "the TorchSampler ignores the penalties until PR 16485 (2026-07, main): 'accepted by SamplingParams but "
            "silently ignored'",
        )
        for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")
    ),
    Support(
        "min_new_tokens",
        "min_new_tokens (min_tokens)",
        MAIN,
        ALL,
        "the TorchSampler compares the prompt plus the generated tokens with min_tokens (PR 7808's "
        "_apply_min_length_penalty) until PR 12166 (2026-03, main), and under ignore_eos bans the last vocabulary "
        "entry until PR 12358",
    ),
    Support(
        "bad_words",
        "bad words (bad_words_ids)",
        MAIN,
        ALL,
        "the TorchSampler ignores bad_words/bad_token_ids until PR 16052 (2026-07, main)",
    ),
    Support(
        "stop_token_ids",
        "stop_token_ids with ignore_eos",
        ((1, 0), (1, 1)),
        ((1, 0), (1, 1)),
        "the worker drops every stop word of an ignore_eos request on main (executor/base_worker.py "
        "`stop_words=[] if ...ignore_eos`, with the generation config's EOS ids as stop words, PRs 9514/10389, "
        "2025-12/2026-01); 1.2 was not read, so it is refused there too",
    ),
    Support("logprobs", "logprobs (the chosen token's)", ALL, ALL, "PR 6097: top-1 log prob on PyTorch (1.0)"),
    Support(
        "top_logprobs",
        "top_logprobs (alternatives)",
        SAMPLING,
        None,
        "TorchSampler: PR 7756 (1.1); the TRTLLMSampler's log probs: the sampled token's (not read further)",
    ),
    Support(
        "prompt_logprobs",
        "prompt log probs",
        MAIN,
        None,
        "PR 7580 (1.1) gives the top k of each prompt position, which can leave the prompt token out; PR 11235 "
        "(main) adds it",
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
        "beam_width",
        "beam search",
        MAIN,
        ALL,
        "1.0's TorchSampler asserts beam width 1; 1.1/1.2 run beams on the TRTLLMSampler; main's TorchSampler too",
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
        "the TorchSampler's beams with log probs: not read",
    ),
)
_BY_FEATURE = {s.feature: s for s in TABLE}
# Refused with the penalty row of beam search: presence/frequency share repetition's rule (PR 16485).
_ALIASES = {
    "beam_width+presence_penalty": "beam_width+repetition_penalty",
    "beam_width+frequency_penalty": "beam_width+repetition_penalty",
}


def not_applied(version: str, series: Series, sampler: Sampler) -> dict[str, str]:
    """Pure: feature → why, for every feature the release's ``sampler`` does not apply, why naming the release."""
    out = {}
    for feature in (*_BY_FEATURE, *_ALIASES):
        support = _BY_FEATURE[_ALIASES.get(feature, feature)]
        if not support.honoured(series, sampler):
            out[feature] = f"TensorRT-LLM {version}'s {sampler} does not support it ({support.source}); leave it out"
    return out


def requested(sampling: SamplingParams, *, bad_words: bool, stop_token_ids: bool) -> frozenset[str]:
    """Pure: the table's features an engine request uses (set to something other than their no-op value)."""
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
COLUMNS: tuple[tuple[str, Series, Sampler], ...] = (
    ("1.0 (TRTLLMSampler)", (1, 0), TRTLLM),
    ("1.1 (TorchSampler)", (1, 1), TORCH),
    ("1.2 (TorchSampler)", (1, 2), TORCH),
    ("1.3 / main (TorchSampler)", (1, 3), TORCH),
)
# 1.1 and 1.2 with option.max_beam_width > 1 run every request on the TRTLLMSampler
BEAMS = ("1.1, 1.2 with `option.max_beam_width` > 1 (TRTLLMSampler)", ((1, 1), (1, 2)), TRTLLM)


def render_table() -> str:
    """The parameter × release table: "yes" where the release applies the parameter, "400" where a request
    that sets it is refused, naming the field and the release."""
    titles = [title for title, _, _ in COLUMNS] + [BEAMS[0]]
    rows = ["| Parameter | " + " | ".join(titles) + " | Why |", "|" + "---|" * (len(titles) + 2)]

    def cell(s: Support, series: Series, sampler: Sampler) -> str:
        return "yes" if s.honoured(series, sampler) else "400"

    for s in TABLE:
        cells = [cell(s, series, sampler) for _, series, sampler in COLUMNS]
        beams = {f"{a}.{b}": cell(s, (a, b), BEAMS[2]) for a, b in BEAMS[1]}
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
