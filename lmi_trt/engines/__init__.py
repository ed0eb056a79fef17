"""Engine selection and construction: (config, artifact, tokenizer facts) → an Engine."""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from lmi_trt.engines.base import Engine
from lmi_trt.engines.registry import ENGINES

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


__all__ = ["Engine", "EngineKind", "HostFacts", "probe_host", "choose_engine"]
