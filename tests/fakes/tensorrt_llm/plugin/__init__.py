"""Fake ``tensorrt_llm.plugin``."""

from tensorrt_llm.plugin.plugin import ContextFMHAType, PluginConfig

__all__ = ["ContextFMHAType", "PluginConfig"]
