"""The engine registry, and the one place the configuration becomes stage settings.

Each engine is one ``EngineEntry``: its name (``option.rolling_batch``), the batch size it takes
when ``option.max_rolling_batch_size`` is unset, its launch rule, whether a checkpoint is compiled
for it, its typed settings view and its factory. ``config`` (the key's choices), ``cli``
(``--engine``), ``launch`` (the placement rule) and ``loader`` (settings, factory, compile) read
this table; adding an engine is one entry here plus its module.

The settings views (``compile_options``, ``trtllm_settings``, ``torch_settings``,
``synthetic_settings``, ``llmapi_settings``; the trtllm engine's ``trtllm_backend_settings`` picks
between the last and ``trtllm_settings`` by ``option.backend``) are built here and only here, from a settled
``LmiConfig`` (``settle``): every stage reads typed fields, never the raw configuration, so a
misspelt name is an ``AttributeError`` rather than a silent default.

This module imports neither the configuration nor an engine implementation at import time
(``config`` imports ``ENGINE_NAMES`` from here); views and factories import what they build.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lmi_trt.engines.base import Engine, EngineError
from lmi_trt.speculative import JSON_KEY, Speculation, SpeculationError, not_here
from lmi_trt.vocabulary import TRTLLM_DEFAULT_BATCH

if TYPE_CHECKING:  # the configuration imports this module; at run time views get an LmiConfig
    from lmi_trt.compile.hf_quant import QuantizeJob
    from lmi_trt.compile.jit import CompileJob
    from lmi_trt.compile.options import CompileOptions
    from lmi_trt.config import LmiConfig
    from lmi_trt.engines.llmapi import LlmApiSettings
    from lmi_trt.engines.trtllm import TrtllmSettings
    from lmi_trt.launch import Placement
    from lmi_trt.sources import ModelArtifact

# How an engine is placed on a host's GPUs (lmi_trt.launch.plan_launch):
#   none: one copy, no GPU; per_gpu: one whole model copy per visible GPU (no TP/PP);
#   mpi_ranks: TP×PP ranks per copy under MPI, several copies as orchestrator-mode Executors.
LaunchRule = Literal["none", "per_gpu", "mpi_ranks"]


class TorchSettings(BaseModel):
    """The torch engine's settings: ``TorchEngine``'s keywords (tests/unit/test_arch_registry.py
    checks that they match), less the tokenizer facts and the placement the loader adds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dtype: Literal["auto", "fp16", "bf16", "fp32"]
    device: Literal["auto", "cpu", "cuda"]
    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)
    trust_remote_code: bool
    max_num_tokens: int | None = Field(ge=1)
    batching: Literal["auto", "continuous", "static"]
    decode_loop: Literal["auto", "builtin", "transformers"]
    # The built-in decode loop's paged KV cache and prompt chunks (refused where that loop does not run).
    enable_kv_cache_reuse: bool
    max_tokens_in_paged_kv_cache: int | None = Field(ge=1)
    tokens_per_block: int | None = Field(ge=1)
    enable_chunked_context: bool
    grammar_compile_timeout: float = Field(gt=0)
    # Speculative decoding (the built-in decode loop: n-gram and draft-model drafts); the draft model's id
    # is a local folder by the time the engine is built (lmi_trt.loader resolves it).
    speculative: Speculation | None


# The speculative methods the torch engine's built-in decode loop runs, and the speculative_config
# members it reads (lmi_trt.speculative.MEMBERS covers the rest; others are refused, never ignored).
TORCH_SPECULATION = ("ngram", "draft_model")
# TensorRT-LLM NGram members the loop's drafting matches at these values only: each request's own tokens
# (no pool shared between requests), every earlier match a candidate (is_use_oldest picks which).
_TORCH_SPECULATIVE_OPTIONS = {"is_public_pool": False, "is_keep_all": True}


