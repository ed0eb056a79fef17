"""The wiring: a configuration becomes each stage's settings, the compile jobs and the engine, here and only here.

Above the stages it wires (sources, compile, engines, launch) and below the two that run them: ``preflight``
and ``load_model`` (``lmi_trt.loader``) each call ``resolve`` once, which settles the configuration for the
engine in these steps, in order:

1. ``settle``: the engine's default batch where ``option.max_rolling_batch_size`` is unset;
2. ``with_backend``: TensorRT-LLM's backend, once the model's kind is known (``registry.choose_backend``);
3. with the launch plan, ``option.tensor_parallel_degree=max`` as a count for an entry that builds no engine;
4. ``refuse_ignored``: an option the chosen entry would not read is a ``StartupError`` naming it, and
   ``check_release``: what the installed TensorRT-LLM's LLM arguments lack or refuse, naming the option;
5. ``fit_lengths``: unset limits follow the model's positions (a Hugging Face config.json).

The settings views (``compile_options``, ``trtllm_settings``, ``llmapi_settings``, ``torch_settings``,
``synthetic_settings``) are built from a settled ``LmiConfig`` here and only here: every stage reads typed fields,
never the raw configuration, so a misspelt name is an ``AttributeError`` rather than a silent default. Each
registry entry's view and factory are its ``WIRING``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lmi_trt.compile.hf_quant import QuantizeJob, ensure_quantized
from lmi_trt.compile.jit import CompileJob, ensure_engine
from lmi_trt.compile.medusa import MedusaPlan, plan_heads
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.probe import detect_trtllm_version
from lmi_trt.config import speculation, with_draft_model
from lmi_trt.engines import probe_trtllm
from lmi_trt.engines.base import Engine, EngineError
from lmi_trt.engines.guided import GuideVocab
from lmi_trt.engines.llmapi import (
    LlmApiEngine,
    LlmApiSettings,
    llm_api_release,
    llm_configs,
    llm_plan,
    probe_llm_api,
)
from lmi_trt.engines.registry import (
    ENTRIES,
    PYTORCH,
    SYNTHETIC,
    TENSORRT,
    TORCH,
    EngineEntry,
    choose_backend,
    entry,
    has_backends,
    is_chosen,
)
from lmi_trt.engines.synthetic import SyntheticEngine
from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings
from lmi_trt.engines.trtllm_drafts import block_reuse, executor_drafts, with_draft_memory
from lmi_trt.engines.trtllm_medusa import built_draft_len, executor_medusa
from lmi_trt.engines.trtllm_speculation import executor_lookahead
from lmi_trt.errors import StartupError
from lmi_trt.keys import LmiConfig, reads
from lmi_trt.launch import LaunchPlan, Placement, trtllm_copy_settings
from lmi_trt.sources import ModelArtifact, ModelPeek, local_fingerprint, resolve_model
from lmi_trt.speculative import BUILD_MODES, JSON_KEY, Speculation, SpeculationError, not_here

log = logging.getLogger(__name__)


class TorchSettings(
    reads(
        "dtype",
        "device",
        "max_input_len",
        "trust_remote_code",
        "max_num_tokens",
        # The built-in decode loop's paged KV cache and prompt chunks (refused where that loop does not run).
        "enable_kv_cache_reuse",
        "max_tokens_in_paged_kv_cache",
        "tokens_per_block",
        "enable_chunked_context",
        "grammar_compile_timeout",
        # LoRA adapters (the built-in decode loop)
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
        max_new_tokens="max_output_len",
        batching="torch_batching",
        decode_loop="torch_decode_loop",
    )
):
    """The torch engine's settings: ``TorchEngine``'s keywords (tests/unit/test_arch_registry.py checks
    that they match), less the tokenizer facts and the placement the loader adds."""

    max_batch_size: int = Field(TORCH.default_batch, ge=1)  # sequences in flight (``_sequences``)
    # Speculative decoding (the built-in decode loop: n-gram and draft-model drafts), from its keys merged
    # (``torch_speculation``); the draft model's id is a local folder by the time the engine is built (load_model).
    speculative: Speculation | None = None


# The speculative methods the torch engine's built-in decode loop runs, and the speculative_config
# members it reads (lmi_trt.speculative.MEMBERS covers the rest; others are refused, never ignored).
TORCH_SPECULATION = ("ngram", "draft_model")
# TensorRT-LLM NGram members the loop's drafting matches at these values only: each request's own tokens
# (no pool shared between requests), every earlier match a candidate (is_use_oldest picks which).
_TORCH_SPECULATIVE_OPTIONS = {"is_public_pool": False, "is_keep_all": True}


class SyntheticSettings(reads("max_input_len", max_new_tokens="max_output_len")):
    """The synthetic benchmark engine's settings (``SyntheticEngine``'s keywords, less the tokenizer's)."""

    tokens_per_second: float | None = Field(None, gt=0)  # option.synthetic_tokens_per_second; 0 → None, unpaced
    max_batch_size: int = Field(SYNTHETIC.default_batch, ge=1)  # sequences in flight (``_sequences``)


