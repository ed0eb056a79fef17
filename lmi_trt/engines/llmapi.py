"""TensorRT-LLM through its LLM API, PyTorch backend: serve a Hugging Face checkpoint with ``tensorrt_llm.LLM``.

Since TensorRT-LLM 1.0 the PyTorch backend is the LLM API's default, and the releases after 1.2 have no
TensorRT-engine Executor at all (NVIDIA/TensorRT-LLM PRs 15918 and 16369), so this engine is the only
path there. Data path: the resolved model folder + ``LlmApiSettings`` → ``llm_plan`` (pure: the ``LLM``
keywords, or an error naming the option) → ``LLM(model_dir, **keywords)`` → one
``generate_async(token ids, SamplingParams, streaming=True)`` per request, read as an async iterator.
No ``BatchedEngine`` (engines/base.py): behind the engine link each request keeps its task, because the LLM
API hands responses over per request only. Its response thread puts each response on that request's own
``GenerationResult.aqueue`` and a reader must ``await self.aqueue.get()`` then ``_handle_response`` per request
(tensorrt_llm/executor/result.py ``GenerationResultBase._aresult_step``, 1.0–1.2 and main); there is no public
call that returns many requests' results at once, as the Executor's ``await_responses`` does (engines/trtllm.py).

Facts it relies on (NVIDIA/TensorRT-LLM, tensorrt_llm/llmapi/llm.py, llm_args.py, sampling_params.py,
executor/result.py; 1.0–1.2 and main):
* ``generate_async`` returns a ``RequestOutput`` at once; bad input raises synchronously (``RequestError``,
  ``ValueError``, ``TypeError``). Iterating it applies one response per step and yields the same object:
  ``outputs[0].token_ids_diff``/``logprobs_diff`` are that step's tokens and log probs.
* An error response raises ``RequestError`` out of that request's iteration only.
* Any other exception is the executor's (trtllm-serve's openai_server.py stops the server on
  ``CppExecutorError``): the engine turns unhealthy, so /ping answers 503 and the process exits.
* ``abort()`` ends the request with ``finish_reason='cancelled'`` (trtllm-serve aborts on disconnect,
  tensorrt_llm/serve/openai_server.py ``await_disconnected``).
* ``finish_reason`` is 'stop' for the end id and for stop words (``stop_reason`` = the stop token id or
  string), 'length', 'timeout' or 'cancelled'. We pass ``include_stop_str_in_output=True`` so stop tokens
  stay in the output as on the Executor path; the serving layer decides what the client sees.
* Requests are built as trtllm-serve builds them (tensorrt_llm/serve/openai_protocol.py ``to_sampling_params``):
  no ``end_id``/``pad_id``, so the LLM's ``_prepare_sampling_params`` runs ``SamplingParams._setup``, which takes
  them from the LLM's tokenizer and tokenizes ``stop``/``bad`` strings; it runs only when ``end_id`` is None
  (tensorrt_llm/llmapi/llm.py, every copy read), and strings it did not tokenize fail the request in the worker
  ("SamplingParams.bad (...) is not processed by tokenizer"). Further EOS ids go as ``stop_token_ids``.
* ``stop_token_ids``/``bad_token_ids`` take single tokens; longer sequences go as ``stop``/``bad`` strings,
  which ``_setup`` tokenizes again (without special tokens), so only sequences whose text re-tokenizes to the
  same ids are passed (a ban that does not is refused); the serving layer still enforces every stop string on
  the text.
* What each release's sampler applies, and so what a request is refused, is ``llmapi_releases``' table: on 1.0
  the LLM is built with ``enable_trtllm_sampler=True`` (its default sampler is greedy only), elsewhere the
  release's own sampler runs.
* Log probs: ``logprobs=k`` gives per token a ``dict[token id, Logprob]`` (top-1 of the sampled token in
  1.0 and 1.1, PR 6097; the top k from 1.2, PR 7976); trtllm-serve's postprocess_handlers.py also accepts plain
  floats. A sampled token missing from its top-k dict gets trtllm-serve's floor, -9999.0.
* Prompt log probs: ``prompt_logprobs=k`` fills ``CompletionOutput.prompt_logprobs`` from the context
  logits (tensorrt_llm/executor/base_worker.py ``_compute_pytorch_prompt_logprobs``): one dict per prompt
  position, of the distribution that position predicts. The PyTorch backend has them from 1.1 (PR 7580), but
  only as the top k, which can leave the prompt token out; PR 11235 (1.3.0rc8) adds the token the position read,
  and PR 12499 (1.3.0rc11) the following one (the next prompt token, or the first generated one), so this engine
  serves prompt log probs from 1.3.0rc11.
* ``SamplingParams.embedding_bias`` ([vocab_size] float32) is added to the logits by the PyTorch sampler
  from 1.1 (PR 6464, merged 2025-08-05 before main's 1.1.0rc0; before it, trtllm-serve's ``logit_bias``
  went through a logits processor), so this engine serves ``logit_bias`` from 1.1.
* Iteration stats come from ``get_stats_async`` (an async iterable of JSON stats that stops after its
  timeout without a new one), only with ``enable_iter_perf_stats=True``, and only once a request was submitted:
  before that the executor prints "Iteration statistics are not available yet" on every call
  (tensorrt_llm/executor/executor.py ``aget_stats``; its ``_iter_stats_result`` is made by the first
  ``generate_async``), so they are polled from the first request on.
* Keywords the user did not set are left to the release (its ``TorchLlmArgs`` defaults, e.g. the scheduler's
  ``GUARANTEED_NO_EVICT``, block reuse on, CUDA graphs up to 128, ``max_seq_len`` from the checkpoint); the
  start-up log says which keywords are the user's, which lmi-trt's and what the release chose, read back from
  ``LLM.args`` (``max_seq_len``, which the worker infers, from the checkpoint as the release does:
  ``release_max_seq_len``, through transformers' AutoConfig as the release reads it: an estimate, since the KV cache
  manager can lower the worker's value). The server's prompt + max_new_tokens limit is that max_seq_len. Past the
  worker's own, 1.0's ``_deduce_max_tokens`` (executor/base_worker.py) leaves a given max_tokens as it is (read_file
  ids 51807206653, 2646354960); later workers cut it with a server-side warning (id 55301320707).

* LoRA adapters (option.enable_lora): the LLM gets the release's ``LoraConfig`` (``lora_plan``; built from
  the module that defines it, ``LORA_CONFIG_MODULES``), each request the registered adapter's
  ``LoRARequest(name, int id, folder)`` (``tensorrt_llm.executor.request``), as trtllm-serve passes its clients' own
  (openai_server.py ``generate_async(..., lora_request=request.lora_request)``). The worker's LoraManager loads an
  adapter once per id (lora_manager.py ``load_from_hf`` skips ids it has seen), so every registration gets a new id;
  it skips modules outside ``lora_target_modules`` with a warning, so adapters are checked when registered
  (``lmi_trt.engines.adapters.read_adapter``: a 400 naming what the release would not apply as peft does).

The ``tensorrt_llm.llmapi`` module is always named ``llmapi`` here and loaded by ``probe_llm_api``; the
test tests/unit/test_llmapi_surface.py checks every name and keyword used on it against the listing of the
real API (tests/fakes/llmapi_surface.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.util
import itertools
import json
import logging
import math
import os
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from packaging.version import InvalidVersion, Version
from pydantic import Field

from lmi_trt.engines import trtllm as trtllm_engine
from lmi_trt.engines.adapters import AdapterTable, read_adapter
from lmi_trt.engines.base import (
    MAX_TOP_LOGPROBS,
    SAMPLING_FEATURES,
    AdapterInfo,
    Beam,
    Capabilities,
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    can,
    cannot,
    error_output,
)
from lmi_trt.engines.guided import warm_guide
from lmi_trt.engines.llmapi_releases import (
    AFTER_LAST_READ,
    TRTLLM,
    Sampler,
    beam_width_rule,
    beams_refused,
    first_unsupported,
    llm_sampler,
    not_applied,
    requested,
    series,
)
from lmi_trt.engines.llmapi_speculation import (
    SpecPlan,
    mtp_layers,
    probed,
    speculation_refusals,
    speculative_plan,
)
from lmi_trt.engines.trtllm import (
    TrtllmConfigError,
    TrtllmSettings,
    TrtllmUnavailable,
    final_tokens_and_reason,
    map_request,
    require_eos,
)
from lmi_trt.keys import reads
from lmi_trt.speculative import Speculation, SpeculationError

log = logging.getLogger(__name__)

_NOT_STARTED = "the trtllm-pytorch engine has not started: what it honours depends on the TensorRT-LLM release"
# TorchLlmArgs' own default (llm_args.py), used for the limits when no option sets it.
LLM_DEFAULT_BATCH = 2048
# What the start-up log reads back from LLM.args for the keywords left to the release (TorchLlmArgs fields).
RELEASE_DEFAULTS = (
    "max_batch_size",
    "max_num_tokens",
    "enable_chunked_prefill",
    "kv_cache_config.enable_block_reuse",
    "kv_cache_config.free_gpu_memory_fraction",
    "scheduler_config.capacity_scheduler_policy",
    "cuda_graph_config.max_batch_size",
    "disable_overlap_scheduler",
)
# trtllm-serve's floor for a log prob (postprocess_handlers.py: max(logprob, -9999.0)).
LOGPROB_FLOOR = -9999.0
# specDecodingStats fields (iteration stats JSON) → the /metrics counters the torch engine exports too (vLLM's names).
SPEC_COUNTERS = {
    "numRequestsWithDraftTokens": "spec_decode_num_drafts",
    "numDraftTokens": "spec_decode_num_draft_tokens",
    "numAcceptedTokens": "spec_decode_num_accepted_tokens",
}
# How long one get_stats_async pass waits for a new iteration before it ends (its default).
STATS_TIMEOUT_S = 2.0
STATS_PAUSE_S = 0.5
DTYPES = {"auto": "auto", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
POLICIES = {"max_utilization": "MAX_UTILIZATION", "guaranteed_no_evict": "GUARANTEED_NO_EVICT"}
# LLM API finish reasons as the Executor's names, so one rule (final_tokens_and_reason) maps both paths.
_REASON_NAMES = {"length": "LENGTH", "cancelled": "CANCELLED", "timeout": "TIMED_OUT"}


# PEFT module → TensorRT-LLM's LoRA module (tensorrt_llm/lora_helper.py get_default_trtllm_modules_to_hf_modules,
# read_file id 53470212518; py_executor_creator falls back to that mapping when lora_dir is not one folder, 1.1-line
# _util.py id 843526953): the seven projections of a Llama block, the ones lmi_trt.engines.adapters reads.
LORA_MODULES = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
# CUDA graphs beside LoRA adapters. PR 5480 ("Enable cuda graph by default", 2025-07-13, before 1.0): "LoRA does not
# support CUDA graph enable mode, the output is different compare with CUDA graph disable"; PRs 7335 and 7336 (LoRA
# CUDA graphs, 2025-08) closed unmerged; PR 8279 ("Multi-LoRA serving with CUDA Graph", commit 1dc49b266e) merged on
# main 2026-01-22 *after* "Bump version to 1.3.0rc1" (#10923, commit 0243abee22; NVIDIA/TensorRT-LLM main's commit
# log): in no 1.2 (on release branches by then) nor 1.3.0rc0, and by llmapi_releases.py's dating rule first verified
# in 1.3.0rc2. Before it lmi-trt turns CUDA graphs off beside adapters (the fake runtime, tests/fakes/tensorrt_llm/
# _lora.py, switches at the same release).
LORA_CUDA_GRAPHS = Version("1.3.0rc2")
# Quantized checkpoints beside adapters: PR 7014 ("Guard against fp8 activations in lora forward", reviewed
# 2025-08-20) fixed FP8 models with LoRA after main's "Bump version to 1.1.0rc0" (#6651, 2025-08-07), so it is in 1.1
# and later; whether the 1.0 branch took it was not read, and no other quantization beside LoRA was read on 1.0.
LORA_QUANTIZED = Version("1.1.0")


# =============================================================================== versions


def llm_api_release(version: str) -> Version:
    """Pure: a TensorRT-LLM version whose LLM API is the PyTorch one, as a PEP 440 version (the 1.3.0 release
    candidates differ one from the next: ``llmapi_releases``), or a refusal. The pre-releases of 1.0-1.2 were not
    read (1.1.0rc0 still builds the TRTLLMSampler by default, PR 6216; sampler_type came with 1.1.0rc1, PR 6831), nor
    any line after 1.3 (``AFTER_LAST_READ``): both are refused."""
    try:
        release = Version(version or "")
    except InvalidVersion:
        raise TrtllmUnavailable(
            f"cannot read the TensorRT-LLM version {version!r}; the pytorch backend needs 1.0 or later"
        ) from None
    if release < Version("1.0.0.dev0"):
        raise TrtllmUnavailable(
            f"TensorRT-LLM {version} has no PyTorch LLM API (tensorrt_llm.LLM builds TensorRT engines before 1.0); "
            "set option.backend=tensorrt, or use a TensorRT-LLM 1.0+ image"
        )
    if release >= AFTER_LAST_READ:
        raise TrtllmUnavailable(
            f"TensorRT-LLM {version} is newer than the releases this engine was checked against (1.0.x-1.2.x and "
            "the 1.3 line: 1.3.0 candidates and 1.3.x); use a TensorRT-LLM 1.0-1.3 image, or set "
            "option.backend=tensorrt where the release still has TensorRT engines"
        )
    if release.is_prerelease and series(release) <= (1, 2):
        line = f"{release.major}.{release.minor}"
        raise TrtllmUnavailable(
            f"TensorRT-LLM {version} is a pre-release of {line}, whose LLM API this engine was not checked against; "
            f"use {line}.0 or a later {line}.x image, or set option.backend=tensorrt"
        )
    return release


def probe_llm_api(gpu_available: Callable[[], bool] | None = None) -> tuple[ModuleType, str]:
    """Import ``tensorrt_llm.llmapi`` and check this host can run it (side effects only here)."""
    try:
        trtllm = importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise TrtllmUnavailable(
            f"TensorRT-LLM is not installed ({exc}); run the TensorRT-LLM image, or set option.rolling_batch=torch"
        ) from exc
    version = getattr(trtllm, "__version__", "")
    llm_api_release(version)
    llmapi = importlib.import_module("tensorrt_llm.llmapi")
    if not (gpu_available or trtllm_engine.cuda_available)():  # looked up on call: one GPU probe for both backends
        raise TrtllmUnavailable(
            "no CUDA GPU is visible, and TensorRT-LLM's PyTorch backend runs on one; check the container's GPU "
            "access (--gpus all, CUDA_VISIBLE_DEVICES) or set option.rolling_batch=torch"
        )
    return llmapi, version


# =============================================================================== settings


# Where DJL's keys go (djl-serving djl_python/properties_manager/trt_properties.py get_kv_cache_config /
# get_pytorch_config / get_llm_kwargs): (the nested config, or None for an LLM keyword; its field). The fields are
# KvCacheConfig's, BaseLlmArgs'/TorchLlmArgs' and MoeConfig's in tensorrt_llm/llmapi/llm_args.py, in every copy read
# from 1.0 to main; DJL's PyTorchConfig keys are TorchLlmArgs fields since 1.0 (kv_cache_dtype: KvCacheConfig.dtype,
# "a pure python field ... only for the Pytorch backend"; moe_backend: MoeConfig.backend).
_DJL_TARGETS: dict[str, tuple[str | None, str]] = {
    "max_attention_window": ("kv_cache_config", "max_attention_window"),
    "sink_token_length": ("kv_cache_config", "sink_token_length"),
    "onboard_blocks": ("kv_cache_config", "onboard_blocks"),
    "cross_kv_cache_fraction": ("kv_cache_config", "cross_kv_cache_fraction"),
    "secondary_offload_min_priority": ("kv_cache_config", "secondary_offload_min_priority"),
    "event_buffer_max_size": ("kv_cache_config", "event_buffer_max_size"),
    "kv_cache_dtype": ("kv_cache_config", "dtype"),
    "moe_tensor_parallel_size": (None, "moe_tensor_parallel_size"),
    "moe_expert_parallel_size": (None, "moe_expert_parallel_size"),
    "enable_attention_dp": (None, "enable_attention_dp"),
    "load_format": (None, "load_format"),
    "iter_stats_max_iterations": (None, "iter_stats_max_iterations"),
    "request_stats_max_iterations": (None, "request_stats_max_iterations"),
    "attn_backend": (None, "attn_backend"),
    "moe_backend": ("moe_config", "backend"),
}
# Every LlmApiSettings field the configuration fills under its own name (its reads):
# the above, plus DJL's enable_overlap_scheduler (TorchLlmArgs.disable_overlap_scheduler, inverted) and
# use_cuda_graph (false: TorchLlmArgs.cuda_graph_config=None, "pass None to disable").
DJL_LLM_FIELDS: tuple[str, ...] = (*_DJL_TARGETS, "enable_overlap_scheduler", "use_cuda_graph")


class LlmApiSettings(
    reads(
        "dtype",
        "max_input_len",
        "trust_remote_code",
        *DJL_LLM_FIELDS,
        # LoRA adapters (DJL's keys as its vLLM line means them): the release's LoraConfig (lora_plan)
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
    )
):
    """What the LLM takes beyond the Executor's runtime settings (``runtime``, shared with the trtllm engine); DJL
    LMI's keys under the LLM's own names (``DJL_LLM_FIELDS``; None: not given, TensorRT-LLM's default)."""

    runtime: TrtllmSettings = Field(default_factory=TrtllmSettings)
    max_seq_len: int | None = Field(None, ge=2)  # option.max_seq_len; None: TensorRT-LLM's, from the checkpoint
    # The options the user set (LmiConfig attribute names), of those whose DJL default differs from TensorRT-LLM's
    # (stages.LLM_RELEASE_DEFAULTED): an unset one is left to the release.
    given: frozenset[str] = frozenset()
    # Speculative decoding from its keys merged (lmi_trt.speculative; the draft model a local folder by the time the
    # engine is built), planned per release by lmi_trt.engines.llmapi_speculation.
    speculative: Speculation | None = None


@dataclass(frozen=True)
class LlmPlan:
    """The ``LLM`` keywords as plain data (the nested configs are built by ``make_llm``; an empty one is left to
    the release), and who set each keyword: an option key, or lmi-trt with its reason."""

    keywords: dict[str, Any]
    kv_cache_config: dict[str, Any]
    scheduler_config: dict[str, Any]
    moe_config: dict[str, Any]
    cuda_graph_config: dict[str, Any] | None  # None: no CUDA graphs; built only when an option or lmi-trt set it
    origins: dict[str, str]  # keyword (nested: "kv_cache_config.dtype") → an option key, or "lmi-trt: why"
    speculative: SpecPlan | None = None  # the speculative_config, built by llm_configs
    lora_config: dict[str, Any] | None = None  # LoraConfig keywords (lora_plan), built by llm_configs

    @property
    def options(self) -> dict[str, str]:
        """The keywords options set, and which option (named in errors)."""
        return {k: v for k, v in self.origins.items() if not v.startswith("lmi-trt: ")}


def check_settings(settings: LlmApiSettings) -> None:
    """Pure: what this backend cannot honour is an error naming the key."""
    rt = settings.runtime
    if rt.tensor_parallel_degree is None:
        raise TrtllmConfigError(
            "option.tensor_parallel_degree=max must be resolved to a GPU count before the pytorch backend starts"
        )
    if rt.multi_block_mode is not None:
        raise TrtllmConfigError(
            f"option.multi_block_mode={str(rt.multi_block_mode).lower()} tunes TensorRT engines; the pytorch "
            "backend has no such switch: remove the key, or set option.backend=tensorrt"
        )
    if rt.enable_trt_overlap:
        raise TrtllmConfigError(
            "option.enable_trt_overlap=true applies to TensorRT engines only; the pytorch backend overlaps "
            "scheduling by itself: remove the key, or set option.backend=tensorrt"
        )
    if rt.device_ids is not None or rt.orchestrator:
        raise TrtllmConfigError(
            "several model copies per host (option.tensor_parallel_degree below the GPU count) are not "
            "supported on the pytorch backend yet; set option.tensor_parallel_degree to the GPU count"
        )
    _check_moe_split(rt.tensor_parallel_degree, settings.moe_tensor_parallel_size, settings.moe_expert_parallel_size)


def checkpoint_quantization(hf_config: Mapping[str, Any], hf_quant_config: Mapping[str, Any]) -> str | None:
    """Pure: how a checkpoint is quantized, from config.json's ``quantization_config`` (transformers) or modelopt's
    hf_quant_config.json ``quantization.quant_algo``; None for an unquantized one."""
    algo = (hf_quant_config.get("quantization") or {}).get("quant_algo")
    if algo:
        return f"hf_quant_config.json quant_algo={algo}"
    quant = hf_config.get("quantization_config")
    if isinstance(quant, Mapping):
        return f"config.json quantization_config.quant_method={quant.get('quant_method')}"
    return None


def llm_plan(
    settings: LlmApiSettings,
    release: Version,
    hf_config: Mapping[str, Any] | None = None,
    quantization: str | None = None,
) -> LlmPlan:
    """Pure: the options as ``LLM`` keywords for a release; a keyword no option sets is left to the release,
    except the few lmi-trt needs (each with its reason in ``origins``). ``hf_config``: the checkpoint's config.json
    where read (MTP speculation needs its heads); ``quantization``: the checkpoint's (``checkpoint_quantization``)."""
    check_settings(settings)
    rt, given = settings.runtime, settings.given
    beams = rt.max_beam_width
    refused = beams_refused(release) if beams > 1 else None
    if refused is not None:
        raise TrtllmConfigError(
            f"option.max_beam_width={beams}: {refused}; use TensorRT-LLM 1.3.0rc26 or later, or set "
            "option.max_beam_width=1"
        )
    spec = None
    if settings.speculative is not None:
        try:
            spec = speculative_plan(
                settings.speculative,
                str(release),
                series(release),
                mtp_layers=mtp_layers(hf_config),
                max_beam_width=beams,
                overlap_scheduler=settings.enable_overlap_scheduler,
            )
        except SpeculationError as exc:
            raise TrtllmConfigError(str(exc)) from exc
    keywords: dict[str, Any] = {}
    origins: dict[str, str] = {}

    def put(name: str, value: Any, origin: str) -> None:
        keywords[name], origins[name] = value, origin

    put("tensor_parallel_size", rt.tensor_parallel_degree, "option.tensor_parallel_degree")
    put("pipeline_parallel_size", rt.pipeline_parallel_degree, "option.pipeline_parallel_degree")
    if settings.dtype != "auto":
        put("dtype", DTYPES[settings.dtype], "option.dtype")
    if settings.trust_remote_code:
        put("trust_remote_code", True, "option.trust_remote_code")
    if rt.max_batch_size_key is not None:
        put("max_batch_size", rt.max_batch_size, rt.max_batch_size_key)
    if beams > 1:
        put("max_beam_width", beams, "option.max_beam_width")
    if "enable_chunked_context" in given:
        put("enable_chunked_prefill", rt.enable_chunked_context, "option.enable_chunked_context")
    if rt.max_num_tokens is not None:
        put("max_num_tokens", rt.max_num_tokens, "option.max_num_tokens")
    if settings.max_input_len is not None:
        # the PyTorch backend does not enforce it (its _check_arguments checks max_num_tokens only); the server does.
        # Sent as DJL sends it; unset, the value is lmi-trt's default, which the start-up log says.
        put(
            "max_input_len",
            settings.max_input_len,
            "option.max_input_len (the longest prompt the server takes)"
            if "max_input_len" in given
            else "lmi-trt: the longest prompt the server takes, lmi-trt's default (1024, or what the model's positions "
            "leave after max_output_len), not TensorRT-LLM's; set option.max_input_len for longer prompts",
        )
    if settings.max_seq_len is not None:  # else TensorRT-LLM's, from the checkpoint (release_max_seq_len)
        put("max_seq_len", settings.max_seq_len, "option.max_seq_len")
    put("enable_iter_perf_stats", True, "lmi-trt: /metrics reads the iteration stats, collected only when asked for")
    # Constrained decoding (response_format, TGI grammar, tool_choice; guided.backend_guide) through the image's
    # xgrammar (llm_args.py guided_decoding_backend); it runs beside the overlap scheduler since
    # NVIDIA/TensorRT-LLM PR 6000 (in 1.0), and only requests that carry a guide are masked.
    # Left out where guided decoding is refused beside the speculation that runs (speculation_refusals): on 1.0 the
    # executor raises for both together, and a one-model path can fail at start-up for it ("Failed to set guided
    # decoder for speculative decoding mode", py_executor_creator.py of the 1.1+ lines).
    if spec is None or "guided" not in speculation_refusals(spec, str(release), series(release)):
        put("guided_decoding_backend", "xgrammar", "lmi-trt: constrained decoding (response_format, grammar, tools)")
    if spec is not None:  # built by llm_configs, as the release's own class
        origins["speculative_config"] = settings.speculative.key("method")
    if series(release) == (1, 0) and spec is None:  # beside drafts the TorchSampler verifies (llm_sampler)
        put(
            "enable_trtllm_sampler",
            True,
            "lmi-trt: 1.0's default TorchSampler takes the argmax for every request; its TRTLLMSampler samples "
            "(docs/source/features/sampling.md of 1.0.0). A 'prototype' knob in 1.0's TorchLlmArgs: TensorRT-LLM "
            "logs that it is not recommended for production use, and 1.0 has no other sampler that samples",
        )
    if beams > 1 and series(release) in ((1, 1), (1, 2)):
        # TorchLlmArgs.sampler_type (PR 6831, first in 1.1.0rc1; llm_args.py read_file id 1090804222: "Options are
        # TRTLLMSampler, TorchSampler or auto"): which sampler 'auto' builds for beams on 1.2 is not pinned down
        put(
            "sampler_type",
            TRTLLM,
            "lmi-trt: beam search on the TRTLLMSampler (1.2's sampler_type='auto' choice for beams was not verified)",
        )
    kv: dict[str, Any] = {}
    reuse = rt.enable_kv_cache_reuse if "enable_kv_cache_reuse" in given else None  # the release's default: on
    fraction = rt.kv_cache_free_gpu_mem_fraction if "kv_cache_free_gpu_mem_fraction" in given else None  # its: 0.9
    for key, value, option in (
        ("enable_block_reuse", reuse, "option.enable_kv_cache_reuse"),
        ("free_gpu_memory_fraction", fraction, "option.kv_cache_free_gpu_mem_fraction"),
        ("max_tokens", rt.max_tokens_in_paged_kv_cache, "option.max_tokens_in_paged_kv_cache"),
        # tensorrt_llm/llmapi/llm_args.py KvCacheConfig.host_cache_size
        ("host_cache_size", rt.kv_cache_host_memory_bytes, "option.kv_cache_host_memory_bytes"),
    ):
        if value is not None:
            kv[key], origins[f"kv_cache_config.{key}"] = value, option
    scheduler: dict[str, Any] = {}
    if "batch_scheduler_policy" in given:
        scheduler["capacity_scheduler_policy"] = POLICIES[rt.batch_scheduler_policy]
        origins["scheduler_config.capacity_scheduler_policy"] = "option.batch_scheduler_policy"
    # DJL's LLM API keys, each given one onto its field (_DJL_TARGETS)
    nested: dict[str, dict[str, Any]] = {"kv_cache_config": kv, "moe_config": {}}
    for name, (config, field) in _DJL_TARGETS.items():
        value = getattr(settings, name)
        if value is None:
            continue
        value = list(value) if isinstance(value, tuple) else value
        if config is None:
            put(field, value, f"option.{name}")
        else:
            nested[config][field], origins[f"{config}.{field}"] = value, f"option.{name}"
    if settings.enable_overlap_scheduler is not None:
        put("disable_overlap_scheduler", not settings.enable_overlap_scheduler, "option.enable_overlap_scheduler")
    graphs: dict[str, Any] | None = {}  # CudaGraphConfig(): the release's default, CUDA graphs on
    if settings.use_cuda_graph is not None:
        graphs = {} if settings.use_cuda_graph else None
        origins["cuda_graph_config"] = "option.use_cuda_graph"
    if beams > 1 and series(release) == (1, 0):
        # 1.0's docs/source/features/sampling.md: "To enable beam search, you must ... Disable overlap scheduling
        # ... Disable the usage of CUDA Graphs". From 1.1 its TRTLLMSampler runs beams beside both (PRs 6223 and
        # 6217; PR 7326, on main 2025-08-29, tests beam search with CUDA graphs and the overlap scheduler).
        for option, on in (
            ("enable_overlap_scheduler", settings.enable_overlap_scheduler),
            ("use_cuda_graph", settings.use_cuda_graph),
        ):
            if on:
                raise TrtllmConfigError(
                    f"option.{option}=true with option.max_beam_width={beams}: beam search on TensorRT-LLM 1.0's "
                    "TRTLLMSampler needs the overlap scheduler and CUDA graphs off (its docs/source/features/"
                    f"sampling.md); remove option.{option}, set option.max_beam_width=1, or use TensorRT-LLM 1.1+"
                )
        why = "lmi-trt: beam search on 1.0's TRTLLMSampler needs it off (its docs/source/features/sampling.md)"
        put("disable_overlap_scheduler", True, why)
        graphs, origins["cuda_graph_config"] = None, why
    lora = None
    if settings.enable_lora:
        lora = lora_plan(settings, release, spec.method if spec is not None else None, quantization)
        origins["lora_config"] = "option.enable_lora"
        for field, option in (
            ("max_lora_rank", "option.max_lora_rank"),
            ("max_loras", "option.max_loras"),
            ("max_cpu_loras", "option.max_cpu_loras"),
            ("lora_dir", "lmi-trt: adapters are registered at run time, each request names its own"),
            (
                "lora_target_modules",
                "lmi-trt: every projection an adapter may adapt (with no lora_dir the release asserts at least one; "
                "_util.py of the 1.x line)",
            ),
        ):
            if field in lora:
                origins[f"lora_config.{field}"] = option
        if release < LORA_CUDA_GRAPHS:
            if settings.use_cuda_graph:
                raise TrtllmConfigError(
                    f"option.use_cuda_graph=true with option.enable_lora=true: TensorRT-LLM {release} does not apply "
                    "LoRA adapters in CUDA graphs (PR 5480: 'the output is different'; PR 8279, which adds them, is "
                    f"first in {LORA_CUDA_GRAPHS}); remove option.use_cuda_graph (lmi-trt turns CUDA graphs off "
                    f"beside adapters there), or use TensorRT-LLM {LORA_CUDA_GRAPHS} or later"
                )
            graphs = None
            origins["cuda_graph_config"] = (
                f"lmi-trt: TensorRT-LLM {release} does not apply LoRA adapters in CUDA graphs (PR 5480)"
            )
    return LlmPlan(keywords, kv, scheduler, nested["moe_config"], graphs, origins, spec, lora)


def lora_plan(
    settings: LlmApiSettings, release: Version, speculation: str | None, quantization: str | None = None
) -> dict[str, Any]:
    """Pure: ``LoraConfig`` keywords (tensorrt_llm/lora_helper.py ``LoraConfig``: lora_dir, max_lora_rank,
    lora_target_modules, max_loras, max_cpu_loras) for DJL's keys as its vLLM line means them: ``max_loras`` adapters
    in the device cache at once (py_executor_creator sizes ``PeftCacheConfig.num_device_module_layer`` from
    ``max_loras``), ``max_cpu_loras`` in the host cache (``num_host_module_layer``; unset: the release's default
    PeftCacheConfig), ``max_lora_rank`` the largest rank. No ``lora_dir``: adapters come per request, so
    ``lora_target_modules`` names every projection (left empty with no lora_dir, the 1.1-line llm_args.py
    ``validate_lora_config_consistency`` expects "all LoRA modules", MoE ones included: "serious memory
    consumption"). What the release would not do beside adapters is a ``TrtllmConfigError`` naming the key."""
    if speculation is not None:
        raise TrtllmConfigError(
            f"option.enable_lora=true with speculative decoding ({speculation}): LoRA adapters beside speculative "
            f"decoding were not verified on TensorRT-LLM {release}; leave one of them out"
        )
    if quantization is not None and release < LORA_QUANTIZED:
        raise TrtllmConfigError(
            f"option.enable_lora=true with a quantized checkpoint ({quantization}): LoRA beside a quantized model "
            f"was not verified on TensorRT-LLM {release} (PR 7014, which fixed FP8 models with LoRA, is first in "
            f"{LORA_QUANTIZED}); serve an unquantized checkpoint, leave out option.enable_lora, or use TensorRT-LLM "
            f"{LORA_QUANTIZED} or later"
        )
    # vLLM's rule, as DJL's keys mean it (vLLM's LoRAConfig: max_cpu_loras >= max_loras); TensorRT-LLM has no such
    # check (_util.py sizes the device and host caches independently): a deliberate refusal for DJL compatibility
    if settings.max_cpu_loras is not None and settings.max_cpu_loras < settings.max_loras:
        raise TrtllmConfigError(
            f"option.max_cpu_loras={settings.max_cpu_loras} is below option.max_loras={settings.max_loras}: every "
            "adapter on the device is also in the host cache (vLLM's rule, as DJL's LoRA keys mean it: "
            "max_cpu_loras >= max_loras); "
            f"set option.max_cpu_loras to at least {settings.max_loras}, or leave it unset"
        )
    plan: dict[str, Any] = {
        "lora_dir": [],
        "max_lora_rank": settings.max_lora_rank,
        "max_loras": settings.max_loras,
        "lora_target_modules": list(LORA_MODULES.values()),
    }
    if settings.max_cpu_loras is not None:
        plan["max_cpu_loras"] = settings.max_cpu_loras
    return plan


def settings_report(plan: LlmPlan, args: Any, version: str, sampler: Sampler, inferred: Sequence[str] = ()) -> str:
    """Pure: for the start-up log, each keyword the user or lmi-trt set (and who), and what the release chose for
    the ones left to it, read back from the LLM's ``args`` (its TorchLlmArgs); ``inferred``: what the release
    chose where ``args`` does not carry it, each with how it is known."""
    ours = dict(plan.keywords)
    ours.update({f"kv_cache_config.{k}": v for k, v in plan.kv_cache_config.items()})
    ours.update({f"scheduler_config.{k}": v for k, v in plan.scheduler_config.items()})
    ours.update({f"moe_config.{k}": v for k, v in plan.moe_config.items()})
    ours.update({f"lora_config.{k}": v for k, v in (plan.lora_config or {}).items()})
    if "cuda_graph_config" in plan.origins:
        ours["cuda_graph_config"] = plan.cuda_graph_config
    mine = {k for k in ours if plan.origins[k].startswith("lmi-trt: ")}
    users = [f"{k}={ours[k]!r} ({plan.origins[k]})" for k in ours if k not in mine]
    lmis = [f"{k}={ours[k]!r} ({plan.origins[k].removeprefix('lmi-trt: ')})" for k in ours if k in mine]
    releases = []
    for path in RELEASE_DEFAULTS:
        if path in ours or path.split(".")[0] in ours:
            continue
        value: Any = args
        for part in path.split("."):
            value = getattr(value, part, None)
        releases.append(f"{path}={getattr(value, 'value', value)!r}")
    releases += inferred
    return (
        f"TensorRT-LLM {version} LLM: sampler {sampler}; set from options: {', '.join(users) or 'none'}; set by "
        f"lmi-trt: {', '.join(lmis)}; TensorRT-LLM {version}'s defaults: {', '.join(releases)}"
    )


def _check_moe_split(tp: int, moe_tp: int | None, moe_ep: int | None) -> None:
    """Pure: TensorRT-LLM splits the tensor-parallel ranks between MoE tensor and expert parallelism, the one not
    given being TP ÷ the other, and refuses a split whose product is not TP (tensorrt_llm/mapping.py MappingBase:
    "moe_tp_size * moe_ep_size * moe_cluster_size must equal to moe_world_size"). Checked here to name the keys."""
    if moe_tp is None and moe_ep is None:
        return
    tp_part = moe_tp if moe_tp is not None else tp // moe_ep
    ep_part = moe_ep if moe_ep is not None else tp // moe_tp
    if tp_part * ep_part != tp:
        given = " × ".join(
            f"option.{name}={value}"
            for name, value in (("moe_tensor_parallel_size", moe_tp), ("moe_expert_parallel_size", moe_ep))
            if value is not None
        )
        raise TrtllmConfigError(
            f"{given} does not split option.tensor_parallel_degree={tp}: the MoE tensor- and expert-parallel sizes "
            f"multiply to the tensor-parallel degree; set them so (e.g. option.moe_expert_parallel_size={tp})"
        )


def llm_configs(llmapi: ModuleType, plan: LlmPlan, version: str) -> dict[str, Any]:
    """The plan's nested configs as this release's own classes, which validate them (pydantic), and every given field
    checked against this release's ``TorchLlmArgs``: what the release lacks or refuses is a ``TrtllmConfigError`` naming
    the option. Run at startup (``lmi_trt.stages.check_release``) and again when the LLM is built."""
    fields = llmapi.TorchLlmArgs.model_fields
    for target, option in plan.options.items():
        if target.split(".")[0] not in fields:
            raise TrtllmConfigError(
                f"{option}: TensorRT-LLM {version}'s LLM has no {target} (tensorrt_llm/llmapi/llm_args.py "
                "TorchLlmArgs); remove the key, or use a release that has it"
            )
    if str(plan.keywords.get("attn_backend", "")).startswith("FLASHINFER") and not importlib.util.find_spec(
        "flashinfer"
    ):
        # tensorrt_llm/_torch/attention_backend/utils.py get_attention_backend falls back to TRTLLM attention
        # when flashinfer does not import (IS_FLASHINFER_AVAILABLE): refused rather than silently replaced.
        raise TrtllmConfigError(
            f"option.attn_backend={plan.keywords['attn_backend']} needs the flashinfer package, which is not "
            "installed (TensorRT-LLM would silently use TRTLLM attention instead); install flashinfer-python, or "
            "set option.attn_backend=TRTLLM"
        )
    built: dict[str, Any] = {}
    if plan.speculative is not None:
        built["speculative_config"] = speculative_config(
            llmapi, plan.speculative, plan.origins["speculative_config"], version
        )
    if plan.lora_config is not None:
        built["lora_config"] = lora_config(plan.lora_config, version)
    if plan.scheduler_config:  # none given: the release's own SchedulerConfig
        built["scheduler_config"] = llmapi.SchedulerConfig(
            capacity_scheduler_policy=llmapi.CapacitySchedulerPolicy(plan.scheduler_config["capacity_scheduler_policy"])
        )
    for name, make, values in (
        ("kv_cache_config", llmapi.KvCacheConfig, plan.kv_cache_config),
        ("cuda_graph_config", llmapi.CudaGraphConfig, plan.cuda_graph_config),
        ("moe_config", llmapi.MoeConfig, plan.moe_config),
    ):
        if values is None:
            built[name] = None
            continue
        if not values and name not in plan.origins:  # none given: the release's own
            continue
        try:
            built[name] = make(**values)
        except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
            errors = exc.errors() if hasattr(exc, "errors") else []
            field = str(errors[0]["loc"][0]) if errors and errors[0].get("loc") else ""
            option = plan.options.get(f"{name}.{field}", f"{name}.{field}" if field else name)
            raise TrtllmConfigError(
                f"{option}: TensorRT-LLM {version} refuses {name}"
                + (f".{field}={values.get(field)!r}" if field else "")
                + f": {exc}; set a value this release takes, or remove the key"
            ) from exc
    return built


def speculative_config(llmapi: ModuleType, spec: SpecPlan, key: str, version: str) -> Any:
    """The release's own speculative config class (llmapi_speculation.CLASSES), which validates the fields; what it
    lacks or refuses is a ``TrtllmConfigError`` naming the key."""
    make = getattr(llmapi, spec.config_class, None)
    if make is None:
        raise TrtllmConfigError(
            f"{key}={spec.method}: TensorRT-LLM {version} has no tensorrt_llm.llmapi.{spec.config_class}; use a "
            "release that has it"
        )
    try:
        return make(**spec.fields)
    except (ValueError, TypeError, AssertionError) as exc:  # pydantic's ValidationError is a ValueError
        raise TrtllmConfigError(
            f"{key}={spec.method}: TensorRT-LLM {version} refuses {spec.config_class}({spec.fields}): {exc}; "
            "set values this release takes"
        ) from exc


# Where a release defines ``LoraConfig``: tensorrt_llm/lora_helper.py in every copy read (ids 53470212518, 2545972156,
# 388674781, 56112947133; NVIDIA's examples import it from there, ids 622098482 and 2457752084); the 1.3.0rc26 docs
# (features/lora.html) import it from tensorrt_llm._torch.peft.lora.config, where the rc18/rc20 docs still used
# tensorrt_llm.lora_manager's re-export, so the class moved between rc20 and rc26. The docs' newer path first.
LORA_CONFIG_MODULES = ("tensorrt_llm._torch.peft.lora.config", "tensorrt_llm.lora_helper")


def lora_config(values: Mapping[str, Any], version: str) -> Any:
    """The release's own ``LoraConfig`` (from the first of ``LORA_CONFIG_MODULES`` that has it); what it refuses,
    or a release where neither path holds it, is a ``TrtllmConfigError`` naming option.enable_lora."""
    for name in LORA_CONFIG_MODULES:
        try:
            make = importlib.import_module(name).LoraConfig
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise TrtllmConfigError(
            f"option.enable_lora=true: TensorRT-LLM {version} has no LoraConfig in {' or '.join(LORA_CONFIG_MODULES)}"
            " (where the releases read define it); serve without option.enable_lora, or use a release lmi-trt reads"
        )
    try:
        return make(**values)
    except (ValueError, TypeError, AssertionError) as exc:
        raise TrtllmConfigError(
            f"option.enable_lora=true: TensorRT-LLM {version} refuses LoraConfig({dict(values)}): {exc}; set "
            "option.max_loras / option.max_lora_rank / option.max_cpu_loras to values this release takes"
        ) from exc


def make_llm(llmapi: ModuleType, model_dir: Path, plan: LlmPlan, version: str, tokenizer: Any = None) -> Any:
    """Construct the LLM (loads the weights; blocking). ``tokenizer``: ours (lmi_trt.serving.tokenizer), so the LLM
    does not load the checkpoint's tokenizer files itself: ``BaseLlmArgs.tokenizer`` takes a
    ``PreTrainedTokenizerBase`` and ``tokenizer_factory`` wraps it as it is (tensorrt_llm/llmapi/tokenizer.py, every
    copy read from 1.0 to main)."""
    return llmapi.LLM(str(model_dir), tokenizer=tokenizer, **llm_configs(llmapi, plan, version), **plan.keywords)


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON file as a dict; empty when it is missing or unreadable (what it would say is unknown)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def config_vocab_size(config: Mapping[str, Any]) -> int | None:
    """Pure: the logits' width from a checkpoint's config.json (a multimodal one keeps it in text_config), or None
    when it does not say (``logit_bias`` is then refused)."""
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return size if isinstance(size, int) and size > 0 else None


def checkpoint_config(model_dir: Path, trust_remote_code: bool) -> Any:
    """The checkpoint's config as TensorRT-LLM's PyTorch backend reads it: ``ModelConfig.from_pretrained`` calls
    ``transformers.AutoConfig.from_pretrained(checkpoint_dir, trust_remote_code=...)`` (tensorrt_llm/_torch/
    model_config.py; read_file ids 2419649560, 5907795105), so attribute_map aliases (GPT-2's ``n_positions``) and
    class defaults count. config.json's own keys where the installed transformers cannot load it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError):  # a model_type this transformers does not know
        return read_json(model_dir / "config.json")


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def release_max_seq_len(config: Any) -> int:
    """Pure: the max_seq_len TensorRT-LLM's PyTorch backend takes for a checkpoint when the LLM gets none, and lowers
    a larger one to ("Specified max_seq_len ... is larger than what the model can support"): PyTorchModelEngine
    ``_init_max_seq_len`` / ``_infer_max_seq_len_from_config`` (tensorrt_llm/_torch/pyexecutor/model_engine.py,
    copies of the 1.x line and main, read_file ids 707893322, 69471950776): ``getattr`` on the transformers config
    (``checkpoint_config``): max_position_embeddings (a multimodal config's text_config's; 2048 when neither says),
    times rope_scaling's factor unless its type is su, longrope, llama3 or yarn; a multimodal model's pretrained
    config is its text config, so its rope_scaling counts too. The value lives in the executor's worker
    (executor/base_worker.py ``self.max_seq_len = _executor.max_seq_len``), not in the LLM's ``args``, and the KV
    cache manager may lower it further (py_executor_creator): an estimate. A model class with its own
    ``infer_max_seq_len`` answers for itself: not modelled."""
    text = _field(config, "text_config") or {}
    # rope_parameters: transformers 5's spelling
    rope = next((r for c in (config, text) for k in ("rope_scaling", "rope_parameters") if (r := _field(c, k))), None)
    factor: float = 1.0
    if isinstance(rope, Mapping) and rope.get("type", rope.get("rope_type")) not in (
        "su",
        "longrope",
        "llama3",
        "yarn",
    ):
        factor = rope.get("factor", 1.0)
    positions = _field(config, "max_position_embeddings") or _field(text, "max_position_embeddings")
    positions = positions if isinstance(positions, int) and positions > 0 else 2048
    return positions if factor == 1 else math.ceil(positions * factor)


def llm_end_id(release: Version, tokenizer_eos: int | None, config: Mapping[str, Any], generation: Mapping[str, Any]):
    """Pure: the end id ``SamplingParams._setup`` gives a request without one: the LLM tokenizer's EOS, except for a
    kimi_k2 model from 1.1 on, whose generation_config.json ``eos_token_id`` wins when it is one id (PR 7120, main
    2025-09-23, before the 1.1 branch cut; tensorrt_llm/sampling_params.py ``_setup`` of the 1.1-1.2 line). 1.0's
    ``_setup(tokenizer, add_special_tokens)`` has no such rule (the 1.0.0rc4 copy)."""
    eos = generation.get("eos_token_id")
    if series(release) >= (1, 1) and config.get("model_type") == "kimi_k2" and isinstance(eos, int):
        return eos
    return tokenizer_eos


def release_refusals(
    version: str,
    sampler: Sampler,
    vocab_size: int | None,
    eos_token_ids: Sequence[int],
    speculation: SpecPlan | None = None,
    lora: bool = False,
) -> dict[str, str]:
    """Pure: feature → why, for what this release's sampler does not apply (``llmapi_releases``' table; engine-only
    features such as beam search with log probs too; with ``speculation``, the method running, what the release does
    not do beside it: ``llmapi_speculation.speculation_refusals``), and what no release can do for this model: bias
    logits without config.json's vocab_size, or hold back more than one EOS id for min_tokens (TorchSampler
    ``_apply_min_length_penalty`` bans ``py_end_id``; the C++ decoder its ``endId``)."""
    release = llm_api_release(version)
    no = not_applied(release, sampler)
    if speculation is not None:  # what the release does not do beside the speculative method that runs
        no.update(speculation_refusals(speculation, version, series(release)))
    if len(eos_token_ids) > 1:
        no.setdefault(
            "min_new_tokens",
            f"TensorRT-LLM holds back one end id ({eos_token_ids[0]}) for min_tokens, and this model also ends on "
            f"{list(eos_token_ids[1:])} (generation_config.json); leave it out",
        )
    if vocab_size is None:
        no.setdefault(
            "logit_bias",
            "the trtllm-pytorch engine cannot bias logits: the checkpoint's config.json gives no vocab_size",
        )
    if not lora:
        no["lora"] = "LoRA adapters are off: set option.enable_lora=true"
    return no


def release_capabilities(
    version: str,
    sampler: Sampler,
    vocab_size: int | None,
    eos_token_ids: Sequence[int],
    max_beam_width: int = 1,
    speculation: SpecPlan | None = None,
    lora: tuple[int, int] | None = None,
) -> Capabilities:
    """Pure: ``release_refusals`` as the serving layer's ``Capabilities`` (its 400s and /v1/capabilities); beams
    where the table's beam row says the release runs them, up to option.max_beam_width; ``lora``: (option.max_loras,
    option.max_lora_rank) where option.enable_lora is on."""
    no = release_refusals(version, sampler, vocab_size, eos_token_ids, speculation, lora is not None)
    if max_beam_width == 1:
        no.setdefault(
            "beam_width",
            "the trtllm-pytorch engine runs 1 beam: option.max_beam_width is 1; serve with option.max_beam_width "
            "set to the widest beam",
        )

    def capability(feature: str, **honoured: Any) -> Any:
        return cannot(no[feature]) if feature in no else can(**honoured)

    return Capabilities(
        release=f"TensorRT-LLM {version} (pytorch backend, {sampler}"
        + (f", {speculation.method} speculative decoding)" if speculation else ")"),
        logprobs=capability("logprobs"),
        top_logprobs=capability("top_logprobs", most=MAX_TOP_LOGPROBS),
        prompt_logprobs=capability("prompt_logprobs"),
        logit_bias=capability("logit_bias"),
        guided=capability("guided"),  # xgrammar through the LLM's guided_decoding_backend (llm_plan)
        **{feature: capability(feature) for feature in SAMPLING_FEATURES},
        beam_search=cannot(no["beam_width"]) if "beam_width" in no else can(most=max_beam_width),
        min_p=cannot("the trtllm-pytorch engine does not pass min_p to TensorRT-LLM here; leave it out, or use top_p"),
        lora=capability("lora", most=lora[0], note=f"up to {lora[0]} adapters on the device, rank ≤ {lora[1]}")
        if lora is not None
        else capability("lora"),
    )


# =============================================================================== requests


@dataclass(frozen=True)
class RequestPlan:
    """``SamplingParams`` keywords, and what reading the result needs."""

    sampling: dict[str, Any]
    end_id: int  # -1: never (ignore_eos)
    extra_eos: frozenset[int]
    guide: dict[str, Any] | None = None  # GuidedDecodingParams keywords (tensorrt_llm/sampling_params.py)
    bias: dict[int, float] = dataclasses.field(default_factory=dict)  # logit_bias → SamplingParams.embedding_bias


@dataclass(frozen=True)
class Codec:
    """The LLM's tokenizer as the two calls ``SamplingParams._setup`` relies on."""

    decode: Callable[[list[int]], str]
    encode: Callable[[str], list[int]]  # without special tokens, as _setup encodes stop/bad strings


