"""The compile stage as the serve and compile commands use it: a ``CompileJob`` + artifact → engine folder.

The job is built from the configuration in one place (``lmi_trt.stages.compile_job``);
nothing here reads the configuration.

``prepare_plan`` is the planning half (no weights needed), ``ensure_engine`` the JIT path through
the engine cache, ``compile_to`` the ahead-of-time path into a folder or ``s3://`` prefix.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from lmi_trt.sources import ModelArtifact, detect_artifact

from .archs import checkpoint_as_hf_config
from .build import BuildSettings, Progress, build_engine
from .cache import CacheKeyInputs, EngineCache, check_output, open_cache, publish_to
from .errors import PlanError
from .options import CompileOptions
from .plan import BuildPlan, GpuFacts, MemoryEstimate, check_fits, estimate_memory, make_checkpoint_plan, make_plan
from .probe import detect_gpu, detect_trtllm_version

log = logging.getLogger(__name__)


class CompileJob(BaseModel):
    """Everything the compile stage reads: the planner's options and how a build runs and is cached."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    options: CompileOptions
    kv_cache_fraction: float  # option.kv_cache_free_gpu_mem_fraction (the memory estimate's KV share)
    timeout_s: float  # option.compile_timeout
    workers: int | None  # option.num_engine_workers
    load_by_shard: bool  # option.load_by_shard
    checkpoint_dir: Path | None  # option.trtllm_checkpoint_path
    cache_uri: str | None  # option.engine_cache_uri
    download_dir: Path  # download_dir (the local engine cache lives under it)
    properties: dict[str, Any]  # compile-time keys → values, written next to the engine


@dataclass(frozen=True)
class PreparedPlan:
    plan: BuildPlan
    memory: MemoryEstimate
    gpu: GpuFacts


def prepare_plan(
    job: CompileJob,
    model_config: dict[str, Any],
    gpu: GpuFacts,
    trtllm_version: str,
    *,
    checkpoint: bool = False,
    require_fit: bool = True,
) -> PreparedPlan:
    """Plan + memory estimate; raises ``PlanError`` for anything that cannot work (not fitting too, if asked).

    ``model_config`` is the HF config.json, or with ``checkpoint`` a TensorRT-LLM checkpoint's.
    """
    plan = (make_checkpoint_plan if checkpoint else make_plan)(job.options, model_config, gpu, trtllm_version)
    hf_config = checkpoint_as_hf_config(model_config) if checkpoint else model_config
    memory = estimate_memory(plan, hf_config, gpu, kv_fraction=job.kv_cache_fraction)
    if require_fit:
        check_fits(plan, memory)
    return PreparedPlan(plan, memory, gpu)


def _host_gpu() -> GpuFacts:
    gpu = detect_gpu()
    if gpu is None:
        raise PlanError(
            "GPU",
            None,
            "no GPU is visible, and TensorRT-LLM engines are built on the GPU they run on",
            "Run on a GPU host, or serve with option.rolling_batch=torch",
        )
    return gpu


def _host_trtllm() -> str:
    version = detect_trtllm_version()
    if version is None:
        raise PlanError(
            "tensorrt_llm",
            None,
            "TensorRT-LLM is not installed on this host",
            "Use the lmi-trt TensorRT-LLM image, or serve with option.rolling_batch=torch",
        )
    return version


def _settings(job: CompileJob, gpu: GpuFacts) -> BuildSettings:
    return BuildSettings(
        timeout_s=job.timeout_s,
        workers=job.workers,
        gpu_count=gpu.count,
        load_by_shard=job.load_by_shard,
        checkpoint_dir=job.checkpoint_dir,
    )


def model_config_of(artifact: ModelArtifact) -> tuple[dict[str, Any], bool]:
    """(config.json, whether it is a TensorRT-LLM checkpoint's) of a compilable artifact."""
    if artifact.kind == "trtllm_checkpoint":
        return json.loads((artifact.path / "config.json").read_text()), True
    if artifact.kind != "hf_checkpoint" or artifact.hf_config is None:
        raise PlanError(
            "option.model_id",
            artifact.model_id,
            f"is a {artifact.kind.replace('_', ' ')}, not a Hugging Face or TensorRT-LLM checkpoint to compile",
            "Point option.model_id at the HF model (an engine folder is served as it is)",
        )
    return artifact.hf_config, False


def ensure_engine(
    job: CompileJob,
    artifact: ModelArtifact,
    *,
    gpu: GpuFacts | None = None,
    trtllm_version: str | None = None,
    cache: EngineCache | None = None,
    progress: Progress | None = None,
) -> ModelArtifact:
    """JIT: the engine for ``artifact`` from the cache, built (once across replicas) when missing."""
    model_config, checkpoint = model_config_of(artifact)
    gpu = gpu or _host_gpu()
    prepared = prepare_plan(job, model_config, gpu, trtllm_version or _host_trtllm(), checkpoint=checkpoint)
    plan = prepared.plan
    for note in plan.notes + prepared.memory.notes:
        log.info("plan: %s", note)
    cache = cache or open_cache(job.cache_uri, job.download_dir, job.timeout_s)
    inputs = CacheKeyInputs.from_plan(artifact.fingerprint, plan, gpu)

    def build(out: Path) -> None:
        build_engine(
            plan,
            artifact.path,
            out,
            settings=_settings(job, gpu),
            tokenizer_dir=artifact.tokenizer_dir,
            properties=job.properties,
            progress=progress,
        )

    result = cache.get_or_build(inputs, build, model_id=artifact.model_id)
    log.info("engine for %s: %s (%s, key %s)", artifact.model_id, result.path, result.source, result.key[:12])
    return detect_artifact(result.path, model_id=artifact.model_id, source=artifact.source, fingerprint=result.key)


def compile_to(
    job: CompileJob,
    artifact: ModelArtifact,
    output: str,
    *,
    gpu: GpuFacts,
    trtllm_version: str,
    client: Any = None,
    progress: Progress | None = None,
) -> PreparedPlan:
    """AOT: build into ``output`` (a new folder, or an ``s3://`` prefix), a self-describing artifact."""
    check_output(output)
    model_config, checkpoint = model_config_of(artifact)
    prepared = prepare_plan(job, model_config, gpu, trtllm_version, checkpoint=checkpoint)
    plan = prepared.plan

    def build(out: Path) -> None:
        build_engine(
            plan,
            artifact.path,
            out,
            settings=_settings(job, gpu),
            tokenizer_dir=artifact.tokenizer_dir,
            properties=job.properties,
            progress=progress,
        )

    publish_to(output, build, CacheKeyInputs.from_plan(artifact.fingerprint, plan, gpu), artifact.model_id, client)
    return prepared
