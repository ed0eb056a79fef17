"""TensorRT-LLM engine: serve a precompiled TensorRT engine through the C++ in-flight-batching Executor.

Data path: ``engine_dir`` (``config.json`` + one plan per rank) → ``EngineFacts`` (pure parse) →
``check_settings`` (what the engine cannot honour is an error, never a silent clip) →
``tensorrt_llm.bindings.executor.Executor`` with in-flight batching → one response-pump thread
that calls ``await_responses`` and hands each batch of results to the event loop in one call,
where they go to per-request streams (a consumer that fell behind reads what queued up as one delta) or,
behind the engine link (``BatchedEngine``), to its ``OutputSink`` in one call per batch, with no task per request.

Supported TensorRT-LLM releases: 0.12 and 1.0–1.2 (README "Supported TensorRT-LLM releases"). Where they differ:
* 0.12's ``Request`` is keyword-only after the prompt; 1.x takes ``max_tokens`` positionally. We
  always pass keywords. ``max_tokens``/``seed``/``min_tokens`` are the current names in both (0.12
  still accepts the deprecated ``max_new_tokens``/``random_seed``/``min_length`` aliases, and logs a
  warning per request for them), so the same keywords serve both.
* ``FinishReason.CANCELLED`` and ``TIMED_OUT`` exist only in 1.x; we map reasons by name.
* A cancelled request gets a final result in 1.x (since 0.16) and nothing in 0.12, so 0.12
  streams are ended here when cancelled.
* ``KvCacheConfig(enable_block_reuse=...)`` defaults to True in 1.x and False in 0.x: always passed.
* Knobs that only some bindings have are probed, not assumed: ``ExtendedRuntimePerfKnobConfig``
  (``multi_block_mode`` at run time) and ``ExecutorConfig.enable_trt_overlap``.

Leader mode (MPI, TP×PP ranks): every rank constructs the Executor; only the rank where
``can_enqueue_requests()`` is True serves requests; the others call ``wait_for_shutdown()``.

The ``tensorrt_llm.bindings.executor`` module is always named ``tle`` here, so the surface test's
AST scan can check every name and keyword this file uses against the real API listing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
import os
import random
import re
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from pydantic import Field

from lmi_trt.compile.lora import TARGET_MODULES, host_module_layers, peft_cache_sizes, with_missing_qkv
from lmi_trt.engines.adapters import AdapterTable
from lmi_trt.engines.base import (
    SAMPLING_FEATURES,
    AdapterInfo,
    Beam,
    Capabilities,
    Capability,
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    OutputSink,
    SamplingParams,
    can,
    cannot,
    error_output,
)
from lmi_trt.engines.guided import GuideVocab, backend_guide, warm_guide
from lmi_trt.engines.trtllm_drafts import (
    DraftModelProposer,
    ExternalDrafts,
    NgramProposer,
    draft_loop,
    draft_refusals,
    drafted_request_refusal,
    engine_draft_errors,
    input_limit_error,
)
from lmi_trt.engines.trtllm_drafts import release_error as drafts_release_error
from lmi_trt.engines.trtllm_lora import MODULES, LoraBuild, executor_tensors, module_dims
from lmi_trt.engines.trtllm_medusa import Medusa, engine_medusa_errors, for_engine, medusa_refusals
from lmi_trt.engines.trtllm_medusa import decoding_config as medusa_decoding_config
from lmi_trt.engines.trtllm_medusa import release_error as medusa_release_error
from lmi_trt.engines.trtllm_speculation import (
    STOP_WORDS_UNREAD,
    UNCOUNTED_DRAFTS,
    Lookahead,
    counts_accepted_drafts,
    decoding_config,
    engine_speculation_errors,
    lookahead_refusals,
    release_error,
    stop_words_error,
)
from lmi_trt.keys import reads

log = logging.getLogger(__name__)

SUPPORTED_SERIES = ((0, 12), (1, 0), (1, 1), (1, 2))
SUPPORTED_TEXT = "0.12.x, 1.0.x, 1.1.x or 1.2.x (≤ 1.2.0rcN)"
# How long one await_responses call may block: bounds how fast close() stops the pump.
PUMP_POLL = timedelta(milliseconds=50)


class TrtllmUnavailable(EngineError):
    """TensorRT-LLM cannot run here: not installed, an unsupported release, or no GPU."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=503)


class TrtllmConfigError(EngineError):
    """The engine folder or the settings are wrong; the message names the key, the value and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=400)


# =============================================================================== versions


@dataclass(frozen=True)
class ApiSpec:
    """What differs between supported releases, as far as this engine is concerned."""

    version: str
    series: tuple[int, int]

    @property
    def lora_weights_cached(self) -> bool:
        # 1.x's LLM API sends a task's weights only while it is not in the Executor's cache, and the Executor answers
        # a task it does not hold "LoRA task N not found in cache. Please send LoRA weights with request"
        # (tensorrt_llm/executor/worker.py _enqueue_request with is_adapter_in_cpu_cache;
        # cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp addRequestPeft, PeftTaskNotCachedException). The
        # 0.12-era worker (the copy passing max_new_tokens) sends them with every request, and so does lmi-trt on 0.x
        # (sending once would work too: the miss path is in every copy). Safe: a task already cached is only bumped
        # (runtime/loraCache.cpp LoraCache::put), at the cost of serialising its weights per request.
        return self.series >= (1, 0)

    @property
    def final_result_on_cancel(self) -> bool:
        # Cancelled requests return a final (empty) result since 0.16 (Executor.cancelRequest,
        # NVIDIA/TensorRT-LLM docs/source/executor.md).
        return self.series >= (0, 16)


def api_spec(version: str) -> ApiSpec:
    """Pure: the spec for an installed ``tensorrt_llm.__version__``, or a clear refusal."""
    m = re.match(r"^(\d+)\.(\d+)", version or "")
    if not m:
        raise TrtllmUnavailable(f"cannot read the TensorRT-LLM version {version!r}; supported: {SUPPORTED_TEXT}")
    series = (int(m.group(1)), int(m.group(2)))
    if series not in SUPPORTED_SERIES:
        raise TrtllmUnavailable(
            f"TensorRT-LLM {version} is not supported by the trtllm engine; supported: {SUPPORTED_TEXT}. "
            "Later releases dropped the TensorRT-engine path; use an image with a supported release, "
            "or option.rolling_batch=torch"
        )
    return ApiSpec(version, series)


def require_eos(eos_token_ids: Sequence[int]) -> list[int]:
    """Both TensorRT-LLM engines stop on an EOS id: without one a request runs to max_new_tokens."""
    if not eos_token_ids:
        raise TrtllmConfigError(
            "no EOS token id: TensorRT-LLM would generate until max_new_tokens; the tokenizer or "
            "generation_config.json must name eos_token_id"
        )
    return list(eos_token_ids)


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def probe_runtime(gpu_available: Callable[[], bool] | None = None) -> tuple[ModuleType, ApiSpec]:
    """Import TensorRT-LLM's executor bindings and check this host can run them (side effects only here)."""
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise TrtllmUnavailable(
            f"TensorRT-LLM is not installed ({exc}); run the TensorRT-LLM image, or set option.rolling_batch=torch"
        ) from exc
    spec = api_spec(getattr(tensorrt_llm, "__version__", ""))
    try:
        import tensorrt_llm.bindings.executor as tle
    except ImportError as exc:
        raise TrtllmUnavailable(f"TensorRT-LLM {spec.version} has no executor bindings ({exc})") from exc
    if not hasattr(tle, "Executor"):
        raise TrtllmUnavailable(
            f"TensorRT-LLM {spec.version} was built without the TensorRT-engine Executor "
            "(tensorrt_llm.bindings.executor.Executor is missing); install a release that ships it: "
            f"{SUPPORTED_TEXT}"
        )
    if not (gpu_available or cuda_available)():
        raise TrtllmUnavailable(
            "no CUDA GPU is visible, and TensorRT engines only run on one; check the container's GPU "
            "access (--gpus all, CUDA_VISIBLE_DEVICES) or set option.rolling_batch=torch"
        )
    return tle, spec


# =============================================================================== settings


class TrtllmSettings(
    reads(
        "max_num_tokens",
        "kv_cache_free_gpu_mem_fraction",
        "max_tokens_in_paged_kv_cache",
        "kv_cache_host_memory_bytes",  # host tier for offloaded KV blocks
        "enable_kv_cache_reuse",
        "batch_scheduler_policy",
        "enable_chunked_context",
        "multi_block_mode",  # None: the engine's or TensorRT-LLM's own default
        "enable_trt_overlap",
        "max_beam_width",
        "pipeline_parallel_degree",
        # LoRA adapters: an engine built with the LoRA plugin, a PEFT cache sized from these (trtllm_lora.py)
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
    )
):
    """Runtime settings of the Executor: the keys it reads (types and defaults are theirs) and what the wiring
    (``lmi_trt.stages``) and the launch plan derive. ``None`` means "the engine's own"."""

    # option.max_num_sequences, else option.max_rolling_batch_size; may only lower the engine's value.
    max_batch_size: int | None = Field(None, ge=1)
    # The option that set max_batch_size (named in errors); None = a default, lowered to the
    # engine's build-time value with a warning instead of an error.
    max_batch_size_key: str | None = None
    tensor_parallel_degree: int | None = Field(1, ge=1)  # option.tensor_parallel_degree; None: "max", the engine's
    # One model copy among several on a host (lmi_trt.launch), or a model beside its draft model's engine: its GPUs,
    # and ORCHESTRATOR mode, the documented way to run several Executors in one process (workers spawned over MPI).
    device_ids: tuple[int, ...] | None = None
    orchestrator: bool = False
    # Lookahead decoding's (W, N, G), the speculation the Executor runs here (lmi_trt.engines.trtllm_speculation).
    lookahead: Lookahead | None = None
    # n-gram draft tokens sent with each request of a draft loop (lmi_trt.engines.trtllm_drafts).
    drafts: ExternalDrafts | None = None
    # Medusa's tree of draft paths, on an engine built with its heads (lmi_trt.engines.trtllm_medusa).
    medusa: Medusa | None = None


# =============================================================================== engine facts


