"""Fake ``tensorrt_llm.llmapi.llm_args`` (real file: tensorrt_llm/llmapi/llm_args.py): the configuration
models the LLM takes, as strict pydantic models (unknown keys are rejected, like the real StrictBaseModel).
Only the fields lmi-trt maps are modelled; their names, order and defaults are the real ones.

The sampler keys differ by release (``_RELEASE_FIELDS``); a key the release lacks is rejected as an unknown one:
* 1.0: ``enable_mixed_sampler`` (renamed from ``mixed_sampler`` by PR 5751) and ``enable_trtllm_sampler``
  (llm_args.py of the 1.0 line, read in a copy with both fields and no ``sampler_type``; the 1.0.0 docs'
  features/sampling.md: "Enable the enable_trtllm_sampler option in the LLM class");
* 1.1 and 1.2: ``sampler_type`` = ``auto`` | ``TorchSampler`` | ``TRTLLMSampler`` (PR 6831, merged 2025-08-16
  after main became 1.1.0rc1); PR 7294 removed ``enable_mixed_sampler``;
* main: PR 18232 (1.3.0rc26) removed ``TRTLLMSampler`` and ``sampler_type``; PR 18513 (1.3.0rc27) accepts
  ``auto`` and ``TorchSampler`` again, ignored, and rejects ``TRTLLMSampler`` (``_state.FIXES``).
``KvCacheConfig.free_gpu_memory_fraction``: None on 1.0 (``default=None``, "Default is 90%"), 0.9 from 1.1 (the
1.1/1.2 copy), bounded to [0, 1] on main (the newest copy).
"""

from __future__ import annotations

