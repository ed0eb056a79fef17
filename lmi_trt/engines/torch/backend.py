"""What the torch engine's batching backends share: the per-request slot, what a backend is to the
engine and the engine to a backend, the pending queue of the backends that run their own thread,
and the rules that end a request or ban its next token.

Every backend (``continuous``, ``static``, ``decode_loop``) takes requests as ``Slot``s from the
engine (``engine.py``) and reports back through ``Host``; none imports the engine or another backend.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ...speculative import Speculation
from ..adapters import LoraAdapter
from ..base import EngineOutput, FinishReason, GenerationRequest, OutputChannel, SamplingParams, TokenDelta
from ..guided import Guide

CLOSE_TIMEOUT_S = 30.0
EXCLUDED = (
    "every token is excluded: the constraint, bad_words and min_new_tokens together allow none at this step; "
    "loosen one of them"
)


def ends_with_any(tokens: Sequence[int], sequences: Sequence[Sequence[int]]) -> bool:
    return any(0 < len(seq) <= len(tokens) and list(tokens[-len(seq) :]) == list(seq) for seq in sequences)


def banned_next_tokens(context: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """HF ``NoBadWordsLogitsProcessor`` semantics: ban a sequence's last token once the context ends
    with the rest of it (single-token sequences are always banned)."""
    return [seq[-1] for seq in bad_words if ends_with_any(context, [seq[:-1]]) or len(seq) == 1]


def finish_reason(generated: Sequence[int], eos_ids: Sequence[int], request: GenerationRequest) -> FinishReason | None:
    if request.stop_token_ids and ends_with_any(generated, request.stop_token_ids):
        return FinishReason.STOP_SEQUENCE
    if eos_ids and generated and generated[-1] in eos_ids:
        return FinishReason.EOS
    if len(generated) >= request.sampling.max_new_tokens:
        return FinishReason.LENGTH
    return None


def excluded_field(slot: Slot) -> str:
    """The request field at fault when every token is excluded (``EXCLUDED``): a constraint the grammar, bad
    words and min_new_tokens together cannot meet is the client's, a 400 naming the grammar where there is one."""
    return "guided" if slot.matcher is not None else "bad_words"


def default_max_num_tokens(max_batch_size: int, max_input_len: int) -> int:
    """Tokens one step may process: a whole prompt plus a decode token for every other request,
    and at least 2048 so a burst of prompts prefills in a few steps rather than dozens."""
    return max(max_input_len + max_batch_size, 2048)


@dataclass(eq=False)
class Slot:
    """One submitted request: opened by the engine on the event loop, advanced by the backend's thread."""

    request: GenerationRequest
    key: str  # unique per submission: a client may reuse a request_id right after cancelling it
    eos_ids: tuple[int, ...]  # empty with ignore_eos
    generator: torch.Generator | None  # per-request RNG when a seed is given
    queue: OutputChannel
    prompt_set: frozenset[int]
    generated: list[int] = field(default_factory=list)
    # Written by the engine thread only.
    finished: bool = False
    # Written on the event loop only (the engine thread reads ``cancelled``).
    cancelled: bool = False
    closed: bool = False
    started: bool = False
    matcher: Guide | None = None  # a constrained request's grammar matcher (engine thread only)
    adapter: LoraAdapter | None = None  # the LoRA adapter its request names, as registered when it opened
    sunk: bool = False  # its outputs go to the engine's sink (TorchEngine.submit_to_sink), not to ``queue``
    # Queue time: from the slot's creation (enqueued at once) to its first batch, set by the
    # engine thread and sent with the first output (EngineOutput.queue_time_s).
    created_at: float = field(default_factory=time.monotonic)
    queue_time_s: float | None = None
    _queue_time_sent: bool = False

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    def scheduled(self) -> None:
        """It entered a batch (engine thread); only the first call counts."""
        if self.queue_time_s is None:
            self.queue_time_s = time.monotonic() - self.created_at

    def take_queue_time(self) -> float | None:
        """The queue time for the output being built: on the first one only (engine thread)."""
        if self._queue_time_sent or self.queue_time_s is None:
            return None
        self._queue_time_sent = True
        return self.queue_time_s


class Backend(Protocol):
    """What the engine needs from a batching path; each runs its own thread."""

    name: str

    def enqueue(self, slot: Slot) -> None: ...

    def cancel(self, slot: Slot) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> dict[str, float]: ...


class Host(Protocol):
    """What a backend needs from the engine that owns it (``TorchEngine``), called from the backend's thread."""

    max_batch_size: int
    max_input_len: int
    max_new_tokens: int
    max_num_tokens: int | None
    # The built-in decode loop's paged KV cache and prompt chunks (refused for the other backends).
    enable_kv_cache_reuse: bool
    max_tokens_in_paged_kv_cache: int | None
    tokens_per_block: int | None
    enable_chunked_context: bool
    speculative: Speculation | None  # the built-in decode loop's speculative decoding
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    sampled_rows: int  # engine-side work, written by the one engine thread

    def slot_by_key(self, key: str) -> Slot | None: ...

    def advance(
        self,
        slots: Sequence[Slot | None],
        logits: torch.Tensor,
        on_finished: Callable[[Slot, FinishReason], None],
    ) -> list[int]: ...

    def deliver(self, items: list[tuple[Slot, EngineOutput | TokenDelta]]) -> None:
        """Hand outputs to the event loop, in order; a ``TokenDelta`` (a plain delta, ``engines/base.py``) only for a
        ``sunk`` slot's output that is neither its first nor its last."""
        ...

    def fail(self, slot: Slot, message: str, code: int, field: str | None = None) -> None: ...

    def die(self, message: str) -> None: ...


class QueuedBackend:
    """A backend whose own thread (``_run``) takes requests from a pending queue."""

    def _start(self, thread_name: str) -> None:
        self._pending: deque[Slot] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def enqueue(self, slot: Slot) -> None:
        with self._wake:
            self._pending.append(slot)
            self._wake.notify()

    def cancel(self, slot: Slot) -> None:
        with self._wake:
            if slot in self._pending:
                self._pending.remove(slot)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=CLOSE_TIMEOUT_S)

    def stats(self) -> dict[str, float]:
        """Backend figures for ``EngineStats.extra`` (none unless a backend has its own)."""
        return {}
