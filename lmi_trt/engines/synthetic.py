"""A real engine without a model: for measuring the serving layer alone and testing it fast.

It implements the whole protocol — a FIFO queue in front of ``max_batch_size`` slots, one
token per active request per step, ``tokens_per_second`` steps a second (None: as fast as
the event loop allows), stop token ids, eos, cancellation and stats — but its "model"
echoes the prompt: output token k is ``prompt_token_ids[k % len(prompt)]``. So outputs are
deterministic, decode to real (multi-byte) text with any tokenizer, and a test steers them
through the prompt: a prompt containing the eos token ends with ``eos_token``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable

from lmi_trt.engines.base import (
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
)

log = logging.getLogger(__name__)


class _Sequence:
    __slots__ = (
        "cycle",
        "error",
        "error_code",
        "generated",
        "pending_ids",
        "pending_lps",
        "reason",
        "request",
        "stop_ids",
        "tail",
        "waiter",
    )

    def __init__(self, request: GenerationRequest, cycle: list[int]) -> None:
        self.request = request
        self.cycle = cycle
        self.generated = 0
        self.stop_ids = request.stop_token_ids
        self.tail: deque[int] = deque(maxlen=max((len(s) for s in request.stop_token_ids), default=1))
        self.pending_ids: list[int] = []
        self.pending_lps: list[float] = []
        self.reason: FinishReason | None = None  # set once finished
        self.error: str | None = None
        self.error_code: int | None = None
        # The consumer's future while it waits for output (None when it is not waiting): one
        # future per wait, resolved by the step that produces its next token.
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)


class SyntheticEngine:
    name = "synthetic"

    def __init__(
        self,
        vocab_size: int,
        *,
        tokens_per_second: float | None = None,
        max_batch_size: int = 256,
        max_input_len: int = 4096,
        max_new_tokens: int = 4096,
        max_seq_len: int | None = None,
        eos_token_id: int | None = None,
        special_token_ids: Iterable[int] = (),
    ) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be ≥ 1, got {vocab_size}")
        if tokens_per_second is not None and not tokens_per_second > 0:
            raise ValueError(f"tokens_per_second must be > 0 or None (as fast as possible), got {tokens_per_second}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be ≥ 1, got {max_batch_size}")
        self.vocab_size = vocab_size
        self.tokens_per_second = tokens_per_second
        self.eos_token_id = eos_token_id
        self._max_new_tokens = max_new_tokens
        self._limits = EngineLimits(
            max_batch_size=max_batch_size,
            max_input_len=max_input_len,
            max_seq_len=max_seq_len,
            max_new_tokens=max_new_tokens,
            supports_logprobs=True,
        )
        excluded = set(special_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        # Used when the prompt gives nothing to echo: plain (non-special) ids.
        self._fallback_cycle = [i for i in range(vocab_size) if i not in excluded] or [0]
        self._waiting: deque[_Sequence] = deque()
        self._active: dict[str, _Sequence] = {}
        self._by_id: dict[str, _Sequence] = {}
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._healthy = True
        self._closed = False
        self._total_requests = 0
        self._total_tokens = 0

    # --- protocol ---
    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def healthy(self) -> bool:
        return self._healthy and (self._loop_task is None or not self._loop_task.done())

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="synthetic-engine")

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        if self._loop_task is None or self._closed:
            raise EngineError("the synthetic engine is not running (call start() first)", code=503)
        if request.request_id in self._by_id:
            raise EngineError(f"request id {request.request_id!r} is already in use", code=400)
        seq = _Sequence(request, [i for i in request.prompt_token_ids if 0 <= i < self.vocab_size] or self._fallback_cycle)
        self._by_id[request.request_id] = seq
        self._total_requests += 1
        problem = self._validate(request)
        if problem is not None:
            self._end(seq, FinishReason.ERROR, error=problem, code=400)
        else:
            self._waiting.append(seq)
            self._work.set()
        return self._stream(seq)

    async def cancel(self, request_id: str) -> None:
        seq = self._by_id.get(request_id)
        if seq is not None and seq.reason is None:
            self._end(seq, FinishReason.CANCELLED)

    def stats(self) -> EngineStats:
        return EngineStats(
            active_requests=len(self._active),
            queued_requests=len(self._waiting),
            max_batch_size=self._limits.max_batch_size,
            total_requests=self._total_requests,
            total_generated_tokens=self._total_tokens,
        )

    async def close(self) -> None:
        self._closed = True
        for seq in list(self._by_id.values()):
            if seq.reason is None:
                self._end(seq, FinishReason.CANCELLED)
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task

    # --- test hook ---
    def fail(self, message: str = "synthetic engine failure") -> None:
        """Die like a crashed engine: unhealthy, every open request ends with an error."""
        self._healthy = False
        for seq in list(self._by_id.values()):
            if seq.reason is None:
                self._end(seq, FinishReason.ERROR, error=message, code=424)

    # --- internals ---
    def _validate(self, request: GenerationRequest) -> str | None:
        n = len(request.prompt_token_ids)
        lim = self._limits
        if n > lim.max_input_len:
            return f"prompt has {n} tokens, more than the engine's max_input_len={lim.max_input_len}"
        if request.sampling.max_new_tokens > self._max_new_tokens:
            return f"max_new_tokens={request.sampling.max_new_tokens} is more than the engine's {self._max_new_tokens}"
        if lim.max_seq_len is not None and n + request.sampling.max_new_tokens > lim.max_seq_len:
            return f"prompt + max_new_tokens = {n + request.sampling.max_new_tokens} exceeds max_seq_len={lim.max_seq_len}"
        return None

    async def _stream(self, seq: _Sequence) -> AsyncIterator[EngineOutput]:
        rid = seq.request.request_id
        create_future = asyncio.get_running_loop().create_future
        try:
            while True:
                if not seq.pending_ids and seq.reason is None:
                    seq.waiter = waiter = create_future()
                    await waiter
                # Everything produced since the last read goes out as one delta: a slow
                # consumer gets fewer, larger deltas instead of a growing backlog.
                ids, lps = seq.pending_ids, seq.pending_lps
                seq.pending_ids, seq.pending_lps = [], []
                if seq.reason is None:
                    yield EngineOutput(rid, ids, lps)
                    continue
                yield EngineOutput(
                    rid, ids, lps, finished=True, finish_reason=seq.reason, error=seq.error, error_code=seq.error_code
                )
                return
        finally:
            if seq.reason is None:  # the consumer left early
                self._end(seq, FinishReason.CANCELLED)

    def _end(self, seq: _Sequence, reason: FinishReason, error: str | None = None, code: int | None = None) -> None:
        seq.reason = reason
        seq.error, seq.error_code = error, code
        rid = seq.request.request_id
        self._by_id.pop(rid, None)
        if self._active.pop(rid, None) is None:
            with contextlib.suppress(ValueError):  # already finished or never queued
                self._waiting.remove(seq)
        seq.wake()

    def _step(self, active: list[_Sequence]) -> None:
        """One engine step: one token for every active sequence (the per-token path, kept flat)."""
        eos = self.eos_token_id
        produced = 0
        for seq in active:
            if seq.reason is not None:  # defensive: _active holds running sequences only
                continue
            req = seq.request
            sampling = req.sampling
            k = seq.generated
            cycle = seq.cycle
            tid = cycle[k % len(cycle)]
            seq.generated = k = k + 1
            seq.pending_ids.append(tid)
            seq.pending_lps.append(-0.25 * ((k - 1) % 4 + 1))
            produced += 1
            if k >= sampling.min_new_tokens:
                if tid == eos and not sampling.ignore_eos:
                    self._end(seq, FinishReason.EOS)
                    continue
                if seq.stop_ids:
                    tail = seq.tail
                    tail.append(tid)
                    recent = list(tail)
                    if any(len(s) <= len(recent) and recent[-len(s):] == s for s in seq.stop_ids):
                        self._end(seq, FinishReason.STOP_SEQUENCE)
                        continue
            elif seq.stop_ids:
                seq.tail.append(tid)
            if k >= sampling.max_new_tokens:
                self._end(seq, FinishReason.LENGTH)
            else:
                w = seq.waiter
                if w is not None:
                    seq.waiter = None
                    if not w.done():
                        w.set_result(None)
        self._total_tokens += produced

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.tokens_per_second if self.tokens_per_second else 0.0
        next_step = loop.time()
        max_batch = self._limits.max_batch_size
        while not self._closed:
            while self._waiting and len(self._active) < max_batch:
                seq = self._waiting.popleft()
                self._active[seq.request.request_id] = seq
            if not self._active:
                self._work.clear()
                await self._work.wait()
                next_step = loop.time()
                continue
            self._step(list(self._active.values()))
            if period:
                next_step += period
                await asyncio.sleep(max(0.0, next_step - loop.time()))
            else:
                await asyncio.sleep(0)