# ------------------------------------------------------------------------------------------------
# Settings views: LmiConfig (settled) → each stage's typed settings.


def settle(config: LmiConfig, kind: str) -> LmiConfig:
    """The configuration as engine ``kind`` runs it: where ``option.max_rolling_batch_size`` is unset, the
    engine's default is filled in, here and only here; every later stage reads it."""
    if config.max_rolling_batch_size is not None:
        return config
    return config.derived(f"{kind} engine default", max_rolling_batch_size=entry(kind).default_batch)


def _batch(config: LmiConfig) -> int:
    if config.max_rolling_batch_size is None:
        raise EngineError("internal: option.max_rolling_batch_size was not settled for the engine (stages.settle)")
    return config.max_rolling_batch_size


def _sequences(config: LmiConfig) -> int:
    """Sequences in flight at run time: DJL's option.max_num_sequences when set (config checks that it is
    ≤ option.max_rolling_batch_size), else the batch size; every engine honours it."""
    return config.max_num_sequences if config.max_num_sequences is not None else _batch(config)


def compile_options(config: LmiConfig) -> CompileOptions:
    """Every ``CompileOptions`` field from its key (``max_batch_size`` ← ``option.max_rolling_batch_size``)."""

    spec = speculation(config)
    if spec is None:
        return CompileOptions.of(config)
    medusa = _medusa_heads(spec)
    return CompileOptions.of(
        config,
        speculative_decoding_mode=BUILD_MODES[spec.method],
        # Medusa: the tree's paths, which the Executor's tree must equal (trtllm_medusa.built_draft_len)
        max_draft_len=spec.max_draft_len if medusa is None else built_draft_len(spec, medusa.num_heads),
        speculative_key=spec.key("method"),
        speculative_method=spec.method,
        medusa=medusa,
    )


def _medusa_heads(spec: Speculation) -> MedusaPlan | None:
    """Medusa's heads as the compile stage builds them in, once their folder is on local disk (the loader and
    `lmi-trt compile` fetch it first: sources.resolve_draft_model); None otherwise, which the planner refuses."""
    if spec.method != "medusa" or spec.draft_model is None or not Path(spec.draft_model).is_dir():
        return None
    folder = Path(spec.draft_model)
    num_heads = spec.options.get("num_medusa_heads")
    return plan_heads(folder, local_fingerprint(folder), num_heads, spec.key("draft_model"))


# The options the PyTorch backend's quantization stage reads (lmi_trt.compile.hf_quant).
QUANTIZE_OPTIONS = (
    "quantize",
    "q_format",
    "awq_block_size",
    "calib_dataset",
    "calib_size",
    "calib_batch_size",
    "calib_max_seq_length",
    "trust_remote_code",
)


def quantize_job(config: LmiConfig) -> QuantizeJob:
    """The pytorch backend's quantization stage input: the calibration options and the engine cache."""

    return QuantizeJob(
        options=CompileOptions.of(config, only=QUANTIZE_OPTIONS),
        timeout_s=config.compile_timeout,
        cache_uri=config.engine_cache_uri,
        download_dir=config.download_dir,
    )


def compile_job(config: LmiConfig) -> CompileJob:
    """The compile stage's input: the planner's options and how the build runs and is cached."""

    return CompileJob(
        options=compile_options(config),
        kv_cache_fraction=config.kv_cache_free_gpu_mem_fraction,
        timeout_s=config.compile_timeout,
        workers=config.num_engine_workers,
        load_by_shard=config.load_by_shard,
        checkpoint_dir=config.trtllm_checkpoint_path,
        cache_uri=config.engine_cache_uri,
        download_dir=config.download_dir,
        properties=config.compile_time_values(),
    )


