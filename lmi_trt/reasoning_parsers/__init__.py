"""Reasoning parsers, one module each, registered by name (``base.register``); see ``base`` for what one is.

Adding a family: a module here that registers its ``ReasoningParser``, and its import below. A chat template
is recognised by the one parser whose ``recognise`` takes its text (they exclude each other).
"""

from __future__ import annotations

import logging
from functools import lru_cache

from . import deepseek_r1, deepseek_v3, qwen3  # noqa: F401
from .base import REGISTRY, ReasoningParser

__all__ = ["REGISTRY", "ReasoningParser", "chosen", "names", "recognise"]

log = logging.getLogger(__name__)


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def recognise(template: str) -> ReasoningParser | None:
    """The parser of the family whose chat template this is, or None."""
    return next((p for p in dict.fromkeys(REGISTRY.values()) if p.recognise(template)), None)


def chosen(option: str | None, enabled: bool | None, template: str | None) -> ReasoningParser | None:
    """The parser a chat of this model goes through: option.reasoning_parser, else the family its chat template
    shows, none where option.enable_reasoning is false."""
    if enabled is False:
        return None
    if option:
        return REGISTRY[option]
    return _recognised(template) if template is not None else None


@lru_cache(maxsize=8)
def _recognised(template: str) -> ReasoningParser | None:
    found = recognise(template)
    log.info("reasoning: the chat template is %s", f"the {found.name} family's" if found else "no family known here")
    return found
