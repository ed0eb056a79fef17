"""The load path, stage by stage: config → sources → (compile) → engine, as one coroutine.

Each stage hands a plain value to the next; nothing here reads the environment.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import logging
from pathlib import Path
from typing import Any

from lmi_trt import reasoning_parsers, stages
from lmi_trt.config import LmiConfig, with_draft_model
from lmi_trt.engines import EngineKind
from lmi_trt.engines.registry import entry
from lmi_trt.errors import StartupError
from lmi_trt.launch import LaunchPlan, build_copies
from lmi_trt.serving.chat import template_text
from lmi_trt.serving.core import LoadedModel
from lmi_trt.serving.tokenizer import load_tokenizer, tokenizer_facts
from lmi_trt.sources import (
    ModelArtifact,
    peek,
    resolve_adapter,
    resolve_draft_model,
    resolve_model,
    resolve_tokenizer,
    startup_adapters,
)

log = logging.getLogger(__name__)


def _eos_ids(tokenizer, artifact: ModelArtifact) -> list[int]:
    """The tokenizer's and generation_config.json's EOS ids (Llama 3 lists several), plus any
    that only config.json names."""
    ids = list(tokenizer_facts(tokenizer, artifact.path).eos_token_ids)
    configured = (artifact.hf_config or {}).get("eos_token_id")
    for i in configured if isinstance(configured, list) else [configured]:
        if isinstance(i, int) and i not in ids:
            ids.append(i)
    return ids


def _model_config(artifact: Any) -> dict | None:
    """The model's sizes, as a Hugging Face config: its config.json, or a TensorRT-LLM engine's pretrained_config
    (``head_size`` is its head_dim: tensorrt_llm/models/modeling_utils.py PretrainedConfig)."""
    if artifact.hf_config is not None or artifact.engine_dir is None:
        return artifact.hf_config
    engine = Path(artifact.engine_dir) / "config.json"
    pretrained = json.loads(engine.read_text()).get("pretrained_config") if engine.is_file() else None
    return {**pretrained, "head_dim": pretrained.get("head_size")} if pretrained else None


async def load_model(config: LmiConfig, kind: EngineKind, plan: LaunchPlan | None = None) -> LoadedModel:
    """``plan`` (``lmi_trt.launch.plan_launch``) with several copies gives a ``ReplicaSet`` of engines."""
    artifact = await asyncio.to_thread(resolve_model, config)
    log.info("model %s resolved: %s from %s at %s", artifact.model_id, artifact.kind, artifact.source, artifact.path)
    config = stages.resolve(config, kind, lambda: artifact, plan)
    served = entry(kind, config.backend)
    draft = await asyncio.to_thread(resolve_draft_model, config)
    if draft is not None:
        log.info("speculative decoding's draft model resolved to %s", draft)
        config = with_draft_model(config, draft)
        config = await asyncio.to_thread(stages.compile_draft_if_needed, served, config)
    artifact = await asyncio.to_thread(stages.compile_if_needed, served, config, artifact)
    tok_dir = await asyncio.to_thread(resolve_tokenizer, config, artifact)
    tokenizer = await asyncio.to_thread(
        load_tokenizer, tok_dir, config.trust_remote_code, slow=config.tokenizer_mode == "slow"
    )
    check_reasoning(config, tokenizer)
    eos = _eos_ids(tokenizer, artifact)
    # One engine per copy of the launch plan (a placement puts it on its GPUs), constructed by the wiring.
    engine = build_copies(
        plan,
        lambda placement: stages.build_engine(served, config, artifact, tokenizer, eos, placement),
        parallel=config.parallel_loading,
    )
    await asyncio.wait_for(engine.start(), timeout=config.model_loading_timeout)
    log.info("engine %s ready: %s", engine.name, engine.limits)
    adapter_source = functools.partial(resolve_adapter, config) if config.enable_lora else None
    if adapter_source is not None:  # DJL's adapters/ folder: every adapter in it, registered at start-up
        for name, folder in await asyncio.to_thread(startup_adapters, config, artifact):
            await engine.register_adapter(name, folder, folder)
    refusing = [name for name, c in engine.capabilities.features().items() if not c.honoured]
    if refusing:  # each with its reason at GET /v1/capabilities and in the 400 of a request that asks
        log.info("engine %s refuses requests for: %s (see GET /v1/capabilities)", engine.name, ", ".join(refusing))
    return LoadedModel(
        engine=engine,
        tokenizer=tokenizer,
        adapter_source=adapter_source,
        tokenizer_dir=tok_dir,
        model_config=_model_config(artifact),
    )


def check_reasoning(config: LmiConfig, tokenizer: Any) -> None:
    """option.enable_reasoning=true needs a reasoning parser: named, or the chat template's family's."""
    template = template_text(tokenizer, config.chat_template)
    if config.enable_reasoning and reasoning_parsers.chosen(config.reasoning_parser, True, template) is None:
        raise StartupError(
            "option.enable_reasoning",
            "true",
            "option.reasoning_parser is unset and the chat template is no reasoning family's known here",
            f"set option.reasoning_parser to one of {', '.join(reasoning_parsers.names())}",
        )


# ------------------------------------------------------------------------------------------------
# Preflight: what can be checked before anything is downloaded or loaded, so a mistake costs
# seconds and one line rather than a load, a traceback and a failed server.


def _check_engine_available(kind: EngineKind) -> None:
    if not entry(kind).needs_trtllm_gpu:
        return
    if importlib.util.find_spec("tensorrt_llm") is None:
        raise StartupError(
            "option.rolling_batch",
            kind,
            "TensorRT-LLM is not installed here",
            "run the TensorRT-LLM image (docker/Dockerfile), or set option.rolling_batch=torch "
            "(or auto) for the embedded torch engine",
        )
    from lmi_trt.engines import trtllm

    if not trtllm.cuda_available():  # the engine's own GPU probe (a test seam as well)
        raise StartupError(
            "option.rolling_batch",
            kind,
            "no CUDA GPU is visible, and TensorRT engines only run on one",
            "give the container GPUs (--gpus all, CUDA_VISIBLE_DEVICES), or set option.rolling_batch=torch (or auto)",
        )


def _check_device(config: LmiConfig, kind: EngineKind) -> None:
    """option.device=cuda for an engine that reads it needs a torch that sees a CUDA GPU (else its first tensor
    fails deep in the load with torch's own assertion)."""
    if config.device != "cuda" or "device" not in stages.honoured(entry(kind), stages.settle(config, kind)):
        return
    import torch

    if torch.cuda.is_available():
        return
    raise StartupError(
        "option.device",
        "cuda",
        f"this torch ({torch.__version__}) is a CPU build"
        if torch.version.cuda is None
        else f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) sees no CUDA GPU",
        "set option.device=cpu (or auto: a GPU when torch sees one), or install a CUDA build of torch "
        "(PyPI's Linux wheels) and give the process a GPU",
    )


def preflight(config: LmiConfig, kind: EngineKind) -> LmiConfig:
    """Everything checkable before loading, in seconds: the engine can run here, the model and
    tokenizer folders exist (or, offline, are in the hub cache), and the limits fit the model.
    Returns ``config`` resolved for the engine (``lmi_trt.stages.resolve``) as far as the model could be read:
    one not readable yet (S3, an uncached hub id) is resolved by ``load_model`` once downloaded."""
    _check_engine_available(kind)
    _check_device(config, kind)
    return stages.resolve(config, kind, lambda: peek(config))