def trtllm_settings(config: LmiConfig) -> TrtllmSettings:

    # DJL: option.max_num_sequences, when set, caps the Executor's batch below the built one.
    key = "option.max_num_sequences" if config.max_num_sequences is not None else "option.max_rolling_batch_size"
    given = config.is_given("max_num_sequences") or config.is_given("max_rolling_batch_size")
    tp = config.tensor_parallel_degree
    return TrtllmSettings.of(
        config,
        max_batch_size=_sequences(config),
        # None: the engine's default, lowered to the engine's build-time batch with a warning.
        max_batch_size_key=key if given else None,
        tensor_parallel_degree=None if tp == "max" else tp,
    )


def executor_settings(config: LmiConfig) -> TrtllmSettings:
    """The Executor's settings: with speculative decoding, n-gram draft tokens (trtllm_drafts), lookahead decoding's
    (W, N, G) or Medusa's tree (trtllm_medusa); any other method is refused there, naming the key (reading it here
    makes the refusal this one rather than refuse_ignored's). Draft tokens turn KV-cache block reuse on when
    option.enable_kv_cache_reuse is unset (trtllm_drafts.block_reuse: the Executor requires it); a draft model needs
    its engine's share of GPU memory (trtllm_drafts.with_draft_memory), and runs both Executors in orchestrator mode
    (TrtllmEngine._drafter)."""
    spec = speculation(config)
    drafts = with_draft_memory(
        executor_drafts(spec, config.max_beam_width), config.draft_kv_cache_free_gpu_mem_fraction
    )
    lookahead = executor_lookahead(spec, config.max_beam_width) if drafts is None else None
    medusa = executor_medusa(spec, config.max_beam_width)
    reuse = block_reuse(drafts, config.is_given("enable_kv_cache_reuse"), config.enable_kv_cache_reuse)
    # two Executors in one process: both in orchestrator mode, as examples/prompt_lookup/run_dtm_pld.py builds its
    # draft and target runners (ModelRunnerCpp is_orchestrator_mode=True)
    orchestrator = drafts is not None and drafts.method == "draft_model"
    return trtllm_settings(config).model_copy(
        update={
            "lookahead": lookahead,
            "drafts": drafts,
            "medusa": medusa,
            "enable_kv_cache_reuse": reuse,
            "orchestrator": orchestrator,
        }
    )


# Options whose DJL default differs from the LLM API's (TorchLlmArgs: block reuse on, GUARANTEED_NO_EVICT, 0.9 of
# free memory for the KV cache): on the pytorch backend an unset one is left to TensorRT-LLM (llmapi.llm_plan).
LLM_RELEASE_DEFAULTED = (
    "enable_kv_cache_reuse",
    "batch_scheduler_policy",
    "enable_chunked_context",
    "kv_cache_free_gpu_mem_fraction",
)


def llmapi_settings(config: LmiConfig) -> LlmApiSettings:
    return LlmApiSettings.of(
        config,
        runtime=trtllm_settings(config),
        max_seq_len=config.max_seq_len,  # unset: TensorRT-LLM's, from the checkpoint (llmapi.release_max_seq_len)
        # where DJL's default differs from TensorRT-LLM's, the LLM gets the option only when the user set it;
        # max_input_len: lmi-trt's own default when unset, which the start-up log says
        given=frozenset(name for name in (*LLM_RELEASE_DEFAULTED, "max_input_len") if config.is_given(name)),
        # planned per release, and refused where the release cannot run it, by llmapi.llm_plan (check_release)
        speculative=speculation(config),
    )


def torch_speculation(config: LmiConfig) -> Speculation | None:
    """The speculative decoding the torch engine is asked for, refused (naming the key) where it is a
    method the engine does not run or a speculative_config member it does not use."""
    spec = speculation(config)
    if spec is None:
        return None
    if spec.method not in TORCH_SPECULATION:
        raise not_here(spec, "torch", TORCH_SPECULATION)
    for member, value in spec.options.items():
        if _TORCH_SPECULATIVE_OPTIONS.get(member, object()) != value:
            raise SpeculationError(
                f"{JSON_KEY}.{member}",
                value,
                "is not something the torch engine's speculative decoding does",
                f"set {json.dumps(_TORCH_SPECULATIVE_OPTIONS[member])} or leave it out"
                if member in _TORCH_SPECULATIVE_OPTIONS
                else "leave it out",
            )
    return spec


def torch_settings(config: LmiConfig) -> TorchSettings:
    return TorchSettings.of(config, max_batch_size=_sequences(config), speculative=torch_speculation(config))


