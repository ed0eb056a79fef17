"""``option.quantize`` on TensorRT-LLM's PyTorch backend: a calibrated Hugging Face checkpoint, once per replica set.

That backend builds no engine: its ``LLM`` loads pre-quantized checkpoints in nvidia-modelopt's unified Hugging Face
format (quantized weights with their scales, ``hf_quant_config.json`` and config.json's ``quantization_config``;
NVIDIA/TensorRT-LLM docs/source/features/quantization.md, "Running Pre-quantized Models"). So the stage here
calibrates the model with modelopt (the same calibration as the TensorRT-engine path, ``quant.calibrated_model``),
writes it with ``export_hf_checkpoint``, and keeps the result in the engine cache under the same rules as engines
(full key, lease, atomic publish): the first replica calibrates and uploads, the others download.

Formats: the ones that page lists for the PyTorch backend that lmi-trt's ``option.quantize`` names: FP8 per tensor
(``fp8``), with an FP8 KV cache (``fp8_kv``), and AWQ (``awq``: W4A16, or W4A8 with ``option.q_format=w4a8_awq``).
A checkpoint that is already quantized is served as it is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from lmi_trt.sources import ModelArtifact, detect_artifact
from lmi_trt.vocabulary import PYTORCH_QUANTIZATIONS, quantization_name

from .cache import CacheKeyInputs, EngineCache, check_output, open_cache, publish_to
from .errors import BuildError, PlanError
from .options import CompileOptions
from .quant import QuantPlan, calibrated_model, calibration_notes, calibration_plan, modelopt_fields

log = logging.getLogger(__name__)

# modelopt's file beside a unified HF checkpoint; config.json's quantization_config says the same in newer exports.
HF_QUANT_CONFIG = "hf_quant_config.json"
# The unified checkpoint fits any GPU and parallel layout the backend loads it on: the cache key has no GPU in it.
ANY_GPU = "any"


class QuantizeJob(BaseModel):
    """What the stage reads: the calibration options and where the result is cached."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    options: CompileOptions  # only its quantization and calibration fields are set (lmi_trt.stages.quantize_job)
    timeout_s: float  # option.compile_timeout: how long another replica's calibration is waited for
    cache_uri: str | None  # option.engine_cache_uri
    download_dir: Path  # download_dir (the local cache lives under it)


def already_quantized(hf_config: dict[str, Any], folder: Path | None = None) -> str | None:
    """The quantization a checkpoint already carries (modelopt's file beside it, or config.json's), or None."""
    if folder is not None and (folder / HF_QUANT_CONFIG).is_file():
        quant = json.loads((folder / HF_QUANT_CONFIG).read_text()).get("quantization", {})
        return str(quant.get("quant_algo") or "modelopt")
    config = hf_config.get("quantization_config")
    if isinstance(config, dict):
        return str(config.get("quant_algo") or config.get("quant_method") or "quantized")
    return None


def plan_hf_quant(opts: CompileOptions, carried: str | None) -> tuple[QuantPlan, list[str]]:
    """Pure: the calibration plan for ``option.quantize`` on the PyTorch backend, or a ``PlanError`` naming the key.
    ``carried``: the quantization the checkpoint already has (``already_quantized``)."""
    q = opts.quantize
    name = quantization_name(q)
    if q not in PYTORCH_QUANTIZATIONS:
        raise PlanError(
            "option.quantize",
            name,
            "the pytorch backend loads modelopt checkpoints in FP8, FP8 KV-cache and AWQ formats "
            "(TensorRT-LLM docs/source/features/quantization.md), not this one",
            "Use fp8, fp8_kv or awq, or set option.backend=tensorrt for the TensorRT-engine formats",
        )
    if carried is not None:
        raise PlanError(
            "option.quantize",
            name,
            f"the checkpoint is already quantized ({carried})",
            "Remove option.quantize: a quantized checkpoint is served as it is",
        )
    return QuantPlan(quantize=q, calibration=calibration_plan(opts), **modelopt_fields(opts)), calibration_notes(opts)


def checkpoint_dtype(hf_config: dict[str, Any]) -> str:
    """The dtype the exported checkpoint keeps its unquantized tensors in: the model's own (torch's name)."""
    dtype = hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16"
    return {"float16": "float16", "bfloat16": "bfloat16", "float32": "float32"}.get(str(dtype), "bfloat16")


