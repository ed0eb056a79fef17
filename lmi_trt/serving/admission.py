"""How many generation requests are in the system, against ``job_queue_size``: counted in this process, or
across the front-end processes of one server (``option.api_server_count`` > 1) in shared memory."""

from __future__ import annotations

from collections.abc import MutableSequence
from typing import Protocol


class Admission(Protocol):
    def total(self) -> int:
        """Requests admitted and not finished, in every process that serves the model."""
        ...

    def take(self, n: int, limit: int) -> bool:
        """Count ``n`` more if the total stays within ``limit``; False (nothing counted) otherwise."""
        ...

    def add(self, n: int) -> None:
        """Count ``n`` more (negative: fewer) without a check: a batch's prompts, checked together before."""
        ...


class LocalAdmission:
    """One process serves the model: a plain counter (the event loop is its only writer)."""

    def __init__(self) -> None:
        self.count = 0

    def total(self) -> int:
        return self.count

    def take(self, n: int, limit: int) -> bool:
        if self.count + n > limit:
            return False
        self.count += n
        return True

    def add(self, n: int) -> None:
        self.count += n


class SharedAdmission:
    """Front end ``index`` of several: each writes only its own slot of a shared array (so a front end that dies
    leaves a slot its supervisor zeroes, and no lock can be left held); the total is the sum of the slots.
    ``take`` counts first and checks after, so two front ends admitting at once may both refuse, never both
    overshoot the limit."""

    def __init__(self, slots: MutableSequence[int], index: int) -> None:
        self.slots = slots
        self.index = index

    def total(self) -> int:
        return sum(self.slots)

    def take(self, n: int, limit: int) -> bool:
        self.slots[self.index] += n
        if sum(self.slots) > limit:
            self.slots[self.index] -= n
            return False
        return True

    def add(self, n: int) -> None:
        self.slots[self.index] += n
