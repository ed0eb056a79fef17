"""Fake ``tensorrt_llm.bindings.executor``: the C++ Executor bindings, in Python.

Names, constructor keywords (and their order), properties and enum members follow
``trtllm_api_surface.py`` (1.x) and, for 0.12, the v0.12.0 tag's cpp/tensorrt_llm/pybind/executor/bindings.cpp. The
Executor really
generates through the Hugging Face checkpoint the engine file points at (see ``_runtime``).

Version-dependent names (``Request``, ``SamplingConfig``, ``KvCacheConfig``, ``ExecutorConfig``,
``ParallelConfig``, ``FinishReason``, ``CapacitySchedulerPolicy``) are rebound whenever
``tensorrt_llm.__version__`` is set: 0.x gets the 0.12 shapes, 1.x and later the 1.x ones.
Objects are copied when passed in, as pybind passes C++ values by copy.
"""

from __future__ import annotations

import copy
import datetime
import enum

from tensorrt_llm import _state

__version__ = _state.version()


def _tllm_error(msg: str) -> RuntimeError:
    # C++ TllmException surfaces in Python as RuntimeError with this prefix.
    return RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: {msg}")


# --------------------------------------------------------------------------- enums


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class BatchingType(enum.Enum):
    STATIC = 0
    INFLIGHT = 1


