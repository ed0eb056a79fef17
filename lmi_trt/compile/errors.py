"""Errors of the compile stage. Each names the key, the value and what would work."""

from __future__ import annotations

from typing import Any

from lmi_trt.errors import LmiError, as_written


class PlanError(LmiError, ValueError):
    """A configuration that cannot become an engine, found before any download or GPU work."""

    def __init__(self, key: str, value: Any, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={as_written(value)}: {problem}. {fix}")


class BuildError(LmiError, RuntimeError):
    """A compile step failed (or timed out); ``stage`` is quantize | convert | build | save | upload."""

    exit_code = 1  # the input was fine; the build itself failed

    def __init__(self, stage: str, message: str, rank: int | None = None) -> None:
        self.stage, self.rank, self.detail = stage, rank, message
        where = f"{stage} (rank {rank})" if rank is not None else stage
        super().__init__(f"compile failed at {where}: {message}")


class CacheError(LmiError, RuntimeError):
    """The engine cache could not be read, verified, locked or written."""
