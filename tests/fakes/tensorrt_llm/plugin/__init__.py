"""Fake ``tensorrt_llm.plugin`` (``PluginConfig`` is rebound per release by ``plugin.plugin``)."""

from tensorrt_llm.plugin import plugin as _plugin
from tensorrt_llm.plugin.plugin import ContextFMHAType, PluginConfig

_plugin._select(_plugin._state.version())

__all__ = ["ContextFMHAType", "PluginConfig"]
