"""Engine selection and construction: (config, artifact, tokenizer facts) → an Engine."""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass
from typing import Literal

from lmi_trt.engines.base import Engine
from lmi_trt.engines.registry import ENGINES
from lmi_trt.vocabulary import PYTORCH_QUANTIZATIONS, QUANTIZE_NAMES

log = logging.getLogger(__name__)

EngineKind = str  # a key of lmi_trt.engines.registry.ENGINES


@dataclass(frozen=True)
class HostFacts:
    trtllm_importable: bool
    gpu_count: int


def probe_host() -> HostFacts:
    """Side-effecting probe, kept at the edge: is TensorRT-LLM importable, how many GPUs."""
    trtllm = importlib.util.find_spec("tensorrt_llm") is not None
    gpus = 0
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        pass
    return HostFacts(trtllm_importable=trtllm, gpu_count=gpus)


def choose_engine(rolling_batch: str, host: HostFacts) -> tuple[EngineKind, str]:
    """Pure: the engine to run and a sentence saying why (logged at startup)."""
    if rolling_batch in ENGINES:
        return rolling_batch, f"option.rolling_batch={rolling_batch}"
    if host.trtllm_importable and host.gpu_count > 0:
        return "trtllm", f"auto: tensorrt_llm is importable and {host.gpu_count} GPU(s) are visible"
    missing = []
    if not host.trtllm_importable:
        missing.append("tensorrt_llm is not installed")
    if host.gpu_count == 0:
        missing.append("no GPU is visible")
    return "torch", "auto: " + " and ".join(missing) + "; using the embedded torch engine"


# ----------------------------------------------------------------------------- TensorRT-LLM's backend

Backend = Literal["pytorch", "tensorrt"]
ArtifactKind = Literal["hf_checkpoint", "trtllm_engine"]


@dataclass(frozen=True)
class TrtllmFacts:
    version: str
    has_executor: bool  # tensorrt_llm.bindings.executor.Executor exists (gone after 1.2: PRs 15918/16369)

    @property
    def series(self) -> tuple[int, int]:
        parts = re.match(r"^(\d+)\.(\d+)", self.version)
        return (int(parts.group(1)), int(parts.group(2))) if parts else (0, 0)


def probe_trtllm() -> TrtllmFacts:
    """Side-effecting probe, kept at the edge: the installed TensorRT-LLM's version and Executor binding."""
    import tensorrt_llm

    try:
        from tensorrt_llm.bindings import executor
    except ImportError:
        executor = None
    return TrtllmFacts(str(getattr(tensorrt_llm, "__version__", "")), hasattr(executor, "Executor"))


def choose_backend(
    backend: str, facts: TrtllmFacts, artifact: ArtifactKind, quantize: str | None = None
) -> tuple[Backend, str]:
    """Pure: which TensorRT-LLM backend serves ``artifact`` and a sentence saying why; a combination the release
    cannot serve is a ``StartupError`` naming option.backend. Since 1.0 the LLM API's default backend is
    PyTorch (NVIDIA/TensorRT-LLM, tensorrt_llm/llmapi/llm.py, 1.0.0); after 1.2 the TensorRT-engine Executor is
    gone (PRs 15918, 16369). ``quantize`` (option.quantize): the PyTorch backend loads modelopt's FP8, FP8 KV and
    AWQ checkpoints (``lmi_trt.compile.hf_quant``); the other formats need a TensorRT engine."""
    from lmi_trt.config import StartupError  # here: the configuration imports this package (its registry)

    v = facts.version
    pytorch_ok = facts.series >= (1, 0)
    engine_only = quantize is not None and QUANTIZE_NAMES.get(quantize) not in PYTORCH_QUANTIZATIONS
    if engine_only and (backend == "pytorch" or not facts.has_executor):
        raise StartupError(
            "option.quantize",
            quantize,
            "a TensorRT-engine format, and "
            + (
                "option.backend=pytorch"
                if backend == "pytorch"
                else f"TensorRT-LLM {v} has no TensorRT-engine Executor"
            )
            + " loads modelopt's FP8, FP8 KV-cache and AWQ checkpoints only",
            "use fp8, fp8_kv or awq, serve a checkpoint quantized beforehand without option.quantize, "
            "or set option.backend=tensorrt on a 0.12-1.2 image",
        )
    engine = artifact == "trtllm_engine"
    if backend == "pytorch":
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
        return "pytorch", "option.backend=pytorch"
    if backend == "tensorrt" or engine or not pytorch_ok or engine_only:
        if not facts.has_executor:
            what = "option.backend=tensorrt" if backend == "tensorrt" else "auto: a precompiled TensorRT engine folder"
            raise StartupError(
                "option.backend",
                backend,
                f"{what} needs the TensorRT-engine Executor, and TensorRT-LLM {v} has none (removed after 1.2)",
                "serve the Hugging Face checkpoint with option.backend=pytorch (or auto), or use a "
                "TensorRT-LLM 0.12-1.2 image",
            )
        if backend == "tensorrt":
            return "tensorrt", "option.backend=tensorrt"
        if engine:
            return "tensorrt", f"auto: a precompiled TensorRT engine folder (TensorRT-LLM {v})"
        if not pytorch_ok:
            return "tensorrt", f"auto: TensorRT-LLM {v} has no PyTorch LLM API (1.0+)"
        return "tensorrt", f"auto: option.quantize={quantize} is a TensorRT-engine format"
    if not facts.has_executor:
        return (
            "pytorch",
            f"auto: TensorRT-LLM {v} has no TensorRT-engine Executor; the PyTorch LLM API is its only path",
        )
    return "pytorch", f"auto: a Hugging Face checkpoint on TensorRT-LLM {v}, whose default backend is PyTorch"


__all__ = [
    "ArtifactKind",
    "Backend",
    "Engine",
    "EngineKind",
    "HostFacts",
    "TrtllmFacts",
    "choose_backend",
    "choose_engine",
    "probe_host",
    "probe_trtllm",
]
