"""Fake ``tensorrt_llm.llmapi`` (real package: tensorrt_llm/llmapi/): the names lmi-trt uses, as the real
``__all__`` exports them in 1.x and on main (the speculative configs: tensorrt_llm/llmapi/__init__.py copies list
EagleDecodingConfig, Eagle3DecodingConfig, MTPDecodingConfig, DraftTargetDecodingConfig; NVIDIA/Model-Optimizer's
specdec bench imports NGramDecodingConfig, DraftTargetDecodingConfig and MTPDecodingConfig from tensorrt_llm.llmapi)."""

from tensorrt_llm.executor import CompletionOutput, RequestError
from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import (
    CapacitySchedulerPolicy,
    ContextChunkingPolicy,
    CudaGraphConfig,
    DraftTargetDecodingConfig,
    Eagle3DecodingConfig,
    EagleDecodingConfig,
    KvCacheConfig,
    MoeConfig,
    MTPDecodingConfig,
    NGramDecodingConfig,
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
    "NGramDecodingConfig",
    "DraftTargetDecodingConfig",
    "EagleDecodingConfig",
    "Eagle3DecodingConfig",
    "MTPDecodingConfig",
]