@dataclass(frozen=True)
class EngineFacts:
    """What an engine folder's config.json says about the engine (as NVIDIA/TensorRT-LLM tensorrt_llm/builder.py
    ``Engine.save`` writes it)."""

    layout: Literal["builder", "legacy"]  # builder: version + pretrained_config + build_config
    version: str | None  # TensorRT-LLM release that built it; None for the legacy layout
    name: str  # architecture (builder) or builder_config.name (legacy file names use it)
    dtype: str
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int | None
    max_beam_width: int
    paged_kv_cache: bool | None
    use_paged_context_fmha: bool
    remove_input_padding: bool | None
    tokens_per_block: int | None
    multi_block_mode: bool | None  # a build flag only in 0.x configs; None where it is a runtime knob
    gather_generation_logits: bool = False
    gather_context_logits: bool = False  # ModelConfig::computeContextLogits: block reuse is turned off for it (1.x)
    quant_algo: str | None = None
    kv_cache_quant_algo: str | None = None
    vocab_size: int | None = None  # the length of a request's embedding bias
    speculative_decoding_mode: int | None = None  # config.json's SpeculativeDecodingMode integer (1: none)
    max_draft_len: int = 0  # build_config's: what builder.py added to max_seq_len, and the draft length but Medusa's
    # A Medusa engine's draft tokens and heads: pretrained_config's max_draft_len and num_medusa_heads, which
    # gptJsonConfig.cpp (newest copy, id 809211714) builds its MedusaModule from (only the other modes read
    # build_config's max_draft_len) and model.py (1.x, id 906315928) sizes the network by (prepare_inputs'
    # max_draft_len); builder.py copies it into build_config only where trtllm-build had no --max_draft_len.
    medusa_draft_len: int = 0
    num_medusa_heads: int = 0
    num_layers: int | None = None  # pretrained_config.num_hidden_layers
    lora: LoraBuild = LoraBuild(False, None, ())
    lora_dims: dict[str, tuple[int, int]] = field(default_factory=dict)  # trtllm_lora.module_dims

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def _flag(value: Any) -> bool | None:
    """Plugin settings are bools, "enable"/"disable", or a dtype string meaning enabled."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() not in ("disable", "disabled", "false", "none", "")
    return bool(value)


def _require(section: dict, key: str, where: str) -> Any:
    if key not in section:
        raise TrtllmConfigError(f"engine config.json has no {where}.{key}; was it written by trtllm-build?")
    return section[key]


def parse_engine_config(config: dict) -> EngineFacts:
    """Pure: the facts from an engine config.json, 1.x/0.8+ (``build_config``) or legacy (``builder_config``)."""
    if "build_config" in config and "pretrained_config" in config:
        pretrained, build = config["pretrained_config"], config["build_config"]
        plugins = build.get("plugin_config") or {}
        mapping = pretrained.get("mapping") or {}
        quant = pretrained.get("quantization") or {}
        max_input = _require(build, "max_input_len", "build_config")
        max_seq = build.get("max_seq_len")
        if max_seq is None:  # ≤0.10 engines record max_output_len instead
            max_seq = max_input + _require(build, "max_output_len", "build_config")
        speculative = build.get("speculative_decoding_mode")
        draft_len = int(build.get("max_draft_len") or 0)
        if speculative not in (None, 1):
            # builder.py build raised the recorded max_seq_len by max_draft_len for speculation's scratch; "Maximum
            # number of generated tokens remains the same" (trtllm_speculation's docstring)
            max_seq -= draft_len
        kv_type = build.get("kv_cache_type")
        paged = (
            (str(getattr(kv_type, "name", kv_type)).upper() == "PAGED")
            if kv_type is not None
            else _flag(plugins.get("paged_kv_cache"))
        )
        return EngineFacts(
            layout="builder",
            version=config.get("version"),
            name=_require(pretrained, "architecture", "pretrained_config"),
            dtype=_require(pretrained, "dtype", "pretrained_config"),
            tp_size=int(mapping.get("tp_size", 1)),
            pp_size=int(mapping.get("pp_size", 1)),
            max_batch_size=_require(build, "max_batch_size", "build_config"),
            max_input_len=max_input,
            max_seq_len=max_seq,
            max_num_tokens=build.get("max_num_tokens"),
            max_beam_width=build.get("max_beam_width", 1),
            paged_kv_cache=paged,
            use_paged_context_fmha=bool(_flag(plugins.get("use_paged_context_fmha"))),
            remove_input_padding=_flag(plugins.get("remove_input_padding")),
            tokens_per_block=plugins.get("tokens_per_block"),
            multi_block_mode=_flag(plugins.get("multi_block_mode")),
            gather_generation_logits=bool(build.get("gather_generation_logits", False)),
            gather_context_logits=bool(build.get("gather_context_logits", False)),
            quant_algo=quant.get("quant_algo"),
            kv_cache_quant_algo=quant.get("kv_cache_quant_algo"),
            vocab_size=pretrained.get("vocab_size"),
            speculative_decoding_mode=speculative,
            max_draft_len=draft_len,
            medusa_draft_len=int(pretrained.get("max_draft_len") or 0),
            num_medusa_heads=int(pretrained.get("num_medusa_heads") or 0),
            num_layers=pretrained.get("num_hidden_layers"),
            lora=LoraBuild.of(build),
            lora_dims=module_dims(pretrained),
        )
    if "builder_config" in config:
        builder, plugins = config["builder_config"], config.get("plugin_config") or {}
        max_input = _require(builder, "max_input_len", "builder_config")
        return EngineFacts(
            layout="legacy",
            version=None,
            name=_require(builder, "name", "builder_config"),
            dtype=_require(builder, "precision", "builder_config"),
            tp_size=int(builder.get("tensor_parallel", 1)),
            pp_size=int(builder.get("pipeline_parallel", 1)),
            max_batch_size=_require(builder, "max_batch_size", "builder_config"),
            max_input_len=max_input,
            max_seq_len=max_input + _require(builder, "max_output_len", "builder_config"),
            max_num_tokens=builder.get("max_num_tokens"),
            max_beam_width=builder.get("max_beam_width", 1),
            paged_kv_cache=_flag(plugins.get("paged_kv_cache")),
            use_paged_context_fmha=bool(_flag(plugins.get("use_paged_context_fmha"))),
            remove_input_padding=_flag(plugins.get("remove_input_padding")),
            tokens_per_block=plugins.get("tokens_per_block"),
            multi_block_mode=_flag(plugins.get("multi_block_mode", builder.get("multi_block_mode"))),
            gather_generation_logits=bool(builder.get("gather_all_token_logits", False)),
        )
    raise TrtllmConfigError(
        "engine config.json has neither build_config+pretrained_config (trtllm-build ≥0.8) nor "
        f"builder_config (older builds); top-level keys: {sorted(config)}. Is this a TRT-LLM checkpoint "
        "(run trtllm-build / lmi-trt compile first) or an HF model folder?"
    )


def resolve_engine_dir(path: Path) -> Path:
    """The folder holding config.json and the plans; a Triton/LMI model folder's ``tensorrt_llm/1/`` too."""
    for candidate in (path, path / "tensorrt_llm" / "1", path / "1"):
        if (candidate / "config.json").is_file():
            return candidate
    raise TrtllmConfigError(
        f"no engine config.json in {path} (nor in its tensorrt_llm/1/ or 1/); point option.model_id at the "
        "folder trtllm-build wrote (config.json + rank*.engine)"
    )


def read_engine_facts(engine_dir: Path) -> EngineFacts:
    path = engine_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrtllmConfigError(f"cannot read the engine config {path}: {exc}") from exc
    return parse_engine_config(config)


# =============================================================================== engine file names

_RANK_FILE = re.compile(r"^rank(?P<rank>\d+)\.engine$")
_LEGACY_FILE = re.compile(r"^.+_tp\d+(?:_pp\d+)?_rank(?P<rank>\d+)\.engine$")


def expected_engine_file(facts: EngineFacts, rank: int) -> str:
    """``GptJsonConfig::engineFilename``: the C++ loader picks the naming from whether ``version`` exists."""
    if facts.version is None:
        pp = f"_pp{facts.pp_size}" if facts.pp_size > 1 else ""
        return f"{facts.name}_{facts.dtype}_tp{facts.tp_size}{pp}_rank{rank}.engine"
    return f"rank{rank}.engine"


def plan_engine_links(names: Iterable[str], facts: EngineFacts) -> dict[str, str]:
    """Pure: for each rank whose expected plan name is missing, the file (other naming) to link it to.

    Empty when every expected name exists. Raises when a rank has no plan, or more than one candidate.
    """
    names = set(names)
    links = {}
    for rank in range(facts.world_size):
        want = expected_engine_file(facts, rank)
        if want in names:
            continue
        found = sorted(
            n for n in names if (m := _RANK_FILE.match(n) or _LEGACY_FILE.match(n)) and int(m.group("rank")) == rank
        )
        if len(found) != 1:
            listing = ", ".join(sorted(n for n in names if n.endswith(".engine"))) or "no .engine files"
            problem = "no plan" if not found else f"{len(found)} candidate plans ({', '.join(found)})"
            raise TrtllmConfigError(
                f"the engine is built for tp={facts.tp_size} pp={facts.pp_size} and TensorRT-LLM loads {want} "
                f"for rank {rank}, but the folder has {problem}; it holds: {listing}"
            )
        links[want] = found[0]
    return links


def prepare_engine_dir(engine_dir: Path, facts: EngineFacts, scratch_dir: Path) -> Path:
    """The folder to hand to the Executor: ``engine_dir`` itself, or — when plans are named the other
    way (legacy vs ``rank{N}.engine``) — a folder of symlinks under ``scratch_dir`` with the names the
    installed Executor expects (``engine_dir`` may be read-only, e.g. /opt/ml/model)."""
    links = plan_engine_links(os.listdir(engine_dir), facts)
    if not links:
        return engine_dir
    shadow = scratch_dir / "engine"
    shadow.mkdir(parents=True, exist_ok=True)
    for entry in os.listdir(engine_dir):
        (shadow / entry).symlink_to((engine_dir / entry).resolve())
    for want, have in links.items():
        (shadow / want).symlink_to((engine_dir / have).resolve())
    log.info("engine plans renamed for this TensorRT-LLM via symlinks in %s: %s", shadow, links)
    return shadow


# =============================================================================== settings checks


def effective_batch_size(settings: TrtllmSettings, facts: EngineFacts) -> int:
    return min(settings.max_batch_size or facts.max_batch_size, facts.max_batch_size)


def effective_beam_width(settings: TrtllmSettings, facts: EngineFacts) -> int:
    return settings.max_beam_width


