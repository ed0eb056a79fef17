"""The load path, stage by stage: config → sources → (compile) → engine, as one coroutine.

Each stage hands a plain value to the next; nothing here reads the environment.
"""

from __future__ import annotations

import asyncio
import logging

from lmi_trt.config import LmiConfig
from lmi_trt.engines import EngineKind, default_batch_size
from lmi_trt.engines.base import Engine, EngineError
from lmi_trt.launch import LaunchPlan, Placement, build_copies, trtllm_copy_settings
from lmi_trt.serving.app import LoadedModel
from lmi_trt.serving.tokenizer import load_tokenizer, tokenizer_facts
from lmi_trt.sources import ModelArtifact, resolve_model, resolve_tokenizer

log = logging.getLogger(__name__)


def build_engine(kind: EngineKind, config: LmiConfig, artifact: ModelArtifact, tokenizer,
                 placement: Placement | None = None) -> Engine:
    """Construct (not start) the engine for an artifact; mismatches are user errors.

    ``placement`` (from the launch plan) puts one model copy on its GPUs: ``cuda:i`` for torch,
    an orchestrator-mode Executor with ``device_ids`` for trtllm.
    """
    batch = default_batch_size(kind, config.max_rolling_batch_size)
    eos = _eos_ids(tokenizer, artifact)
    if kind == "synthetic":
        from lmi_trt.engines.synthetic import SyntheticEngine

        return SyntheticEngine(
            len(tokenizer),
            tokens_per_second=config.synthetic_tokens_per_second or None,
            max_batch_size=batch,
            max_input_len=config.max_input_len,
            max_new_tokens=config.max_output_len,
            special_token_ids=tuple(tokenizer.all_special_ids),
        )
    if kind == "torch":
        if artifact.kind != "hf_checkpoint":
            raise EngineError(
                f"option.model_id={artifact.model_id!r} is a {artifact.kind.replace('_', ' ')}, which only the "
                "trtllm engine can serve; the torch engine needs a Hugging Face checkpoint "
                "(install TensorRT-LLM on a GPU host, or point option.model_id at the HF model)",
                code=400,
            )
        from lmi_trt.engines.torch import TorchEngine

        return TorchEngine(
            artifact.path,
            dtype=config.dtype,
            device=(placement.torch_device if placement else None) or config.device,
            max_batch_size=batch,
            max_input_len=config.max_input_len,
            max_new_tokens=config.max_output_len,
            trust_remote_code=config.trust_remote_code,
            eos_token_ids=eos,
            pad_token_id=tokenizer.pad_token_id,
            max_num_tokens=config.max_num_tokens,
            batching=config.torch_batching,
            decode_loop=config.torch_decode_loop,
        )
    from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings

    if artifact.kind != "trtllm_engine":
        raise EngineError(f"internal: {artifact.model_id!r} reached the engine stage uncompiled ({artifact.kind})")
    settings = TrtllmSettings.from_config(config, max_batch_size=batch)
    if placement is not None and placement.orchestrator:
        settings = trtllm_copy_settings(settings, placement)
    return TrtllmEngine(artifact.engine_dir, settings, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id)


def _eos_ids(tokenizer, artifact: ModelArtifact) -> list[int]:
    """The tokenizer's and generation_config.json's EOS ids (Llama 3 lists several), plus any
    that only config.json names."""
    ids = list(tokenizer_facts(tokenizer, artifact.path).eos_token_ids)
    configured = (artifact.hf_config or {}).get("eos_token_id")
    for i in configured if isinstance(configured, list) else [configured]:
        if isinstance(i, int) and i not in ids:
            ids.append(i)
    return ids


def compile_if_needed(kind: EngineKind, config: LmiConfig, artifact: ModelArtifact) -> ModelArtifact:
    """The JIT stage: a checkpoint served by trtllm becomes an engine (from the cache, or built once)."""
    if kind != "trtllm" or artifact.kind == "trtllm_engine":
        return artifact
    from lmi_trt.compile.jit import ensure_engine

    return ensure_engine(config, artifact, progress=lambda msg: log.info("compile: %s", msg))


async def load_model(config: LmiConfig, kind: EngineKind, plan: LaunchPlan | None = None) -> LoadedModel:
    """``plan`` (``lmi_trt.launch.plan_launch``) with several copies gives a ``ReplicaSet`` of engines."""
    artifact = await asyncio.to_thread(resolve_model, config)
    log.info("model %s resolved: %s from %s at %s", artifact.model_id, artifact.kind, artifact.source, artifact.path)
    artifact = await asyncio.to_thread(compile_if_needed, kind, config, artifact)
    tok_dir = await asyncio.to_thread(resolve_tokenizer, config, artifact)
    tokenizer = await asyncio.to_thread(load_tokenizer, tok_dir, config.trust_remote_code)
    engine = build_copies(plan, lambda placement: build_engine(kind, config, artifact, tokenizer, placement))
    await asyncio.wait_for(engine.start(), timeout=config.model_loading_timeout)
    log.info("engine %s ready: %s", engine.name, engine.limits)
    return LoadedModel(engine=engine, tokenizer=tokenizer)