class SyntheticSettings(BaseModel):
    """The synthetic benchmark engine's settings (``SyntheticEngine``'s keywords, less the tokenizer's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tokens_per_second: float | None = Field(gt=0)
    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_new_tokens: int = Field(ge=1)


@dataclass(frozen=True)
class EngineEntry:
    name: str
    default_batch: int  # option.max_rolling_batch_size when unset
    launch: LaunchRule
    compiles: bool  # a Hugging Face checkpoint is compiled (lmi_trt.compile) before it is served
    needs_trtllm_gpu: bool  # runs only where tensorrt_llm imports and a GPU is visible (auto picks it there)
    uses_model: bool  # serves the model's weights (the synthetic engine only needs its tokenizer)
    settings: Callable[[LmiConfig], BaseModel]
    factory: Callable[..., Engine]  # (settings, artifact, tokenizer, eos ids, placement) → Engine, not started


# ------------------------------------------------------------------------------------------------
# Settings views: LmiConfig (settled) → each stage's typed settings.


def _batch(config: LmiConfig) -> int:
    if config.max_rolling_batch_size is None:
        raise EngineError("internal: option.max_rolling_batch_size was not settled for the engine (registry.settle)")
    return config.max_rolling_batch_size


def _sequences(config: LmiConfig) -> int:
    """Sequences in flight at run time: DJL's option.max_num_sequences when set (config checks that it is
    ≤ option.max_rolling_batch_size), else the batch size; every engine honours it."""
    return config.max_num_sequences if config.max_num_sequences is not None else _batch(config)


def compile_options(config: LmiConfig) -> CompileOptions:
    """Every ``CompileOptions`` field from the configuration field of the same name
    (``max_batch_size`` ← ``option.max_rolling_batch_size``)."""
    from lmi_trt.compile.options import CompileOptions

    return _compile_options(config, CompileOptions.model_fields)


def _compile_options(config: LmiConfig, names: Iterable[str]) -> CompileOptions:
    """``CompileOptions`` with the named fields from the configuration (the others keep their defaults)."""
    from lmi_trt.compile.options import CompileOptions

    values: dict[str, Any] = {}
    for name in names:
        value = _batch(config) if name == "max_batch_size" else getattr(config, name)
        values[name] = str(value) if isinstance(value, PurePath) else value
    return CompileOptions(**values)


# The options the PyTorch backend's quantization stage reads (lmi_trt.compile.hf_quant).
QUANTIZE_OPTIONS = (
    "quantize",
    "q_format",
    "awq_block_size",
    "calib_dataset",
    "calib_size",
    "calib_batch_size",
    "calib_max_seq_length",
    "trust_remote_code",
)


def quantizes(kind: str, config: LmiConfig) -> bool:
    """Whether a Hugging Face checkpoint is calibrated before ``kind`` serves it: ``option.quantize`` on
    TensorRT-LLM's pytorch backend, which loads modelopt's quantized checkpoints rather than building engines."""
    return ENGINES[kind].compiles and config.backend == "pytorch" and config.quantize is not None


def quantize_job(config: LmiConfig) -> QuantizeJob:
    """The pytorch backend's quantization stage input: the calibration options and the engine cache."""
    from lmi_trt.compile.hf_quant import QuantizeJob

    return QuantizeJob(
        options=_compile_options(config, QUANTIZE_OPTIONS),
        timeout_s=config.compile_timeout,
        cache_uri=config.engine_cache_uri,
        download_dir=config.download_dir,
    )


def compile_job(config: LmiConfig) -> CompileJob:
    """The compile stage's input: the planner's options and how the build runs and is cached."""
    from lmi_trt.compile.jit import CompileJob

    return CompileJob(
        options=compile_options(config),
        kv_cache_fraction=config.kv_cache_free_gpu_mem_fraction,
        timeout_s=config.compile_timeout,
        workers=config.num_engine_workers,
        load_by_shard=config.load_by_shard,
        checkpoint_dir=config.trtllm_checkpoint_path,
        cache_uri=config.engine_cache_uri,
        download_dir=config.download_dir,
        properties=config.compile_time_values(),
    )


def trtllm_settings(config: LmiConfig) -> TrtllmSettings:
    from lmi_trt.engines.trtllm import TrtllmSettings

    # DJL: option.max_num_sequences, when set, caps the Executor's batch below the built one.
    key = "option.max_num_sequences" if config.max_num_sequences is not None else "option.max_rolling_batch_size"
    batch = _sequences(config)
    given = config.is_given("max_num_sequences") or config.is_given("max_rolling_batch_size")
    tp = config.tensor_parallel_degree
    return TrtllmSettings(
        max_batch_size=batch,
        # None: the engine's default, lowered to the engine's build-time batch with a warning.
        max_batch_size_key=key if given else None,
        max_num_tokens=config.max_num_tokens,
        kv_cache_free_gpu_mem_fraction=config.kv_cache_free_gpu_mem_fraction,
        max_tokens_in_paged_kv_cache=config.max_tokens_in_paged_kv_cache,
        kv_cache_host_memory_bytes=config.kv_cache_host_memory_bytes,
        enable_kv_cache_reuse=config.enable_kv_cache_reuse,
        batch_scheduler_policy=config.batch_scheduler_policy,
        enable_chunked_context=config.enable_chunked_context,
        multi_block_mode=config.multi_block_mode,
        enable_trt_overlap=config.enable_trt_overlap,
        max_beam_width=config.max_beam_width,
        tensor_parallel_degree=None if tp == "max" else tp,
        pipeline_parallel_degree=config.pipeline_parallel_degree,
    )


