"""The load path, stage by stage: config → sources → (compile) → engine, as one coroutine.

Each stage hands a plain value to the next; nothing here reads the environment.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmi_trt.config import LmiConfig, StartupError, speculation, with_draft_model
from lmi_trt.engines import ArtifactKind, EngineKind, choose_backend, probe_trtllm, registry
from lmi_trt.engines.base import Engine
from lmi_trt.launch import LaunchPlan, Placement, build_copies
from lmi_trt.serving import reasoning_parsers
from lmi_trt.serving.chat import template_text
from lmi_trt.serving.core import LoadedModel
from lmi_trt.serving.tokenizer import load_tokenizer, tokenizer_facts
from lmi_trt.sources import ModelArtifact, hub_token, resolve_draft_model, resolve_model, resolve_tokenizer
from lmi_trt.sources.artifact import is_hf_config

log = logging.getLogger(__name__)


def build_engine(
    kind: EngineKind, config: LmiConfig, artifact: ModelArtifact, tokenizer, placement: Placement | None = None
) -> Engine:
    """Construct (not start) the engine for an artifact (``lmi_trt.engines.registry``); mismatches are
    user errors. ``placement`` (from the launch plan) puts one model copy on its GPUs."""
    return registry.build_engine(kind, config, artifact, tokenizer, _eos_ids(tokenizer, artifact), placement)


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
    """The JIT stage: a checkpoint served by trtllm's tensorrt backend becomes an engine (from the cache, or
    built once); the pytorch backend loads the checkpoint itself (``registry.compiles``), calibrated first
    with ``option.quantize`` (``registry.quantizes``: from the cache, or calibrated once)."""
    if registry.quantizes(kind, config) and artifact.kind == "hf_checkpoint":
        from lmi_trt.compile.hf_quant import ensure_quantized
        from lmi_trt.compile.probe import detect_trtllm_version

        return ensure_quantized(
            registry.quantize_job(config),
            artifact,
            trtllm_version=detect_trtllm_version() or "",
            progress=lambda msg: log.info("compile: %s", msg),
        )
    if not registry.compiles(kind, config) or artifact.kind == "trtllm_engine":
        return artifact
    from lmi_trt.compile.jit import ensure_engine

    return ensure_engine(registry.compile_job(config), artifact, progress=lambda msg: log.info("compile: %s", msg))


async def load_model(config: LmiConfig, kind: EngineKind, plan: LaunchPlan | None = None) -> LoadedModel:
    """``plan`` (``lmi_trt.launch.plan_launch``) with several copies gives a ``ReplicaSet`` of engines."""
    config = registry.settle(config, kind)
    artifact = await asyncio.to_thread(resolve_model, config)
    log.info("model %s resolved: %s from %s at %s", artifact.model_id, artifact.kind, artifact.source, artifact.path)
    if artifact.kind == "hf_checkpoint":  # a hub model preflight could not read before its download
        config = fit_lengths(config, artifact.hf_config, kind)
    if registry.ENGINES[kind].needs_trtllm_gpu:  # on TensorRT-LLM: preflight chose by what it could read;
        # the resolved folder decides
        config = with_backend(config, artifact.kind)
    if plan is not None and config.tensor_parallel_degree == "max" and not registry.compiles(kind, config):
        # DJL's default in its TensorRT-LLM image; the pytorch backend's LLM takes a count (a TensorRT engine
        # build resolves max itself, and a built engine states its own)
        config = config.derived(
            f"option.tensor_parallel_degree=max on {plan.gpu_count} GPU(s)", tensor_parallel_degree=plan.tensor_parallel
        )
    registry.refuse_ignored(kind, config)
    registry.check_release(kind, config)
    draft = await asyncio.to_thread(resolve_draft_model, config)
    if draft is not None:
        log.info("speculative decoding's draft model resolved to %s", draft)
        config = with_draft_model(config, draft)
    artifact = await asyncio.to_thread(compile_if_needed, kind, config, artifact)
    tok_dir = await asyncio.to_thread(resolve_tokenizer, config, artifact)
    tokenizer = await asyncio.to_thread(
        load_tokenizer, tok_dir, config.trust_remote_code, slow=config.tokenizer_mode == "slow"
    )
    check_reasoning(config, tokenizer)
    engine = build_copies(
        plan,
        lambda placement: build_engine(kind, config, artifact, tokenizer, placement),
        parallel=config.parallel_loading,
    )
    await asyncio.wait_for(engine.start(), timeout=config.model_loading_timeout)
    log.info("engine %s ready: %s", engine.name, engine.limits)
    refusing = [name for name, c in engine.capabilities.features().items() if not c.honoured]
    if refusing:  # each with its reason at GET /v1/capabilities and in the 400 of a request that asks
        log.info("engine %s refuses requests for: %s (see GET /v1/capabilities)", engine.name, ", ".join(refusing))
    return LoadedModel(engine=engine, tokenizer=tokenizer)


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

# Defaults of unset limits where the model has room for them (LmiConfig's field defaults).
_DEFAULT_INPUT = LmiConfig.model_fields["max_input_len"].default
_DEFAULT_OUTPUT = LmiConfig.model_fields["max_output_len"].default
# config.json keys stating the positions a model was trained for, in the order transformers'
# configurations use them (GPT-2: n_positions, ChatGLM/Qwen-1: seq_length).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length")


def model_positions(hf_config: Mapping[str, Any] | None) -> tuple[int, str] | None:
    """(positions, the config.json key stating them); multimodal configs keep them in text_config."""
    if not hf_config:
        return None
    for cfg in (hf_config, hf_config.get("text_config") or {}):
        for key in _POSITION_KEYS:
            if isinstance(cfg.get(key), int) and cfg[key] > 1:
                return cfg[key], key
    return None


def fit_lengths(config: LmiConfig, hf_config: Mapping[str, Any] | None, kind: EngineKind) -> LmiConfig:
    """Unset ``max_input_len`` / ``max_output_len`` follow the model's positions (as vLLM's
    ``max_model_len`` and TGI's ``max_total_tokens`` do): the defaults where they fit, else output
    a quarter of the positions and input the rest. Limits the user set that do not fit are a
    ``StartupError`` naming them (torch; the trtllm build plan checks them with RoPE scaling)."""
    found = model_positions(hf_config)
    if found is None or not registry.ENGINES[kind].uses_model:
        return config
    positions, key = found
    given = config.model_fields_set
    inp, out = config.max_input_len, config.max_output_len
    if "max_input_len" in given and inp >= positions:
        raise StartupError(
            "option.max_input_len",
            inp,
            f"the model has {positions} positions (config.json {key})",
            f"set it below {positions}, leaving room for option.max_output_len",
        )
    if "max_output_len" in given and out >= positions:
        raise StartupError(
            "option.max_output_len",
            out,
            f"the model has {positions} positions (config.json {key})",
            f"set it below {positions}, leaving room for the prompt",
        )
    if "max_output_len" not in given:
        out = (
            min(_DEFAULT_OUTPUT, positions - inp) if "max_input_len" in given else min(_DEFAULT_OUTPUT, positions // 4)
        )
    if "max_input_len" not in given:
        inp = min(_DEFAULT_INPUT, positions - out)
    if inp + out > positions and not registry.ENGINES[kind].compiles:  # a build plan checks with RoPE scaling
        raise StartupError(
            "option.max_input_len + option.max_output_len",
            f"{inp} + {out} = {inp + out}",
            f"exceeds the model's {positions} positions (config.json {key})",
            f"set them to fit, e.g. option.max_input_len={positions - positions // 4} "
            f"option.max_output_len={positions // 4}, or leave both unset to follow the model",
        )
    if (inp, out) == (config.max_input_len, config.max_output_len):
        return config
    log.info(
        "option.max_input_len=%d and option.max_output_len=%d follow the model's %d positions (config.json %s); "
        "set them to choose others",
        inp,
        out,
        positions,
        key,
    )
    return config.derived(f"the model's {positions} positions", max_input_len=inp, max_output_len=out)


def _local_folder(name: str, key: str) -> Path | None:
    """The folder ``name`` is, None for a hub id or s3:// URI; a path that cannot exist is an error."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise StartupError(key, name, "is a file", "name a folder holding the model (config.json and weights)")
    if name.startswith(("/", "./", "../", "~")):
        raise StartupError(key, name, f"no such folder ({path.resolve()})", "check the path")
    return None