def split_words(words: Sequence[Sequence[int]], codec: Codec | None) -> tuple[list[int], list[str], list[list[int]]]:
    """Pure: single-token words as ids; longer ones as text where the LLM's re-tokenization gives the same
    ids back (the LLM API takes only those two forms; no codec: no text); the rest are returned as they are."""
    ids = [w[0] for w in words if len(w) == 1]
    texts, left = [], []
    for word in (list(w) for w in words if len(w) > 1):
        text = codec.decode(word) if codec is not None else None
        if codec is not None and codec.encode(text) == word:
            texts.append(text)
        else:
            left.append(word)
    return ids, texts, left


def plan_request(
    req: GenerationRequest,
    *,
    eos_token_ids: Sequence[int],
    end_id: int | None,
    pad_token_id: int,
    max_beam_width: int,
    seed: int,
    codec: Codec,
    unsupported: Mapping[str, str] | None = None,
    beam_rule: str | None = None,
) -> RequestPlan:
    """Pure: a protocol request as ``SamplingParams`` keywords; ``EngineError(400)`` for what cannot be served.

    ``end_id`` is the one the LLM's ``SamplingParams._setup`` takes from its tokenizer (None: it has none, so
    the request names one and no stop/ban goes as text). ``unsupported``: feature → why, what the release does not
    apply (``release_refusals``); ``beam_rule``: why a beam width other than ``max_beam_width`` is refused
    (``llmapi_releases.beam_width_rule``), None where none is.
    The checks, the DJL sampling rules and the stop words are the Executor path's (``map_request``); here they
    are spelled the LLM API's way. A stop sequence the LLM cannot match is left to the serving layer's text
    match; a banned sequence it cannot match is refused."""
    # the LLM's end id first: the others stop as stop words (map_request)
    eos = [end_id, *(e for e in eos_token_ids if e != end_id)] if end_id is not None else list(eos_token_ids)
    # beams with stop words: the release table's beam_width+stop row decides (release_refusals)
    spec = map_request(
        req, eos_token_ids=eos, pad_token_id=pad_token_id, max_beam_width=max_beam_width, seed=seed, beams_stop=True
    )
    if req.adapter is not None and req.sampling.beam_width > 1:
        raise EngineError(
            "beam search with a LoRA adapter was not verified on the pytorch backend; ask for 1 beam with an adapter",
            code=400,
            field="adapter",
        )
    if beam_rule is not None and req.sampling.beam_width != max_beam_width:
        raise EngineError(f"beam_width={req.sampling.beam_width}: {beam_rule}", code=400, field="beam_width")
    unsupported = unsupported or {}
    used = requested(
        req.sampling,
        bad_words=any(req.bad_words_ids),
        stop_token_ids=any(req.stop_token_ids),
        stop=bool(spec.request["stop_words"]),
    )
    refusing = first_unsupported(unsupported, used)
    if refusing is not None:
        name, why = refusing  # the serving layer names the field as the client wrote it (EngineOutput.error_field)
        raise EngineError(why, code=400, field=name)
    p = req.sampling
    sampling = dict(spec.sampling)
    beam_width = sampling.pop("beam_width")
    if beam_width > 1:
        # the LLM API's beam width is best_of, of which n come back (tensorrt_llm/sampling_params.py, 1.0-1.2:
        # it has no num_return_sequences); length_penalty and early_stopping are its fields too
        sampling.update(use_beam_search=True, best_of=beam_width, n=sampling.pop("num_return_sequences"))
    if "seed" in unsupported:  # the sampler draws from its own generator: send none
        sampling.pop("seed", None)
    texts = end_id is not None  # only _setup tokenizes them
    stop_ids, stop_texts, _ = split_words(spec.request["stop_words"] or [], codec if texts else None)
    bad_ids, bad_texts, unbannable = split_words(spec.request["bad_words"] or [], codec if texts else None)
    if unbannable:
        why = "it takes banned sequences as text" if texts else "its tokenizer has no EOS, so it tokenizes no text"
        raise EngineError(
            f"bad word sequence {unbannable[0]} cannot be banned on the pytorch backend: {why}, and "
            f"{codec.decode(unbannable[0])!r} tokenizes differently; ban single tokens instead",
            code=400,
            field="bad_words",
        )
    sampling.update(
        max_tokens=p.max_new_tokens,
        ignore_eos=p.ignore_eos,
        stop_token_ids=stop_ids or None,
        stop=stop_texts or None,
        bad_token_ids=bad_ids or None,
        bad=bad_texts or None,
        include_stop_str_in_output=True,
        # logprobs=k: the k most likely tokens per step (the sampled one's log prob is read from them)
        logprobs=max(p.top_logprobs, 1) if p.logprobs or p.top_logprobs else None,
        # the top 1 of each prompt position; from 1.3.0rc11 each entry also holds the token it predicts (PR 12499)
        prompt_logprobs=1 if p.prompt_logprobs else None,
        detokenize=False,  # the serving layer detokenizes incrementally
    )
    if not texts:  # no _setup: the request names its end and pad ids
        sampling.update(end_id=eos[0], pad_id=pad_token_id)
    return RequestPlan(
        sampling,
        spec.request["end_id"],
        frozenset() if p.ignore_eos else frozenset(eos[1:]),
        dict([spec.guide]) if spec.guide is not None else None,
        spec.bias,
    )