# Options whose DJL default differs from the LLM API's (TorchLlmArgs: block reuse on, GUARANTEED_NO_EVICT, 0.9 of
# free memory for the KV cache): on the pytorch backend an unset one is left to TensorRT-LLM (llmapi.llm_plan).
LLM_RELEASE_DEFAULTED = (
    "enable_kv_cache_reuse",
    "batch_scheduler_policy",
    "enable_chunked_context",
    "kv_cache_free_gpu_mem_fraction",
)


def llmapi_settings(config: LmiConfig) -> LlmApiSettings:
    from lmi_trt.engines.llmapi import DJL_LLM_FIELDS, LlmApiSettings

    return LlmApiSettings(
        runtime=trtllm_settings(config),
        dtype=config.dtype,
        max_input_len=config.max_input_len,
        max_seq_len=config.max_seq_len,  # unset: TensorRT-LLM's, from the checkpoint (llmapi.release_max_seq_len)
        trust_remote_code=config.trust_remote_code,
        **{name: getattr(config, name) for name in DJL_LLM_FIELDS},
        # where DJL's default differs from TensorRT-LLM's, the LLM gets the option only when the user set it
        given=frozenset(name for name in LLM_RELEASE_DEFAULTED if config.is_given(name)),
    )


def trtllm_backend_settings(config: LmiConfig) -> TrtllmSettings | LlmApiSettings:
    """The trtllm engine's view for its TensorRT-LLM backend (``option.backend``, resolved by
    ``lmi_trt.engines.choose_backend`` before the engine is built): the LLM API's settings on pytorch,
    the Executor's on tensorrt."""
    return llmapi_settings(config) if config.backend == "pytorch" else trtllm_settings(config)


def torch_speculation(config: LmiConfig) -> Speculation | None:
    """The speculative decoding the torch engine is asked for, refused (naming the key) where it is a
    method the engine does not run or a speculative_config member it does not use."""
    from lmi_trt.config import speculation

    spec = speculation(config)
    if spec is None:
        return None
    if spec.method not in TORCH_SPECULATION:
        raise not_here(spec, "torch", TORCH_SPECULATION)
    for member, value in spec.options.items():
        if _TORCH_SPECULATIVE_OPTIONS.get(member, object()) != value:
            raise SpeculationError(
                f"{JSON_KEY}.{member}",
                value,
                "is not something the torch engine's speculative decoding does",
                f"set {json.dumps(_TORCH_SPECULATIVE_OPTIONS[member])} or leave it out"
                if member in _TORCH_SPECULATIVE_OPTIONS
                else "leave it out",
            )
    return spec


def torch_settings(config: LmiConfig) -> TorchSettings:
    return TorchSettings(
        dtype=config.dtype,
        device=config.device,
        max_batch_size=_sequences(config),
        max_input_len=config.max_input_len,
        max_new_tokens=config.max_output_len,
        trust_remote_code=config.trust_remote_code,
        max_num_tokens=config.max_num_tokens,
        batching=config.torch_batching,
        decode_loop=config.torch_decode_loop,
        enable_kv_cache_reuse=config.enable_kv_cache_reuse,
        max_tokens_in_paged_kv_cache=config.max_tokens_in_paged_kv_cache,
        tokens_per_block=config.tokens_per_block,
        enable_chunked_context=config.enable_chunked_context,
        grammar_compile_timeout=config.grammar_compile_timeout,
        speculative=torch_speculation(config),
    )


def synthetic_settings(config: LmiConfig) -> SyntheticSettings:
    return SyntheticSettings(
        tokens_per_second=config.synthetic_tokens_per_second or None,  # 0 = as fast as possible
        max_batch_size=_sequences(config),
        max_input_len=config.max_input_len,
        max_new_tokens=config.max_output_len,
    )