def _hub_config(name: str, key: str, revision: str | None, token: str | None) -> Mapping[str, Any] | None:
    """config.json of a hub model from the local cache. A model not in the cache cannot load with HF_HUB_OFFLINE, nor
    where the hub cannot give it (one quick request), so either is an error now; else the download decides (None)."""
    if name.startswith("s3://"):
        return None
    from huggingface_hub import constants, try_to_load_from_cache

    from lmi_trt.sources.hf import hub_problem

    try:
        cached = try_to_load_from_cache(name, "config.json", revision=revision)
    except ValueError:  # not a valid repo id either
        cached = None
    if isinstance(cached, str):
        return _read_json(Path(cached))
    folder = Path(name).resolve()
    if not constants.HF_HUB_OFFLINE:
        found = hub_problem(name, revision, token)
        if found is None:
            return None
        problem, fix = found
        raise StartupError(key, name, f"no such local folder exists ({folder}), and {problem}", fix)
    raise StartupError(
        key,
        name,
        f"no such local folder exists ({folder}), and it is not a Hugging Face model in the local hub cache "
        "while HF_HUB_OFFLINE is set",
        "give an existing folder (./path or an absolute path), download the model beforehand "
        f"(`hf download {name}` with the same HF_HOME), or unset HF_HUB_OFFLINE",
    )


