"""Fake ``tensorrt_llm.executor.utils`` (real file: tensorrt_llm/executor/utils.py)."""


class RequestError(RuntimeError):
    """The error raised when the request is failed."""
