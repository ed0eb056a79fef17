"""The root of every error lmi-trt raises on purpose.

Each stage keeps its own error class (``ConfigError``, ``SourceError``, ``PlanError``, ``BuildError``,
``CacheError``, ``EngineError``, ``LmiHttpError``, ...), and each of them is an ``LmiError``: the
``lmi-trt`` command prints one as a single line naming the key, and exits with its ``exit_code``
(2: the input or the host cannot work, fix and rerun; 1: a build or a run failed), never with a
traceback. The server answers a request's ``LmiHttpError`` with its status.
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
