"""Tool-call parsers, one module each, registered by name (``base.register``); see ``base`` for what a parser is.

Adding a format: a module here that registers its ``ToolParser``, and its import below. A chat template is
recognised by the one parser whose ``recognise`` takes its text (they exclude each other).
"""

from __future__ import annotations

from . import deepseek_v3, deepseek_v31, hermes, llama3_json, llama4_pythonic, mistral, qwen3_coder  # noqa: F401
from .base import REGISTRY, ToolParser

__all__ = ["REGISTRY", "ToolParser", "names", "recognise"]


def names() -> tuple[str, ...]:
    """Every name a parser is registered under (its own and its aliases)."""
    return tuple(REGISTRY)


def recognise(template: str) -> ToolParser | None:
    """The parser whose format a chat template's text writes, or None."""
    return next((p for p in dict.fromkeys(REGISTRY.values()) if p.recognise(template)), None)
