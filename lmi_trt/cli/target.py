"""What ``plan`` and ``compile`` share: the GPU to plan or build for (this host's, or the one the --gpu*
flags name) and the TensorRT-LLM backend ``serve`` would pick on a release."""

from __future__ import annotations

import argparse
from typing import Any

from lmi_trt.compile.plan import GpuFacts
from lmi_trt.compile.probe import GPU_PRESETS

# What `plan` assumes when neither a GPU nor --gpu* flags say otherwise.
DEFAULT_PLAN_GPU = "h100"
DEFAULT_PLAN_TRTLLM_VERSION = "1.0.0"


def add_target_flags(p: argparse.ArgumentParser, *, for_compile: bool) -> None:
    g = p.add_argument_group(
        "target GPU"
        + (
            " (only when this host's GPU cannot be detected)"
            if for_compile
            else " (default: the GPUs of this host, else --gpu h100)"
        )
    )
    g.add_argument("--gpu", choices=sorted(GPU_PRESETS), help="a known GPU model")
    g.add_argument("--gpu-sm", type=int, metavar="N", help="compute capability × 10 (H100: 90, L4: 89, A100: 80)")
    g.add_argument("--gpu-memory-gib", type=float, metavar="N", help="memory of one GPU in GiB")
    g.add_argument("--gpu-count", type=int, metavar="N", help="GPUs on the host")
    if not for_compile:
        p.add_argument(
            "--trtllm-version",
            metavar="V",
            help=f"plan for this TensorRT-LLM (default: the installed one, else {DEFAULT_PLAN_TRTLLM_VERSION})",
        )


def target_gpu(
    args: argparse.Namespace, detected: GpuFacts | None, wanted_count: int = 1
) -> tuple[GpuFacts, str | None]:
    """The GPU to plan for and, when it is an assumption rather than this host's, a sentence saying so.

    A preset (or the default one) comes with as many GPUs as the configuration asks for
    (``wanted_count``) unless ``--gpu-count`` says otherwise.
    """
    overrides = {
        k: v
        for k, v in (("sm", args.gpu_sm), ("memory_gib", args.gpu_memory_gib), ("count", args.gpu_count))
        if v is not None
    }
    if args.gpu:
        base, why = GPU_PRESETS[args.gpu], f"--gpu {args.gpu}"
    elif detected is not None:
        base, why = detected, None
    else:
        base, why = GPU_PRESETS[DEFAULT_PLAN_GPU], f"no GPU detected; assuming --gpu {DEFAULT_PLAN_GPU}"
    if base is not detected:
        base = base.model_copy(update={"count": wanted_count})
    gpu = base.model_copy(update=overrides)
    if overrides and why is None:
        why = "this host's GPU with " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return gpu, why


def checkpoint_backend(config: Any, version: str) -> tuple[str, str]:
    """Pure: the TensorRT-LLM backend ``serve`` would pick for a Hugging Face checkpoint on ``version``, and why."""
    from lmi_trt.engines import choose_backend

    return choose_backend(
        config.backend,
        release_facts(version),
        "hf_checkpoint",
        config.quantize.value if config.quantize is not None else None,
    )


def release_facts(version: str) -> Any:
    """A release's ``TrtllmFacts`` as planned for: the Executor binding up to 1.2 (NVIDIA/TensorRT-LLM PRs 15918
    and 16369 removed it after)."""
    from lmi_trt.engines import TrtllmFacts

    return TrtllmFacts(version, has_executor=TrtllmFacts(version, True).series <= (1, 2))