def token_logprobs(tokens: Sequence[int], entries: Sequence[Any]) -> list[float]:
    """Pure: the sampled tokens' log probs from the LLM API's per-token entries (a dict of Logprob, or a float)."""
    out = []
    for token, entry in zip(tokens, entries):
        if isinstance(entry, dict):
            hit = entry.get(token)
            out.append(max(hit.logprob, LOGPROB_FLOOR) if hit is not None else LOGPROB_FLOOR)
        else:
            out.append(max(float(entry), LOGPROB_FLOOR))
    return out


def prompt_token_logprobs(prompt: Sequence[int], entries: Sequence[Any]) -> list[float | None]:
    """Pure: each prompt token's log prob (None for the first, which nothing predicts) from the LLM API's
    prompt entries, where entry t is the distribution after ``prompt[:t + 1]`` (so it scores ``prompt[t + 1]``)."""
    return [None, *token_logprobs(prompt[1:], entries)]


def top_entries(entry: Any, k: int) -> list[tuple[int, float]]:
    """Pure: the ``k`` most likely (token id, log prob) of one step's entry, best first; a float entry (the
    sampled token's log prob only) has no alternatives."""
    if not isinstance(entry, dict):
        return []
    ranked = sorted(entry.items(), key=lambda item: -item[1].logprob)
    return [(token, max(lp.logprob, LOGPROB_FLOOR)) for token, lp in ranked[:k]]