import enum
from os import PathLike
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from tensorrt_llm import _state


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CapacitySchedulerPolicy(str, enum.Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class ContextChunkingPolicy(str, enum.Enum):
    FIRST_COME_FIRST_SERVED = "FIRST_COME_FIRST_SERVED"
    EQUAL_PROGRESS = "EQUAL_PROGRESS"


class KvCacheConfig(_Strict):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = 0.9  # 1.0: None (_release_default)
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    dtype: str = "auto"
    tokens_per_block: int = 32

    @model_validator(mode="before")
    @classmethod
    def _release_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "free_gpu_memory_fraction" not in data and _state.series() < (1, 1):
            return {**data, "free_gpu_memory_fraction": None}
        return data

    @field_validator("free_gpu_memory_fraction")
    @classmethod
    def _fraction(cls, value: float | None) -> float | None:
        if value is not None and _state.series() >= (1, 3) and not 0.0 <= value <= 1.0:
            raise ValueError("Input should be less than or equal to 1 and greater than or equal to 0")
        return value


class CudaGraphConfig(_Strict):
    batch_sizes: list[int] | None = None
    max_batch_size: int = Field(0, ge=0)
    enable_padding: bool = False

    @model_validator(mode="after")
    def _sizes(self) -> CudaGraphConfig:
        if self.batch_sizes:
            self.batch_sizes = sorted(self.batch_sizes)
            if self.max_batch_size and self.max_batch_size != self.batch_sizes[-1]:
                raise ValueError("CudaGraphConfig: max_batch_size conflicts with max(batch_sizes)")
            self.max_batch_size = self.batch_sizes[-1]
        elif not self.max_batch_size:
            self.max_batch_size = 128
        return self


# MoeConfig.backend's choices by release, as the copies of llm_args.py read list them (dated by content: the 1.0 copy
# still has enable_mixed_sampler, which PR 7294 removed in 1.1; the 1.1 copy adds sampler_type and TRITON; the 1.2
# copy adds AUTO as the default; main adds DENSEGEMM, MARLIN and MEGAMOE_DEEPGEMM).
_MOE_BACKENDS = {
    (1, 0): ("CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA"),
    (1, 1): ("CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"),
    (1, 2): ("AUTO", "CUTLASS", "CUTEDSL", "WIDEEP", "TRTLLM", "DEEPGEMM", "VANILLA", "TRITON"),
    (1, 3): (
        "AUTO",
        "CUTLASS",
        "CUTEDSL",
        "WIDEEP",
        "TRTLLM",
        "DEEPGEMM",
        "DENSEGEMM",
        "VANILLA",
        "TRITON",
        "MARLIN",
        "MEGAMOE_DEEPGEMM",
    ),
}


class MoeConfig(_Strict):
    """The real one is a StrictBaseModel whose ``backend`` is a Literal of the release's choices (default CUTLASS,
    AUTO from 1.2); a name the release lacks is a ValidationError. Only ``backend`` is modelled."""

    backend: str = "CUTLASS"

    @model_validator(mode="before")
    @classmethod
    def _release_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and "backend" not in data and _state.series() >= (1, 2):
            return {**data, "backend": "AUTO"}
        return data

    @field_validator("backend")
    @classmethod
    def _release_choices(cls, value: str) -> str:
        choices = _MOE_BACKENDS[min(_state.series(), (1, 3))]
        if value not in choices:
            raise ValueError(f"Input should be {', '.join(repr(c) for c in choices)}")
        return value


class SchedulerConfig(_Strict):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: dict | None = None


# ------------------------------------------------------------------ speculative decoding
# The speculative configs (tensorrt_llm/llmapi/llm_args.py ``DecodingBaseConfig`` and its subclasses), read in four
# copies dated as above: the 1.0 copy (enable_mixed_sampler; read_file id 1520735490), the 1.1 copy (sampler_type,
# TRITON; id 1090804222), the 1.2-dated copy (MoE AUTO default; may be an early main; id 7019226376) and main (id
# 55143598664). Only the fields lmi-trt sets, and the checks on them, are modelled. Simplifications: the draft model is
# stored as ``speculative_model_dir``, which every copy accepts (the field in 1.0/1.1; an alias of
# ``speculative_model`` from PR 10099 on); NGram's ``max_matching_ngram_size`` default is 2 (the 1.0 and 1.1 copies
# default it to 0 and assert > 0; lmi-trt always sets it).
#
# ``allow_advanced_sampling`` differs by release, so the classes are built once per shape and the module's names are
# rebound when the release played changes (``_rebind``), as the plugin and executor fakes do:
# * absent in the 1.0 and 1.1 copies;
# * ``Field(default=False, status="prototype", description="If true, allows non-greedy sampling when speculation is
#   used. Only applicable to 1-model code paths; non-greedy sampling is always enabled on 2-model paths.")`` in the
#   1.2-dated copy (PR 9885, merged 2025-12-12); llm_args.py's ``Field`` wrapper puts ``status`` into
#   ``json_schema_extra`` (1.1 copy). Whether release 1.2.x was cut before PR 9885 is not pinned: the fake's 1.2 plays
#   the 1.2-dated copy, and the engine probes the field rather than the version, so it is right either way;
# * ``status="deprecated"`` ("DEPRECATED: no-op kept for backward compatibility ... Non-greedy sampling is now
#   auto-detected per request; this flag no longer has any effect") in main's copy: PR 14745 (opened 2026-05-29).
#   Which 1.3.0 candidate took it is not pinned: the fake's candidates play the prototype flag, its 1.3.0 main's.
_ADVANCED_SAMPLING = "allow_advanced_sampling"


def _advanced_sampling_status() -> str | None:
    """The ``allow_advanced_sampling`` field's status in the release played (None: no such field)."""
    if _state.series() < (1, 2):
        return None
    return "deprecated" if _state.has("advanced_sampling_auto") else "prototype"


class DecodingBaseConfig(_Strict):
    max_draft_len: int | None = None
    speculative_model_dir: str | None = None
    max_concurrency: int | None = None  # "PyTorch only": from the 1.1 copy on

    @model_validator(mode="before")
    @classmethod
    def _release_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "max_concurrency" in data and _state.series() < (1, 1):
            raise ValueError("max_concurrency: Extra inputs are not permitted (DecodingBaseConfig of the 1.0 line)")
        return data

    def supports_backend(self, backend: str) -> bool:
        return backend == "pytorch"

    def _positive_draft_len(self, name: str, no_draft_model: str | None = None) -> None:
        # "max_draft_len must be > 0 for NGram" (1.2-dated copy); the 1.0 copy asserts it in validate_speculative_config
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError(f"max_draft_len must be > 0 for {name}")
        if no_draft_model is not None and self.speculative_model_dir is None:
            raise ValueError(no_draft_model)


def _speculative_classes(status: str | None) -> dict[str, type]:
    """The speculative config classes of one shape of ``DecodingBaseConfig`` (module comment above)."""
    base: type[DecodingBaseConfig] = DecodingBaseConfig
    if status is not None:
        field = (bool, Field(False, json_schema_extra={"status": status}))
        base = create_model("DecodingBaseConfig", __base__=DecodingBaseConfig, **{_ADVANCED_SAMPLING: field})

    class NGramDecodingConfig(base):
        max_matching_ngram_size: int = 2
        is_keep_all: bool = True
        is_use_oldest: bool = True
        is_public_pool: bool = True
        decoding_type: ClassVar[str] = "NGram"

        @model_validator(mode="after")
        def _check(self) -> NGramDecodingConfig:
            self._positive_draft_len("NGram")
            if self.max_matching_ngram_size <= 0:
                raise ValueError("max_matching_ngram_size must be > 0 for NGram")
            return self

    class DraftTargetDecodingConfig(base):
        decoding_type: ClassVar[str] = "Draft_Target"

        @model_validator(mode="after")
        def _check(self) -> DraftTargetDecodingConfig:
            self._positive_draft_len("DraftTarget", "speculative_model must be specified for DraftTarget")
            return self

    class EagleDecodingConfig(base):
        eagle3_one_model: bool | None = True
        decoding_type: ClassVar[str] = "Eagle"

        @model_validator(mode="after")
        def _check(self) -> EagleDecodingConfig:
            self._positive_draft_len("Eagle", "Draft model must be provided for EAGLE")
            return self

    class Eagle3DecodingConfig(EagleDecodingConfig):
        """``decoding_type: Literal["Eagle3"]``: in the 1.2-dated and main copies only."""

        decoding_type: ClassVar[str] = "Eagle3"

        @model_validator(mode="before")
        @classmethod
        def _in_release(cls, data: Any) -> Any:
            if _state.series() < (1, 2):
                raise ValueError(f"Eagle3DecodingConfig is not in TensorRT-LLM {_state.version()}")
            return data

    class MTPDecodingConfig(base):
        num_nextn_predict_layers: int = 1
        use_mtp_vanilla: bool = False
        decoding_type: ClassVar[str] = "MTP"

        @model_validator(mode="before")
        @classmethod
        def _main_spelling(cls, data: Any) -> Any:
            # from PR 12341 (main's copy): num_nextn_predict_layers is an internal field remapped from max_draft_len (a
            # given num_nextn_predict_layers is remapped with a deprecation warning); before it (1.0 to 1.2 and the
            # early 1.3.0 candidates, _state.FIXES), num_nextn_predict_layers overwrites max_draft_len (_check)
            if isinstance(data, dict) and _state.has("mtp_max_draft_len") and "max_draft_len" in data:
                return {k: v for k, v in data.items() if k != "max_draft_len"} | {
                    "num_nextn_predict_layers": data["max_draft_len"]
                }
            return data

        @model_validator(mode="after")
        def _check(self) -> MTPDecodingConfig:
            if self.num_nextn_predict_layers <= 0:
                raise ValueError("num_nextn_predict_layers must be > 0")
            self.max_draft_len = self.num_nextn_predict_layers  # set from it in every copy read
            return self

    return {
        "NGramDecodingConfig": NGramDecodingConfig,
        "DraftTargetDecodingConfig": DraftTargetDecodingConfig,
        "EagleDecodingConfig": EagleDecodingConfig,
        "Eagle3DecodingConfig": Eagle3DecodingConfig,
        "MTPDecodingConfig": MTPDecodingConfig,
    }


_SHAPES = {status: _speculative_classes(status) for status in (None, "prototype", "deprecated")}
NGramDecodingConfig = DraftTargetDecodingConfig = EagleDecodingConfig = Eagle3DecodingConfig = MTPDecodingConfig = None


def _rebind(_version: str) -> None:
    """Bind this module's (and ``tensorrt_llm.llmapi``'s) speculative config names to the release's shape."""
    import sys

    shape = _SHAPES[_advanced_sampling_status()]
    for module in (sys.modules[__name__], sys.modules.get("tensorrt_llm.llmapi")):
        if module is None:
            continue
        for name, cls in shape.items():
            setattr(module, name, cls)


_state.on_change(_rebind)


class LoadFormat(enum.Enum):
    AUTO = 0
    DUMMY = 1  # "Initialize all weights randomly."


class TorchLlmArgs(_Strict):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str
    # A path, or a tokenizer object (BaseLlmArgs: Union[str, Path, TokenizerBase, PreTrainedTokenizerBase]), which
    # tokenizer_factory uses as it is (wrapped in TransformersTokenizer; the fake keeps the object).
    tokenizer: Any = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    revision: str | None = None
    tokenizer_revision: str | None = None
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    gpus_per_node: int | None = None
    moe_tensor_parallel_size: int | None = None
    moe_expert_parallel_size: int | None = None
    enable_attention_dp: bool = False
    load_format: Any = LoadFormat.AUTO
    enable_lora: bool = False
    lora_config: Any = None  # Optional[LoraConfig] (tensorrt_llm/lora_helper.py)
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
    iter_stats_max_iterations: int | None = None
    request_stats_max_iterations: int | None = None
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    max_batch_size: int | None = 2048
    max_input_len: int | None = 1024
    max_seq_len: int | None = None
    max_beam_width: int | None = 1
    max_num_tokens: int | None = 8192
    gather_generation_logits: bool = False
    num_postprocess_workers: int = 0
    postprocess_tokenizer_dir: str | None = None
    reasoning_parser: str | None = None
    return_perf_metrics: bool = False
    cuda_graph_config: CudaGraphConfig | None = Field(default_factory=CudaGraphConfig)
    disable_overlap_scheduler: bool = False
    moe_config: MoeConfig = Field(default_factory=MoeConfig)
    attn_backend: str = "TRTLLM"
    enable_mixed_sampler: bool = False
    enable_trtllm_sampler: bool = False
    sampler_type: Literal["auto", "TorchSampler", "TRTLLMSampler"] = "auto"
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    torch_compile_config: dict | None = None
    stream_interval: int = Field(1, gt=0)
    max_stats_len: int = 1000
    # NGram, Draft_Target, Eagle(3), MTP... (a DecodingBaseConfig); the PyTorch backend's validate_speculative_config
    # refuses a type whose supports_backend("pytorch") is false (Medusa, Lookahead: not modelled here)
    speculative_config: DecodingBaseConfig | None = None

    @field_validator("lora_config")
    @classmethod
    def _lora_config(cls, value: Any) -> Any:
        from tensorrt_llm.lora_helper import LoraConfig

        if value is not None and not isinstance(value, LoraConfig):
            raise ValueError(f"lora_config must be a LoraConfig, not {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _lora_config_consistency(self):
        """BaseLlmArgs.validate_lora_config_consistency (llm_args.py, the 1.1-line copy id 1090804222, the same in
        the 1.2-era id 7019226376): with neither lora_dir nor lora_target_modules, "all LoRA modules will be
        expected" (every default module, MoE ones included)."""
        lora = self.lora_config
        if lora is not None and not lora.lora_dir and not lora.lora_target_modules:
            from tensorrt_llm.lora_helper import get_default_trtllm_modules_to_hf_modules

            lora.lora_target_modules = list(get_default_trtllm_modules_to_hf_modules())
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: Any) -> Any:
        from transformers import PreTrainedTokenizerBase

        if value is None or isinstance(value, (str, PathLike, PreTrainedTokenizerBase)):
            return value
        raise ValueError(f"Unrecognized tokenizer {value}")

    @field_validator("load_format", mode="before")
    @classmethod
    def _load_format(cls, value: Any) -> LoadFormat:
        # TorchLlmArgs.convert_load_format: LoadFormat[v.upper()], else ValueError("Invalid LoadFormat: ...").
        if isinstance(value, LoadFormat):
            return value
        if str(value).upper() not in LoadFormat.__members__:
            raise ValueError(f"Invalid LoadFormat: {value}")
        return LoadFormat[str(value).upper()]

    @model_validator(mode="after")
    def _moe_split(self) -> TorchLlmArgs:
        # tensorrt_llm/mapping.py MappingBase: the unset MoE size is TP ÷ the other, and the product must be TP.
        tp, moe_tp, moe_ep = self.tensor_parallel_size, self.moe_tensor_parallel_size, self.moe_expert_parallel_size
        if moe_tp is not None or moe_ep is not None:
            moe_tp = moe_tp if moe_tp is not None else tp // moe_ep
            moe_ep = moe_ep if moe_ep is not None else tp // moe_tp
            if moe_tp * moe_ep != tp:
                raise ValueError(
                    "moe_tp_size * moe_ep_size * moe_cluster_size must equal to moe_world_size, "
                    f"but got {moe_tp * moe_ep} != {tp}"
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _release_fields(cls, data: dict) -> dict:
        for key in data:
            if not _field_in_release(key):
                raise ValueError(f"{key}: not a field of TorchLlmArgs in TensorRT-LLM {_state.version()}")
        if data.get("sampler_type") == "TRTLLMSampler" and _state.has("torch_only"):
            raise ValueError("sampler_type='TRTLLMSampler' was removed; TorchSampler is the only sampler (PR 18513)")
        return data

    @model_validator(mode="before")
    @classmethod
    def _none_means_default(cls, data: dict) -> dict:
        # The real validator resets an explicit None to the field default for these four.
        defaults = {"max_batch_size": 2048, "max_input_len": 1024, "max_beam_width": 1, "max_num_tokens": 8192}
        return {k: (defaults[k] if v is None and k in defaults else v) for k, v in data.items()}


# TorchLlmArgs fields that exist in some releases only (see the module docstring).
_RELEASE_FIELDS = {
    "enable_mixed_sampler": lambda: _state.series() == (1, 0),
    "enable_trtllm_sampler": lambda: _state.series() == (1, 0),
    "sampler_type": lambda: (
        _state.series() >= (1, 1) and (not _state.has("torch_only") or _state.has("sampler_type_again"))
    ),
}


def _field_in_release(key: str) -> bool:
    """Whether ``key`` is a TorchLlmArgs field of the release the fake plays."""
    return key not in _RELEASE_FIELDS or _RELEASE_FIELDS[key]()


# Keys that only the TensorRT-engine LLM (TrtLlmArgs) takes; 1.x's _TorchLLM names them in its error.
_TRT_ONLY_KEYS = frozenset(
    {
        "build_config",
        "quant_config",
        "calib_config",
        "embedding_parallel_mode",
        "fast_build",
        "enable_build_cache",
        "extended_runtime_perf_knob_config",
        "enable_tqdm",
        "workspace",
        "auto_parallel",
        "auto_parallel_world_size",
    }
)
