"""The root of every error lmi-trt raises on purpose.

Each stage keeps its own error class (``ConfigError``, ``SourceError``, ``PlanError``, ``BuildError``,
``CacheError``, ``EngineError``, ``LmiHttpError``, ...), and each of them is an ``LmiError``: the
``lmi-trt`` command prints one as a single line naming the key, and exits with its ``exit_code``
(2: the input or the host cannot work, fix and rerun; 1: a build or a run failed), never with a
traceback. The server answers a request's ``LmiHttpError`` with its status.
"""

from __future__ import annotations


class LmiError(Exception):
    """An error lmi-trt raises on purpose; its message names the key or field, the value and what works."""

    exit_code = 2
