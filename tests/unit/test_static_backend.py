"""The torch engine's static-batching thread under interleavings that load makes likely: the
interleaving is forced here (a condition variable that runs a hook inside the gather wait), so
the test does not depend on timing."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import torch

from lmi_trt.engines.torch import backend as torch_backend
from lmi_trt.engines.torch.static import StaticBackend


class _GatherProbe(threading.Condition):
    """Runs ``on_gather`` (once) when the thread enters the timed wait that gathers a batch, and
    reports when it waits for work again afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.on_gather = None
        self.gathered = False
        self.idle_after_gather = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and self.on_gather is not None:
            hook, self.on_gather, self.gathered = self.on_gather, None, True
            hook()
        elif timeout is None and self.gathered:
            self.idle_after_gather.set()
        return super().wait(timeout)


class _Recording(StaticBackend):
    def __init__(self, engine, model) -> None:
        self.batches: list[list] = []
        self.decoded = threading.Event()
        super().__init__(engine, model)

    def _decode(self, slots) -> None:
        self.batches.append(list(slots))
        self.decoded.set()


class _Request:
    """What the backend's queue handles of a request (torch_backend.Slot's queue-time hook)."""

    def scheduled(self) -> None:
        pass


def _until(condition, bound_s: float = 60.0) -> bool:
    deadline = time.monotonic() + bound_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_request_cancelled_while_its_batch_gathers_leaves_the_thread_serving(monkeypatch):
    """The client of the only pending request leaves while the batch gathers: the batch is empty.
    The thread used to take that for "stopping" and exit, so every later request waited forever."""
    monkeypatch.setattr(torch_backend, "threading", SimpleNamespace(Condition=_GatherProbe, Thread=threading.Thread))
    died: list[str] = []
    engine = SimpleNamespace(max_batch_size=4, die=died.append, fail=lambda *a: died.append(a))
    backend = _Recording(engine, SimpleNamespace(device=torch.device("cpu")))
    gone, later = _Request(), _Request()
    backend._wake.on_gather = lambda: backend.cancel(gone)  # lands between enqueue and batch
    try:
        backend.enqueue(gone)
        assert _until(lambda: backend._wake.idle_after_gather.is_set() or not backend._thread.is_alive())
        assert backend._thread.is_alive(), "the static batching thread exited while the engine runs"
        backend.enqueue(later)
        assert _until(backend.decoded.is_set)
        assert backend.batches == [[later]] and not died
    finally:
        backend.close()
    assert not backend._thread.is_alive()
