"""Fake ``tensorrt_llm.llmapi.llm_args`` (real file: tensorrt_llm/llmapi/llm_args.py): the configuration
models the LLM takes, as strict pydantic models (unknown keys are rejected, like the real StrictBaseModel).
Only the fields lmi-trt maps are modelled; their names, order and defaults are the real ones."""

from __future__ import annotations

import enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    free_gpu_memory_fraction: float | None = Field(0.9, ge=0.0, le=1.0)
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


class SchedulerConfig(_Strict):
    capacity_scheduler_policy: CapacitySchedulerPolicy = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: ContextChunkingPolicy | None = None
    dynamic_batch_config: dict | None = None


class TorchLlmArgs(_Strict):
    model: str
    tokenizer: str | None = None
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
    enable_attention_dp: bool = False
    enable_lora: bool = False
    lora_config: dict | None = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None
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
    attn_backend: str = "TRTLLM"
    sampler_type: str = "auto"
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    torch_compile_config: dict | None = None
    stream_interval: int = Field(1, gt=0)
    max_stats_len: int = 1000

    @model_validator(mode="before")
    @classmethod
    def _none_means_default(cls, data: dict) -> dict:
        # The real validator resets an explicit None to the field default for these four.
        defaults = {"max_batch_size": 2048, "max_input_len": 1024, "max_beam_width": 1, "max_num_tokens": 8192}
        return {k: (defaults[k] if v is None and k in defaults else v) for k, v in data.items()}


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
