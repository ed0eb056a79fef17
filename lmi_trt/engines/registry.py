"""The engine registry: facts about each way of serving a model, and nothing else.

An ``EngineEntry`` is one way of serving: the embedded ``torch`` engine, the ``synthetic`` benchmark engine,
and TensorRT-LLM once per backend (``option.rolling_batch=trtllm`` with ``option.backend``: ``tensorrt``, the
C++ Executor over TensorRT engines; ``pytorch``, the LLM API's PyTorch backend). TensorRT-LLM's own
``LLM`` takes the same shape: one argument class per backend over shared declarations (``TrtLlmArgs`` and
``TorchLlmArgs`` over ``BaseLlmArgs``, NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, 1.0 and later).
An entry says what that way of serving does (how it is launched, whether a checkpoint is compiled or
calibrated first, which TensorRT-LLM releases and quantizations it takes); every stage asks these
facts instead of comparing an engine's or a backend's name (tests/unit/test_arch_registry.py holds that).

Which backend serves a model on a TensorRT-LLM release (``choose_backend``) is decided here too, from the
entries' facts and the release's (``TrtllmFacts``), as a pure function.

A leaf: it imports no stage and nothing of the configuration. The wiring that turns a configuration into an
entry's settings, its compile job and its engine sits above it, in ``lmi_trt.stages``; adding an engine is an
entry here, its wiring there, and its module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Literal

from lmi_trt.errors import StartupError
from lmi_trt.vocabulary import PYTORCH_QUANTIZATIONS, QUANTIZE_NAMES, TRTLLM_DEFAULT_BATCH, Quantization

# How an entry is placed on a host's GPUs (lmi_trt.launch.plan_launch):
#   none: one copy, no GPU; per_gpu: one whole model copy per visible GPU (no TP/PP);
#   mpi_ranks: TP×PP ranks per copy under MPI, several copies as orchestrator-mode Executors;
#   llm_workers: one copy in one process, whose LLM starts its TP×PP workers itself.
LaunchRule = Literal["none", "per_gpu", "mpi_ranks", "llm_workers"]


@dataclass(frozen=True)
class EngineEntry:
    engine: str  # option.rolling_batch
    backend: str | None  # option.backend of a TensorRT-LLM entry; None: the engine serves one way
    # Facts every entry of an engine shares:
    default_batch: int  # option.max_rolling_batch_size when unset
    needs_trtllm_gpu: bool  # runs only where tensorrt_llm imports and a GPU is visible (auto picks it there)
    uses_model: bool  # serves the model's weights (the synthetic engine only needs its tokenizer)
    # TensorRT-LLM sizes prompt + output against the model's positions itself (RoPE scaling included; the
    # build plan does for TensorRT engines); elsewhere limits that do not fit are refused at startup.
    checks_lengths: bool
    # Facts of this way of serving:
    launch: LaunchRule
    builds_engine: bool  # a Hugging Face checkpoint is compiled into a TensorRT engine first (lmi_trt.compile)
    calibrates: bool  # option.quantize calibrates a Hugging Face checkpoint first (lmi_trt.compile.hf_quant)
    # On TensorRT-LLM: the first release that has it, and whether it needs the Executor binding (gone after 1.2:
    # NVIDIA/TensorRT-LLM PRs 15918, 16369).
    since: tuple[int, int] = (0, 0)
    needs_executor: bool = False
    quantizations: frozenset[Quantization] | None = None  # the option.quantize formats it loads; None: any

    def loads(self, quantization: Quantization | None) -> bool:
        """Whether it serves a checkpoint quantized (or calibrated) to ``quantization``."""
        return self.quantizations is None or quantization in self.quantizations

    @property
    def label(self) -> str:
        """How messages name it: ``torch``, ``trtllm (pytorch)``."""
        return f"{self.engine} ({self.backend})" if self.backend else self.engine

    @property
    def title(self) -> str:
        """``the torch engine``, ``the trtllm engine on the pytorch backend``."""
        return f"the {self.engine} engine" + (f" on the {self.backend} backend" if self.backend else "")


# Default batches are DJL's (LmiConfigRecommender.setRollingBatchSize: 256 for trtllm, 32 for the
# others); the torch engine's cache is sized from it up front.
TENSORRT = EngineEntry(
    "trtllm",
    "tensorrt",
    default_batch=TRTLLM_DEFAULT_BATCH,
    needs_trtllm_gpu=True,
    uses_model=True,
    checks_lengths=True,
    launch="mpi_ranks",
    builds_engine=True,
    calibrates=False,
    needs_executor=True,
)
# Since 1.0 the LLM API's default backend (tensorrt_llm/llmapi/llm.py, 1.0.0); it loads the checkpoint itself (as
# DJL's LMI does, no trtllm-build), calibrated first where option.quantize asks for one of modelopt's formats.
PYTORCH = replace(
    TENSORRT,
    backend="pytorch",
    launch="llm_workers",
    builds_engine=False,
    calibrates=True,
    since=(1, 0),
    needs_executor=False,
    quantizations=PYTORCH_QUANTIZATIONS,
)
TORCH = EngineEntry(
    "torch",
    None,
    default_batch=32,
    needs_trtllm_gpu=False,
    uses_model=True,
    checks_lengths=False,
    launch="per_gpu",
    builds_engine=False,
    calibrates=False,
)
SYNTHETIC = replace(TORCH, engine="synthetic", default_batch=TRTLLM_DEFAULT_BATCH, uses_model=False, launch="none")

ENTRIES: tuple[EngineEntry, ...] = (TENSORRT, PYTORCH, TORCH, SYNTHETIC)
# option.rolling_batch's values, and option.backend's besides auto.
ENGINE_NAMES: tuple[str, ...] = tuple(dict.fromkeys(e.engine for e in ENTRIES))
BACKEND_NAMES: tuple[str, ...] = tuple(e.backend for e in ENTRIES if e.backend)
# option.rolling_batch=auto: the first of these the host can run (TensorRT-LLM needs its package and a GPU).
AUTO_ORDER: tuple[str, ...] = ("trtllm", "torch")
# The engine `lmi-trt plan` and `lmi-trt compile` build for.
COMPILING_ENGINE = next(e.engine for e in ENTRIES if e.builds_engine)


def entries(engine: str) -> tuple[EngineEntry, ...]:
    """The ways ``engine`` (an option.rolling_batch value) serves, one per backend."""
    found = tuple(e for e in ENTRIES if e.engine == engine)
    if not found:
        raise ValueError(f"engine {engine!r} is not one of {', '.join(ENGINE_NAMES)}")
    return found


def entry(engine: str, backend: str = "auto") -> EngineEntry:
    """The entry serving ``engine`` on ``backend`` (option.backend). While a TensorRT-LLM backend is still
    ``auto`` (decided once the model is read), the engine's first entry: the facts its entries share are
    read from it, and a launch is planned as for TensorRT engines."""
    found = entries(engine)
    return next((e for e in found if e.backend == backend), found[0])


def has_backends(engine: str) -> bool:
    """Whether ``engine`` serves in several ways, one per option.backend (TensorRT-LLM)."""
    return len(entries(engine)) > 1


def is_chosen(engine: str, backend: str) -> bool:
    """Whether ``backend`` picks one entry of ``engine``: always for an engine that serves one way."""
    return not has_backends(engine) or backend in BACKEND_NAMES


# ------------------------------------------------------------------------------------------------
# TensorRT-LLM's backend for a model on a release.


@dataclass(frozen=True)
class TrtllmFacts:
    version: str
    has_executor: bool  # tensorrt_llm.bindings.executor.Executor exists (gone after 1.2: PRs 15918/16369)

    @property
    def series(self) -> tuple[int, int]:
        parts = re.match(r"^(\d+)\.(\d+)", self.version)
        return (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)

    def has(self, entry: EngineEntry) -> bool:
        """Whether this release runs ``entry``."""
        return self.series >= entry.since and (self.has_executor or not entry.needs_executor)


def choose_backend(backend: str, facts: TrtllmFacts, artifact: str, quantize: str | None = None) -> tuple[str, str]:
    """Pure: which TensorRT-LLM backend serves ``artifact`` (the model's kind, ``lmi_trt.sources``) and a sentence
    saying why; a combination the release cannot serve is a ``StartupError`` naming option.backend. Since 1.0 the
    LLM API's default backend is PyTorch (NVIDIA/TensorRT-LLM, tensorrt_llm/llmapi/llm.py, 1.0.0); after 1.2 the
    TensorRT-engine Executor is gone (PRs 15918, 16369). ``quantize`` (option.quantize): the PyTorch backend loads
    modelopt's FP8, FP8 KV and AWQ checkpoints (``lmi_trt.compile.hf_quant``); the other formats need a TensorRT
    engine."""
    v = facts.version
    pytorch_ok = facts.has(PYTORCH)
    engine_only = quantize is not None and not PYTORCH.loads(QUANTIZE_NAMES.get(quantize))
    if engine_only and (backend == PYTORCH.backend or not facts.has(TENSORRT)):
        raise StartupError(
            "option.quantize",
            quantize,
            "a TensorRT-engine format, and "
            + (
                "option.backend=pytorch"
                if backend == PYTORCH.backend
                else f"TensorRT-LLM {v} has no TensorRT-engine Executor"
            )
            + " loads modelopt's FP8, FP8 KV-cache and AWQ checkpoints only",
            "use fp8, fp8_kv or awq, serve a checkpoint quantized beforehand without option.quantize, "
            "or set option.backend=tensorrt on a 0.12-1.2 image",
        )
    engine = artifact == "trtllm_engine"
    if backend == PYTORCH.backend:
        if not pytorch_ok:
            raise StartupError(
                "option.backend",
                backend,
                f"TensorRT-LLM {v} has no PyTorch LLM API (it starts at 1.0)",
                "set option.backend=tensorrt (or auto), or use a TensorRT-LLM 1.0+ image",
            )
        if engine:
            raise StartupError(
                "option.backend",
                backend,
                "the model is a precompiled TensorRT engine folder, which only the tensorrt backend loads",
                "set option.backend=tensorrt (or auto), or point option.model_id at the Hugging Face checkpoint",
            )
        return PYTORCH.backend, "option.backend=pytorch"
    if backend == TENSORRT.backend or engine or not pytorch_ok or engine_only:
        if not facts.has(TENSORRT):
            what = (
                "option.backend=tensorrt"
                if backend == TENSORRT.backend
                else "auto: a precompiled TensorRT engine folder"
            )
            raise StartupError(
                "option.backend",
                backend,
                f"{what} needs the TensorRT-engine Executor, and TensorRT-LLM {v} has none (removed after 1.2)",
                "serve the Hugging Face checkpoint with option.backend=pytorch (or auto), or use a "
                "TensorRT-LLM 0.12-1.2 image",
            )
        if backend == TENSORRT.backend:
            return TENSORRT.backend, "option.backend=tensorrt"
        if engine:
            return TENSORRT.backend, f"auto: a precompiled TensorRT engine folder (TensorRT-LLM {v})"
        if not pytorch_ok:
            return TENSORRT.backend, f"auto: TensorRT-LLM {v} has no PyTorch LLM API (1.0+)"
        return TENSORRT.backend, f"auto: option.quantize={quantize} is a TensorRT-engine format"
    if not facts.has(TENSORRT):
        return (
            PYTORCH.backend,
            f"auto: TensorRT-LLM {v} has no TensorRT-engine Executor; the PyTorch LLM API is its only path",
        )
    return PYTORCH.backend, f"auto: a Hugging Face checkpoint on TensorRT-LLM {v}, whose default backend is PyTorch"
