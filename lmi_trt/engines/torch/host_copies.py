"""The decode loop's copies between host and device without pinning memory for each one.

Every step uploads small host tensors (block-table entries, a step's layout, admitted requests' sampling
parameters) and downloads its sampled tokens. Both must be asynchronous, so both need pinned host memory; taking
it per copy (``Tensor.pin_memory()``, ``torch.empty(..., pin_memory=True)``) goes through torch's pinned-memory
cache each time (a lock, an event per block, a fresh ``cudaHostAlloc`` when no cached block of the size is free
yet), several calls that each release and retake the GIL, which the event loop's thread wants too. Here the
memory is pinned once: uploads are staged in one buffer used in two halves, downloads land in buffers reused once
read. On CPU both are plain copies.
"""

from __future__ import annotations

import torch


class Uploads:
    """Host→device copies staged in one pinned buffer of two halves, each reused only once the device has done
    with its previous copies (an event recorded when the copies left it: a half holds many steps' uploads, so that
    event is long past by then). A tensor larger than a half is pinned on its own."""

    ALIGN = 64  # bytes: every staged tensor starts at a multiple (``Tensor.view(dtype)`` needs its size's)

    def __init__(self, device: torch.device, nbytes: int = 8 << 20) -> None:
        self.device = device
        self._buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True) if device.type == "cuda" else None
        self._half_bytes = nbytes // 2
        self._half = 0
        self._used = 0  # bytes of the current half taken
        self._left: list[torch.cuda.Event | None] = [None, None]  # when the copies left each half last

    def put(self, cpu: torch.Tensor) -> torch.Tensor:
        """``cpu`` on the device; the copy is queued on the current stream, the host never waits for it."""
        if self._buffer is None:
            return cpu.to(self.device)
        cpu = cpu.contiguous()
        size = cpu.numel() * cpu.element_size()
        taken = -(-size // self.ALIGN) * self.ALIGN
        if taken > self._half_bytes:
            return cpu.pin_memory().to(self.device, non_blocking=True)
        if self._used + taken > self._half_bytes:
            self._switch()
        start = self._half * self._half_bytes + self._used
        self._used += taken
        staged = self._buffer[start : start + size].view(cpu.dtype).view(cpu.shape)
        staged.copy_(cpu)
        return staged.to(self.device, non_blocking=True)

    def _switch(self) -> None:
        left = torch.cuda.Event()
        left.record()
        self._left[self._half] = left
        self._half ^= 1
        self._used = 0
        previous = self._left[self._half]
        if previous is not None:
            previous.synchronize()


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
