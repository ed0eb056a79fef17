"""Speculative decoding on the LLM API's PyTorch backend, per TensorRT-LLM release: which ``speculative_config``
class each method is, with which fields, and what a release does not do beside it. Pure: the LLM API engine
(``lmi_trt.engines.llmapi``) builds the config from ``speculative_plan`` and refuses from ``speculation_refusals``.

What was read (NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py; the index keeps crawl copies, dated by content
as tests/fakes/tensorrt_llm/llmapi/llm_args.py dates them: the 1.0 copy has ``enable_mixed_sampler`` and no
``sampler_type``; the 1.1 copy adds ``sampler_type`` and the TRITON MoE backend; the copy dated 1.2 has the AUTO MoE
default and no DENSEGEMM, and may be an early 1.3 main; main has DENSEGEMM):

* every copy: ``NGramDecodingConfig`` (``max_draft_len``, ``max_matching_ngram_size``, ``is_keep_all``,
  ``is_use_oldest``, ``is_public_pool``), ``DraftTargetDecodingConfig`` (``max_draft_len`` and the draft model),
  ``EagleDecodingConfig`` (EAGLE-3 on the PyTorch backend: ``spec_dec_mode`` EAGLE3 / EAGLE3_ONE_MODEL;
  ``eagle3_one_model``; "Draft model must be provided for EAGLE") and ``MTPDecodingConfig``
  (``num_nextn_predict_layers``, which sets ``max_draft_len``); ``supports_backend`` is ``backend == "pytorch"``
  for NGram, Draft_Target and MTP, and Medusa's is ``backend not in ("pytorch", "_autodeploy")``. The 1.0 copy's
  ``validate_speculative_config`` asserts ``max_draft_len > 0`` and ``max_matching_ngram_size > 0`` for NGram and a
  draft model for Draft_Target and Eagle.
* the draft model is ``speculative_model_dir`` in the 1.0 and 1.1 copies; PR 10099 renamed it
  ``speculative_model`` and kept ``speculative_model_dir`` as an alias (``AliasChoices``, in the 1.2-dated and main
  copies), so ``speculative_model_dir`` is the name every release takes.
* ``max_concurrency`` ("speculation will be disabled at batch sizes above this value", PyTorch only) is in the 1.1
  copy's ``DecodingBaseConfig`` and later, not in the 1.0 copy's.
* ``Eagle3DecodingConfig`` (``decoding_type: Literal["Eagle3"]``) is in the 1.2-dated and main copies and exported
  by tensorrt_llm/llmapi/__init__.py there; this engine uses it from 1.3 and ``EagleDecodingConfig`` before.
* one-model and two-model paths: EAGLE-3 with ``eagle3_one_model`` (its default) and MTP run their heads inside the
  target's engine and verify in their own worker (_torch/speculative/utils.py ``get_spec_worker``:
  Eagle3OneModelWorker, MTPWorker, MTPEagleWorker; ``get_spec_drafter`` gives them no drafter); n-gram, draft-target
  and EAGLE-3 with ``eagle3_one_model=false`` have a drafter and verify in the TorchSampler (``get_spec_decoder``:
  TorchSampler for EAGLE3; the default sampler for the others). (utils.py copy id 13542650405.)
* sampling on the one-model paths: their workers take the argmax of the target's logits ("Currently only support
  greedy sampling. All decoding is done using Top1 and token equality is used for acceptance", mtp.py
  ``sample_and_accept_draft_tokens``; eagle3.py ``Eagle3OneModelWorker``: ``torch.argmax(logits)``), unless
  ``allow_advanced_sampling`` (DecodingBaseConfig; PR 9885, merged 2025-12-12; ``status="prototype"``, default off:
  "allows non-greedy sampling when speculation is used. Only applicable to 1-model code paths; non-greedy sampling is
  always enabled on 2-model paths"; py_executor_creator.py: "Falling back to greedy decoding ... set
  allow_advanced_sampling=True") is set; from PR 14745 the flag is ``status="deprecated"``, "no-op kept for backward
  compatibility ... Non-greedy sampling is now auto-detected per request". Which sampling parameters the prototype
  path honours was not established: the one-model sampling code at PR 9885 was not found in the index, and later PRs
  change it (PR 14745 "draft honors target params", so drafts did not before; PR 16561 which of top-k / top-p the
  one-model sampler applies; PR 18515 adds min-p). So sampling beside a one-model path is served only where the
  release's field is deprecated (per-request auto-detection), and refused where it is absent or a prototype (the
  flag is never set). Whether release 1.2.x and which 1.3.0 candidate hold which is not pinned, so the engine probes
  the installed class (``advanced_sampling``; llm_args.py's ``Field`` puts ``status`` into ``json_schema_extra``,
  1.1 copy).
* sampling on the two-model paths: the 1.2 line's TorchSampler (sampler.py, read_file id 440197692: it has PR 7976's
  ``handle_logprobs``, main 2025-09-30, after the 1.2.0rc0 bump that cut 1.1) draws each
  position's token with the request's own strategy and keeps drafts while they equal it
  (``_process_draft_tokens_greedy``), or rejection-samples where the drafter gave its probabilities
  (``_process_draft_tokens_rejection_sampling``); both keep the target's distribution, and PR 7294 removed
  ``enable_mixed_sampler`` in 1.1, so per-request strategies apply: they sample from 1.2. No copy of the 1.1 line's
  sampler.py beside drafts was read, so 1.1 is refused like 1.0 (whose TorchSampler takes the argmax unless
  ``enable_mixed_sampler``, which lmi-trt does not set beside drafts). Its ``update_requests`` gives log probs for
  every token it keeps (``handle_logprobs(..., count=1 + num_accepted)``), so ``logprobs`` / ``top_logprobs`` are
  served beside the two-model paths from 1.2; prompt log probs and the one-model samplers' log probs were not read:
  refused.
* the sampler: _torch/pyexecutor/_util.py ``instantiate_sampler`` (two copies read, both from before 1.1: the
  ``mixed_sampler`` era) picks ``get_spec_decoder`` (a TorchSampler subclass) for a model with a ``spec_config`` —
  in the newer copy only where ``spec_dec_mode.has_spec_decoder()`` — before ``enable_trtllm_sampler``; otherwise
  the default TorchSampler. Whether the TRTLLMSampler verifies draft tokens was not read, so lmi-trt never asks for
  it beside speculation (no ``enable_trtllm_sampler`` on 1.0; no beams, for which 1.1/1.2 pick it).
* the overlap scheduler: _torch/pyexecutor/py_executor_creator.py turns it off ("Disable overlap scheduler for
  speculation mode ...") where ``spec_dec_mode.support_overlap_scheduler()`` is false; in the oldest
  _torch/speculative/interface.py copy read (id 2550156383) it is ``is_mtp() or is_eagle3_one_model()``; later copies
  (ids 10039271475, 735060080) add ``has_draft_model()`` (EAGLE3 two-model and DRAFT_TARGET) from a release not
  pinned: ``option.enable_overlap_scheduler=true`` is refused beside every two-model path rather than switched off
  on some releases. N-gram has it in no copy read.
* guided decoding: interface.py ``support_guided_decoder`` is ``is_none() or has_spec_drafter()``, and
  ``has_spec_drafter`` counts n-gram, draft-target and EAGLE3 two-model (every copy read): they keep the guided
  decoder from 1.1 (PR 6300). The one-model EAGLE-3 and MTP paths go to a separate
  ``support_capturable_guided_decoder`` path, not read further: refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from lmi_trt.speculative import JSON_KEY, METHODS, Speculation, SpeculationError

Series = tuple[int, int]

# The methods the PyTorch backend runs, and the speculative_config class of each (from the series given; the last
# entry at or below a release applies).
CLASSES: dict[str, tuple[tuple[Series, str], ...]] = {
    "ngram": (((1, 0), "NGramDecodingConfig"),),
    "draft_model": (((1, 0), "DraftTargetDecodingConfig"),),
    "eagle3": (((1, 0), "EagleDecodingConfig"), ((1, 3), "Eagle3DecodingConfig")),
    "mtp": (((1, 0), "MTPDecodingConfig"),),
}
TWO_MODEL_SAMPLES_FROM: Series = (1, 2)  # the TorchSampler's per-request strategies beside drafts (docstring)
ADVANCED_SAMPLING = "allow_advanced_sampling"  # DecodingBaseConfig, where the release has it (docstring)
MAX_CONCURRENCY_FROM: Series = (1, 1)  # DecodingBaseConfig.max_concurrency
# speculative_config members passed on as written, per method (TensorRT-LLM's own fields); others are refused.
PASSED: dict[str, dict[str, type]] = {
    "ngram": {"is_keep_all": bool, "is_public_pool": bool},
    "draft_model": {},
    "eagle3": {"eagle3_one_model": bool},
    "mtp": {"use_mtp_vanilla": bool},
}
# Request features not read beside speculation on any release: refused rather than assumed.
UNREAD = ("repetition_penalty", "presence_penalty", "frequency_penalty", "min_new_tokens", "bad_words", "logit_bias")
UNREAD += ("prompt_logprobs", "beam_width")


@dataclass(frozen=True)
class SpecPlan:
    """The ``speculative_config`` to build: ``llmapi.<config_class>(**fields)``, and what the start-up log says."""

    config_class: str
    fields: dict[str, Any]
    method: str
    description: str
    one_model: bool = False  # heads inside the target's engine, verified by their own worker (docstring)
    # the installed class's allow_advanced_sampling: "absent", its status ("prototype", "deprecated", or "stable" with
    # none), or None before the class was probed (``probed``)
    advanced_sampling: str | None = None


def advanced_sampling(config_class: type) -> str:
    """The release's ``allow_advanced_sampling`` field on ``config_class`` (a pydantic model): "absent", or its
    ``status`` (llm_args.py's ``Field(status=...)`` → ``json_schema_extra``), "stable" when it has none."""
    field = getattr(config_class, "model_fields", {}).get(ADVANCED_SAMPLING)
    if field is None:
        return "absent"
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    return str(extra.get("status") or "stable")


def probed(spec: SpecPlan, config_class: type) -> SpecPlan:
    """``spec`` with what the installed ``config_class`` says about sampling on one-model paths."""
    return replace(spec, advanced_sampling=advanced_sampling(config_class))


def config_class(method: str, series: Series) -> str:
    return [name for first, name in CLASSES[method] if first <= series][-1]


def speculative_plan(
    spec: Speculation,
    version: str,
    series: Series,
    *,
    mtp_layers: int | None,
    max_beam_width: int,
    overlap_scheduler: bool | None,
) -> SpecPlan:
    """Pure: the release's speculative config for ``spec``, or a ``SpeculationError`` naming the key, the release and
    what would work. ``mtp_layers``: the checkpoint's config.json ``num_nextn_predict_layers`` (0: none, None: not
    read yet);
    ``overlap_scheduler``: option.enable_overlap_scheduler (None: unset)."""
    if spec.method not in CLASSES:
        raise SpeculationError(
            spec.key("method"),
            spec.method,
            f"TensorRT-LLM {version}'s PyTorch backend does not run {spec.method} ({METHODS[spec.method]}): its "
            "speculative config does not support the pytorch backend (llm_args.py supports_backend)",
            f"use one of {', '.join(CLASSES)} on option.backend=pytorch; {spec.method} runs on TensorRT engines, "
            "which lmi-trt's tensorrt backend does not build for speculation"
            + ("; for EAGLE-3 write decoding_type Eagle or Eagle3, or method eagle3" if spec.method == "eagle" else ""),
        )
    if max_beam_width > 1:
        raise SpeculationError(
            "option.max_beam_width",
            max_beam_width,
            f"beam search beside speculative decoding ({spec.key('method')}={spec.method}): TensorRT-LLM "
            f'{version} verifies drafts in its TorchSampler or spec decoder, which decode one beam ("TorchSampler '
            'only supports beam_width = 1"); beam search would need the TRTLLMSampler, not read beside drafts',
            "set option.max_beam_width=1, or turn speculation off",
        )
    one_model = spec.method == "mtp" or (spec.method == "eagle3" and spec.options.get("eagle3_one_model", True))
    if overlap_scheduler and not one_model:
        raise SpeculationError(
            "option.enable_overlap_scheduler",
            True,
            f"TensorRT-LLM turns the overlap scheduler off for two-model {spec.method} speculation where "
            "support_overlap_scheduler() is false (py_executor_creator.py: 'Disable overlap scheduler for speculation "
            "mode'; interface.py: MTP and EAGLE-3 one-model only in the oldest copy, the draft-model modes added "
            "from a release not pinned, n-gram in none), so it may not be honoured",
            "leave option.enable_overlap_scheduler unset or false"
            + (f", or set {JSON_KEY}'s eagle3_one_model=true" if spec.method == "eagle3" else ""),
        )
    if spec.max_concurrency is not None and series < MAX_CONCURRENCY_FROM:
        raise SpeculationError(
            spec.key("max_concurrency"),
            spec.max_concurrency,
            f"TensorRT-LLM {version}'s speculative configs have no max_concurrency (DecodingBaseConfig: from 1.1)",
            "leave it out, or use a 1.1+ image",
        )
    if spec.max_concurrency is not None and one_model:
        # max_concurrency is read by the drafter only (py_executor.py of the 1.1 line: ``if self.drafter is not None``
        # ... ``should_use_spec_decode``; PR 6676), and _torch/speculative/utils.py get_spec_drafter gives none to
        # EAGLE3_ONE_MODEL or MTP one-model; main turns it into draft_len_schedule for one-model modes, from a
        # 1.3.0 release candidate not pinned: refused on every release rather than ignored on some
        raise SpeculationError(
            spec.key("max_concurrency"),
            spec.max_concurrency,
            f"TensorRT-LLM {version} reads max_concurrency through its drafter, which one-model {spec.method} "
            "speculation does not have (_torch/speculative/utils.py get_spec_drafter): it would be ignored",
            "leave it out"
            + (f", or set {JSON_KEY}'s eagle3_one_model=false (two-model EAGLE-3)" if spec.method == "eagle3" else ""),
        )
    if spec.method == "ngram" and spec.min_matching_ngram_size != 1:
        raise SpeculationError(
            spec.key("min_matching_ngram_size"),
            spec.min_matching_ngram_size,
            "TensorRT-LLM's NGramDecodingConfig has no shortest n-gram: it matches down to one token",
            "set it to 1 (vLLM's form copies prompt_lookup_max into it, or 5 with neither, when it is left out)",
        )
    fields: dict[str, Any] = {"max_draft_len": spec.max_draft_len}
    if spec.max_concurrency is not None:
        fields["max_concurrency"] = spec.max_concurrency
    if spec.method == "ngram":
        fields["max_matching_ngram_size"] = spec.max_matching_ngram_size
        # is_use_oldest: passed only when set, so TensorRT-LLM's own default holds otherwise (``is_use_oldest: bool =
        # True`` in NGramDecodingConfig, llm_args.py of 1.0, 1.1 and main; _torch/speculative/ngram.py)
        if spec.use_oldest is not None:
            fields["is_use_oldest"] = spec.use_oldest
        which = {None: "TensorRT-LLM's default: the oldest", True: "the oldest", False: "the latest"}[spec.use_oldest]
        describe = f"n-gram prompt lookup ({which} match of up to {spec.max_matching_ngram_size} tokens)"
    elif spec.method == "mtp":
        if mtp_layers == 0:
            raise SpeculationError(
                spec.key("method"),
                spec.method,
                "the model has no multi-token-prediction heads (its config.json has no num_nextn_predict_layers)",
                "use an MTP checkpoint (DeepSeek V3/R1), or another method",
            )
        # MTPDecodingConfig sets max_draft_len from num_nextn_predict_layers (default 1) in 1.0's
        # validate_speculative_config and 1.1's __init__ / from_dict, and on the 1.3.0 candidates before PR 12341
        # ("decouple MTP num_nextn_predict_layers from max_draft_len", 2026-03-19; candidate not pinned), so a lone
        # max_draft_len would be overwritten there; main's copy remaps a given num_nextn_predict_layers to
        # max_draft_len (with a deprecation warning): passed on every release
        fields = {"num_nextn_predict_layers": spec.max_draft_len} | {
            k: v for k, v in fields.items() if k != "max_draft_len"
        }
        vanilla = spec.options.get("use_mtp_vanilla") is True or (mtp_layers or 0) > 1
        if vanilla and mtp_layers and spec.max_draft_len > mtp_layers:
            # PR 14457 (2026-05-22, "Restore DeepSeek shared-weights vanilla MTP path"): after PR 12341 vanilla MTP's
            # max_draft_len was clamped to the checkpoint's MTP layers; which candidate took PR 14457, and what
            # releases before PR 12341 do with more steps than layers, were not read: refused everywhere
            raise SpeculationError(
                spec.key("max_draft_len"),
                spec.max_draft_len,
                f"vanilla MTP runs one of the checkpoint's MTP layers per draft token, and the model has {mtp_layers} "
                f"(config.json num_nextn_predict_layers); TensorRT-LLM {version} may cut the draft length to that "
                "without a word (clamped after PR 12341 until PR 14457, neither pinned to a release)",
                f"set the draft length (max_draft_len) to at most {mtp_layers}"
                + (f", or leave {JSON_KEY}'s use_mtp_vanilla out (one layer: MTP-Eagle)" if mtp_layers == 1 else ""),
            )
        describe = "the model's MTP heads" + (f" ({mtp_layers} in config.json)" if mtp_layers else "")
    else:
        if spec.draft_model is None:  # resolve() requires it for draft_model; EAGLE-3 needs its draft heads
            raise SpeculationError(
                spec.key("method"),
                spec.method,
                "needs the draft model ('Draft model must be provided for EAGLE', llm_args.py)",
                f"set option.speculative_draft_model (or {JSON_KEY}'s speculative_model)",
            )
        fields["speculative_model_dir"] = spec.draft_model
        describe = (
            "a draft model" if spec.method == "draft_model" else "EAGLE-3 draft heads"
        ) + f" ({spec.draft_model})"
    fields |= _passed(spec)
    name = config_class(spec.method, series)
    return SpecPlan(
        name,
        fields,
        spec.method,
        f"{describe}, up to {spec.max_draft_len} draft tokens a step"
        + (f", off above {spec.max_concurrency} requests" if spec.max_concurrency else "")
        + f" ({'one' if one_model else 'two'}-model; TensorRT-LLM {version} {name})",
        one_model,
    )


def _passed(spec: Speculation) -> dict[str, Any]:
    """The speculative_config members TensorRT-LLM's class for this method takes as they are; any other is refused."""
    allowed = PASSED[spec.method]
    out = {}
    for member, value in spec.options.items():
        kind = allowed.get(member)
        if kind is None or not isinstance(value, kind):
            raise SpeculationError(
                f"{JSON_KEY}.{member}",
                value,
                f"is not a {spec.method} setting lmi-trt passes to TensorRT-LLM",
                "leave it out"
                + (f"; it takes {', '.join(allowed)} ({kind.__name__ if kind else ''})" if allowed else ""),
            )
        out[member] = value
    return out


def speculation_refusals(spec: SpecPlan, version: str, series: Series) -> dict[str, str]:
    """Pure: request feature → why, for what this release does not do beside ``spec`` (module docstring)."""
    method = spec.method
    why = f"not read beside {method} speculation in TensorRT-LLM {version}; lmi-trt refuses it rather than assume"
    out = {feature: why for feature in UNREAD}
    if spec.one_model:
        out["logprobs"] = out["top_logprobs"] = (
            f"not read for the one-model {method} worker's sampler in TensorRT-LLM {version} (the TorchSampler's "
            "log probs beside drafts were read for the two-model paths only); lmi-trt refuses it rather than assume"
        )
        out["seed"] = (
            f"the one-model {method} worker's sampling seed was not read in TensorRT-LLM {version}; lmi-trt refuses "
            "it rather than assume"
        )
        if spec.advanced_sampling != "deprecated":
            state = {None: "not probed", "absent": "absent"}.get(spec.advanced_sampling, spec.advanced_sampling)
            out["sampling"] = (
                f"TensorRT-LLM {version} decodes greedily beside one-model {method} speculation unless "
                f"{ADVANCED_SAMPLING} is set (mtp.py / eagle3.py: the worker takes the argmax of the target's "
                f"logits), and this release's field is {state}: a prototype flag (PR 9885) whose sampling parameters "
                "were not read, so lmi-trt does not set it; per-request sampling comes with PR 14745 (the field "
                "deprecated). Send a greedy request (temperature 0), or use a release whose field is deprecated"
                + (f", or set {JSON_KEY}'s eagle3_one_model=false" if method == "eagle3" else "")
            )
    elif series < TWO_MODEL_SAMPLES_FROM:
        out["sampling"] = out["seed"] = (
            f"TensorRT-LLM {version}'s TorchSampler beside {method} speculation: 1.0's takes the argmax "
            "(enable_mixed_sampler is off), and per-request strategies and log probs beside drafts were read in the "
            "1.2 line's sampler.py only; send a greedy request (temperature 0), or use a 1.2+ image"
        )
        out["logprobs"] = out["top_logprobs"] = why
    if series < (1, 1):
        # py_executor_creator.py of the 1.0 line raises "Guided decoding is not supported with speculative decoding."
        # for guided_decoding_config beside any spec_config (NVIDIA/TensorRT-LLM PR 6300, in 1.1, lifted it; 1.1's
        # release notes: "Enabled guided decoding to work in conjunction with speculative decoding"); llm_plan
        # leaves guided_decoding_backend out wherever guided is refused here
        out["guided"] = (
            f"TensorRT-LLM {version} cannot guide decoding beside {method} speculation ('Guided decoding is not "
            "supported with speculative decoding', py_executor_creator.py; lifted by PR 6300 in 1.1); leave the "
            "grammar out, serve without speculation, or use a 1.1+ image"
        )
    elif spec.one_model:
        out["guided"] = (
            f"TensorRT-LLM's one-model {method} speculation guides through its capturable guided decoder "
            "(_torch/speculative/interface.py support_guided_decoder: none or a drafter only), which lmi-trt has not "
            "read; leave the grammar out, or use n-gram, a draft model or two-model EAGLE-3"
        )
    return out


def mtp_layers(hf_config: Mapping[str, Any] | None) -> int | None:
    """The checkpoint's MTP heads (config.json ``num_nextn_predict_layers``, as DeepSeek V3 states them): 0 for
    none, None while the config is not read yet (``speculative_plan`` checks MTP once it is)."""
    if hf_config is None:
        return None
    value = hf_config.get("num_nextn_predict_layers")
    return value if isinstance(value, int) and value > 0 else 0
