"""Engine selection: which engine serves (``choose_engine``), and the host probes it decides from.

The facts it decides by, and TensorRT-LLM's backend choice (``choose_backend``), are the registry's
(``lmi_trt.engines.registry``); building an engine from the configuration is ``lmi_trt.stages``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from lmi_trt.engines.base import Engine
from lmi_trt.engines.registry import AUTO_ORDER, ENGINE_NAMES, TrtllmFacts, choose_backend, entry

log = logging.getLogger(__name__)

EngineKind = str  # an option.rolling_batch value: lmi_trt.engines.registry.ENGINE_NAMES


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
    """Pure: the engine to run and a sentence saying why (logged at startup); ``auto`` takes the first engine of
    ``AUTO_ORDER`` the host can run."""
    if rolling_batch in ENGINE_NAMES:
        return rolling_batch, f"option.rolling_batch={rolling_batch}"
    runs = host.trtllm_importable and host.gpu_count > 0
    kind = next(name for name in AUTO_ORDER if runs or not entry(name).needs_trtllm_gpu)
    if runs:
        return kind, f"auto: tensorrt_llm is importable and {host.gpu_count} GPU(s) are visible"
    missing = []
    if not host.trtllm_importable:
        missing.append("tensorrt_llm is not installed")
    if host.gpu_count == 0:
        missing.append("no GPU is visible")
    return kind, "auto: " + " and ".join(missing) + f"; using the embedded {kind} engine"


def probe_trtllm() -> TrtllmFacts:
    """Side-effecting probe, kept at the edge: the installed TensorRT-LLM's version and Executor binding."""
    import tensorrt_llm

    try:
        from tensorrt_llm.bindings import executor
    except ImportError:
        executor = None
    return TrtllmFacts(str(getattr(tensorrt_llm, "__version__", "")), hasattr(executor, "Executor"))


__all__ = [
    "Engine",
    "EngineKind",
    "HostFacts",
    "TrtllmFacts",
    "choose_backend",
    "choose_engine",
    "probe_host",
    "probe_trtllm",
]
