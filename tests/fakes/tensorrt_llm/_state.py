"""Which TensorRT-LLM release the fake impersonates (private to the fake).

The release comes from the environment variable ``LMI_TRT_FAKE_RELEASE`` (one of ``RELEASES``),
read once at import, so server processes started by tests impersonate the same release as the test.
Unset, the fake is 1.0.0: the release ``docker/Dockerfile``'s base image ships, so the default run
exercises the shipped image's API. Tests may switch it in-process with
``tensorrt_llm.__version__ = "0.12.0"``; listeners (the executor bindings, ``PluginConfig``,
``BuildConfig``, ``ExtendedRuntimePerfKnobConfig``) then rebind the names whose shape differs.
"""

from __future__ import annotations

import os
import re

# 1.3.0: the release after 1.2, without the TensorRT-engine Executor (NVIDIA/TensorRT-LLM PRs 15918 and 16369):
# the LLM API's PyTorch backend only.
RELEASES = ("0.12.0", "1.0.0", "1.1.0", "1.2.1", "1.3.0")
ENV = "LMI_TRT_FAKE_RELEASE"
DEFAULT_VERSION = "1.0.0"


def _from_environment() -> str:
    value = os.environ.get(ENV, "").strip()
    if not value:
        return DEFAULT_VERSION
    if value not in RELEASES:
        raise ValueError(f"fake tensorrt_llm: {ENV}={value!r} is not one of {', '.join(RELEASES)}")
    return value


_version = _from_environment()
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
    """Any parseable version is accepted: 0.x gets the 0.12 shapes, 1.x and later the 1.x ones (1.2 and
    later the pydantic ``PluginConfig``), so callers can also be tested against releases they must refuse."""
    global _version
    series(v)
    _version = v
    for listener in _listeners:
        listener(v)


def on_change(listener) -> None:
    """Register a callback run (now and) whenever the version changes."""
    _listeners.append(listener)
    listener(_version)