class _CapacitySchedulerPolicy1x(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class _CapacitySchedulerPolicy012(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1


class ContextChunkingPolicy(enum.Enum):
    EQUAL_PROGRESS = 0
    FIRST_COME_FIRST_SERVED = 1


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class _FinishReason1x(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class _FinishReason012(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3


class RequestType(enum.Enum):
    REQUEST_TYPE_CONTEXT_AND_GENERATION = 0
    REQUEST_TYPE_CONTEXT_ONLY = 1
    REQUEST_TYPE_GENERATION_ONLY = 2


class RequestStage(enum.Enum):
    QUEUED = 0
    ENCODER_IN_PROGRESS = 1
    CONTEXT_IN_PROGRESS = 2
    GENERATION_IN_PROGRESS = 3
    GENERATION_COMPLETE = 4


for _cls in (_CapacitySchedulerPolicy1x, _CapacitySchedulerPolicy012):
    _cls.__name__ = _cls.__qualname__ = "CapacitySchedulerPolicy"
for _cls in (_FinishReason1x, _FinishReason012):
    _cls.__name__ = _cls.__qualname__ = "FinishReason"

# --------------------------------------------------------------------------- configs


class DynamicBatchConfig:
    def __init__(self, enable_batch_size_tuning, enable_max_num_tokens_tuning, dynamic_batch_moving_average_window):
        self._values = (enable_batch_size_tuning, enable_max_num_tokens_tuning, dynamic_batch_moving_average_window)

    enable_batch_size_tuning = property(lambda self: self._values[0])
    enable_max_num_tokens_tuning = property(lambda self: self._values[1])
    dynamic_batch_moving_average_window = property(lambda self: self._values[2])


class SchedulerConfig:
    def __init__(
        self,
        capacity_scheduler_policy=_CapacitySchedulerPolicy1x.GUARANTEED_NO_EVICT,
        context_chunking_policy=None,
        dynamic_batch_config=None,
    ):
        if capacity_scheduler_policy.__class__.__name__ != "CapacitySchedulerPolicy":
            raise TypeError(
                f"capacity_scheduler_policy must be a CapacitySchedulerPolicy, got {capacity_scheduler_policy!r}"
            )
        self._policy = capacity_scheduler_policy
        self._chunking = context_chunking_policy
        self._dynamic = dynamic_batch_config

    capacity_scheduler_policy = property(lambda self: self._policy)
    context_chunking_policy = property(lambda self: self._chunking)
    dynamic_batch_config = property(lambda self: self._dynamic)


def _check_fraction(fraction) -> None:
    """cpp/tensorrt_llm/executor/kvCacheConfig.cpp (NVIDIA/TensorRT-LLM; the 0.x seven-argument copy and the 1.x copies
    with crossKvCacheFraction alike): the constructor calls setFreeGpuMemoryFraction, which checks
    ``freeGpuMemoryFraction > 0.F`` and ``freeGpuMemoryFraction < 1.F`` (and kvCacheManager.cpp's
    calculateFreeMemBytes again: "Invalid freeMemFraction, freeMemFraction (%f) must be smaller than 1.0f")."""
    if fraction is None:
        return
    if not fraction > 0.0:
        raise _tllm_error("freeGpuMemoryFraction > 0.F")
    if not fraction < 1.0:
        raise _tllm_error("freeGpuMemoryFraction < 1.F")


class _KvCacheConfig1x:
    def __init__(
        self,
        enable_block_reuse=True,
        max_tokens=None,
        max_attention_window=None,
        sink_token_length=None,
        free_gpu_memory_fraction=None,
        host_cache_size=None,
        onboard_blocks=True,
        cross_kv_cache_fraction=None,
        secondary_offload_min_priority=None,
        event_buffer_max_size=0,
        *,
        enable_partial_reuse=True,
        copy_on_partial_reuse=True,
        use_uvm=False,
        runtime_defaults=None,
    ):
        _check_fraction(free_gpu_memory_fraction)
        self.enable_block_reuse = enable_block_reuse
        self.max_tokens = max_tokens
        self.max_attention_window = max_attention_window
        self.sink_token_length = sink_token_length
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.host_cache_size = host_cache_size
        self.onboard_blocks = onboard_blocks
        self.cross_kv_cache_fraction = cross_kv_cache_fraction
        self.secondary_offload_min_priority = secondary_offload_min_priority
        self.event_buffer_max_size = event_buffer_max_size
        self.enable_partial_reuse = enable_partial_reuse
        self.copy_on_partial_reuse = copy_on_partial_reuse
        self.use_uvm = use_uvm
        self._runtime_defaults = runtime_defaults

    def fill_empty_fields_from_runtime_defaults(self, runtime_defaults):
        if self.max_attention_window is None:
            self.max_attention_window = runtime_defaults.max_attention_window
        if self.sink_token_length is None:
            self.sink_token_length = runtime_defaults.sink_token_length


class _KvCacheConfig012:
    """0.x: the first seven arguments only, and block reuse off by default."""

    def __init__(
        self,
        enable_block_reuse=False,
        max_tokens=None,
        max_attention_window=None,
        sink_token_length=None,
        free_gpu_memory_fraction=None,
        host_cache_size=None,
        onboard_blocks=True,
    ):
        _check_fraction(free_gpu_memory_fraction)
        self.enable_block_reuse = enable_block_reuse
        self.max_tokens = max_tokens
        self.max_attention_window = max_attention_window
        self.sink_token_length = sink_token_length
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.host_cache_size = host_cache_size
        self.onboard_blocks = onboard_blocks


class _OrchestratorConfig1x:
    """cpp/tensorrt_llm/pybind/executor/executorConfig.cpp and the nanobind copy (1.x): ``py::init<bool, std::string,
    std::shared_ptr<mpi::MpiComm>, bool>()``, is_orchestrator=True, worker_executable_path="", orch_leader_comm=None,
    spawn_processes=True."""

    def __init__(self, is_orchestrator=True, worker_executable_path="", orch_leader_comm=None, spawn_processes=True):
        self.is_orchestrator = is_orchestrator
        self.worker_executable_path = worker_executable_path
        self.orch_leader_comm = orch_leader_comm
        self.spawn_processes = spawn_processes


class _OrchestratorConfig012:
    """0.x pybind executorConfig.cpp (the copy whose KvCacheConfig binds the seven 0.12 arguments): ``py::init<bool,
    std::string>()``, is_orchestrator=True, worker_executable_path="" only; processes are always spawned."""

    def __init__(self, is_orchestrator=True, worker_executable_path=""):
        self.is_orchestrator = is_orchestrator
        self.worker_executable_path = worker_executable_path


class _ParallelConfig1x:
    def __init__(
        self,
        communication_type=CommunicationType.MPI,
        communication_mode=CommunicationMode.LEADER,
        device_ids=None,
        participant_ids=None,
        orchestrator_config=None,
        num_nodes=None,
    ):
        self.communication_type = communication_type
        self.communication_mode = communication_mode
        self.device_ids = device_ids
        self.participant_ids = participant_ids
        self.orchestrator_config = orchestrator_config
        self.num_nodes = num_nodes


class _ParallelConfig012:
    def __init__(
        self,
        communication_type=CommunicationType.MPI,
        communication_mode=CommunicationMode.LEADER,
        device_ids=None,
        participant_ids=None,
        orchestrator_config=None,
    ):
        self.communication_type = communication_type
        self.communication_mode = communication_mode
        self.device_ids = device_ids
        self.participant_ids = participant_ids
        self.orchestrator_config = orchestrator_config


class PeftCacheConfig:
    def __init__(
        self,
        num_host_module_layer=0,
        num_device_module_layer=0,
        optimal_adapter_size=8,
        max_adapter_size=64,
        num_put_workers=1,
        num_ensure_workers=1,
        num_copy_streams=1,
        max_pages_per_block_host=24,
        max_pages_per_block_device=8,
        device_cache_percent=None,
        host_cache_size=None,
        lora_prefetch_dir=None,
    ):
        self._values = dict(locals())
        del self._values["self"]


class LoraConfig:
    """executor.h ``LoraConfig(taskId, weights = nullopt, config = nullopt)``; the LLM API's worker passes them as
    ``task_id=``, ``weights=``, ``config=`` (tensorrt_llm/executor/worker.py _enqueue_request). Read by the runtime."""

    def __init__(self, task_id, weights=None, config=None):
        self._task_id, self._weights, self._config = task_id, weights, config

    # read-only, as executor.h has getters only (getTaskId, getWeights, getConfig)
    task_id = property(lambda self: self._task_id)
    weights = property(lambda self: self._weights)
    config = property(lambda self: self._config)


class _ExtendedRuntimePerfKnobConfig1x:
    """1.x: ``multi_block_mode`` defaults on (cpp/tensorrt_llm/pybind/executor/executorConfig.cpp and
    cpp/include/tensorrt_llm/executor/executor.h, ``ExtendedRuntimePerfKnobConfig(bool multiBlockMode = true,
    ...)``)."""

    def __init__(self, multi_block_mode=True, enable_context_fmha_fp32_acc=False):
        self.multi_block_mode = multi_block_mode
        self.enable_context_fmha_fp32_acc = enable_context_fmha_fp32_acc
        self.cuda_graph_mode = False
        self.cuda_graph_cache_size = 0


class _ExtendedRuntimePerfKnobConfig012:
    """0.12: the same knob, but ``multi_block_mode`` defaults off (executor.h at v0.12.0)."""

    def __init__(self, multi_block_mode=False, enable_context_fmha_fp32_acc=False):
        self.multi_block_mode = multi_block_mode
        self.enable_context_fmha_fp32_acc = enable_context_fmha_fp32_acc
        self.cuda_graph_mode = False
        self.cuda_graph_cache_size = 0


for _cls in (_ExtendedRuntimePerfKnobConfig1x, _ExtendedRuntimePerfKnobConfig012):
    _cls.__name__ = _cls.__qualname__ = "ExtendedRuntimePerfKnobConfig"


class _ExecutorConfig1x:
    def __init__(
        self,
        max_beam_width=1,
        scheduler_config=SchedulerConfig(),
        kv_cache_config=None,
        enable_chunked_context=False,
        normalize_log_probs=True,
        iter_stats_max_iterations=1000,
        request_stats_max_iterations=0,
        batching_type=BatchingType.INFLIGHT,
        max_batch_size=None,
        max_num_tokens=None,
        parallel_config=None,
        peft_cache_config=PeftCacheConfig(),
        logits_post_processor_config=None,
        decoding_config=None,
        use_gpu_direct_storage=False,
        gpu_weights_percent=1.0,
        max_queue_size=None,
        extended_runtime_perf_knob_config=_ExtendedRuntimePerfKnobConfig1x(),
        debug_config=None,
        recv_poll_period_ms=0,
        max_seq_idle_microseconds=180000000,
        spec_dec_config=None,
        guided_decoding_config=None,
        additional_model_outputs=None,
        cache_transceiver_config=None,
        gather_generation_logits=False,
        mm_embedding_offloading=False,
        enable_trt_overlap=False,
    ):
        # kv_cache_config's default is KvCacheConfig() of the *current* version.
        kv_cache_config = KvCacheConfig() if kv_cache_config is None else kv_cache_config
        for name, value in list(locals().items()):
            if name != "self":
                setattr(self, name, copy.copy(value))


class _ExecutorConfig012:
    """0.12: the same first names, fewer knobs. our 0.12 reading only pins "the same first eight names";
    the rest follows the later 0.x binding read for that section, cut at the knobs 0.12 had."""

    def __init__(
        self,
        max_beam_width=1,
        scheduler_config=SchedulerConfig(),
        kv_cache_config=None,
        enable_chunked_context=False,
        normalize_log_probs=True,
        iter_stats_max_iterations=1000,
        request_stats_max_iterations=0,
        batching_type=BatchingType.INFLIGHT,
        max_batch_size=None,
        max_num_tokens=None,
        parallel_config=None,
        peft_cache_config=PeftCacheConfig(),
        logits_post_processor_config=None,
        decoding_config=None,
        gpu_weights_percent=1.0,
        max_queue_size=None,
        extended_runtime_perf_knob_config=_ExtendedRuntimePerfKnobConfig012(),
    ):
        kv_cache_config = KvCacheConfig() if kv_cache_config is None else kv_cache_config
        for name, value in list(locals().items()):
            if name != "self":
                setattr(self, name, copy.copy(value))


# --------------------------------------------------------------------------- request side


class _SamplingConfig1x:
    def __init__(
        self,
        beam_width=1,
        *,
        top_k=None,
        top_p=None,
        top_p_min=None,
        top_p_reset_ids=None,
        top_p_decay=None,
        seed=None,
        temperature=None,
        min_tokens=None,
        beam_search_diversity_rate=None,
        repetition_penalty=None,
        presence_penalty=None,
        frequency_penalty=None,
        length_penalty=None,
        early_stopping=None,
        no_repeat_ngram_size=None,
        num_return_sequences=None,
        min_p=None,
        beam_width_array=None,
    ):
        _check_sampling(beam_width, top_k, top_p, temperature, repetition_penalty, min_tokens)
        _check_sampling_1x(beam_width, top_p, length_penalty, early_stopping, num_return_sequences)
        for name, value in list(locals().items()):
            if name != "self":
                setattr(self, name, value)


class _SamplingConfig012:
    """0.11–0.12: ``seed``/``min_tokens`` plus the deprecated ``random_seed``/``min_length`` aliases."""

    def __init__(
        self,
        beam_width=1,
        *,
        top_k=None,
        top_p=None,
        top_p_min=None,
        top_p_reset_ids=None,
        top_p_decay=None,
        seed=None,
        random_seed=None,
        temperature=None,
        min_tokens=None,
        min_length=None,
        beam_search_diversity_rate=None,
        repetition_penalty=None,
        presence_penalty=None,
        frequency_penalty=None,
        length_penalty=None,
        early_stopping=None,
        no_repeat_ngram_size=None,
        num_return_sequences=None,
    ):
        seed = random_seed if seed is None else seed
        min_tokens = min_length if min_tokens is None else min_tokens
        _check_sampling(beam_width, top_k, top_p, temperature, repetition_penalty, min_tokens)
        for name, value in list(locals().items()):
            if name not in ("self", "random_seed", "min_length"):
                setattr(self, name, value)

    # The deprecated names read and write the same values, as the 0.12 properties do.
    random_seed = property(lambda self: self.seed, lambda self, v: setattr(self, "seed", v))
    min_length = property(lambda self: self.min_tokens, lambda self, v: setattr(self, "min_tokens", v))


def _check_sampling(beam_width, top_k, top_p, temperature, repetition_penalty, min_tokens) -> None:
    if beam_width < 1:
        raise _tllm_error(f"beamWidth ({beam_width}) must be > 0")
    if top_k is not None and top_k < 0:
        raise _tllm_error(f"topK ({top_k}) must be >= 0")
    if top_p is not None and not 0.0 <= top_p <= 1.0:
        raise _tllm_error(f"topP ({top_p}) must be in [0, 1]")
    if temperature is not None and temperature < 0.0:
        raise _tllm_error(f"temperature ({temperature}) must be >= 0")
    if repetition_penalty is not None and repetition_penalty <= 0.0:
        raise _tllm_error(f"repetitionPenalty ({repetition_penalty}) must be > 0")
    if min_tokens is not None and min_tokens < 0:
        raise _tllm_error(f"minTokens ({min_tokens}) must be >= 0")


def _check_sampling_1x(beam_width, top_p, length_penalty, early_stopping, num_return_sequences) -> None:
    """The 1.x constructor's further checks (cpp/tensorrt_llm/executor/samplingConfig.cpp, the copy with
    beamWidthArray: checkBeamWidth against kMaxBeamWidth 1024, checkTopP > 0, checkLengthPenalty >= 0,
    checkEarlyStopping >= 0, checkNumReturnSequences). The older 0.1x copy (minP, no beamWidthArray) stores
    lengthPenalty and earlyStopping unchecked, so _SamplingConfig012 leaves these out."""
    if beam_width > 1024:
        raise _tllm_error(f"beamWidth ({beam_width}) must be <= kMaxBeamWidth (1024)")
    if top_p is not None and top_p <= 0.0:
        raise _tllm_error(f"topP ({top_p}) must be > 0")
    if length_penalty is not None and length_penalty < 0.0:
        raise _tllm_error(f"lengthPenalty ({length_penalty}) must be >= 0")
    if early_stopping is not None and early_stopping < 0:
        raise _tllm_error(f"earlyStopping ({early_stopping}) must be >= 0")
    if num_return_sequences is not None and (
        num_return_sequences <= 0 or (beam_width != 1 and num_return_sequences > beam_width)
    ):
        raise _tllm_error(f"numReturnSequences ({num_return_sequences}) must be > 0 and <= beamWidth ({beam_width})")


class OutputConfig:
    def __init__(
        self,
        return_log_probs=False,
        return_context_logits=False,
        return_generation_logits=False,
        exclude_input_from_output=False,
        return_encoder_output=False,
        return_perf_metrics=False,
        additional_model_outputs=None,
    ):
        for name, value in list(locals().items()):
            if name != "self":
                setattr(self, name, value)


class LookaheadDecodingConfig:
    """executor.h ``LookaheadDecodingConfig`` (W, N, G) and its binding (cpp/tensorrt_llm/pybind/executor/request.cpp
    and the nanobind copy: ``max_window_size``, ``max_ngram_size``, ``max_verification_set_size``, read-only;
    ``calculate_speculative_resource`` and the static defaults), with the constructor's checks and
    ``calculateSpeculativeResourceTuple`` of cpp/tensorrt_llm/executor/decodingConfig.cpp (read at the crawl copy
    with ExternalDraftTokensConfig's fastLogits, a 1.x state)."""

    def __init__(self, max_window_size, max_ngram_size, max_verification_set_size):
        w, n, g = max_window_size, max_ngram_size, max_verification_set_size
        for ok, message in (
            (n >= 1, "ngramSize requires >= 1"),
            (w >= 1, "windowSize requires >= 1"),
            (n != 1 or g == 0, "ngramSize=1 requires verificationSetSize=0"),
            (n != 1 or w == 1, "ngramSize=1 requires windowSize=1"),
            (g >= 0, "verificationSetSize requires >=0"),
        ):
            if not ok:
                raise _tllm_error(message)
        self._w, self._n, self._g = w, n, g

    max_window_size = property(lambda self: self._w)
    max_ngram_size = property(lambda self: self._n)
    max_verification_set_size = property(lambda self: self._g)

    def calculate_speculative_resource(self):
        return LookaheadDecodingConfig.calculate_speculative_resource_tuple(self._w, self._n, self._g)

    @staticmethod
    def calculate_speculative_resource_tuple(window_size, ngram_size, verification_set_size):
        """(maxDecodingTokens, maxPathLen, maxDraftTokens, maxDraftPathLen), as decodingConfig.cpp computes them."""
        draft = (0 if ngram_size == 1 else ngram_size - 2) + (window_size - 1 + verification_set_size) * (
            ngram_size - 1
        )
        return draft + 1, ngram_size, draft, ngram_size - 1

    @staticmethod
    def get_default_lookahead_decoding_window():
        return 4

    @staticmethod
    def get_default_lookahead_decoding_ngram():
        return 3

    @staticmethod
    def get_default_lookahead_decoding_verification_set():
        return 4


class DecodingMode:
    """executor.h ``DecodingMode``: built by its static factories, asked with ``is*``."""

    _KINDS = ("Auto", "TopK", "TopP", "TopKTopP", "BeamSearch", "Medusa", "Lookahead", "ExplicitDraftTokens", "Eagle")

    def __init__(self, kind):
        self._kind = kind

    name = property(lambda self: self._kind)


def _decoding_mode_api():
    for kind in DecodingMode._KINDS:
        setattr(DecodingMode, kind, staticmethod(lambda kind=kind: DecodingMode(kind)))
        setattr(DecodingMode, f"is{kind}", lambda self, kind=kind: self._kind == kind)
    DecodingMode.isTopKorTopP = lambda self: self._kind in ("TopK", "TopP", "TopKTopP")
    DecodingMode.isTopKandTopP = lambda self: self._kind == "TopKTopP"
    del DecodingMode.isTopKTopP


_decoding_mode_api()


class DecodingConfig:
    """executor.h ``DecodingConfig``; its constructor's checks (decodingConfig.cpp): a lookahead config, Medusa
    choices or an EAGLE config needs the decoding mode set, to Lookahead, Medusa or Eagle."""

    def __init__(self, decoding_mode=None, lookahead_decoding_config=None, medusa_choices=None, eagle_config=None):
        for given, kind, what in (
            (lookahead_decoding_config, "Lookahead", "LookaheadDecodingConfig is set"),
            (medusa_choices, "Medusa", "MedusaChoices are set"),
            (eagle_config, "Eagle", "EagleConfig is set"),
        ):
            if given is not None and decoding_mode is None:
                raise _tllm_error(f"{what}, but DecodingMode is not set")
            if given is not None and not getattr(decoding_mode, f"is{kind}")():
                raise _tllm_error(f"{what}, but DecodingMode is not set to {kind}")
        self.decoding_mode = decoding_mode
        self.lookahead_decoding_config = lookahead_decoding_config
        self.medusa_choices = medusa_choices
        self.eagle_config = eagle_config


class GuidedDecodingConfig:
    """executor.h ``GuidedDecodingConfig`` (1.x; 0.12's ExecutorConfig has no guided_decoding_config). The fake
    guides with xgrammar only."""

    class GuidedDecodingBackend(enum.Enum):
        XGRAMMAR = 0
        LLGUIDANCE = 1

    def __init__(self, backend, encoded_vocab=None, tokenizer_str=None, stop_token_ids=None):
        # Kept private: the listing names no properties (the runtime reads them).
        self._backend, self._encoded_vocab = backend, encoded_vocab
        self._tokenizer_str, self._stop_token_ids = tokenizer_str, stop_token_ids


class GuidedDecodingParams:
    """executor.h ``GuidedDecodingParams`` (1.x): read-only guide type and guide."""

    class GuideType(enum.Enum):
        JSON = 0
        JSON_SCHEMA = 1
        REGEX = 2
        EBNF_GRAMMAR = 3
        STRUCTURAL_TAG = 4

    def __init__(self, guide_type, guide=None):
        self._guide_type, self._guide = guide_type, guide

    guide_type = property(lambda self: self._guide_type)
    guide = property(lambda self: self._guide)


class _ExternalDraftTokensConfig1x:
    """executor.h ``ExternalDraftTokensConfig`` as the 1.x bindings expose it (cpp/tensorrt_llm/pybind/executor/
    request.cpp and the nanobind copy: ``(tokens, logits=None, acceptance_threshold=None, fast_logits=None)``, each a
    read-only property)."""

    def __init__(self, tokens, logits=None, acceptance_threshold=None, fast_logits=None):
        self._tokens, self._logits = list(tokens), logits
        self._threshold, self._fast = acceptance_threshold, fast_logits

    tokens = property(lambda self: list(self._tokens))
    logits = property(lambda self: self._logits)
    acceptance_threshold = property(lambda self: self._threshold)
    fast_logits = property(lambda self: self._fast)


class _ExternalDraftTokensConfig012:
    """A 0.x copy of request.cpp (OutputConfig of five flags): ``(tokens, logits=None, acceptance_threshold=None)``,
    no fast_logits."""

    def __init__(self, tokens, logits=None, acceptance_threshold=None):
        self._tokens, self._logits, self._threshold = list(tokens), logits, acceptance_threshold

    tokens = property(lambda self: list(self._tokens))
    logits = property(lambda self: self._logits)
    acceptance_threshold = property(lambda self: self._threshold)


class _RequestBase:
    """Shared storage: ``input_token_ids``/``max_tokens`` are read-only, ``type`` is stored as
    ``request_type`` (as in the bindings), everything else is a read/write attribute."""

    BATCHED_POST_PROCESSOR_NAME = "batched"

    def _store(self, values: dict) -> None:
        values = dict(values)
        values.pop("self")
        self._input_token_ids = list(values.pop("input_token_ids"))
        self._max_tokens = values.pop("max_tokens")
        if self._max_tokens is None:
            raise _tllm_error("missing required argument max_tokens")
        if not self._input_token_ids:
            raise _tllm_error("input_token_ids must not be empty")
        self.request_type = values.pop("type")
        for name, value in values.items():
            setattr(self, name, copy.copy(value))

    input_token_ids = property(lambda self: list(self._input_token_ids))
    max_tokens = property(lambda self: self._max_tokens)


class _Request1x(_RequestBase):
    def __init__(
        self,
        input_token_ids,
        max_tokens,
        *,
        streaming=False,
        sampling_config=None,
        output_config=None,
        end_id=None,
        pad_id=None,
        position_ids=None,
        bad_words=None,
        stop_words=None,
        embedding_bias=None,
        external_draft_tokens_config=None,
        prompt_tuning_config=None,
        multimodal_input=None,
        multimodal_embedding=None,
        mrope_config=None,
        lora_config=None,
        lookahead_config=None,
        kv_cache_retention_config=None,
        logits_post_processor_name=None,
        logits_post_processor=None,
        encoder_input_token_ids=None,
        client_id=None,
        return_all_generated_tokens=False,
        priority=0.5,
        type=RequestType.REQUEST_TYPE_CONTEXT_AND_GENERATION,
        context_phase_params=None,
        encoder_input_features=None,
        encoder_output_length=None,
        cross_attention_mask=None,
        num_return_sequences=1,
        eagle_config=None,
        skip_cross_attn_blocks=None,
        guided_decoding_params=None,
        language_adapter_uid=None,
        allotted_time_ms=None,
        cache_salt_id=None,
    ):
        # Defaults are SamplingConfig()/OutputConfig() of the current version.
        sampling_config = SamplingConfig() if sampling_config is None else sampling_config
        output_config = OutputConfig() if output_config is None else output_config
        self._store(locals())


class _Request012(_RequestBase):
    """0.11–0.12: keyword-only after the prompt; ``max_new_tokens`` is the deprecated alias."""

    def __init__(
        self,
        input_token_ids,
        *,
        max_tokens=None,
        max_new_tokens=None,
        streaming=False,
        sampling_config=None,
        output_config=None,
        end_id=None,
        pad_id=None,
        position_ids=None,
        bad_words=None,
        stop_words=None,
        embedding_bias=None,
        external_draft_tokens_config=None,
        prompt_tuning_config=None,
        lora_config=None,
        lookahead_config=None,
        logits_post_processor_name=None,
        encoder_input_token_ids=None,
        client_id=None,
        return_all_generated_tokens=False,
        priority=0.5,
        type=RequestType.REQUEST_TYPE_CONTEXT_AND_GENERATION,
    ):
        max_tokens = max_new_tokens if max_tokens is None else max_tokens
        sampling_config = SamplingConfig() if sampling_config is None else sampling_config
        output_config = OutputConfig() if output_config is None else output_config
        values = dict(locals())
        del values["max_new_tokens"]
        self._store(values)

    max_new_tokens = property(lambda self: self._max_tokens)


for _cls in (_Request1x, _Request012):
    _cls.__name__ = _cls.__qualname__ = "Request"
for _cls in (_SamplingConfig1x, _SamplingConfig012):
    _cls.__name__ = _cls.__qualname__ = "SamplingConfig"
for _cls in (_KvCacheConfig1x, _KvCacheConfig012):
    _cls.__name__ = _cls.__qualname__ = "KvCacheConfig"
for _cls in (_ExternalDraftTokensConfig1x, _ExternalDraftTokensConfig012):
    _cls.__name__ = _cls.__qualname__ = "ExternalDraftTokensConfig"
for _cls in (_ExecutorConfig1x, _ExecutorConfig012):
    _cls.__name__ = _cls.__qualname__ = "ExecutorConfig"
for _cls in (_ParallelConfig1x, _ParallelConfig012):
    _cls.__name__ = _cls.__qualname__ = "ParallelConfig"
for _cls in (_OrchestratorConfig1x, _OrchestratorConfig012):
    _cls.__name__ = _cls.__qualname__ = "OrchestratorConfig"

# --------------------------------------------------------------------------- responses & stats


def _result_class(fields: dict, base: type = object) -> type:
    """A Result shape binding ``fields`` (name -> default, or a factory for a fresh list) on top of ``base``'s.
    Slots: a pybind/nanobind object takes no attribute it does not bind (no py::dynamic_attr())."""

    def __init__(self):
        base.__init__(self)
        for name, default in fields.items():
            setattr(self, name, default() if callable(default) else default)

    return type("Result", (base,), {"__slots__": tuple(fields), "__init__": __init__})


# 0.x: the pybind Result of a lookahead-era NVIDIA/TensorRT-LLM crawl copy of the executor bindings (its
# DecodingConfig takes lookahead_decoding_config; its ExtendedRuntimePerfKnobConfig has enable_context_fmha_fp32_acc):
# no decoding_iter.
_Result012 = _result_class(
    {
        "is_final": False,
        "output_token_ids": list,
        "cum_log_probs": None,
        "log_probs": None,
        "context_logits": None,
        "generation_logits": None,
        "encoder_output": None,
        "finish_reasons": list,
        "sequence_index": 0,
        "is_sequence_final": False,
    }
)
# 1.0: the later fields but no decoding_iter, since 1.0 is not shown to bind it: every binding copy read that does
# (pybind ``def_readwrite("decoding_iter", &tle::Result::decodingIter)``, nanobind ``def_rw``) is undated or 1.1+
# (nanobind), and the release that added it was not pinned.
_Result10 = _result_class(
    {
        "spec_dec_fast_logits_info": None,
        "avg_decoded_tokens_per_iter": 0.0,
        "context_phase_params": None,
        "request_perf_metrics": None,
        "additional_outputs": list,
    },
    _Result012,
)
_Result1x = _result_class({"decoding_iter": 0}, _Result10)


class Response:
    """Either an error (``Response(request_id, "message")``) or a ``Result`` — two overloads in the
    bindings, told apart by the type of the second argument as pybind does."""

    def __init__(self, request_id, result, client_id=None):
        self._request_id = request_id
        self._client_id = client_id
        if isinstance(result, str):
            self._error, self._result = result, None
        else:
            self._error, self._result = None, result

    request_id = property(lambda self: self._request_id)
    client_id = property(lambda self: self._client_id)

    def has_error(self):
        return self._error is not None

    @property
    def error_msg(self):
        if self._error is None:
            raise _tllm_error("Cannot get the error message of a response without error")
        return self._error

    @property
    def result(self):
        if self._error is not None:
            raise _tllm_error(f"Cannot get the result for a response with an error ({self._error})")
        return self._result

    def clear_context_logits(self):
        if self._result is not None:
            self._result.context_logits = None

    def clear_generation_logits(self):
        if self._result is not None:
            self._result.generation_logits = None


class KvCacheStats:
    def __init__(self):
        self.max_num_blocks = 0
        self.free_num_blocks = 0
        self.used_num_blocks = 0
        self.tokens_per_block = 0
        self.alloc_total_blocks = 0
        self.alloc_new_blocks = 0
        self.reused_blocks = 0
        self.missed_blocks = 0
        self.cache_hit_rate = 0.0


class InflightBatchingStats:
    def __init__(self):
        self.num_scheduled_requests = 0
        self.num_context_requests = 0
        self.num_gen_requests = 0
        self.num_paused_requests = 0
        self.num_ctx_tokens = 0
        self.micro_batch_id = 0
        self.avg_num_decoded_tokens_per_iter = 0.0


class IterationStats:
    def __init__(self):
        self.timestamp = ""
        self.iter = 0
        self.iter_latency_ms = 0.0
        self.new_active_requests_queue_latency_ms = 0.0
        self.num_new_active_requests = 0
        self.num_active_requests = 0
        self.num_queued_requests = 0
        self.num_completed_requests = 0
        self.max_num_active_requests = 0
        self.gpu_mem_usage = 0
        self.cpu_mem_usage = 0
        self.pinned_mem_usage = 0
        self.kv_cache_stats = None
        self.cross_kv_cache_stats = None
        self.static_batching_stats = None
        self.inflight_batching_stats = None
        self.specdec_stats = None

    def to_json_str(self):
        import json

        def plain(v):
            return v.__dict__ if hasattr(v, "__dict__") else v

        return json.dumps({k: plain(v) for k, v in self.__dict__.items()})


class RequestStats:
    def __init__(self):
        self.id = 0
        self.stage = RequestStage.QUEUED
        self.context_prefill_position = 0
        self.num_generated_tokens = 0
        self.avg_num_decoded_tokens_per_iter = 0.0
        self.scheduled = False
        self.paused = False
        self.dis_serving_stats = None
        self.alloc_total_blocks_per_request = 0
        self.alloc_new_blocks_per_request = 0
        self.reused_blocks_per_request = 0
        self.missed_blocks_per_request = 0
        self.kv_cache_hit_rate_per_request = 0.0

    def to_json_str(self):
        import json

        return json.dumps({k: (v.name if isinstance(v, enum.Enum) else v) for k, v in self.__dict__.items()})


class RequestStatsPerIteration:
    def __init__(self):
        self.iter = 0
        self.request_stats = []

    def to_json_str(self):
        import json

        return json.dumps(
            {"iter": self.iter, "request_stats": [json.loads(s.to_json_str()) for s in self.request_stats]}
        )


# --------------------------------------------------------------------------- the executor


class Executor:
    """Only the decoder-only engine-directory overload ``Executor(model_path, model_type, executor_config)``."""

    def __init__(self, model_path, model_type, executor_config):
        from tensorrt_llm import _runtime

        if model_type != ModelType.DECODER_ONLY:
            raise _tllm_error(f"the fake executor serves decoder-only engines, got {model_type}")
        self._impl = _runtime.ExecutorImpl(model_path, executor_config, api=_api())

    def enqueue_request(self, request):
        return self._impl.enqueue(request)

    def enqueue_requests(self, requests):
        return [self._impl.enqueue(r) for r in requests]

    def await_responses(self, *args, **kwargs):
        """The three overloads, resolved as pybind does: ``(timeout=None)``, ``(id, timeout=None)``,
        ``(ids, timeout=None)``; a bare ``int`` is a request id, a ``timedelta`` (or float seconds) a timeout."""
        if len(args) > 2 or set(kwargs) - {"id", "ids", "timeout"}:
            raise TypeError(f"await_responses(): incompatible function arguments {args!r} {kwargs!r}")
        target, timeout = None, kwargs.get("timeout")
        if "id" in kwargs or "ids" in kwargs:
            target = kwargs.get("id", kwargs.get("ids"))
            if args:
                raise TypeError("await_responses(): incompatible function arguments")
        elif args:
            if isinstance(args[0], (int, list)) and not isinstance(args[0], bool):
                target = args[0]
                if len(args) == 2:
                    timeout = args[1]
            elif len(args) == 1:
                timeout = args[0]
            else:
                raise TypeError("await_responses(): incompatible function arguments")
        seconds = _seconds(timeout)
        if isinstance(target, list):
            return [self._impl.await_responses(i, seconds) for i in target]
        return self._impl.await_responses(target, seconds)

    def get_num_responses_ready(self, id=None):
        return self._impl.num_ready(id)

    def cancel_request(self, id):
        self._impl.cancel(id)

    def get_latest_iteration_stats(self):
        return self._impl.drain_iteration_stats()

    def get_latest_request_stats(self):
        return self._impl.drain_request_stats()

    def can_enqueue_requests(self):
        return self._impl.is_leader

    def shutdown(self):
        self._impl.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return max(timeout.total_seconds(), 0.0)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        return max(float(timeout), 0.0)
    raise TypeError(f"await_responses(): timeout must be a datetime.timedelta, got {type(timeout).__name__}")


# --------------------------------------------------------------------------- version switching

_VARIANTS = {
    "Request": (_Request012, _Request1x),
    "SamplingConfig": (_SamplingConfig012, _SamplingConfig1x),
    "KvCacheConfig": (_KvCacheConfig012, _KvCacheConfig1x),
    "ExecutorConfig": (_ExecutorConfig012, _ExecutorConfig1x),
    "ExternalDraftTokensConfig": (_ExternalDraftTokensConfig012, _ExternalDraftTokensConfig1x),
    "ParallelConfig": (_ParallelConfig012, _ParallelConfig1x),
    "OrchestratorConfig": (_OrchestratorConfig012, _OrchestratorConfig1x),
    "FinishReason": (_FinishReason012, _FinishReason1x),
    "CapacitySchedulerPolicy": (_CapacitySchedulerPolicy012, _CapacitySchedulerPolicy1x),
    "ExtendedRuntimePerfKnobConfig": (_ExtendedRuntimePerfKnobConfig012, _ExtendedRuntimePerfKnobConfig1x),
}

Request = _Request1x
SamplingConfig = _SamplingConfig1x
KvCacheConfig = _KvCacheConfig1x
ExecutorConfig = _ExecutorConfig1x
ExternalDraftTokensConfig = _ExternalDraftTokensConfig1x
ParallelConfig = _ParallelConfig1x
OrchestratorConfig = _OrchestratorConfig1x
FinishReason = _FinishReason1x
CapacitySchedulerPolicy = _CapacitySchedulerPolicy1x
ExtendedRuntimePerfKnobConfig = _ExtendedRuntimePerfKnobConfig1x
Result = _Result1x


_EXECUTOR = Executor
_SINCE_1X = {"GuidedDecodingConfig": GuidedDecodingConfig, "GuidedDecodingParams": GuidedDecodingParams}


def _select(version: str) -> None:
    old = _state.series(version)[0] == 0
    g = globals()
    g["__version__"] = version
    for name, (v012, v1x) in _VARIANTS.items():
        g[name] = v012 if old else v1x
    g["Result"] = _Result012 if old else _Result10 if _state.series(version) < (1, 1) else _Result1x
    # NVIDIA/TensorRT-LLM PR 16369 (on main after 1.2, the fake's "1.3.0"): "The nanobind Executor class no
    # longer exists".
    if _state.series(version) >= (1, 3):
        g.pop("Executor", None)
    else:
        g["Executor"] = _EXECUTOR
    for name, cls in _SINCE_1X.items():  # guided decoding came to the Executor after 0.12
        if old:
            g.pop(name, None)
        else:
            g[name] = cls


def _api():
    """This module, for the runtime to build results of the current version's shapes."""
    import sys

    return sys.modules[__name__]


_state.on_change(_select)
