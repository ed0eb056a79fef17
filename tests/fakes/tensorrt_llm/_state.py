"""Which TensorRT-LLM release the fake impersonates (private to the fake).

Tests switch it with ``tensorrt_llm.__version__ = "0.12.0"``; the executor bindings then
rebind the names whose shape differs between 0.12 and 1.x (trtllm_api.md §1.4–1.7).
"""

from __future__ import annotations

import re

DEFAULT_VERSION = "1.2.0rc2"

_version = DEFAULT_VERSION
_listeners: list = []


def version() -> str:
    return _version


def series(v: str | None = None) -> tuple[int, int]:
    m = re.match(r"^(\d+)\.(\d+)", v or _version)
    if not m:
        raise ValueError(f"fake tensorrt_llm: cannot parse version {v!r}")
    return int(m.group(1)), int(m.group(2))


def is_0x() -> bool:
    return series()[0] == 0


def set_version(v: str) -> None:
    """Any parseable version is accepted: 0.x gets the 0.12 binding shapes, 1.x and later the 1.x ones,
    so callers can also be tested against releases they must refuse."""
    global _version
    series(v)
    _version = v
    for listener in _listeners:
        listener(v)


def on_change(listener) -> None:
    """Register a callback run (now and) whenever the version changes."""
    _listeners.append(listener)
    listener(_version)
