"""Side-effecting probes kept at the edge: which GPUs and which TensorRT-LLM this host has.

Nothing here imports ``tensorrt_llm`` when its package metadata answers: importing it initialises
MPI and CUDA, which the compile does in its worker processes instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import shutil
import subprocess

from .plan import GpuFacts

log = logging.getLogger(__name__)

# For `lmi-trt plan --gpu NAME` on a machine without the target GPU.
GPU_PRESETS: dict[str, GpuFacts] = {
    "t4": GpuFacts(name="Tesla T4", sm=75, memory_gib=15.0, count=1),
    "a10g": GpuFacts(name="NVIDIA A10G", sm=86, memory_gib=22.0, count=1),
    "l4": GpuFacts(name="NVIDIA L4", sm=89, memory_gib=22.0, count=1),
    "l40s": GpuFacts(name="NVIDIA L40S", sm=89, memory_gib=44.5, count=1),
    "a100-40gb": GpuFacts(name="NVIDIA A100-SXM4-40GB", sm=80, memory_gib=39.4, count=1),
    "a100-80gb": GpuFacts(name="NVIDIA A100-SXM4-80GB", sm=80, memory_gib=79.2, count=1),
    "h100": GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=79.1, count=1),
    "h200": GpuFacts(name="NVIDIA H200", sm=90, memory_gib=139.8, count=1),
}


def detect_gpu() -> GpuFacts | None:
    """The visible GPUs (through torch, which honours CUDA_VISIBLE_DEVICES), else nvidia-smi; None if none."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            props = torch.cuda.get_device_properties(0)
            return GpuFacts(
                name=props.name,
                sm=props.major * 10 + props.minor,
                memory_gib=props.total_memory / 1024**3,
                count=torch.cuda.device_count(),
            )
    except ImportError:
        pass
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("nvidia-smi failed: %s", e)
        return None
    rows = [[c.strip() for c in line.split(",")] for line in out.strip().splitlines() if line.strip()]
    if not rows:
        return None
    name, cap, mib = rows[0]
    major, _, minor = cap.partition(".")
    return GpuFacts(name=name, sm=int(major) * 10 + int(minor or 0), memory_gib=float(mib) / 1024, count=len(rows))


def detect_trtllm_version() -> str | None:
    """The installed TensorRT-LLM's version, or None when it is not installed."""
    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    import tensorrt_llm  # a source checkout or a test double without package metadata

    return str(tensorrt_llm.__version__)
