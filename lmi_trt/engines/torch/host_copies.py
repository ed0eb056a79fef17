"""Where the decode loop's device→host copies land: pinned host buffers, reused once read.

Every step's sampled tokens come back with an asynchronous copy, which needs pinned host memory. Taking it per step
(``torch.empty(..., pin_memory=True)``) goes through torch's pinned-memory cache each time (a lock, events to query,
a ``cudaHostAlloc`` when no cached block of the size is free). On H100 hosts a take-copy-give of a step's 3 × 256
outputs here cost 5–9 µs of host time against 11–21 µs that way (benchmarks/gpu_host_copies.py). Uploads stay with
``Tensor.pin_memory()``: staging them in a buffer pinned once measured slower (32 µs against 23 µs a call, the
slicing and views it needs being torch calls of their own).
"""

from __future__ import annotations

import torch


class Downloads:
    """Pinned host tensors for device→host copies, by shape and dtype: ``take`` one, copy into it, and ``give`` it
    back once its contents are read (one never given back is left to the garbage collector)."""

    def __init__(self) -> None:
        self._free: dict[tuple[tuple[int, ...], torch.dtype], list[torch.Tensor]] = {}

    def take(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        free = self._free.get((tuple(shape), dtype))
        return free.pop() if free else torch.empty(shape, dtype=dtype, pin_memory=True)

    def give(self, host: torch.Tensor) -> None:
        self._free.setdefault((tuple(host.shape), host.dtype), []).append(host)