def calibrate_and_export_hf(
    hf_dir: Path,
    out_dir: Path,
    quant: QuantPlan,
    hf_config: dict[str, Any],
    *,
    tokenizer_dir: Path | None,
    trust_remote_code: bool,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Calibrate with modelopt and write the unified HF checkpoint, with the tokenizer the LLM loads from it."""
    import torch
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import AutoTokenizer

    say = progress or (lambda msg: log.info("%s", msg))
    dtype = checkpoint_dtype(hf_config)
    model = calibrated_model(hf_dir, quant, dtype=dtype, trust_remote_code=trust_remote_code, say=say)
    say(f"quantize: exporting a {quant.quant_algo} Hugging Face checkpoint to {out_dir}")
    export_hf_checkpoint(model, dtype=getattr(torch, dtype), export_dir=out_dir)
    AutoTokenizer.from_pretrained(tokenizer_dir or hf_dir, trust_remote_code=trust_remote_code).save_pretrained(out_dir)
    written = json.loads((out_dir / HF_QUANT_CONFIG).read_text()).get("quantization", {})
    got = (written.get("quant_algo"), written.get("kv_cache_quant_algo"))
    if got != (quant.quant_algo, quant.kv_cache_quant_algo):
        raise BuildError(
            "quantize",
            f"modelopt exported quant_algo={got[0]}, kv_cache_quant_algo={got[1]}; the plan "
            f"wants {quant.quant_algo}, {quant.kv_cache_quant_algo}",
        )
    return out_dir


def cache_inputs(fingerprint: str, quant: QuantPlan, trtllm_version: str) -> CacheKeyInputs:
    import modelopt

    plan = {"export": "modelopt_hf", "modelopt": modelopt.__version__, **quant.model_dump(mode="json")}
    return CacheKeyInputs(
        fingerprint=fingerprint,
        plan=plan,
        trtllm_version=trtllm_version,
        gpu_sm=0,
        gpu_name=ANY_GPU,
        tp_size=1,
        pp_size=1,
    )


def ensure_quantized(
    job: QuantizeJob,
    artifact: ModelArtifact,
    *,
    trtllm_version: str,
    cache: EngineCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> ModelArtifact:
    """The calibrated checkpoint for ``artifact`` from the cache, calibrated (once across replicas) when missing."""
    quant, build = _planned_calibration(job, artifact, progress)
    cache = cache or open_cache(job.cache_uri, job.download_dir, job.timeout_s)
    result = cache.get_or_build(
        cache_inputs(artifact.fingerprint, quant, trtllm_version), build, model_id=artifact.model_id
    )
    log.info(
        "%s checkpoint for %s: %s (%s, key %s)",
        quant.quant_algo,
        artifact.model_id,
        result.path,
        result.source,
        result.key[:12],
    )
    return detect_artifact(result.path, model_id=artifact.model_id, source=artifact.source, fingerprint=result.key)


def quantize_to(
    job: QuantizeJob,
    artifact: ModelArtifact,
    output: str,
    *,
    trtllm_version: str,
    client: Any = None,
    progress: Callable[[str], None] | None = None,
) -> QuantPlan:
    """AOT (``lmi-trt compile`` on the pytorch backend): the calibrated checkpoint into ``output`` (a new folder or
    an ``s3://`` prefix), with the cache's manifest; served as a pre-quantized model."""
    check_output(output)
    quant, build = _planned_calibration(job, artifact, progress)
    publish_to(output, build, cache_inputs(artifact.fingerprint, quant, trtllm_version), artifact.model_id, client)
    return quant


def _planned_calibration(
    job: QuantizeJob, artifact: ModelArtifact, progress: Callable[[str], None] | None
) -> tuple[QuantPlan, Callable[[Path], None]]:
    """The plan (its notes logged) and the build that writes the calibrated checkpoint into a folder."""
    hf_config = artifact.hf_config or {}
    quant, notes = plan_hf_quant(job.options, already_quantized(hf_config, artifact.path))
    for note in notes:
        log.info("plan: %s", note)

    def build(out: Path) -> None:
        calibrate_and_export_hf(
            artifact.path,
            out,
            quant,
            hf_config,
            tokenizer_dir=artifact.tokenizer_dir,
            trust_remote_code=job.options.trust_remote_code,
            progress=progress,
        )

    return quant, build