# ------------------------------------------------------------------------------------------------
# Factories: settings + the loaded artifact and tokenizer → an engine (not started).


def _build_synthetic(
    settings: SyntheticSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:
    from lmi_trt.engines.synthetic import SyntheticEngine

    return SyntheticEngine(len(tokenizer), **settings.model_dump(), special_token_ids=tuple(tokenizer.all_special_ids))


def _build_torch(
    settings: TorchSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:
    if artifact.kind != "hf_checkpoint":
        raise EngineError(
            f"option.model_id={artifact.model_id!r} is a {artifact.kind.replace('_', ' ')}, which only the "
            "trtllm engine can serve; the torch engine needs a Hugging Face checkpoint "
            "(install TensorRT-LLM on a GPU host, or point option.model_id at the HF model)",
            code=400,
        )
    from lmi_trt.engines.torch import TorchEngine

    if placement is not None and placement.torch_device:
        settings = settings.model_copy(update={"device": placement.torch_device})
    return TorchEngine(artifact.path, **dict(settings), eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id)


def _build_trtllm(
    settings: TrtllmSettings | LlmApiSettings,
    artifact: ModelArtifact,
    tokenizer: Any,
    eos: list[int],
    placement: Placement | None,
) -> Engine:
    from lmi_trt.engines.guided import GuideVocab
    from lmi_trt.engines.llmapi import LlmApiEngine, LlmApiSettings
    from lmi_trt.engines.trtllm import TrtllmEngine
    from lmi_trt.launch import trtllm_copy_settings

    if isinstance(settings, LlmApiSettings):  # the pytorch backend: the LLM loads the checkpoint, starts its workers
        return LlmApiEngine(
            artifact.path, settings, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer
        )
    if artifact.kind != "trtllm_engine":
        raise EngineError(f"internal: {artifact.model_id!r} reached the engine stage uncompiled ({artifact.kind})")
    if placement is not None and placement.orchestrator:  # one copy among several: its GPUs, orchestrator mode
        settings = trtllm_copy_settings(settings, placement)
    return TrtllmEngine(
        artifact.engine_dir,
        settings,
        eos_token_ids=eos,
        pad_token_id=tokenizer.pad_token_id,
        guide_vocab=functools.partial(GuideVocab.of, tokenizer, eos),
    )


# Default batches are DJL's (LmiConfigRecommender.setRollingBatchSize: 256 for trtllm, 32 for the
# others); the torch engine's cache is sized from it up front.
ENGINES: dict[str, EngineEntry] = {
    entry.name: entry
    for entry in (
        EngineEntry(
            "trtllm",
            TRTLLM_DEFAULT_BATCH,
            "mpi_ranks",
            compiles=True,
            needs_trtllm_gpu=True,
            uses_model=True,
            settings=trtllm_backend_settings,
            factory=_build_trtllm,
        ),
        EngineEntry(
            "torch",
            32,
            "per_gpu",
            compiles=False,
            needs_trtllm_gpu=False,
            uses_model=True,
            settings=torch_settings,
            factory=_build_torch,
        ),
        EngineEntry(
            "synthetic",
            TRTLLM_DEFAULT_BATCH,
            "none",
            compiles=False,
            needs_trtllm_gpu=False,
            uses_model=False,
            settings=synthetic_settings,
            factory=_build_synthetic,
        ),
    )
}
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)
# The engine `lmi-trt plan` and `lmi-trt compile` build for.
COMPILING_ENGINE = next(name for name, entry in ENGINES.items() if entry.compiles)


def settle(config: LmiConfig, kind: str) -> LmiConfig:
    """The configuration as the chosen engine runs it: where ``option.max_rolling_batch_size`` is
    unset, the engine's default is filled in, here and only here; every later stage reads it."""
    if config.max_rolling_batch_size is not None:
        return config
    return config.derived(f"{kind} engine default", max_rolling_batch_size=ENGINES[kind].default_batch)


def compiles(kind: str, config: LmiConfig) -> bool:
    """Whether a Hugging Face checkpoint is compiled before ``kind`` serves it: the engine's rule, except on
    TensorRT-LLM's pytorch backend, whose LLM loads the checkpoint itself (as DJL's LMI does, no trtllm-build)."""
    return ENGINES[kind].compiles and config.backend != "pytorch"


class _Reads:
    """A configuration that records which of its fields are read (``honoured``)."""

    def __init__(self, config: LmiConfig) -> None:
        self._config = config
        self.names: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.names.add(name)
        return getattr(self._config, name)


def honoured(kind: str, config: LmiConfig) -> frozenset[str]:
    """The fields engine ``kind`` reads for a settled ``config`` (its backend resolved): its settings view's,
    and its compile job's where it compiles. Derived from the views themselves, so it cannot drift from them."""
    probe = _Reads(config)
    ENGINES[kind].settings(probe)  # type: ignore[arg-type]
    if compiles(kind, config):
        compile_job(probe)  # type: ignore[arg-type]
    if quantizes(kind, config):
        quantize_job(probe)  # type: ignore[arg-type]
    return frozenset(probe.names)


# Fields a settings view reads that other stages honour for every engine, or place and refuse per engine.
HONOURED_ELSEWHERE: dict[str, str] = {
    "trust_remote_code": "the tokenizer is loaded with it for every engine",
    "tensor_parallel_degree": "lmi_trt.launch places it, or refuses it, per engine",
    "pipeline_parallel_degree": "lmi_trt.launch places it, or refuses it, per engine",
    "download_dir": "sources download s3:// models there for every engine",
    "max_output_len": "the server caps every request's new tokens with it (serving.core), for every engine",
}


def refuse_ignored(kind: str, config: LmiConfig) -> None:
    """A StartupError for the first option the user set that engine ``kind`` would ignore: one that some
    engine's (or backend's) settings read and this one's do not. Every accepted option is honoured or refused."""
    from lmi_trt.config import StartupError

    used = honoured(kind, config)
    for name in type(config).model_fields:
        if name in used or name in HONOURED_ELSEWHERE or not config.is_given(name):
            continue
        users = [
            f"{other} ({backend})" if backend else other
            for (other, backend), read in _reads_by_engine().items()
            if name in read
        ]
        if users:
            where = f"the {kind} engine" + (f" on the {config.backend} backend" if kind == "trtllm" else "")
            raise StartupError(
                config.label(name),
                getattr(config, name),
                f"{where} does not use it",
                f"leave it out, or serve with an engine that does: {', '.join(users)}",
            )


def check_release(kind: str, config: LmiConfig) -> None:
    """On TensorRT-LLM's pytorch backend (its release installed, ``option.backend`` resolved), what the installed
    release's own LLM arguments lack or refuse is a ``TrtllmConfigError`` naming the option before anything loads
    (``lmi_trt.engines.llmapi.llm_configs``); nothing to check on the other engines and backends."""
    from lmi_trt.engines.llmapi import LlmApiSettings, llm_api_release, llm_configs, llm_plan, probe_llm_api

    settings = ENGINES[kind].settings(config)
    if not isinstance(settings, LlmApiSettings):
        return
    runtime = settings.runtime
    if runtime.tensor_parallel_degree is None:  # max: the launch plan resolves it; the MoE split is checked then
        split = (settings.moe_tensor_parallel_size or 1) * (settings.moe_expert_parallel_size or 1)
        settings = settings.model_copy(update={"runtime": runtime.model_copy(update={"tensor_parallel_degree": split})})
    llmapi, version = probe_llm_api(lambda: True)  # the GPU is the engine's to check, when it starts
    llm_configs(llmapi, llm_plan(settings, llm_api_release(version)), version)


def engine_backends() -> list[tuple[str, str | None]]:
    """Every engine, the TensorRT-LLM one once per backend."""
    return [
        (kind, backend)
        for kind in ENGINES
        for backend in (("pytorch", "tensorrt") if ENGINES[kind].needs_trtllm_gpu else (None,))
    ]


@functools.cache
def _reads_by_engine() -> dict[tuple[str, str | None], frozenset[str]]:
    """What each engine (and backend) reads, on the default configuration: which engines an option is for."""
    from lmi_trt.config import LmiConfig

    out = {}
    for kind, backend in engine_backends():
        config = settle(LmiConfig(), kind)
        out[(kind, backend)] = honoured(kind, config.model_copy(update={"backend": backend}) if backend else config)
    return out


def build_engine(
    kind: str,
    config: LmiConfig,
    artifact: ModelArtifact,
    tokenizer: Any,
    eos: list[int],
    placement: Placement | None = None,
) -> Engine:
    """Construct (not start) the engine ``kind`` for a settled configuration."""
    entry = ENGINES[kind]
    return entry.factory(entry.settings(config), artifact, tokenizer, eos, placement)