def check_settings(settings: TrtllmSettings, facts: EngineFacts) -> list[str]:
    """Pure: warnings for what is adjusted; one error listing everything the engine cannot honour."""
    errors, warnings = [], []
    tp, pp = settings.tensor_parallel_degree, settings.pipeline_parallel_degree
    if tp is not None and (tp, pp) != (facts.tp_size, facts.pp_size):
        errors.append(
            f"option.tensor_parallel_degree={tp} and option.pipeline_parallel_degree={pp}, but the engine is built "
            f"for tp={facts.tp_size} pp={facts.pp_size} ({facts.world_size} GPU(s)); set "
            f"option.tensor_parallel_degree={facts.tp_size} and option.pipeline_parallel_degree={facts.pp_size}, "
            "or rebuild the engine"
        )
    if settings.max_batch_size is not None and settings.max_batch_size > facts.max_batch_size:
        if settings.max_batch_size_key:
            errors.append(
                f"{settings.max_batch_size_key}={settings.max_batch_size} exceeds the engine's built "
                f"max_batch_size={facts.max_batch_size}; set it to at most {facts.max_batch_size}, or rebuild "
                "the engine with a larger max_batch_size"
            )
        else:
            warnings.append(
                f"the default batch size {settings.max_batch_size} is above the engine's built max_batch_size="
                f"{facts.max_batch_size}; serving at most {facts.max_batch_size} requests at once"
            )
    if settings.max_num_tokens and facts.max_num_tokens and settings.max_num_tokens > facts.max_num_tokens:
        errors.append(
            f"option.max_num_tokens={settings.max_num_tokens} exceeds the engine's built max_num_tokens="
            f"{facts.max_num_tokens}; the runtime can only lower it: set at most {facts.max_num_tokens} or rebuild"
        )
    if settings.max_beam_width > facts.max_beam_width:
        errors.append(
            f"option.max_beam_width={settings.max_beam_width} exceeds the engine's built max_beam_width="
            f"{facts.max_beam_width}; lower it or rebuild the engine with --max_beam_width {settings.max_beam_width}"
        )
    if facts.paged_kv_cache is False:
        errors.append(
            "the engine was built without a paged KV cache, which in-flight batching needs; rebuild it with "
            "--kv_cache_type paged (--paged_kv_cache enable on older releases)"
        )
    if facts.remove_input_padding is False:
        errors.append(
            "the engine was built with remove_input_padding disabled; in-flight batching needs packed input: "
            "rebuild with --remove_input_padding enable"
        )
    for key, enabled in (
        ("enable_kv_cache_reuse", settings.enable_kv_cache_reuse),
        ("enable_chunked_context", settings.enable_chunked_context),
    ):
        if enabled and not facts.use_paged_context_fmha:
            errors.append(
                f"option.{key}=true needs an engine built with paged context FMHA (TensorRT-LLM 0.x refuses block "
                'reuse without it: "When KV cache block reuse is set, model has to be built with paged context FMHA '
                'support"; 1.x turns it off with a warning: "KV cache reuse disabled because model was not built '
                "with paged context FMHA support\"), and config.json's "
                "build_config.plugin_config.use_paged_context_fmha is off; rebuild with --use_paged_context_fmha "
                f"enable, or set option.{key}=false"
                + (
                    " (not an option with draft tokens, which need block reuse)"
                    if settings.drafts is not None and key == "enable_kv_cache_reuse"
                    else ""
                )
            )
    errors += lora_errors(settings, facts)
    if settings.max_tokens_in_paged_kv_cache and settings.max_tokens_in_paged_kv_cache < facts.max_seq_len:
        warnings.append(
            f"option.max_tokens_in_paged_kv_cache={settings.max_tokens_in_paged_kv_cache} is less than one "
            f"max_seq_len={facts.max_seq_len} sequence; long requests will wait or be rejected"
        )
    if settings.medusa is not None:
        errors += engine_medusa_errors(
            settings.medusa, facts.speculative_decoding_mode, facts.medusa_draft_len, facts.num_medusa_heads
        )
    elif settings.drafts is None:
        errors += engine_speculation_errors(settings.lookahead, facts.speculative_decoding_mode, facts.max_draft_len)
    else:
        errors += engine_draft_errors(
            settings.drafts,
            facts.speculative_decoding_mode,
            facts.max_draft_len,
            facts.max_seq_len,
            settings.enable_kv_cache_reuse,
            facts.gather_context_logits,
            min(n for n in (settings.max_num_tokens, facts.max_num_tokens) if n) if facts.max_num_tokens else None,
            settings.enable_chunked_context,
        )
    if errors:
        raise TrtllmConfigError("; ".join(errors))
    return warnings


def lora_errors(settings: TrtllmSettings, facts: EngineFacts) -> list[str]:
    """option.enable_lora needs an engine built with the LoRA plugin (its config.json says so: trtllm_lora.LoraBuild)
    and a max_lora_rank within the built one (loraUtils.cpp refuses a rank above it)."""
    if not settings.enable_lora:
        return []
    lora = facts.lora
    if not lora.plugin or not lora.target_modules:
        return [
            "option.enable_lora=true, but the engine was built without the LoRA plugin (its config.json "
            "build_config.plugin_config.lora_plugin is unset, or build_config.lora_config.lora_target_modules is "
            f"empty); rebuild it with trtllm-build --lora_plugin auto --lora_target_modules {' '.join(TARGET_MODULES)} "
            "--max_lora_rank N (or let lmi-trt build it from the Hugging Face checkpoint), or set "
            "option.enable_lora=false"
        ]
    if lora.max_lora_rank is not None and settings.max_lora_rank > lora.max_lora_rank:
        return [
            f"option.max_lora_rank={settings.max_lora_rank} exceeds the engine's built max_lora_rank="
            f"{lora.max_lora_rank} (build_config.lora_config); set at most {lora.max_lora_rank}, or rebuild with "
            f"--max_lora_rank {settings.max_lora_rank}"
        ]
    if facts.num_layers is None:
        return ["option.enable_lora=true: the engine's config.json has no pretrained_config.num_hidden_layers"]
    built = re.match(r"^(\d+)\.(\d+)", facts.version or "")
    if settings.enable_kv_cache_reuse and (built is None or (int(built[1]), int(built[2])) < (0, 13)):
        # KV cache block reuse learned LoRA (blocks keyed by the task id) after 0.12: NVIDIA/TensorRT-LLM PR #2184
        # "Supported KV cache reuse for P-Tuning and LoRA" (2024-09-03, the push after 0.12). Before it, two adapters
        # sharing a prompt prefix could reuse each other's KV blocks and answer wrongly without a word.
        return [
            "option.enable_lora=true beside option.enable_kv_cache_reuse=true on an engine of TensorRT-LLM "
            f"{facts.version or 'unknown release'}: block reuse keys blocks by LoRA task only from the release after "
            "0.12 (NVIDIA/TensorRT-LLM PR #2184), so adapters could share each other's cached prompts; set "
            "option.enable_kv_cache_reuse=false, or use an engine of a 1.x release"
        ]
    return []


def peft_cache_config(tle: ModuleType, settings: TrtllmSettings, facts: EngineFacts) -> Any:
    """``ExecutorConfig.peft_cache_config``: its host and device caches sized as the LLM API sizes them
    (compile.lora.peft_cache_sizes) for option.max_lora_rank, option.max_loras adapters on the device and
    option.max_cpu_loras (at least option.max_loras; unset: option.max_loras) in host memory, the host cache made
    big enough for that many whole adapters in its pages (compile.lora.host_module_layers): the engine holds back a
    request whose adapter would be one more than that (TrtllmEngine._lora_full)."""
    layers, rank, held = facts.num_layers or 0, settings.max_lora_rank, host_adapters(settings)
    sizes = peft_cache_sizes(rank, layers, facts.lora.target_modules, settings.max_loras, held)
    targets = with_missing_qkv(facts.lora.target_modules)
    dims = [sum(facts.lora_dims[hf]) for hf, (trt, _) in MODULES.items() if trt in targets and hf in facts.lora_dims]
    if dims:
        sizes["num_host_module_layer"] = max(
            sizes["num_host_module_layer"], host_module_layers(dims, layers, rank, held)
        )
    return tle.PeftCacheConfig(**sizes)


def host_adapters(settings: TrtllmSettings) -> int:
    """How many adapters the Executor's host cache holds: option.max_cpu_loras, at least option.max_loras."""
    return max(settings.max_cpu_loras or settings.max_loras, settings.max_loras)


def _orchestrator_config(tle: ModuleType) -> Any:
    """Orchestrator mode spawns TensorRT-LLM's own ``bin/executorWorker`` for the copy's ranks."""
    package = importlib.util.find_spec("tensorrt_llm")
    root = Path(package.submodule_search_locations[0]) if package and package.submodule_search_locations else Path()
    return tle.OrchestratorConfig(is_orchestrator=True, worker_executable_path=str(root / "bin" / "executorWorker"))


def effective_multi_block_mode(tle: ModuleType, settings: TrtllmSettings) -> tuple[bool, str]:
    """The multi-block attention setting the Executor gets, and where it comes from."""
    if settings.multi_block_mode is not None:
        return settings.multi_block_mode, "option.multi_block_mode"
    return bool(tle.ExtendedRuntimePerfKnobConfig().multi_block_mode), "this TensorRT-LLM's default"


