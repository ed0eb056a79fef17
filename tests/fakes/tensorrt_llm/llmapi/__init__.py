"""Fake ``tensorrt_llm.llmapi`` (real package: tensorrt_llm/llmapi/): the names lmi-trt uses, as the real
``__all__`` exports them in 1.x and on main."""

from tensorrt_llm.executor import CompletionOutput, RequestError
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import (
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    CudaGraphConfig,
    KvCacheConfig,
    MoeConfig,
    SchedulerConfig,
    TorchLlmArgs,
)
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "RequestOutput",
    "SamplingParams",
    "GuidedDecodingParams",
    "KvCacheConfig",
    "CudaGraphConfig",
    "MoeConfig",
    "SchedulerConfig",
    "CapacitySchedulerPolicy",
    "ContextChunkingPolicy",
    "RequestError",
    "TorchLlmArgs",
]
