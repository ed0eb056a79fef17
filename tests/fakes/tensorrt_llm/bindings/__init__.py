"""Fake ``tensorrt_llm.bindings``: only the ``executor`` submodule is provided."""

from tensorrt_llm.bindings import executor

__all__ = ["executor"]