def build_executor_config(
    tle: ModuleType, settings: TrtllmSettings, facts: EngineFacts, guide_vocab: Callable[[], GuideVocab] | None = None
) -> tuple[Any, list[str]]:
    """The ``ExecutorConfig`` for these settings, plus warnings for knobs this release lacks. With
    ``guide_vocab``, on a release whose Executor has guided decoding (1.x; not 0.12), through xgrammar (the
    vocabulary is read from the tokenizer only then: a large one takes a while)."""
    warnings = []
    kv_cache = tle.KvCacheConfig(
        enable_block_reuse=settings.enable_kv_cache_reuse,
        max_tokens=settings.max_tokens_in_paged_kv_cache,
        free_gpu_memory_fraction=settings.kv_cache_free_gpu_mem_fraction,
        # Bytes of host memory for KV blocks evicted from the GPU (executor.h KvCacheConfig hostCacheSize).
        host_cache_size=settings.kv_cache_host_memory_bytes,
    )
    policy = getattr(tle.CapacitySchedulerPolicy, settings.batch_scheduler_policy.upper())
    extra = {}
    if hasattr(tle, "ExtendedRuntimePerfKnobConfig"):
        # Always passed: its default differs by release (off in 0.12, on in 1.x; executor.h's
        # ExtendedRuntimePerfKnobConfig), so unset means this release's default, stated at start-up.
        extra["extended_runtime_perf_knob_config"] = tle.ExtendedRuntimePerfKnobConfig(
            multi_block_mode=effective_multi_block_mode(tle, settings)[0]
        )
    elif settings.multi_block_mode is not None:
        if facts.multi_block_mode is not None and facts.multi_block_mode != settings.multi_block_mode:
            raise TrtllmConfigError(  # refused, never accepted and ignored
                f"option.multi_block_mode={str(settings.multi_block_mode).lower()}: in this TensorRT-LLM it is a "
                f"build option and the engine was built with multi_block_mode={str(facts.multi_block_mode).lower()}; "
                "leave the option out, set it to the built value, or rebuild the engine"
            )
    if guide_vocab is not None and guided_capability(tle, guide_vocab).honoured:
        vocab = guide_vocab()
        extra["guided_decoding_config"] = tle.GuidedDecodingConfig(
            tle.GuidedDecodingConfig.GuidedDecodingBackend.XGRAMMAR,
            encoded_vocab=vocab.encoded_vocab,
            tokenizer_str=vocab.tokenizer_str,
            stop_token_ids=vocab.stop_token_ids,
        )
    if settings.lookahead is not None:
        extra["decoding_config"] = decoding_config(tle, settings.lookahead)
    if settings.medusa is not None:
        extra["decoding_config"] = medusa_decoding_config(tle, settings.medusa)
    if settings.enable_lora:
        extra["peft_cache_config"] = peft_cache_config(tle, settings, facts)
    if settings.enable_trt_overlap:
        if hasattr(tle.ExecutorConfig(), "enable_trt_overlap"):
            extra["enable_trt_overlap"] = True
        else:
            raise TrtllmConfigError(
                "option.enable_trt_overlap=true: this TensorRT-LLM's ExecutorConfig has no enable_trt_overlap; "
                "leave it out or set it to false"
            )
    config = tle.ExecutorConfig(
        max_beam_width=effective_beam_width(settings, facts),
        scheduler_config=tle.SchedulerConfig(capacity_scheduler_policy=policy),
        kv_cache_config=kv_cache,
        # The Python binding defaults to False while recent C++ defaults to True: always pass it.
        enable_chunked_context=settings.enable_chunked_context,
        batching_type=tle.BatchingType.INFLIGHT,
        max_batch_size=effective_batch_size(settings, facts),
        max_num_tokens=settings.max_num_tokens,
        parallel_config=tle.ParallelConfig(
            communication_type=tle.CommunicationType.MPI,
            communication_mode=(
                tle.CommunicationMode.ORCHESTRATOR if settings.orchestrator else tle.CommunicationMode.LEADER
            ),
            device_ids=list(settings.device_ids) if settings.device_ids else None,
            orchestrator_config=_orchestrator_config(tle) if settings.orchestrator else None,
        ),
        **extra,
    )
    return config, warnings


# =============================================================================== requests


@dataclass(frozen=True)
class RequestSpec:
    """Keyword arguments for ``Request``, ``SamplingConfig`` and ``OutputConfig``."""

    request: dict[str, Any]
    sampling: dict[str, Any]
    output: dict[str, Any]
    guide: tuple[str, str] | None = None  # guided.backend_guide: ("regex" | "grammar", text)
    bias: dict[int, float] = field(default_factory=dict)  # logit_bias: token id → added to its logit
    # LoraConfig(task_id, weights, config): weights and config None where the Executor holds the task cached
    lora: tuple[int, Any, Any] | None = None
    drafts: tuple[int, ...] = ()  # ExternalDraftTokensConfig's tokens (lmi_trt.engines.trtllm_drafts)