def synthetic_settings(config: LmiConfig) -> SyntheticSettings:
    return SyntheticSettings.of(
        config,
        tokens_per_second=config.synthetic_tokens_per_second or None,  # 0 = as fast as possible
        max_batch_size=_sequences(config),
    )


# ------------------------------------------------------------------------------------------------
# Factories: settings + the loaded artifact and tokenizer → an engine (not started).


def _build_synthetic(
    settings: SyntheticSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:

    return SyntheticEngine(len(tokenizer), **settings.model_dump(), special_token_ids=tuple(tokenizer.all_special_ids))


def _build_torch(
    settings: TorchSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:
    if artifact.kind != "hf_checkpoint":
        raise EngineError(
            f"option.model_id={artifact.model_id!r} is a {artifact.kind.replace('_', ' ')}, which only the "
            "trtllm engine can serve; the torch engine needs a Hugging Face checkpoint "
            "(install TensorRT-LLM on a GPU host, or point option.model_id at the HF model)",
            code=400,
        )
    from lmi_trt.engines.torch import TorchEngine

    if placement is not None and placement.torch_device:
        settings = settings.model_copy(update={"device": placement.torch_device})
    # dict(), not model_dump(): the speculation stays a Speculation
    return TorchEngine(artifact.path, **dict(settings), eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id)


def _build_executor(
    settings: TrtllmSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:

    if artifact.kind != "trtllm_engine":
        raise EngineError(f"internal: {artifact.model_id!r} reached the engine stage uncompiled ({artifact.kind})")
    if placement is not None and placement.orchestrator:  # one copy among several, or beside a draft model's engine
        settings = trtllm_copy_settings(settings, placement)
    return TrtllmEngine(
        artifact.engine_dir,
        settings,
        eos_token_ids=eos,
        pad_token_id=tokenizer.pad_token_id,
        guide_vocab=functools.partial(GuideVocab.of, tokenizer, eos),
    )


def _build_llm(
    settings: LlmApiSettings, artifact: ModelArtifact, tokenizer: Any, eos: list[int], placement: Placement | None
) -> Engine:
    """The pytorch backend: the LLM loads the checkpoint and starts its workers itself."""

    return LlmApiEngine(
        artifact.path, settings, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id, tokenizer=tokenizer
    )


@dataclass(frozen=True)
class Wiring:
    """How a registry entry is built: its settings view of the configuration, and its factory."""

    settings: Callable[[LmiConfig], BaseModel]
    factory: Callable[..., Engine]  # (settings, artifact, tokenizer, eos ids, placement) → Engine, not started


WIRING: dict[EngineEntry, Wiring] = {
    TENSORRT: Wiring(executor_settings, _build_executor),
    PYTORCH: Wiring(llmapi_settings, _build_llm),
    TORCH: Wiring(torch_settings, _build_torch),
    SYNTHETIC: Wiring(synthetic_settings, _build_synthetic),
}


def build_engine(
    served: EngineEntry,
    config: LmiConfig,
    artifact: ModelArtifact,
    tokenizer: Any,
    eos: list[int],
    placement: Placement | None = None,
) -> Engine:
    """Construct (not start) the engine of entry ``served`` for a resolved configuration."""
    wiring = WIRING[served]
    return wiring.factory(wiring.settings(config), artifact, tokenizer, eos, placement)


def _progress(msg: str) -> None:
    log.info("compile: %s", msg)


def compile_if_needed(served: EngineEntry, config: LmiConfig, artifact: ModelArtifact) -> ModelArtifact:
    """The JIT stage: a checkpoint the entry builds an engine for becomes one (from the cache, or built once); one
    it calibrates under ``option.quantize`` becomes the calibrated checkpoint (from the cache, or calibrated once)."""
    if served.calibrates and config.quantize is not None and artifact.kind == "hf_checkpoint":
        return ensure_quantized(
            quantize_job(config), artifact, trtllm_version=detect_trtllm_version() or "", progress=_progress
        )
    if not served.builds_engine or artifact.kind == "trtllm_engine":
        return artifact

    return ensure_engine(compile_job(config), artifact, progress=_progress)


# The speculation keys a draft model's own build leaves out (it is built as a plain engine).
_SPECULATION_FIELDS = (
    "speculative_config",
    "speculative_decoding_mode",
    "speculative_draft_model",
    "max_matching_ngram_size",
    "prompt_lookup_min",
    "speculative_disable_by_batch_size",
)


def draft_compile_config(config: LmiConfig, draft_folder: str) -> LmiConfig:
    """The configuration the draft model's engine is built from: the target's compile options on ``draft_folder``,
    with no speculation, and ``max_input_len`` = the target's max_seq_len - 1 (each draft request's input is the
    sequence so far; lmi_trt.engines.trtllm_drafts), the same max_seq_len."""
    total = config.max_seq_len or config.max_input_len + config.max_output_len
    return config.derived(
        "the draft model's own engine (speculative decoding)",
        model_id=draft_folder,
        max_input_len=total - 1,
        max_output_len=1,
        max_draft_len=0,
        **dict.fromkeys(_SPECULATION_FIELDS),
    )


def compile_draft_if_needed(served: EngineEntry, config: LmiConfig) -> LmiConfig:
    """The JIT stage for a draft model on the tensorrt backend: its checkpoint (a local folder by now) becomes an
    engine (from the cache, or built once), and ``config`` names that engine as the draft model."""
    spec = speculation(config)
    if not served.builds_engine or spec is None or spec.method != "draft_model":
        return config
    draft = draft_compile_config(config, spec.draft_model)
    built = ensure_engine(compile_job(draft), resolve_model(draft), progress=_progress)
    return with_draft_model(config, built.engine_dir)


# ------------------------------------------------------------------------------------------------
# Honoured or refused: every option the user sets is read by the entry that serves, or refused naming it.


class _Reads:
    """A configuration that records which of its fields are read (``honoured``)."""

    def __init__(self, config: LmiConfig) -> None:
        self._config = config
        self.names: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.names.add(name)
        return getattr(self._config, name)


def honoured(served: EngineEntry, config: LmiConfig) -> frozenset[str]:
    """The fields entry ``served`` reads for a settled ``config``: its settings view's, and its compile (or
    calibration) job's where it has one. Derived from the views themselves, so it cannot drift from them."""
    probe = _Reads(config)
    WIRING[served].settings(probe)  # type: ignore[arg-type]
    if served.builds_engine:
        compile_job(probe)  # type: ignore[arg-type]
    if served.calibrates and config.quantize is not None:
        quantize_job(probe)  # type: ignore[arg-type]
    return frozenset(probe.names)


# Fields a settings view reads that other stages honour for every engine, or place and refuse per engine.
HONOURED_ELSEWHERE: dict[str, str] = {
    "trust_remote_code": "the tokenizer is loaded with it for every engine",
    "tensor_parallel_degree": "lmi_trt.launch places it, or refuses it, per engine",
    "pipeline_parallel_degree": "lmi_trt.launch places it, or refuses it, per engine",
    "download_dir": "sources download s3:// models there for every engine",
    "max_output_len": "the server caps each request's new tokens with it where the engine states no cap of its own "
    "(serving.core.output_cap)",
}


def refuse_ignored(served: EngineEntry, config: LmiConfig) -> None:
    """A StartupError for the first option the user set that entry ``served`` would ignore: one that some other
    entry's settings read and this one's do not. Every accepted option is honoured or refused."""
    used = honoured(served, config)
    for name in type(config).model_fields:
        if name in used or name in HONOURED_ELSEWHERE or not config.is_given(name):
            continue
        users = [other.label for other, read in _reads_by_entry().items() if name in read]
        if users:
            raise StartupError(
                config.label(name),
                getattr(config, name),
                f"{served.title} does not use it",
                f"leave it out, or serve with an engine that does: {', '.join(users)}",
            )


def check_release(served: EngineEntry, config: LmiConfig, hf_config: Mapping[str, Any] | None = None) -> None:
    """Where the entry's engine is the LLM API (its release installed, ``option.backend`` resolved), what the
    installed release's own LLM arguments lack or refuse is a ``TrtllmConfigError`` naming the option before
    anything loads (``lmi_trt.engines.llmapi.llm_configs``), speculative decoding included (``hf_config``: the
    checkpoint's config.json where read, for MTP's heads); nothing to check elsewhere."""
    settings = WIRING[served].settings(config)
    if not isinstance(settings, LlmApiSettings):
        return
    runtime = settings.runtime
    if runtime.tensor_parallel_degree is None:  # max: the launch plan resolves it; the MoE split is checked then
        split = (settings.moe_tensor_parallel_size or 1) * (settings.moe_expert_parallel_size or 1)
        settings = settings.model_copy(update={"runtime": runtime.model_copy(update={"tensor_parallel_degree": split})})
    llmapi, version = probe_llm_api(lambda: True)  # the GPU is the engine's to check, when it starts
    llm_configs(llmapi, llm_plan(settings, llm_api_release(version), hf_config), version)


@functools.cache
def _reads_by_entry() -> dict[EngineEntry, frozenset[str]]:
    """What each entry reads, on the default configuration: which entries an option is for."""
    return {
        e: honoured(e, settle(LmiConfig(), e.engine).model_copy(update={"backend": e.backend or "auto"}))
        for e in ENTRIES
    }


# ------------------------------------------------------------------------------------------------
# Resolution: the configuration settled for the engine and what is known of the model.

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


def fit_lengths(config: LmiConfig, hf_config: Mapping[str, Any] | None, kind: str) -> LmiConfig:
    """Unset ``max_input_len`` / ``max_output_len`` follow the model's positions (as vLLM's
    ``max_model_len`` and TGI's ``max_total_tokens`` do): the defaults where they fit, else output
    a quarter of the positions and input the rest. Limits the user set that do not fit are a
    ``StartupError`` naming them (torch; the trtllm build plan checks them with RoPE scaling)."""
    found = model_positions(hf_config)
    facts = entry(kind)
    if found is None or not facts.uses_model:
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
    if inp + out > positions and not facts.checks_lengths:
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


def _refuse_unused_heads(config: LmiConfig) -> None:
    """A precompiled Medusa engine decodes with the heads built into it (compile/medusa.py writes them into the
    checkpoint the engine is built from): heads named beside it would be fetched and never used."""
    spec = speculation(config)
    if spec is not None and spec.method == "medusa" and spec.draft_model is not None:
        raise StartupError(
            spec.key("draft_model"),
            spec.draft_model,
            "option.model_id is a precompiled TensorRT engine, which decodes with the Medusa heads built into it (if "
            "it was built with Medusa); heads named at serve time would not be used",
            "leave it out to decode with the engine's own heads, or serve the Hugging Face checkpoint so that the "
            "compile stage builds an engine with these heads",
        )


def with_backend(config: LmiConfig, artifact_kind: str) -> LmiConfig:
    """``config`` with option.backend resolved for TensorRT-LLM as installed here (logged with its reason);
    a combination this release cannot serve is a StartupError naming option.backend."""
    quantize = config.quantize.value if config.quantize is not None else None
    backend, why = choose_backend(config.backend, probe_trtllm(), artifact_kind, quantize)
    log.info("TensorRT-LLM backend: %s (%s)", backend, why)
    return config if backend == config.backend else config.derived(why, backend=backend)


def resolve(
    config: LmiConfig,
    kind: str,
    read_model: Callable[[], ModelArtifact | ModelPeek | None],
    plan: LaunchPlan | None = None,
) -> LmiConfig:
    """The configuration as engine ``kind`` serves the model ``read_model`` gives: the downloaded artifact, or what
    preflight can read of it before a download (None: nothing yet; ``load_model`` resolves again once it has the
    artifact, with its launch ``plan``). The steps of the module's docstring; what the configuration alone settles
    is checked before the model is read, so an option no engine here can honour costs no model lookup."""
    config = settle(config, kind)
    chosen = is_chosen(kind, config.backend)
    if chosen:  # one way of serving, or option.backend given: what it ignores is known without the model
        refuse_ignored(entry(kind, config.backend), config)
    model = read_model()
    artifact = model.kind if model is not None else None
    if artifact is not None and has_backends(kind):  # TensorRT-LLM: the model's kind decides the backend
        config = with_backend(config, artifact)
    if not is_chosen(kind, config.backend):
        return config
    served = entry(kind, config.backend)
    if plan is not None and config.tensor_parallel_degree == "max" and not served.builds_engine:
        # DJL's default in its TensorRT-LLM image; the pytorch backend's LLM takes a count (a TensorRT engine
        # build resolves max itself, and a built engine states its own)
        config = config.derived(
            f"option.tensor_parallel_degree=max on {plan.gpu_count} GPU(s)", tensor_parallel_degree=plan.tensor_parallel
        )
    if not chosen:
        refuse_ignored(served, config)
    check_release(served, config, model.hf_config if model is not None else None)
    if artifact == "trtllm_engine":
        _refuse_unused_heads(config)
    if artifact != "hf_checkpoint":  # a TensorRT-LLM engine folder states its own limits
        return config
    return fit_lengths(config, model.hf_config, kind)
