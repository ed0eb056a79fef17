"""The root of every error lmi-trt raises on purpose, and the configuration's errors.

Each stage keeps its own error class (``SourceError``, ``PlanError``, ``BuildError``, ``CacheError``,
``EngineError``, ``LmiHttpError``, ...), and each of them is an ``LmiError``: the ``lmi-trt`` command prints
one as a single line naming the key, and exits with its ``exit_code`` (2: the input or the host cannot work,
fix and rerun; 1: a build or a run failed), never with a traceback. The server answers a request's
``LmiHttpError`` with its status. ``ConfigError`` and ``StartupError`` are every stage's (a key the
configuration, the engine registry, the launch plan or the wiring refuses), so they live here, below them all.
"""

from __future__ import annotations

import enum
from typing import Any


class LmiError(Exception):
    """An error lmi-trt raises on purpose; its message names the key or field, the value and what works."""

    exit_code = 2


def as_written(value: Any) -> str:
    """A key's value as a user writes it, quoted: an enum member by its value ('fp8', not <Quantization.FP8: 'fp8'>)."""
    return repr(value.value if isinstance(value, enum.Enum) else value)


class ConfigError(LmiError, ValueError):
    """An invalid configuration; the message names the key as written, the value and what is allowed."""


class StartupError(ConfigError):
    """Why the server cannot start, found before it loads anything: the key (or flag), its value, the
    problem and the fix. ``lmi-trt`` prints it as one line and exits 2; the structured fields are the
    shape every error root is to share (key, value, problem, fix)."""

    def __init__(self, key: str, value: Any, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={as_written(value)}: {problem}; {fix}")
