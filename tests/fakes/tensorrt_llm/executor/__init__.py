"""Fake ``tensorrt_llm.executor``: the LLM API's result types (real package: tensorrt_llm/executor/)."""

from tensorrt_llm.executor.result import CompletionOutput, GenerationResult
from tensorrt_llm.executor.utils import RequestError

__all__ = ["CompletionOutput", "GenerationResult", "RequestError"]