def _read_json(path: Path) -> Mapping[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the sources stage reports an unreadable config.json with its own message
    return data if isinstance(data, dict) else None


def _check_engine_available(kind: EngineKind) -> None:
    if not registry.ENGINES[kind].needs_trtllm_gpu:
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
    if config.device != "cuda" or "device" not in registry.honoured(kind, config):
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


def with_backend(config: LmiConfig, artifact_kind: ArtifactKind) -> LmiConfig:
    """``config`` with option.backend resolved for TensorRT-LLM as installed here (logged with its reason);
    a combination this release cannot serve is a StartupError naming option.backend."""
    quantize = config.quantize.value if config.quantize is not None else None
    backend, why = choose_backend(config.backend, probe_trtllm(), artifact_kind, quantize)
    log.info("TensorRT-LLM backend: %s (%s)", backend, why)
    return config if backend == config.backend else config.derived(why, backend=backend)


def preflight(config: LmiConfig, kind: EngineKind) -> LmiConfig:
    """Everything checkable before loading, in seconds: the engine can run here, the model and
    tokenizer folders exist (or, offline, are in the hub cache), and the limits fit the model.
    Returns ``config`` settled for the engine (``registry.settle``), unset limits following the model."""
    _check_engine_available(kind)
    config = registry.settle(config, kind)
    _check_device(config, kind)
    if not registry.ENGINES[kind].needs_trtllm_gpu or config.backend != "auto":  # else: once the backend is known
        registry.refuse_ignored(kind, config)
    if config.tokenizer_id is not None:
        tokenizer = _local_folder(config.tokenizer_id, "option.tokenizer_id")
        if tokenizer is None:
            _hub_config(config.tokenizer_id, "option.tokenizer_id", config.tokenizer_revision, hub_token(config))
    spec = speculation(config)
    if spec is not None and spec.draft_model is not None:  # found (or, offline, cached) like the model
        draft_key = spec.key("draft_model")
        if _local_folder(spec.draft_model, draft_key) is None:
            _hub_config(spec.draft_model, draft_key, None, hub_token(config))
    if not registry.ENGINES[kind].uses_model and config.model_id is None and config.model_dir is None:
        return config
    if config.model_id is None:
        folder = config.model_dir
        hf_config = _read_json(folder / "config.json") if folder is not None else None
    else:
        folder = _local_folder(config.model_id, "option.model_id")
        hf_config = (
            _read_json(folder / "config.json")
            if folder is not None
            else _hub_config(config.model_id, "option.model_id", config.revision, hub_token(config))
        )
    if registry.ENGINES[kind].needs_trtllm_gpu and hf_config is not None:  # on TensorRT-LLM, a model read
        # here decides the backend now; one not readable yet (S3, an uncached hub id) is decided by
        # load_model once resolved (pinning a guess here made an S3 engine folder a "checkpoint")
        config = with_backend(config, "trtllm_engine" if "build_config" in hf_config else "hf_checkpoint")
        registry.refuse_ignored(kind, config)
        registry.check_release(kind, config)
    if not is_hf_config(hf_config):  # a TensorRT-LLM engine folder states its own limits
        return config
    return fit_lengths(config, hf_config, kind)