def reason_name(finish_reason: str | None, stop_reason: int | str | None) -> str:
    """Pure: an LLM API finish reason as the Executor's FinishReason name."""
    if finish_reason == "stop":
        return "END_ID" if stop_reason is None else "STOP_WORDS"
    return _REASON_NAMES.get(finish_reason or "", "NOT_FINISHED")


# =============================================================================== the engine


@dataclass(eq=False)
class _Request:
    request_id: str
    result: Any  # the RequestOutput
    plan: RequestPlan
    max_new_tokens: int
    logprobs: bool
    top_logprobs: int
    prompt: Sequence[int] | None = None  # the prompt ids while its log probs are still to be reported
    adapter: str | None = None  # the LoRA adapter it generates with (an adapter in use is not unregistered)
    generated: int = 0
    cancelled: bool = False
    done: bool = False


class LlmApiEngine:
    """The ``Engine`` protocol over ``tensorrt_llm.LLM`` (PyTorch backend, TensorRT-LLM ≥ 1.0)."""

    name = "trtllm-pytorch"

    def __init__(
        self,
        model_dir: str | os.PathLike,
        settings: LlmApiSettings | None = None,
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int | None = None,
        gpu_available: Callable[[], bool] | None = None,
        tokenizer: Any = None,
    ) -> None:
        require_eos(eos_token_ids)
        self._model_dir = Path(model_dir)
        if not (self._model_dir / "config.json").is_file():
            raise TrtllmConfigError(f"{self._model_dir} is not a Hugging Face checkpoint folder (no config.json)")
        self.settings = settings or LlmApiSettings()
        check_settings(self.settings)
        rt = self.settings.runtime
        self._config = read_json(self._model_dir / "config.json")
        self._generation_config = read_json(self._model_dir / "generation_config.json")
        # What the release takes for this checkpoint (its worker's value; the LLM's args do not carry it)
        self._release_max_seq_len = release_max_seq_len(
            checkpoint_config(self._model_dir, self.settings.trust_remote_code)
        )
        given = self.settings.max_seq_len
        if given is not None and given > self._release_max_seq_len:
            raise TrtllmConfigError(
                f"option.max_seq_len={given} is more than TensorRT-LLM takes for {self._model_dir.name} "
                f"({self._release_max_seq_len}: config.json's max_position_embeddings, scaled by rope_scaling's factor "
                "where TensorRT-LLM scales it), and it would lower it silently (_torch/pyexecutor/model_engine.py "
                f"_init_max_seq_len); set option.max_seq_len to at most {self._release_max_seq_len}, or leave it unset"
            )
        self._limits = EngineLimits(
            max_batch_size=rt.max_batch_size if rt.max_batch_size_key is not None else LLM_DEFAULT_BATCH,
            max_input_len=self.settings.max_input_len,
            max_seq_len=given or self._release_max_seq_len,
            max_beam_width=rt.max_beam_width,
        )
        self._capabilities = Capabilities(  # until start() finds the release
            release="",
            logprobs=can(),
            guided=can(),
            lora=cannot(_NOT_STARTED),
            **dict.fromkeys(
                ("top_logprobs", "prompt_logprobs", "logit_bias", "beam_search", "min_p", *SAMPLING_FEATURES),
                cannot(_NOT_STARTED),
            ),
        )
        self._unsupported: dict[str, str] = {}
        self._beam_rule: str | None = None
        self._eos = list(eos_token_ids)
        self._pad = self._eos[0] if pad_token_id is None else pad_token_id
        self._vocab_size = config_vocab_size(self._config)
        self._speculation: str | None = None  # the speculative method running, once started
        # draft tokens proposed/accepted so far, from every iteration's specDecodingStats (C++ executor/types.h
        # SpecDecodingStats: numDraftTokens, numAcceptedTokens, numRequestsWithDraftTokens); None until the release
        # reports one: py_executor.py of the 1.1 line fills stats.specdec_stats only with a spec resource manager,
        # which _torch/speculative/utils.py get_spec_resource_manager gives neither draft-target nor the one-model
        # modes, so zeros there would read as a 0 % acceptance rate that was never measured
        self._spec_counts: dict[str, float] | None = None
        self._gpu_available = gpu_available
        self._tokenizer = tokenizer  # ours, handed to the LLM (make_llm); None: the LLM loads the checkpoint's
        self._llm: Any = None
        self._llmapi: ModuleType | None = None
        self._codec: Codec | None = None
        self._end_id: int | None = None  # the LLM's, as SamplingParams._setup picks it (llm_end_id)
        self.tensorrt_llm_version: str | None = None
        self._healthy = False
        self._closed = False
        self._requests: dict[str, _Request] = {}
        # LoRA adapters: name → the LoRARequest every request naming it sends (its int id unique per registration:
        # the worker's LoraManager keeps an adapter's weights by that id, load_from_hf skipping ids it has seen)
        self._adapters: AdapterTable[Any] = AdapterTable(
            enabled=self.settings.enable_lora,
            max_registered=self.settings.max_cpu_loras,
            using=lambda name: sum(1 for entry in self._requests.values() if entry.adapter == name),
        )
        self._lora_ids = itertools.count(1)
        self._stats_task: asyncio.Task | None = None
        self._closing: asyncio.Future | None = None  # set by close(): ends every open stream
        self._last_iteration: dict | None = None
        self._total_requests = 0
        self._total_tokens = 0

    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def start(self) -> None:
        if self._llm is not None or self._closed:
            raise RuntimeError("LlmApiEngine.start() may be called once")
        llmapi, version = probe_llm_api(self._gpu_available)
        release = llm_api_release(version)
        quantization = checkpoint_quantization(self._config, read_json(self._model_dir / "hf_quant_config.json"))
        plan = llm_plan(self.settings, release, self._config, quantization)
        method = plan.speculative.method if plan.speculative is not None else None
        sampler = llm_sampler(release, self._limits.max_beam_width, speculative=method is not None)
        log.info("loading %s with TensorRT-LLM %s (pytorch backend)", self._model_dir, version)
        try:
            self._llm = await asyncio.to_thread(make_llm, llmapi, self._model_dir, plan, version, self._tokenizer)
        except TrtllmConfigError:  # an option this release lacks or refuses (llm_configs), already named
            raise
        except ValueError as exc:  # pydantic's ValidationError is one too
            raise TrtllmConfigError(
                f"TensorRT-LLM {version} refused the settings for {self._model_dir}: {exc}"
            ) from exc
        except RuntimeError as exc:
            out_of_memory = "out of memory" in str(exc).lower()
            raise EngineError(
                f"TensorRT-LLM {version} could not load {self._model_dir}: {exc}"
                + ("; lower option.kv_cache_free_gpu_mem_fraction or the batch size" if out_of_memory else ""),
                code=507 if out_of_memory else 424,
            ) from exc
        self._llmapi, self.tensorrt_llm_version = llmapi, version
        inferred = []
        if self.settings.max_seq_len is None:
            read_back = self._llm.args.max_seq_len  # a release that fills it in (in-process worker): its own word
            how = (
                "read back from the LLM"
                if read_back
                else "an estimate from the checkpoint, as its model engine infers it; the worker's KV cache may hold "
                "less (py_executor_creator), so set option.max_seq_len for a limit of your own"
            )
            max_seq_len = read_back or self._release_max_seq_len
            self._limits = dataclasses.replace(self._limits, max_seq_len=max_seq_len)
            inferred.append(f"max_seq_len={max_seq_len} ({how}; the server's prompt + max_new_tokens limit)")
        log.info("%s", settings_report(plan, self._llm.args, version, sampler, inferred))
        log.info(
            "TensorRT-LLM %s (pytorch backend): %s",
            version,
            f"speculative decoding: {plan.speculative.description}" if method else "no speculative decoding",
        )
        self._speculation = method
        # what the installed speculative config class says about sampling on one-model paths (llmapi_speculation)
        spec = probed(plan.speculative, getattr(llmapi, plan.speculative.config_class)) if method else None
        lora = (self.settings.max_loras, self.settings.max_lora_rank) if self.settings.enable_lora else None
        self._capabilities = release_capabilities(
            version, sampler, self._vocab_size, self._eos, self._limits.max_beam_width, spec, lora
        )
        self._unsupported = release_refusals(version, sampler, self._vocab_size, self._eos, spec, lora is not None)
        self._beam_rule = beam_width_rule(release, self._limits.max_beam_width)
        log.info(
            "TensorRT-LLM %s (pytorch backend, %s): refused per request: %s",
            version,
            sampler,
            ", ".join(self._unsupported) or "nothing",
        )
        tokenizer = self._llm.tokenizer
        self._codec = Codec(tokenizer.decode, lambda text: tokenizer.encode(text, add_special_tokens=False))
        self._end_id = llm_end_id(release, tokenizer.eos_token_id, self._config, self._generation_config)
        self._closing = asyncio.get_running_loop().create_future()
        self._healthy = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        for entry in list(self._requests.values()):
            self._abort(entry)
        if self._closing is not None:
            self._closing.set_result(None)
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
        if self._llm is not None:
            await asyncio.to_thread(self._llm.shutdown)

    # ------------------------------------------------------------------ requests

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        await warm_guide(request.sampling.guided)
        entry = self._enqueue(request)
        if isinstance(entry, EngineOutput):
            yield entry
            return
        try:
            while True:
                out = await self._next_output(entry)
                if out.finished:
                    self._forget(entry)
                yield out
                if out.finished:
                    return
        finally:
            if not entry.done:  # the consumer went away (client disconnect): free the slot
                self._abort(entry)
                self._forget(entry)

    async def _next_output(self, entry: _Request) -> EngineOutput:
        """The next step of one request, its failure as an error output, or a 503 once the engine closes."""
        step = asyncio.ensure_future(entry.result.__anext__())
        await asyncio.wait({step, self._closing}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            step.cancel()
            return error_output(entry.request_id, "the engine is shutting down", 503)
        try:
            result = step.result()
        except self._llmapi.RequestError as exc:
            return error_output(entry.request_id, f"TensorRT-LLM failed the request: {exc}", 424)
        except StopAsyncIteration:  # no final step seen: the result ended without one
            return error_output(entry.request_id, "TensorRT-LLM ended the request without a result", 424)
        except Exception as exc:  # noqa: BLE001 — an executor failure: trtllm-serve stops the server on one
            log.exception("TensorRT-LLM failed outside one request")
            self._healthy = False
            return error_output(entry.request_id, f"TensorRT-LLM failed: {type(exc).__name__}: {exc}", 424)
        if result.finished and entry.plan.sampling.get("use_beam_search"):
            return self._beams_output(entry, result.outputs)
        return self._to_output(entry, result.outputs[0], finished=result.finished)

    def _beams_output(self, entry: _Request, completions: Sequence[Any]) -> EngineOutput:
        """A beam-search request's final step: one CompletionOutput per beam returned (n of them, best first:
        tensorrt_llm/executor/result.py); their cumulative log-probs are not length-normalized, so no score."""
        beams = []
        for completion in completions:
            ids = list(completion.token_ids)
            tokens, reason = final_tokens_and_reason(
                ids,
                reason_name(completion.finish_reason, completion.stop_reason),
                end_id=entry.plan.end_id,
                extra_eos=entry.plan.extra_eos,
                generated=len(ids),
                max_new_tokens=entry.max_new_tokens,
            )
            beams.append(Beam(tokens, FinishReason.CANCELLED if entry.cancelled else reason))
        if not beams:
            return error_output(entry.request_id, "TensorRT-LLM's beam-search result holds no beam", 424)
        self._total_tokens += sum(len(b.token_ids) for b in beams)
        best = beams[0]
        return EngineOutput(
            entry.request_id, best.token_ids, finished=True, finish_reason=best.finish_reason, beams=beams
        )

    def _enqueue(self, request: GenerationRequest) -> _Request | EngineOutput:
        rid = request.request_id
        if not self._healthy or self._llm is None:
            return error_output(rid, "the TensorRT-LLM engine is not running", 503)
        if rid in self._requests:
            return error_output(rid, f"request id {rid!r} is already in flight", 400)
        llmapi = self._llmapi
        try:
            plan = plan_request(
                request,
                eos_token_ids=self._eos,
                end_id=self._end_id,
                pad_token_id=self._pad,
                max_beam_width=self._limits.max_beam_width,
                seed=random.getrandbits(63),
                codec=self._codec,
                unsupported=self._unsupported,
                beam_rule=self._beam_rule,
            )
            guide = llmapi.GuidedDecodingParams(**plan.guide) if plan.guide is not None else None
            bias = trtllm_engine.embedding_bias(plan.bias, self._vocab_size) if plan.bias else None
            # trtllm-serve passes the request's own LoRARequest (openai_server.py: generate_async(...,
            # lora_request=request.lora_request)); here the registered adapter's
            lora = self._adapters.get(request.adapter) if request.adapter is not None else None
            result = self._llm.generate_async(
                inputs=list(request.prompt_token_ids),
                sampling_params=llmapi.SamplingParams(**plan.sampling, guided_decoding=guide, embedding_bias=bias),
                lora_request=lora,
                streaming=request.streaming,
            )
        except EngineError as exc:
            return error_output(rid, str(exc), exc.code, exc.field)
        except (llmapi.RequestError, ValueError, TypeError) as exc:
            return error_output(rid, f"TensorRT-LLM rejected the request: {exc}", 400)
        except RuntimeError as exc:
            return error_output(rid, f"TensorRT-LLM could not take the request: {exc}", 503)
        entry = _Request(
            rid,
            result,
            plan,
            request.sampling.max_new_tokens,
            request.sampling.logprobs,
            request.sampling.top_logprobs,
            request.prompt_token_ids if request.sampling.prompt_logprobs else None,
            request.adapter,
        )
        self._requests[rid] = entry
        self._total_requests += 1
        if self._stats_task is None:  # the executor has iteration stats from the first request on
            self._stats_task = asyncio.create_task(self._poll_stats(), name="llmapi-stats")
        return entry

    def _to_output(self, entry: _Request, completion: Any, *, finished: bool) -> EngineOutput:
        tokens = list(completion.token_ids_diff)
        logprobs = token_logprobs(tokens, completion.logprobs_diff) if entry.logprobs else None
        top = (
            [top_entries(e, entry.top_logprobs) for e in completion.logprobs_diff[: len(tokens)]]
            if entry.top_logprobs
            else None
        )
        prompt = None
        if entry.prompt is not None and completion.prompt_logprobs:  # on the first step, kept on the later ones
            prompt, entry.prompt = prompt_token_logprobs(entry.prompt, completion.prompt_logprobs), None
        entry.generated += len(tokens)
        self._total_tokens += len(tokens)
        if not finished:
            return EngineOutput(entry.request_id, tokens, logprobs, top, prompt_logprobs=prompt)
        tokens, reason = final_tokens_and_reason(
            tokens,
            reason_name(completion.finish_reason, completion.stop_reason),
            end_id=entry.plan.end_id,
            extra_eos=entry.plan.extra_eos,
            generated=entry.generated,
            max_new_tokens=entry.max_new_tokens,
        )
        if entry.cancelled:
            reason = FinishReason.CANCELLED
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)]
        if top is not None:
            top = top[: len(tokens)]
        return EngineOutput(
            entry.request_id, tokens, logprobs, top, prompt_logprobs=prompt, finished=True, finish_reason=reason
        )

    async def cancel(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is not None and not entry.done:
            self._abort(entry)

    def _abort(self, entry: _Request) -> None:
        if entry.cancelled:
            return
        entry.cancelled = True
        try:
            entry.result.abort()
        except (RuntimeError, TypeError) as exc:  # the executor is already gone (shutdown; a dead weakref: TypeError)
            log.warning("abort of %s failed: %s", entry.request_id, exc)

    def _forget(self, entry: _Request) -> None:
        entry.done = True
        self._requests.pop(entry.request_id, None)

    # ------------------------------------------------------------------ LoRA adapters (AdapterHost)

    def adapters(self) -> list[AdapterInfo]:
        return self._adapters.infos()

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo:
        """Check the adapter in ``folder`` (off the event loop) and serve it as ``name``: 409 for a name taken or
        option.max_cpu_loras reached; 400 for one the release would not serve as peft does: a rank above
        option.max_lora_rank, modules outside ``lora_target_modules`` (the worker's LoraManager skips those with a
        warning: lora_manager.py ``load_from_hf``), anything but plain LoRA (``read_adapter``)."""
        if self._llm is None or not self._healthy:
            raise EngineError("the TensorRT-LLM engine is not running", code=503)
        import torch

        self._adapters.check_room(name)
        text = self._config.get("text_config") or {}
        adapter = await asyncio.to_thread(
            read_adapter,
            name,
            Path(folder),
            max_rank=self.settings.max_lora_rank,
            num_layers=self._config.get("num_hidden_layers") or text.get("num_hidden_layers") or 0,
            # read for its names and shapes only: the weights are the worker's to load. use_rslora is served: the
            # loader scales by lora_alpha / sqrt(r) (lora_manager.py load_from_hf, ``rs_lora = bool(hf_config.get(
            # "use_rslora", False))``, read_file id 1059464385), since NVIDIA/TensorRT-LLM PR 1669 (2024-06, before 1.0)
            dtype=torch.float32,
        )
        # LoRARequest(lora_name, lora_int_id, lora_path) as trtllm-serve's clients send it (docs/source/features/
        # lora.md; examples/serve/openai_completion_client_for_lora.py); tensorrt_llm/executor/request.py checks the
        # path exists
        make = importlib.import_module("tensorrt_llm.executor.request").LoRARequest
        try:
            lora = make(name, next(self._lora_ids), str(folder))
        except ValueError as exc:
            raise EngineError(
                f"LoRA adapter {name!r}: TensorRT-LLM refused it: {exc}", code=400, field="adapter"
            ) from exc
        info = AdapterInfo(name=name, src=src, folder=str(folder), rank=adapter.rank)
        self._adapters.add(info, lora)
        log.info("LoRA adapter %r registered from %s (rank %d, id %d)", name, src, adapter.rank, lora.lora_int_id)
        return info

    async def unregister_adapter(self, name: str) -> None:
        """404 for a name not registered; 409 while a request uses it. The worker keeps the weights it loaded
        under the adapter's id (its LoraManager has no unload): a name registered again gets a new id."""
        self._adapters.remove(name)
        log.info("LoRA adapter %r unregistered", name)

    # ------------------------------------------------------------------ stats

    async def _poll_stats(self) -> None:
        """Keep the newest iteration stats. A get_stats_async pass ends after its timeout when idle; the
        pause between passes bounds the polling however a release ends them (stats queue up meanwhile)."""
        failed_before = False
        while not self._closed:
            try:
                async for stat in self._llm.get_stats_async(timeout=STATS_TIMEOUT_S):
                    self._last_iteration = json.loads(stat) if isinstance(stat, str) else stat
                    self._count_speculation(self._last_iteration.get("specDecodingStats"))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 — stats must never take serving down
                log.log(
                    logging.DEBUG if failed_before else logging.WARNING,
                    "reading TensorRT-LLM iteration stats failed",
                    exc_info=True,
                )
                failed_before = True
            await asyncio.sleep(STATS_PAUSE_S)

    def _count_speculation(self, spec: Mapping[str, Any] | None) -> None:
        """Add one iteration's speculative-decoding figures (each iteration is read once) to the running totals."""
        if not spec or self._speculation is None:
            return
        if self._spec_counts is None:
            self._spec_counts = dict.fromkeys(SPEC_COUNTERS.values(), 0.0)
        for field, name in SPEC_COUNTERS.items():
            self._spec_counts[name] += float(spec.get(field) or 0)

    def stats(self) -> EngineStats:
        extra: dict[str, float] = dict(self._spec_counts or {})
        it = self._last_iteration
        if it is not None:
            extra["executor_active_requests"] = float(it.get("numActiveRequests", 0))
            kv = it.get("kvCacheStats")
            if kv:
                extra["kv_cache_free_blocks"] = float(kv.get("freeNumBlocks", 0))
                extra["kv_cache_used_blocks"] = float(kv.get("usedNumBlocks", 0))
                extra["kv_cache_max_blocks"] = float(kv.get("maxNumBlocks", 0))
        return EngineStats(
            active_requests=len(self._requests),
            queued_requests=int(it.get("numQueuedRequests", 0)) if it is not None else 0,
            max_batch_size=self._limits.max_batch_size,
            total_requests=self._total_requests,
            total_generated_tokens=self._total_tokens,
            extra=extra,
        )
