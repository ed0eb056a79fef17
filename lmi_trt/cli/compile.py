"""``lmi-trt compile --output DIR|s3://bucket/prefix`` downloads the model, builds every rank on this host's GPUs
and writes a self-describing precompiled artifact that ``serve`` loads as it is (on the pytorch backend: the
calibrated checkpoint of option.quantize)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, Any

from lmi_trt.compile.errors import BuildError, CacheError, PlanError
from lmi_trt.compile.probe import detect_gpu, detect_trtllm_version
from lmi_trt.engines.registry import COMPILING_ENGINE, entries, entry

from .flags import add_config_flags, fitted_job, load_compile_job
from .target import add_target_flags, checkpoint_backend, release_facts, target_gpu

if TYPE_CHECKING:
    from lmi_trt.compile.jit import CompileJob

log = logging.getLogger(__name__)


def add_parser(subparsers: Any) -> None:
    comp = subparsers.add_parser("compile", help="build the TensorRT-LLM engine ahead of time into a folder or s3://")
    add_config_flags(comp)
    comp.add_argument(
        "--output",
        required=True,
        metavar="DIR|s3://bucket/prefix",
        help="a new folder, or an s3:// prefix to upload the artifact to",
    )
    add_target_flags(comp, for_compile=True)
    comp.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    from lmi_trt.sources import SourceError

    try:
        config, job = load_compile_job(args)
        version = detect_trtllm_version()
        if version is None:
            raise PlanError(
                "tensorrt_llm",
                None,
                "TensorRT-LLM is not installed on this host",
                "Run `lmi-trt compile` in the lmi-trt TensorRT-LLM image on a GPU of the target type",
            )
        made = (_calibrate if _calibrates_only(config, version) else _build)(args, config, job, version)
    except (PlanError, SourceError, ValueError, CacheError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code if isinstance(e, BuildError) else 2  # 1: the build itself failed; 2: its input
    print(made)
    return 0


def _build(args: argparse.Namespace, config: Any, job: CompileJob, version: str) -> str:
    """The TensorRT engine, for the GPU of this host (or the one the --gpu* flags name when there is none)."""
    from lmi_trt.compile.cache import check_output
    from lmi_trt.compile.jit import compile_to
    from lmi_trt.config import speculation, with_draft_model
    from lmi_trt.sources import resolve_draft_model, resolve_model

    detected = detect_gpu()
    flags = any(v is not None for v in (args.gpu, args.gpu_sm, args.gpu_memory_gib, args.gpu_count))
    if detected is not None and flags:
        raise PlanError(
            "--gpu",
            args.gpu or args.gpu_sm,
            f"this host has {detected.count}× {detected.name}; engines are built for the GPU they are built on",
            "Remove the --gpu* flags",
        )
    if detected is None and not flags:
        raise PlanError("--gpu", None, "no GPU detected", "Run on the target GPU type")
    gpu, _ = target_gpu(args, detected)
    check_output(args.output)
    artifact = resolve_model(config)
    spec = speculation(config)
    if spec is not None and spec.method == "medusa":
        # the heads are built into the engine: fetched first, as serve does
        config = with_draft_model(config, resolve_draft_model(config))  # type: ignore[arg-type]  # Medusa has heads
    config, job = fitted_job(config, artifact.hf_config)
    prepared = compile_to(
        job, artifact, args.output, gpu=gpu, trtllm_version=version, progress=lambda msg: log.info("compile: %s", msg)
    )
    return (
        f"compiled {artifact.model_id} → {args.output} (TP {prepared.plan.tp_size} × PP {prepared.plan.pp_size}, "
        f"{prepared.plan.dtype}); serve it with option.model_id={args.output}"
    )


def _calibrates_only(config: Any, version: str) -> bool:
    """``lmi-trt compile`` builds a TensorRT engine, except where serving would take the pytorch backend without
    one: chosen (option.backend=pytorch), or the only one left (a release without the Executor). There the
    artifact made ahead of time is the calibrated checkpoint of option.quantize."""
    backend, _ = checkpoint_backend(config, version)  # a combination the release cannot serve: StartupError
    served, facts = entry(COMPILING_ENGINE, backend), release_facts(version)
    builders = [e for e in entries(COMPILING_ENGINE) if e.builds_engine and facts.has(e)]
    return not served.builds_engine and (config.backend == served.backend or not builders)


def _calibrate(args: argparse.Namespace, config: Any, job: CompileJob, version: str) -> str:
    """The pytorch backend's artifact: option.quantize's calibrated checkpoint (there is no engine to build)."""
    from lmi_trt import stages
    from lmi_trt.compile.hf_quant import quantize_to
    from lmi_trt.sources import resolve_model

    if config.quantize is None:
        raise PlanError(
            "option.quantize",
            None,
            "the pytorch backend loads the Hugging Face checkpoint itself: there is no engine to compile",
            "Set option.quantize (fp8, fp8_kv or awq) to calibrate a checkpoint ahead of time, or "
            "option.backend=tensorrt to build an engine on a 0.12-1.2 image",
        )
    artifact = resolve_model(config)
    quant = quantize_to(
        stages.quantize_job(config),
        artifact,
        args.output,
        trtllm_version=version,
        progress=lambda msg: log.info("compile: %s", msg),
    )
    return (
        f"calibrated {artifact.model_id} → {args.output} ({quant.quant_algo}, a modelopt Hugging Face checkpoint "
        f"for the pytorch backend); serve it with option.model_id={args.output}, without option.quantize"
    )