def sampling_kwargs(p: SamplingParams, seed: int) -> dict[str, Any]:
    """Pure: ``SamplingConfig`` keywords with DJL semantics.

    ``do_sample=False`` is greedy (``top_k=1``) whatever temperature/top_k/top_p say. ``do_sample=True``
    applies the request's values as they are: DJL's defaults for unset ones were filled in by the core
    (``lmi_trt.serving.core.sampling_params``), identically for every engine (top_k 0: no top-k limit).
    ``seed`` is used when sampling without a request seed (DJL draws one per request).
    """
    kw: dict[str, Any] = {"beam_width": p.beam_width}
    if p.beam_width == 1:
        if p.do_sample:
            kw["top_k"], kw["top_p"], kw["temperature"] = p.top_k, p.top_p, p.temperature
            kw["seed"] = (p.seed if p.seed is not None else seed) % 2**64  # RandomSeedType is uint64
        else:
            kw["top_k"] = 1
    if p.repetition_penalty != 1.0:
        kw["repetition_penalty"] = p.repetition_penalty
    if p.presence_penalty:
        kw["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        kw["frequency_penalty"] = p.frequency_penalty
    if p.min_new_tokens:
        kw["min_tokens"] = p.min_new_tokens
    if p.beam_width > 1:
        # executor.h SamplingConfig (1.0-1.2): lengthPenalty divides a beam's cumulative log-prob by its length to
        # that power (applyLengthPenalty, cpp/tensorrt_llm/kernels/beamSearchKernels.h), as transformers does;
        # earlyStopping 1 ends the search once beamWidth beams finished, 0 compares the running beams with the
        # finished ones at their current length (transformers' False), and any other value is transformers'
        # "never" bounded by the engine's max_seq_len (beamSearchKernelsTemplate.h: "Specialization for
        # earlyStopping == 'never'" uses nMaxSeqLen - inputLength), which map_request refuses; numReturnSequences
        # <= beamWidth beams come back (numReturnBeams).
        kw["length_penalty"] = p.length_penalty
        kw["early_stopping"] = 1 if p.early_stopping is True else 0
        kw["num_return_sequences"] = p.num_return_sequences
    return kw


def map_request(
    req: GenerationRequest,
    *,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    max_beam_width: int,
    seed: int,
    beams_stop: bool = False,
) -> RequestSpec:
    """Pure: a protocol request as Executor keywords; ``EngineError(400)`` for what cannot be served.
    ``beams_stop``: stop words (a model's further EOS ids too) may go with beams; the caller says so where
    its release is read to handle them (the LLM API's own table), else beams with stop words are refused."""
    p = req.sampling
    if not req.prompt_token_ids:
        raise EngineError("the prompt has no tokens", code=400)
    if p.max_new_tokens < 1:
        raise EngineError(f"max_new_tokens={p.max_new_tokens}: ask for at least 1 token", code=400)
    if p.beam_width > 1 and req.streaming:
        raise EngineError(
            f"beam_width={p.beam_width} needs a non-streaming request: beams rewrite earlier tokens, which "
            "streamed deltas cannot express; set stream=false or beam_width=1",
            code=400,
        )
    if p.beam_width > 1 and p.early_stopping == "never":
        # TensorRT-LLM's "never" (earlyStopping >= 2) scores a running beam against the longest sequence the
        # engine holds (nMaxSeqLen, beamSearchKernelsTemplate.h), transformers' against this request's length.
        raise EngineError(
            "early_stopping='never' is not transformers' rule in TensorRT-LLM: its earlyStopping 2 bounds a running "
            "beam's best score by the engine's max_seq_len, not this request's length, so its beams can differ; "
            "use true or false",
            code=400,
            field="early_stopping",
        )
    if p.beam_width > 1 and p.length_penalty < 0:
        # SamplingConfig's constructor asserts lengthPenalty >= 0 from 1.0 (checkLengthPenalty,
        # cpp/tensorrt_llm/executor/samplingConfig.cpp); the LLM API builds the same one
        # (tensorrt_llm/sampling_params.py _get_sampling_config). 0.12 takes no beams here (executor_capabilities).
        raise EngineError(
            f"length_penalty={p.length_penalty}: TensorRT-LLM takes a length penalty of 0 or more; use 0 for the raw "
            "log-prob, or a positive value",
            code=400,
            field="length_penalty",
        )
    if p.beam_width > max_beam_width:
        raise EngineError(
            f"beam_width={p.beam_width} exceeds the engine's max_beam_width={max_beam_width}; lower beam_width, "
            f"or rebuild the engine with --max_beam_width {p.beam_width} and set option.max_beam_width",
            code=400,
        )
    stop_words = [list(s) for s in req.stop_token_ids if s]
    if not p.ignore_eos:
        # One end_id per request: further EOS ids (Llama-3's <|eot_id|>, …) stop as stop words.
        stop_words += [[e] for e in eos_token_ids[1:] if [e] not in stop_words]
    if p.beam_width > 1 and stop_words and not beams_stop:
        # The beam kernels move a beam into the finished candidates on end_id only (is_end_token, cpp/tensorrt_llm/
        # kernels/beamSearchKernelsTemplate.h); a stop word only marks it finished. TensorRT-LLM's own
        # tests/unittest/_torch/sampler/test_beam_search.py (1.2 era) skips "Beam search on TRTLLMSampler does not
        # correctly handle stop_token_ids", and NVIDIA/TensorRT-LLM#7145 (0.21) crashes on them: refused until read.
        asked = "stop_token_ids" if req.stop_token_ids else "beam_width"
        why = "stop tokens" if req.stop_token_ids else f"the model's further EOS ids {eos_token_ids[1:]} (stop words)"
        raise EngineError(
            f"beam_width={p.beam_width} cannot be combined with {why} on TensorRT-LLM's Executor: its beam search "
            "finishes a beam on the end id only; ask for 1 beam, or set ignore_eos",
            code=400,
            field=asked,
        )
    request = {
        "input_token_ids": list(req.prompt_token_ids),
        "max_tokens": p.max_new_tokens,
        "streaming": req.streaming,
        # end_id -1 never matches: how the LLM API implements ignore_eos.
        "end_id": -1 if p.ignore_eos else eos_token_ids[0],
        "pad_id": pad_token_id,
        "stop_words": stop_words or None,
        "bad_words": [list(b) for b in req.bad_words_ids if b] or None,
    }
    output = {"exclude_input_from_output": True, "return_log_probs": p.logprobs}
    return RequestSpec(
        request,
        sampling_kwargs(p, seed),
        output,
        backend_guide(p.guided) if p.guided is not None else None,
        dict(p.logit_bias),
    )


def lora_capability(settings: TrtllmSettings) -> Capability:
    """LoRA adapters per request (``LoraConfig``), where option.enable_lora asked for them (check_settings made sure
    the engine was built with the LoRA plugin)."""
    if not settings.enable_lora:
        return cannot("LoRA adapters are off: set option.enable_lora=true (an engine built with the LoRA plugin)")
    return can(
        most=settings.max_loras,
        note=f"up to {settings.max_loras} adapters on the device at once, rank ≤ {settings.max_lora_rank}",
    )


def executor_capabilities(
    release: str,
    has_vocab_size: bool,
    guided: Capability,
    max_beam_width: int = 1,
    series: tuple[int, int] = (1, 0),
    lookahead: Lookahead | None = None,
    lora: Capability | None = None,
    drafts: ExternalDrafts | None = None,
    medusa: Medusa | None = None,
) -> Capabilities:
    """Pure: what the Executor path honours. Its OutputConfig returns the chosen token's log-prob only
    (returnLogProbs); alternatives and prompt log-probs would need logits gathered at build time
    (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/executor/executor.h, OutputConfig, 0.12-1.2).
    logit_bias is the request's embedding bias, [vocab_size] (every release's Request has it). With ``lookahead``,
    what the Executor does not do beside it is refused (``trtllm_speculation.lookahead_refusals``), and likewise
    beside draft tokens and Medusa."""
    capabilities = Capabilities(
        release=release,
        logprobs=can(),
        top_logprobs=cannot(
            "the trtllm engine (TensorRT-LLM's Executor) returns the chosen token's log-prob only, no "
            "alternatives; ask for logprobs without alternatives"
        ),
        prompt_logprobs=cannot(
            "the trtllm engine (TensorRT-LLM's Executor) does not score the prompt: that needs context logits "
            "gathered when the engine is built; leave it out"
        ),
        logit_bias=can()
        if has_vocab_size
        else cannot("the trtllm engine cannot bias logits: the engine's config.json does not give its vocab_size"),
        guided=guided,
        # the C++ decoder applies the request's SamplingConfig (randomSeed, repetition/presence/frequencyPenalty,
        # minTokens) and its Request's badWords/stopWords, end id -1 or not (executor.h)
        **dict.fromkeys(SAMPLING_FEATURES, can()),
        # SamplingConfig's beamWidth, up to the ExecutorConfig's maxBeamWidth, which the engine was built for
        beam_search=beam_capability(max_beam_width, series),
        min_p=cannot("the trtllm engine does not pass min_p to TensorRT-LLM here; leave it out, or use top_p"),
        lora=lora or cannot("LoRA adapters are off: set option.enable_lora=true"),
    )
    if lookahead is None and drafts is None and medusa is None:
        return capabilities
    features = capabilities.features()
    refusals = (
        lookahead_refusals(lookahead)
        if lookahead is not None
        else medusa_refusals()
        if medusa is not None
        else draft_refusals()
    )
    refused = {k: cannot(why) for k, why in refusals.items() if k in features}
    return replace(capabilities, **refused)


def beam_capability(max_beam_width: int, series: tuple[int, int]) -> Capability:
    """SamplingConfig's beamWidth, up to the ExecutorConfig's maxBeamWidth, which the engine was built for. Not on
    0.12: whether its SamplingConfig takes num_return_sequences and earlyStopping 0 was not read at that tag
    (NVIDIA/TensorRT-LLM#2239 shows 0.11's BeamSearchLayer refusing earlyStopping 0), so it is refused, not assumed."""
    if series < (1, 0):
        return cannot(
            f"the trtllm engine does not run beams on TensorRT-LLM {series[0]}.{series[1]}: its beam settings "
            "(num_return_sequences, early_stopping 0) are not verified there; ask for 1 beam, or serve with 1.0 "
            "or later"
        )
    if max_beam_width > 1:
        return can(most=max_beam_width)
    return cannot(
        "the trtllm engine runs 1 beam: option.max_beam_width is 1; serve with option.max_beam_width set to the "
        "widest beam (an engine built with at least that --max_beam_width)"
    )


def guided_capability(tle: ModuleType, guide_vocab: Callable[[], GuideVocab] | None) -> Capability:
    """Constrained decoding on the Executor: its GuidedDecodingConfig (1.x, not 0.12) with the tokenizer's
    vocabulary (``build_executor_config`` passes one exactly when both are there)."""
    if not hasattr(tle, "GuidedDecodingConfig"):
        return cannot(
            "the trtllm engine has no constrained decoding on this TensorRT-LLM (its Executor has none before 1.0); "
            "leave it out"
        )
    if guide_vocab is None:
        return cannot(
            "the trtllm engine was started without the tokenizer's vocabulary, which constrained decoding needs"
        )
    return can()


# executor.h GuidedDecodingParams::GuideType for the two forms backend_guide gives.
GUIDE_TYPES = {"regex": "REGEX", "grammar": "EBNF_GRAMMAR"}


def embedding_bias(bias: dict[int, float], vocab_size: int) -> Any:
    """OpenAI's logit_bias as TensorRT-LLM's embedding bias: added to the logits the token is chosen from.
    executor.h Request embeddingBias: "Expected type is kFP32 and shape is [vocab_size]"; the LLM API's
    SamplingParams.embedding_bias takes the same tensor (trtllm-serve's openai_protocol.py
    ``_logit_bias_to_embedding_bias``)."""
    import torch

    tensor = torch.zeros(vocab_size, dtype=torch.float32)
    tensor[list(bias)] = torch.tensor(list(bias.values()), dtype=torch.float32)
    return tensor


def to_executor_request(tle: ModuleType, spec: RequestSpec, vocab_size: int | None = None) -> Any:
    extra = {}
    if spec.bias:
        extra["embedding_bias"] = embedding_bias(spec.bias, vocab_size)
    if spec.lora is not None:
        task_id, weights, config = spec.lora  # executor.h LoraConfig(taskId, weights, config); keywords as the
        # LLM API's worker passes them (tensorrt_llm/executor/worker.py _enqueue_request)
        extra["lora_config"] = tle.LoraConfig(task_id=task_id, weights=weights, config=config)
    if spec.drafts:
        # tokens only: acceptance by id (trtllm_drafts' docstring); the binding's keyword in 0.12-1.2 (request.cpp)
        extra["external_draft_tokens_config"] = tle.ExternalDraftTokensConfig(list(spec.drafts))
    if spec.guide is not None:
        kind, text = spec.guide
        extra["guided_decoding_params"] = tle.GuidedDecodingParams(
            getattr(tle.GuidedDecodingParams.GuideType, GUIDE_TYPES[kind]), text
        )
    return tle.Request(
        **spec.request,
        sampling_config=tle.SamplingConfig(**spec.sampling),
        output_config=tle.OutputConfig(**spec.output),
        **extra,
    )


# peftCacheManager.cpp addRequestPeft: a request naming a task the cache does not hold, without its weights.
_LORA_NOT_CACHED = "not found in cache. Please send LoRA weights with request"

_FINISH_REASONS = {
    "END_ID": FinishReason.EOS,
    "STOP_WORDS": FinishReason.STOP_SEQUENCE,
    "LENGTH": FinishReason.LENGTH,
    "CANCELLED": FinishReason.CANCELLED,
    # Only with Request.allotted_time_ms, which we never set; stopped early, like a cancel.
    "TIMED_OUT": FinishReason.CANCELLED,
}


def final_tokens_and_reason(
    tokens: list[int],
    reason_name: str,
    *,
    end_id: int,
    extra_eos: frozenset[int],
    generated: int,
    max_new_tokens: int,
) -> tuple[list[int], FinishReason]:
    """Pure: the last delta's tokens and why the sequence ended.

    An extra EOS id ends as a stop word: report it as EOS and drop it, as the end id itself is not
    part of TensorRT-LLM's output. Without a reason (NOT_FINISHED on a final result), fall back to
    DJL's rule: LENGTH when all tokens were produced, else EOS. ``generated`` counts ``tokens`` too.
    """
    if reason_name == "END_ID" and tokens and tokens[-1] == end_id:
        return tokens[:-1], FinishReason.EOS
    if reason_name == "STOP_WORDS" and tokens and tokens[-1] in extra_eos:
        return tokens[:-1], FinishReason.EOS
    if reason_name in _FINISH_REASONS:
        return tokens, _FINISH_REASONS[reason_name]
    return tokens, FinishReason.LENGTH if generated >= max_new_tokens else FinishReason.EOS


# =============================================================================== the engine


@dataclass(eq=False)
class _Stream:
    request_id: str
    max_new_tokens: int
    end_id: int
    extra_eos: frozenset[int]
    logprobs: bool
    beam_width: int
    exec_id: int | None = None  # None while held back (see TrtllmEngine._must_wait)
    adapter: str | None = None  # the LoRA adapter it generates with
    lora_resend: RequestSpec | None = None  # sent without the task's weights: this spec (with them) on a cache miss
    held: RequestSpec | None = None  # the request to enqueue when its beam width's turn comes
    # Outputs not read yet, and the consumer's future while it waits for one (event loop only).
    pending: list[EngineOutput] = field(default_factory=list)
    waiter: asyncio.Future | None = None
    generated: int = 0
    cancelled: bool = False
    done: bool = False
    drafted: bool = False  # sent with draft tokens (trtllm_drafts): final after its one verification step
    sunk: bool = False  # its outputs go to the engine's sink (TrtllmEngine.submit_to_sink), not to ``pending``


def _push(stream: _Stream, out: EngineOutput) -> None:
    stream.pending.append(out)
    waiter = stream.waiter
    if waiter is not None:
        stream.waiter = None
        if not waiter.done():
            waiter.set_result(None)


def _take(stream: _Stream) -> EngineOutput:
    """The next delta: the outputs queued for a consumer that fell behind, merged into one (one
    detokenizer pass, one write downstream). An error output is never merged: the tokens before
    it go out first, then the error, as they arrived; nor are outputs with and without log probs."""
    pending = stream.pending
    first = pending[0]
    n = 1
    if first.error is None and not first.finished:
        with_lps = first.logprobs is not None
        while n < len(pending):
            nxt = pending[n]
            if nxt.error is not None or (nxt.logprobs is not None) != with_lps:
                break
            n += 1
            if nxt.finished:
                break
    if n == 1:
        return pending.pop(0)
    merged, stream.pending = pending[:n], pending[n:]
    last = merged[-1]
    return EngineOutput(
        last.request_id,
        [t for out in merged for t in out.token_ids],
        [lp for out in merged for lp in out.logprobs] if with_lps else None,  # type: ignore[union-attr]
        finished=last.finished,
        finish_reason=last.finish_reason,
    )


class TrtllmEngine:
    """The ``Engine`` protocol over ``tensorrt_llm.bindings.executor.Executor``."""

    name = "trtllm"

    def __init__(
        self,
        engine_dir: str | os.PathLike,
        settings: TrtllmSettings | None = None,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int | None = None,
        scratch_dir: str | os.PathLike | None = None,
        gpu_available: Callable[[], bool] | None = None,
        guide_vocab: Callable[[], GuideVocab] | None = None,
    ) -> None:
        require_eos(eos_token_ids)
        self._guide_vocab = guide_vocab  # constrained decoding, where the release's Executor has it
        self._engine_dir = resolve_engine_dir(Path(engine_dir))
        self.facts = read_engine_facts(self._engine_dir)
        self.settings = settings or TrtllmSettings()
        if self.settings.medusa is not None:
            medusa = for_engine(self.settings.medusa, self.facts.num_medusa_heads)
            self.settings = self.settings.model_copy(update={"medusa": medusa})
        further_eos = stop_words_error(*self._tree_speculation(), list(eos_token_ids))
        if further_eos is not None:
            raise TrtllmConfigError(further_eos)
        for warning in check_settings(self.settings, self.facts):
            log.warning("%s", warning)
        self._eos = list(eos_token_ids)
        self._pad = self._eos[0] if pad_token_id is None else pad_token_id
        self._scratch = Path(scratch_dir) if scratch_dir is not None else None
        self._gpu_available = gpu_available
        self._limits = EngineLimits(
            max_batch_size=effective_batch_size(self.settings, self.facts),
            max_input_len=self.facts.max_input_len,
            max_seq_len=self.facts.max_seq_len,
            max_beam_width=effective_beam_width(self.settings, self.facts),
        )
        self._capabilities = executor_capabilities(
            "",
            self.facts.vocab_size is not None,
            cannot("the trtllm engine has not started yet"),
            self._limits.max_beam_width,
            lookahead=self.settings.lookahead,
            drafts=self.settings.drafts,
            medusa=self.settings.medusa,
        )
        self._tle: ModuleType | None = None
        self._spec: ApiSpec | None = None
        self._executor: Any = None
        self._leader = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pump: threading.Thread | None = None
        self._stopping = threading.Event()
        self._healthy = False
        self._closed = False
        self._owned_scratch: Path | None = None
        self._streams: dict[int, _Stream] = {}  # by executor request id
        self._by_request_id: dict[str, _Stream] = {}
        self._sink: OutputSink | None = None
        self._sunk: list[EngineOutput] = []  # the sink's outputs of this turn of the loop (one await_responses batch)
        # Requests held back because their beam width differs from the running ones' (see _must_wait),
        # and how many running-width requests went ahead of them since the last switch.
        self._held: list[_Stream] = []
        self._passed_held = 0
        self._releasing = False
        self._total_requests = 0
        self._total_tokens = 0
        self._accepted_drafts = 0  # lookahead: draft tokens accepted, over finished requests
        self._counts_drafts = False  # lookahead on a release whose Result binds decoding_iter
        self._proposed_drafts = 0  # draft loop: draft tokens sent, over iterations
        self._drafted_iterations = 0  # draft loop: iterations that sent drafts
        self._draft_loops: dict[str, bool] = {}  # running draft loops by request id: cancelled yet
        # draft-model drafts: a second engine (its own Executor) over the draft engine, decoding greedily
        self._draft_engine = self._drafter(gpu_available)
        self._last_iteration: Any = None
        # LoRA adapters: name → (task id, LoraConfig's weights and config); task ids whose weights the Executor
        # was sent (1.x caches them: lora_weights_cached), and the next id.
        self._adapters: AdapterTable[tuple[int, Any, Any]] = AdapterTable(
            enabled=self.settings.enable_lora, max_registered=self.settings.max_cpu_loras, using=self._using_adapter
        )
        self._sent_tasks: set[int] = set()
        self._next_task = 1

    def _tree_speculation(self) -> tuple[str | None, str]:
        """(the key that turned on lookahead decoding or Medusa, the method), or (None, "") for neither: the
        decoding modes whose stop criteria are not pinned per release (trtllm_speculation.STOP_WORDS_UNREAD)."""
        for method, setting in (("lookahead", self.settings.lookahead), ("medusa", self.settings.medusa)):
            if setting is not None:
                return setting.key, method
        return None, ""

    def _drafter(self, gpu_available: Callable[[], bool] | None) -> TrtllmEngine | None:
        """The draft model's engine: a second Executor in this process on the copy's own GPUs (``device_ids``), both
        in orchestrator mode, as examples/prompt_lookup/run_dtm_pld.py builds its draft and target runners
        (ModelRunnerCpp ``is_orchestrator_mode=True``, each with its device list; model_runner_cpp.py: "MPI world size
        must be 1 in Orchestrator mode"; lmi_trt.launch runs this process under ``mpirun -n 1`` for it). It gets the
        runner settings the example gives both runners (trtllm_drafts' docstring): block reuse where its engine can
        keep it, the model's option.enable_chunked_context, and its own KV-cache share
        (option.draft_kv_cache_free_gpu_mem_fraction, trtllm_drafts.with_draft_memory); it starts first. Its inputs are
        the model's (up to max_seq_len - 1 tokens), so its input limit is checked as the model's. Tensor or pipeline
        parallelism beside a draft model is refused: lmi-trt runs TP×PP > 1 in leader mode under mpirun, where the
        examples' two orchestrators do not apply, and no source read here runs two Executors on one such MPI world."""
        drafts = self.settings.drafts
        if drafts is None or drafts.method != "draft_model":
            return None
        if not self.settings.orchestrator or drafts.kv_fraction is None:
            raise TrtllmConfigError(
                f"internal: {drafts.key}=draft_model needs orchestrator mode and the draft's KV-cache share "
                "(lmi_trt.stages.executor_settings sets both)"
            )
        who = f"{drafts.key}=draft_model: the draft model's engine ({drafts.draft_model})"
        facts = read_engine_facts(resolve_engine_dir(Path(drafts.draft_model)))
        chunked = self.settings.enable_chunked_context
        try:
            draft = TrtllmEngine(
                drafts.draft_model,
                TrtllmSettings(
                    tensor_parallel_degree=None,
                    orchestrator=True,
                    device_ids=self.settings.device_ids,
                    kv_cache_free_gpu_mem_fraction=drafts.kv_fraction,
                    # 1.x fixExecutorConfig turns reuse off (a warning only) for these engines: not asked of them
                    enable_kv_cache_reuse=facts.use_paged_context_fmha and not facts.gather_context_logits,
                    enable_chunked_context=chunked,
                ),
                eos_token_ids=self._eos,
                pad_token_id=self._pad,
                gpu_available=gpu_available,
            )
        except TrtllmConfigError as exc:
            raise TrtllmConfigError(f"{who}: {exc}") from exc
        for name, engine_facts in (("model's", self.facts), ("draft model's", draft.facts)):
            if engine_facts.world_size > 1:
                raise TrtllmConfigError(
                    f"{drafts.key}=draft_model: the {name} engine has tp={engine_facts.tp_size} "
                    f"pp={engine_facts.pp_size}, and a draft model runs here with one GPU per engine only (both "
                    "Executors in orchestrator mode, as TensorRT-LLM's examples/prompt_lookup/run_dtm_pld.py); set "
                    "option.tensor_parallel_degree=1 and option.pipeline_parallel_degree=1 (and build the draft with "
                    "them), or use n-gram drafts"
                )
        if draft.facts.vocab_size != self.facts.vocab_size:
            raise TrtllmConfigError(
                f"{drafts.key}=draft_model: the draft engine's vocab_size is {draft.facts.vocab_size} and the "
                f"model's {self.facts.vocab_size} (config.json pretrained_config.vocab_size); the draft model must "
                "share the model's tokenizer"
            )
        too_long = input_limit_error(who, self.facts.max_seq_len - 1, draft.facts.max_num_tokens, chunked)
        if too_long is not None:
            raise TrtllmConfigError(too_long)
        return draft

    # ------------------------------------------------------------------ lifecycle

    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def is_leader(self) -> bool:
        """True on the rank that serves requests (always, without MPI)."""
        return self._leader

    @property
    def tensorrt_llm_version(self) -> str | None:
        return self._spec.version if self._spec else None

    async def start(self) -> None:
        if self._executor is not None or self._closed:
            raise RuntimeError("TrtllmEngine.start() may be called once")
        tle, spec = probe_runtime(self._gpu_available)
        too_old = (
            release_error(self.settings.lookahead, spec.version, spec.series)
            or drafts_release_error(self.settings.drafts, spec.version, spec.series)
            or medusa_release_error(self.settings.medusa, spec.version, spec.series)
        )
        if too_old is not None:
            raise TrtllmConfigError(too_old)
        if self._scratch is None:
            self._owned_scratch = self._scratch = Path(tempfile.mkdtemp(prefix="lmi-trt-engine-"))
        engine_dir = prepare_engine_dir(self._engine_dir, self.facts, self._scratch)
        config, warnings = build_executor_config(tle, self.settings, self.facts, self._guide_vocab)
        for warning in warnings:
            log.warning("%s", warning)
        if self._draft_engine is not None:
            # first, with its bounded KV-cache share; the model's Executor then sizes its own from what is left
            log.info(
                "draft model: its Executor starts first, its KV cache taking option."
                "draft_kv_cache_free_gpu_mem_fraction=%s of the free GPU memory; the model's then takes "
                "option.kv_cache_free_gpu_mem_fraction=%s of what is left",
                self._draft_engine.settings.kv_cache_free_gpu_mem_fraction,
                self.settings.kv_cache_free_gpu_mem_fraction,
            )
            try:
                await self._draft_engine.start()
            except BaseException:
                if self._owned_scratch is not None:
                    shutil.rmtree(self._owned_scratch, ignore_errors=True)
                raise
        log.info(
            "loading TensorRT-LLM %s engine %s (built by %s, %s, tp=%d pp=%d, batch %d, max_input_len %d, "
            "max_seq_len %d)",
            spec.version,
            engine_dir,
            self.facts.version or "a legacy release",
            self.facts.dtype,
            self.facts.tp_size,
            self.facts.pp_size,
            self._limits.max_batch_size,
            self.facts.max_input_len,
            self.facts.max_seq_len,
        )
        on_executor = self.settings.lookahead or self.settings.medusa
        if on_executor is not None:
            log.info("speculative decoding: %s", on_executor.describe())
            self._counts_drafts = counts_accepted_drafts(tle)
            if not self._counts_drafts:
                log.info("%s", UNCOUNTED_DRAFTS.format(version=spec.version))
        if self.settings.drafts is not None:
            log.info(
                "speculative decoding: %s; KV-cache block reuse on (option.enable_kv_cache_reuse, turned on for draft "
                "tokens when unset: TensorRT-LLM's Executor requires it for a draft_tokens_external engine)",
                self.settings.drafts.describe(),
            )
        if hasattr(tle, "ExtendedRuntimePerfKnobConfig"):
            multi_block, source = effective_multi_block_mode(tle, self.settings)
            log.info("multi_block_mode=%s (%s)", "on" if multi_block else "off", source)
        try:
            executor = await asyncio.to_thread(tle.Executor, str(engine_dir), tle.ModelType.DECODER_ONLY, config)
        except RuntimeError as exc:
            if self._draft_engine is not None:
                await self._draft_engine.close()
            if self._owned_scratch is not None:
                shutil.rmtree(self._owned_scratch, ignore_errors=True)
            out_of_memory = "out of memory" in str(exc).lower()
            raise EngineError(
                f"TensorRT-LLM {spec.version} could not load the engine in {engine_dir}: {exc}"
                + ("; lower option.kv_cache_free_gpu_mem_fraction or the batch size" if out_of_memory else ""),
                code=507 if out_of_memory else 424,
            ) from exc
        self._tle, self._spec, self._executor = tle, spec, executor
        self._capabilities = executor_capabilities(
            f"TensorRT-LLM {spec.version} (tensorrt backend)",
            self.facts.vocab_size is not None,
            guided_capability(tle, self._guide_vocab),
            self._limits.max_beam_width,
            spec.series,
            self.settings.lookahead,
            lora_capability(self.settings),
            self.settings.drafts,
            self.settings.medusa,
        )
        self._loop = asyncio.get_running_loop()
        self._leader = bool(executor.can_enqueue_requests())
        if self._leader:
            self._pump = threading.Thread(target=self._pump_loop, name="trtllm-response-pump", daemon=True)
            self._pump.start()
        self._healthy = True

    def wait_for_shutdown(self) -> None:
        """Block a follower rank (``can_enqueue_requests()`` False) until the leader shuts down.

        TensorRT-LLM's ``shutdown()`` on a follower returns once the leader's has run (leader mode)."""
        if self._executor is None:
            raise RuntimeError("call start() before wait_for_shutdown()")
        if self._leader:
            raise RuntimeError("wait_for_shutdown() is for follower ranks; the leader serves requests and close()s")
        self._executor.shutdown()
        self._healthy = False
        self._closed = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        self._stopping.set()
        held, self._held = self._held, []
        for stream in [*self._streams.values(), *held]:
            self._finish(stream, error_output(stream.request_id, "the engine is shutting down", 503))
        if self._pump is not None:
            await asyncio.to_thread(self._pump.join)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown)
        if self._draft_engine is not None:
            await self._draft_engine.close()
        if self._owned_scratch is not None:
            shutil.rmtree(self._owned_scratch, ignore_errors=True)

    # ------------------------------------------------------------------ requests

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if self.settings.drafts is not None:
            return self._draft_loop(request)
        return self._generate(request)

    async def _draft_loop(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        rid = request.request_id
        self._draft_loops[rid] = False
        drafts = self.settings.drafts
        proposer = (
            NgramProposer(drafts) if self._draft_engine is None else DraftModelProposer(self._draft_engine.submit, rid)
        )
        loop = draft_loop(
            self,
            request,
            drafts,
            proposer,
            self._limits.max_seq_len,
            self._count_drafts,
            frozenset(self._eos),
            lambda: self._draft_loops.get(rid, False),
        )
        try:
            async with aclosing(loop) as outputs:
                async for out in outputs:
                    yield out
        finally:
            self._draft_loops.pop(rid, None)

    # -- BatchedEngine (base.py): the engine's process of several front ends (serving/engine_link.py) ----------

    def attach(self, sink: OutputSink) -> None:
        self._sink = sink

    def sinks(self, request: GenerationRequest) -> bool:
        """Not one that needs ``submit``'s own work: the draft loop's iterations, compiling a grammar off the loop."""
        return self.settings.drafts is None and request.sampling.guided is None

    def submit_to_sink(self, request: GenerationRequest) -> None:
        """Straight to the Executor as a stream whose outputs ``_deliver`` hands to the sink, each ``await_responses``
        batch's together."""
        assert self._sink is not None, "attach() a sink first"
        stream = self._enqueue(request, sunk=True)
        if isinstance(stream, EngineOutput):
            self._sink.put([stream])

    def _deliver(self, stream: _Stream, out: EngineOutput) -> None:
        if not stream.sunk:
            _push(stream, out)
            return
        self._sunk.append(out)  # to the sink, with the other outputs of this turn of the loop
        if len(self._sunk) == 1:
            asyncio.get_running_loop().call_soon(self._put_sunk)

    def _put_sunk(self) -> None:
        outs, self._sunk = self._sunk, []
        self._sink.put(outs)  # type: ignore[union-attr]

    def verify_drafts(self, request: GenerationRequest, drafts: list[int]) -> AsyncIterator[EngineOutput]:
        """One Executor request carrying ``drafts`` as its ExternalDraftTokensConfig (none: a plain request), for
        ``trtllm_drafts.draft_loop``."""
        return self._generate(request, tuple(drafts))

    def _count_drafts(self, proposed: int, accepted: int) -> None:
        self._drafted_iterations += 1
        self._proposed_drafts += proposed
        self._accepted_drafts += accepted

    async def _generate(self, request: GenerationRequest, drafts: tuple[int, ...] = ()) -> AsyncIterator[EngineOutput]:
        await warm_guide(request.sampling.guided)
        stream = self._enqueue(request, drafts)
        if isinstance(stream, EngineOutput):
            yield stream
            return
        create_future = asyncio.get_running_loop().create_future
        try:
            while True:
                if not stream.pending:
                    stream.waiter = waiter = create_future()
                    await waiter
                    continue
                out = _take(stream)
                yield out
                if out.finished:
                    return
        finally:
            if not stream.done:  # the consumer went away (client disconnect): free the slot
                self._cancel_stream(stream)

    def _enqueue(
        self, request: GenerationRequest, drafts: tuple[int, ...] = (), sunk: bool = False
    ) -> _Stream | EngineOutput:
        rid = request.request_id
        if not self._healthy or self._executor is None:
            return error_output(rid, "the TensorRT-LLM engine is not running", 503)
        if not self._leader:
            return error_output(rid, "this MPI rank does not take requests (leader mode: rank 0 does)", 503)
        if rid in self._by_request_id:
            return error_output(rid, f"request id {rid!r} is already in flight", 400)
        if self.settings.lookahead is not None and request.sampling.do_sample:
            return error_output(rid, lookahead_refusals(self.settings.lookahead)["sampling"], 400, "temperature")
        if self.settings.medusa is not None and request.sampling.do_sample:
            return error_output(rid, medusa_refusals()["sampling"], 400, "temperature")
        tree_key, tree_method = self._tree_speculation()
        if tree_key is not None and request.stop_token_ids:
            why = f"stop_token_ids beside {tree_method}: {STOP_WORDS_UNREAD}; leave them out"
            return error_output(rid, why, 400, "stop_token_ids")
        if self.settings.drafts is not None:
            field, refused = drafted_request_refusal(request)
            if refused is not None:
                return error_output(rid, refused, 400, field)
        try:
            spec = map_request(
                request,
                eos_token_ids=self._eos,
                pad_token_id=self._pad,
                max_beam_width=self._limits.max_beam_width,
                seed=random.getrandbits(63),
            )
            spec, resend = self._with_lora(dataclasses.replace(spec, drafts=drafts), request.adapter)
        except EngineError as exc:
            return error_output(rid, str(exc), exc.code, exc.field)
        stream = _Stream(
            request_id=rid,
            max_new_tokens=request.sampling.max_new_tokens,
            end_id=spec.request["end_id"],
            extra_eos=frozenset(self._eos[1:]) if not request.sampling.ignore_eos else frozenset(),
            logprobs=request.sampling.logprobs,
            beam_width=request.sampling.beam_width,
            adapter=request.adapter,
            lora_resend=resend,
            drafted=bool(drafts),
            sunk=sunk,
        )
        if self._must_wait(stream.beam_width) or self._lora_full(stream.adapter):
            stream.held = spec
            self._held.append(stream)
        else:
            error = self._submit(stream, spec)
            if error is not None:
                return error
        self._by_request_id[rid] = stream
        self._total_requests += 1
        return stream

    def _must_wait(self, beam_width: int) -> bool:
        """Whether a request of this beam width is held back here instead of enqueued.

        TensorRT-LLM's executor does not dequeue a request whose beam width differs from the running
        requests' (``Executor::Impl::getLeaderNewReqWithIds``, cpp/tensorrt_llm/executor/executorImpl.cpp),
        and nothing queued behind it either: one such request would stall every later one until the
        running batch drained. So it waits here while the others keep flowing; once it waits, at most
        ``max_batch_size`` more running-width requests go ahead of it, then the running batch drains
        and the held width's group runs together (``_release_held``).
        """
        if not self._streams:
            return False
        running = next(iter(self._streams.values())).beam_width
        if beam_width != running:
            return True
        return bool(self._held) and self._passed_held >= self._limits.max_batch_size

    def _lora_full(self, adapter: str | None) -> bool:
        """Whether a request's adapter is held back here: it is not in flight and the Executor's host cache holds
        as many adapters as run. The Executor puts every fetched request's task in its host cache, before
        scheduling, and evicts only tasks no request uses; with none to evict the request fails with "PEFT Cache is
        full. Could not store taskId=N" (``cpp/tensorrt_llm/executor/executorImpl.cpp`` updatePeftCache in the fetch
        loop; ``peftCacheManager.cpp`` addRequestPeft; ``runtime/loraCache.cpp`` claimPagesWithEvict). Load is no
        client's fault: it waits, as the torch engine waits for an adapter slot."""
        if adapter is None:
            return False
        running = {s.adapter for s in self._streams.values() if s.adapter is not None}
        return adapter not in running and len(running) >= host_adapters(self.settings)

    def _submit(self, stream: _Stream, spec: RequestSpec) -> EngineOutput | None:
        try:
            exec_id = self._executor.enqueue_request(to_executor_request(self._tle, spec, self.facts.vocab_size))
        except (RuntimeError, TypeError, ValueError) as exc:
            return error_output(stream.request_id, f"TensorRT-LLM rejected the request: {exc}", 424)
        stream.exec_id, stream.held = exec_id, None
        self._streams[exec_id] = stream
        if self._held:
            self._passed_held += 1
        return None

    def _release_held(self) -> None:
        """Nothing runs any more: enqueue the oldest held request's beam-width group, in arrival order."""
        if self._releasing or self._streams or not self._held or not self._healthy:
            return
        self._releasing = True
        try:
            width = self._held[0].beam_width
            group = [s for s in self._held if s.beam_width == width]
            self._held = [s for s in self._held if s.beam_width != width]
            self._passed_held = 0
            for stream in group:
                if self._lora_full(stream.adapter):  # its turn comes when the running batch drains again
                    self._held.append(stream)
                    continue
                error = self._submit(stream, stream.held)
                if error is not None:
                    self._finish(stream, error)
        finally:
            self._releasing = False
        self._release_held()  # every request of the group failed to enqueue: the next group's turn

    async def cancel(self, request_id: str) -> None:
        if request_id in self._draft_loops:  # seen between its iterations; one in flight is cancelled below
            self._draft_loops[request_id] = True
        stream = self._by_request_id.get(request_id)
        if stream is not None and not stream.done:
            self._cancel_stream(stream)

    def _cancel_stream(self, stream: _Stream) -> None:
        if stream.cancelled or stream.done:
            return
        stream.cancelled = True
        if stream.exec_id is None:  # held back here: the executor never saw it
            self._held.remove(stream)
            self._finish(
                stream, EngineOutput(stream.request_id, [], finished=True, finish_reason=FinishReason.CANCELLED)
            )
            return
        try:
            self._executor.cancel_request(stream.exec_id)
        except RuntimeError as exc:
            log.warning("cancel_request(%d) for %s failed: %s", stream.exec_id, stream.request_id, exc)
        if not self._spec.final_result_on_cancel:
            # This release sends nothing back for a cancelled request: end the stream here.
            self._finish(
                stream, EngineOutput(stream.request_id, [], finished=True, finish_reason=FinishReason.CANCELLED)
            )

    def _finish(self, stream: _Stream, out: EngineOutput) -> None:
        stream.done = True
        if stream.exec_id is not None:
            self._streams.pop(stream.exec_id, None)
        self._by_request_id.pop(stream.request_id, None)
        self._deliver(stream, out)
        self._release_held()

    # ------------------------------------------------------------------ LoRA adapters (AdapterHost)

    def adapters(self) -> list[AdapterInfo]:
        return self._adapters.infos()

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo:
        """Read the PEFT adapter in ``folder`` into ``LoraConfig``'s layout (off the event loop) and serve it as
        ``name``, a task id of its own; 400 for an adapter this engine cannot apply, 409 for a name taken or
        option.max_cpu_loras reached."""
        self._adapters.check_room(name)
        weights, config, rank = await asyncio.to_thread(self._read_adapter, name, Path(folder))
        task = self._next_task
        self._next_task += 1
        info = AdapterInfo(name=name, src=src, folder=str(folder), rank=rank)
        self._adapters.add(info, (task, weights, config))
        log.info("LoRA adapter %r registered from %s (rank %d, task %d, %d rows)", name, src, rank, task, len(config))
        return info

    def _read_adapter(self, name: str, folder: Path) -> tuple[Any, Any, int]:
        import torch

        from lmi_trt.engines.adapters import read_adapter  # PEFT's layout, read without peft (safetensors)

        dtype = getattr(torch, self.facts.dtype)  # loraUtils.cpp: the weights must be of the model's dtype
        adapter = read_adapter(
            name, folder, max_rank=self.settings.max_lora_rank, num_layers=self.facts.num_layers, dtype=dtype
        )
        weights, config = executor_tensors(name, adapter, self.facts.lora, self.facts.lora_dims)
        return weights, config, adapter.rank

    async def unregister_adapter(self, name: str) -> None:
        """404 for a name not registered; 409 while a request (running or held back) uses it."""
        task, _, _ = self._adapters.get(name)
        self._adapters.remove(name)
        self._sent_tasks.discard(task)
        log.info("LoRA adapter %r unregistered", name)

    def _using_adapter(self, name: str) -> int:
        """Requests in flight (running or held back) that generate with adapter ``name``."""
        return sum(1 for s in [*self._streams.values(), *self._held] if s.adapter == name and not s.done)

    def _with_lora(self, spec: RequestSpec, adapter: str | None) -> tuple[RequestSpec, RequestSpec | None]:
        """The spec with the adapter's ``LoraConfig``; on 1.x without its weights once the Executor was sent them,
        with the full spec to resend on a cache miss (second of the pair)."""
        if adapter is None:
            return spec, None
        task, weights, config = self._adapters.get(adapter)
        full = dataclasses.replace(spec, lora=(task, weights, config))
        if not self._spec.lora_weights_cached or task not in self._sent_tasks:
            self._sent_tasks.add(task)
            return full, None
        return dataclasses.replace(spec, lora=(task, None, None)), full

    def _resend_lora(self, stream: _Stream) -> None:
        """The Executor no longer holds the task (evicted from its host cache): the same request again, with the
        weights; its executor id changes (nothing was generated for it)."""
        spec, stream.lora_resend = stream.lora_resend, None
        self._streams.pop(stream.exec_id, None)
        log.info("LoRA adapter %r was evicted from TensorRT-LLM's cache: sent again", stream.adapter)
        error = self._submit(stream, spec)
        if error is not None:
            self._finish(stream, error)

    # ------------------------------------------------------------------ response pump

    def _pump_loop(self) -> None:
        """The one thread that waits on the Executor; everything else happens on the event loop."""
        try:
            while not self._stopping.is_set():
                responses = self._executor.await_responses(timeout=PUMP_POLL)
                if responses:
                    self._loop.call_soon_threadsafe(self._dispatch, responses)
        except BaseException as exc:  # noqa: BLE001 — any death of the pump must fail the engine loudly
            if self._stopping.is_set():
                return
            log.exception("the TensorRT-LLM response pump died")
            try:
                self._loop.call_soon_threadsafe(self._pump_died, f"{type(exc).__name__}: {exc}")
            except RuntimeError:  # the event loop is already closed
                pass

    def _pump_died(self, reason: str) -> None:
        self._healthy = False
        held, self._held = self._held, []
        for stream in [*self._streams.values(), *held]:
            self._finish(
                stream, error_output(stream.request_id, f"the TensorRT-LLM response loop stopped: {reason}", 424)
            )

    def _dispatch(self, responses: list) -> None:
        for response in responses:
            stream = self._streams.get(response.request_id)
            if stream is None:  # already ended here (0.12 cancel, shutdown, pump failure)
                continue
            if response.has_error():
                if stream.lora_resend is not None and _LORA_NOT_CACHED in response.error_msg:
                    self._resend_lora(stream)
                    continue
                self._finish(stream, error_output(stream.request_id, response.error_msg, 424))
                continue
            out = self._to_output(stream, response.result)
            self._total_tokens += len(out.token_ids)
            if out.finished:
                self._finish(stream, out)
            else:
                self._deliver(stream, out)

    def _to_output(self, stream: _Stream, result: Any) -> EngineOutput:
        if stream.beam_width > 1 and result.is_final:
            return self._beams_output(stream, result)
        tokens = list(result.output_token_ids[0]) if result.output_token_ids else []
        start = stream.generated
        stream.generated += len(tokens)
        logprobs = None
        if stream.logprobs and result.log_probs:
            # output_token_ids is the delta, log_probs everything generated so far (LlmRequest::createResult
            # in cpp/tensorrt_llm/batch_manager/llmRequest.cpp; tensorrt_llm/executor/result.py replaces
            # its log-probs with each result's): take the delta's positions. A non-streaming result is
            # one delta from position 0.
            logprobs = list(result.log_probs[0][start : start + len(tokens)])
        if not result.is_final:
            return EngineOutput(stream.request_id, tokens, logprobs)
        reason_name = result.finish_reasons[0].name if result.finish_reasons else "NOT_FINISHED"
        if stream.drafted and reason_name == "NOT_FINISHED":
            # a request with draft tokens is final after its one verification step, with fewer tokens than its
            # max_tokens (trtllm_drafts' docstring): no end of sequence, the draft loop goes on
            reason_name = "LENGTH"
        tokens, reason = final_tokens_and_reason(
            tokens,
            reason_name,
            end_id=stream.end_id,
            extra_eos=stream.extra_eos,
            generated=stream.generated,
            max_new_tokens=stream.max_new_tokens,
        )
        if stream.cancelled:
            reason = FinishReason.CANCELLED
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        if self._counts_drafts:
            # Result.decodingIter: "In speculative decoding, might be less than maximum length of the beam in
            # outputTokenIds as more than one token can be generated per iteration" (executor.h, 1.x): the tokens
            # beyond one per iteration are accepted drafts.
            self._accepted_drafts += max(stream.generated - result.decoding_iter, 0)
        return EngineOutput(stream.request_id, tokens, logprobs, finished=True, finish_reason=reason)

    def _beams_output(self, stream: _Stream, result: Any) -> EngineOutput:
        """A beam-search request's one final result: output_token_ids and finish_reasons hold one entry per beam
        returned, best first (executor.h Result; numReturnBeams of them); cum_log_probs are not length-normalized
        (BeamHypotheses.bReturnNormedScore is always false, beamSearchKernels.h), so no score is given."""
        beams = []
        for i, ids in enumerate(result.output_token_ids):
            reasons = result.finish_reasons
            tokens, reason = final_tokens_and_reason(
                list(ids),
                reasons[i].name if i < len(reasons) else "NOT_FINISHED",
                end_id=stream.end_id,
                extra_eos=stream.extra_eos,
                generated=len(ids),
                max_new_tokens=stream.max_new_tokens,
            )
            beams.append(Beam(tokens, FinishReason.CANCELLED if stream.cancelled else reason))
        stream.generated = sum(len(b.token_ids) for b in beams)
        if not beams:
            return error_output(stream.request_id, "TensorRT-LLM's final beam-search result holds no beam", 424)
        best = beams[0]
        return EngineOutput(
            stream.request_id, best.token_ids, finished=True, finish_reason=best.finish_reason, beams=beams
        )

    # ------------------------------------------------------------------ stats

    def stats(self) -> EngineStats:
        extra: dict[str, float] = {}
        if self._leader and self._executor is not None and not self._closed:
            drained = self._executor.get_latest_iteration_stats()
            if drained:
                self._last_iteration = drained[-1]
        it = self._last_iteration
        if it is not None:
            extra["executor_active_requests"] = float(it.num_active_requests)
            kv = it.kv_cache_stats
            if kv is not None:
                extra["kv_cache_free_blocks"] = float(kv.free_num_blocks)
                extra["kv_cache_used_blocks"] = float(kv.used_num_blocks)
                extra["kv_cache_max_blocks"] = float(kv.max_num_blocks)
        if self._counts_drafts or self.settings.drafts is not None:
            extra["spec_decode_num_accepted_tokens"] = float(self._accepted_drafts)
        if self.settings.drafts is not None:
            extra["spec_decode_num_drafts"] = float(self._drafted_iterations)
            extra["spec_decode_num_draft_tokens"] = float(self._proposed_drafts)
        return EngineStats(
            active_requests=len(self._streams),
            queued_requests=(it.num_queued_requests if it is not None else 0) + len(self._held),
            max_batch_size=self._limits.max_batch_size,
            total_requests=self._total_requests,
            total_generated_tokens=self._total_tokens,
            extra=extra,
        )
