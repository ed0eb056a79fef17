"""A real engine without a model: for measuring the serving layer alone and testing it fast.

It implements the whole protocol — a FIFO queue in front of ``max_batch_size`` slots, one
token per active request per step, ``tokens_per_second`` steps a second on its own clock
(so the rate is per sequence; None: one step per event-loop pass, as fast as the consumers
take them), stop token ids, eos, cancellation and stats — but its "model"
echoes the prompt: output token k is ``prompt_token_ids[k % len(prompt)]``. So outputs are
deterministic, decode to real (multi-byte) text with any tokenizer, and a test steers them
through the prompt: a prompt containing the eos token ends with ``eos_token``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Hashable, Iterable

from lmi_trt.engines.base import (
    Capabilities,
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    OutputSink,
    TokenDelta,
    can,
    cannot,
    error_output,
    refused,
)
from lmi_trt.engines.registry import SYNTHETIC

log = logging.getLogger(__name__)

# A per-sequence rate this high is no GPU's: it means as fast as possible (lock-step), as None
# does; benchmark scripts have long passed 1e9 for that.
ASAP_TOKENS_PER_SECOND = 1e6
# Catching up with the clock never takes more steps than this in one go (a stalled loop must not
# turn into one huge burst; the schedule then slips instead).
_MAX_STEPS_AT_ONCE = 1024

# Log probability of output token k (0-based): -0.25, -0.5, -0.75, -1.0, repeating. Grown on demand.
_LOGPROBS: list[float] = []


def _logprobs(n: int) -> list[float]:
    if len(_LOGPROBS) < n:
        _LOGPROBS.extend(-0.25 * (k % 4 + 1) for k in range(len(_LOGPROBS), n))
    return _LOGPROBS


class _Sequence:
    """One request. Its outputs are a deterministic function of the prompt, so they are laid out
    once when it enters the batch (``plan``) and a step only advances ``generated``; the consumer
    slices what it has not read yet. A step thus costs the serving core what a real engine's
    delivery costs (a counter and a wake-up), not a model's sampling in Python."""

    __slots__ = (
        "consumer",
        "cycle",
        "end_at",
        "end_reason",
        "error",
        "error_code",
        "generated",
        "ids",
        "lps",
        "queue_time_s",
        "queued_at",
        "read",
        "reason",
        "request",
        "sunk",
        "waiter",
    )

    def __init__(self, request: GenerationRequest, cycle: list[int], sunk: bool) -> None:
        self.request = request
        self.sunk = sunk  # its outputs go to the engine's sink (submit_to_sink), not to a consumer's iterator
        self.consumer: Hashable = None  # the sink's consumer of its outputs (OutputSink.consumer); None: its iterator
        self.cycle = cycle
        self.generated = 0  # tokens produced so far
        self.read = 0  # tokens handed to the consumer so far
        self.ids: list[int] = []
        self.lps: list[float] = _LOGPROBS
        self.end_at = 0  # the step count at which the sequence ends by itself, and why
        self.end_reason = FinishReason.LENGTH
        self.reason: FinishReason | None = None  # set once finished
        self.error: str | None = None
        self.error_code: int | None = None
        self.queued_at = 0.0  # the loop's time when it entered the waiting queue
        self.queue_time_s: float | None = None  # set when it enters the batch; sent with the first output
        # The consumer's future while it waits for output (None when it is not waiting): one
        # future per wait, resolved by the step that produces its next token.
        self.waiter: asyncio.Future[None] | None = None

    def plan(self, eos_token_id: int | None) -> None:
        """Lay out the output: token k is ``cycle[k % len(cycle)]``; the sequence ends at the first
        eos (unless ignored) or stop token ids at or after ``min_new_tokens``, else at ``max_new_tokens``."""
        req = self.request
        sampling = req.sampling
        n = sampling.max_new_tokens
        cycle = self.cycle
        self.ids = ids = (cycle * (n // len(cycle) + 1))[:n]
        self.lps = _logprobs(n)
        self.end_at, self.end_reason = n, FinishReason.LENGTH
        eos = None if sampling.ignore_eos else eos_token_id
        stops = [s for s in req.stop_token_ids if s]
        if (eos is None or eos not in cycle) and not stops:
            return
        for k in range(max(sampling.min_new_tokens, 1), n + 1):  # k tokens generated, the last is ids[k - 1]
            if ids[k - 1] == eos:
                self.end_at, self.end_reason = k, FinishReason.EOS
                return
            if any(len(s) <= k and ids[k - len(s) : k] == s for s in stops):
                self.end_at, self.end_reason = k, FinishReason.STOP_SEQUENCE
                return

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)


_NO_MODEL = "the synthetic engine has no model"
CAPABILITIES = Capabilities(
    release="",
    logprobs=can(note="made-up values (-0.25, -0.5, -0.75, -1.0, repeating): there is no model"),
    top_logprobs=cannot(f"{_NO_MODEL}, so no alternatives; ask for the chosen token's log-prob only"),
    prompt_logprobs=cannot(f"{_NO_MODEL} to score the prompt; leave it out"),
    logit_bias=cannot(f"{_NO_MODEL} whose logits could be biased; leave it out"),
    guided=cannot(
        f"{_NO_MODEL} to constrain (it echoes the prompt); leave it out or serve with option.rolling_batch=torch"
    ),
    seed=can(note="nothing is drawn: the output echoes the prompt whatever the sampling fields say"),
    **dict.fromkeys(
        ("repetition_penalty", "presence_penalty", "frequency_penalty"),
        cannot(f"{_NO_MODEL} whose logits a penalty could change; leave it out"),
    ),
    min_new_tokens=can(),
    lora=cannot(f"{_NO_MODEL} to adapt; leave the adapter out or serve with option.rolling_batch=torch"),
    bad_words=cannot(f"{_NO_MODEL}: it echoes the prompt, banned words included; leave it out"),
    stop_token_ids=can(),
    beam_search=cannot(f"{_NO_MODEL} to score beams; ask for 1 beam, or serve with option.rolling_batch=torch"),
    min_p=cannot(f"{_NO_MODEL} whose distribution min_p could cut; leave it out"),
)


class SyntheticEngine:
    name = "synthetic"

    def __init__(
        self,
        vocab_size: int,
        *,
        tokens_per_second: float | None = None,
        max_batch_size: int = SYNTHETIC.default_batch,
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
        )
        excluded = set(special_token_ids) | ({eos_token_id} if eos_token_id is not None else set())
        # Used when the prompt gives nothing to echo: plain (non-special) ids.
        self._fallback_cycle = [i for i in range(vocab_size) if i not in excluded] or [0]
        self._waiting: deque[_Sequence] = deque()
        self._active: dict[str, _Sequence] = {}
        # The active sequences by their consumer (None: their own iterators), so that a step behind a sink asks
        # whether each consumer is backlogged once, not each request.
        self._groups: dict[Hashable, dict[str, _Sequence]] = {}
        self._by_id: dict[str, _Sequence] = {}
        self._work = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._sink: OutputSink | None = None
        self._outbox: list[EngineOutput] = []  # the sink's outputs of this step (ends, and first outputs)
        self._deltas: list[TokenDelta] = []  # and its plain deltas
        self._healthy = True
        self._closed = False
        self._total_requests = 0
        self._total_tokens = 0

    # --- protocol ---
    @property
    def limits(self) -> EngineLimits:
        return self._limits

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    @property
    def healthy(self) -> bool:
        return self._healthy and (self._loop_task is None or not self._loop_task.done())

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="synthetic-engine")

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        seq = self._enqueue(request, sunk=False)
        if isinstance(seq, EngineError):
            return refused(request.request_id, seq)
        return self._stream(seq)

    # --- BatchedEngine (engines/base.py) ---
    def attach(self, sink: OutputSink) -> None:
        self._sink = sink

    def sinks(self, request: GenerationRequest) -> bool:
        return True

    def submit_to_sink(self, request: GenerationRequest) -> None:
        assert self._sink is not None, "attach() a sink first"
        seq = self._enqueue(request, sunk=True)
        if isinstance(seq, EngineError):
            self._sink.put([error_output(request.request_id, str(seq), seq.code, seq.field)])
        self._put_outbox()

    def _put_outbox(self) -> None:
        # Only sunk sequences fill these (attached). A request's outputs are in one of the two lists per step.
        if self._outbox:
            outs, self._outbox = self._outbox, []
            self._sink.put(outs)  # type: ignore[union-attr]
        if self._deltas:
            deltas, self._deltas = self._deltas, []
            self._sink.put_deltas(deltas)  # type: ignore[union-attr]

    def _enqueue(self, request: GenerationRequest, sunk: bool) -> _Sequence | EngineError:
        if self._loop_task is None or self._closed:
            return EngineError("the synthetic engine is not running (call start() first)", code=503)
        if request.request_id in self._by_id:
            return EngineError(f"request id {request.request_id!r} is already in use", code=400)
        seq = _Sequence(
            request, [i for i in request.prompt_token_ids if 0 <= i < self.vocab_size] or self._fallback_cycle, sunk
        )
        if sunk:
            seq.consumer = self._sink.consumer(request.request_id)  # type: ignore[union-attr]  # sunk: attached
        self._by_id[request.request_id] = seq
        self._total_requests += 1
        problem = self._validate(request)
        if problem is not None:
            self._end(seq, FinishReason.ERROR, error=problem, code=400)
        else:
            seq.queued_at = asyncio.get_running_loop().time()
            self._waiting.append(seq)
            self._work.set()
        return seq

    async def cancel(self, request_id: str) -> None:
        seq = self._by_id.get(request_id)
        if seq is not None and seq.reason is None:
            self._end(seq, FinishReason.CANCELLED)
            self._put_outbox()

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
        self._put_outbox()
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
        self._put_outbox()

    # --- internals ---
    def _validate(self, request: GenerationRequest) -> str | None:
        n = len(request.prompt_token_ids)
        lim = self._limits
        if n > lim.max_input_len:
            return f"prompt has {n} tokens, more than the engine's max_input_len={lim.max_input_len}"
        if request.sampling.max_new_tokens > self._max_new_tokens:
            return f"max_new_tokens={request.sampling.max_new_tokens} is more than the engine's {self._max_new_tokens}"
        if lim.max_seq_len is not None and n + request.sampling.max_new_tokens > lim.max_seq_len:
            return (
                f"prompt + max_new_tokens = {n + request.sampling.max_new_tokens} exceeds max_seq_len={lim.max_seq_len}"
            )
        return None

    async def _stream(self, seq: _Sequence) -> AsyncIterator[EngineOutput]:
        rid = seq.request.request_id
        create_future = asyncio.get_running_loop().create_future
        try:
            while True:
                if seq.read == seq.generated and seq.reason is None:
                    seq.waiter = waiter = create_future()
                    await waiter
                # Everything produced since the last read goes out as one delta: a slow
                # consumer gets fewer, larger deltas instead of a growing backlog.
                a, b = seq.read, seq.generated
                seq.read = b
                queue_time, seq.queue_time_s = seq.queue_time_s, None
                if seq.reason is None:
                    yield EngineOutput(rid, seq.ids[a:b], seq.lps[a:b], queue_time_s=queue_time)
                    continue
                yield EngineOutput(
                    rid,
                    seq.ids[a:b],
                    seq.lps[a:b],
                    finished=True,
                    finish_reason=seq.reason,
                    error=seq.error,
                    error_code=seq.error_code,
                    queue_time_s=queue_time,
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
        else:
            group = self._groups[seq.consumer]
            del group[rid]
            if not group:
                del self._groups[seq.consumer]
        if seq.sunk:
            a, b = seq.read, seq.generated
            seq.read = b
            queue_time, seq.queue_time_s = seq.queue_time_s, None
            self._outbox.append(
                EngineOutput(
                    rid,
                    seq.ids[a:b],
                    seq.lps[a:b],
                    finished=True,
                    finish_reason=reason,
                    error=error,
                    error_code=code,
                    queue_time_s=queue_time,
                )
            )
        else:
            seq.wake()

    def _step(self, active: list[_Sequence]) -> None:
        """One engine step: one token for every active sequence (each a counter and a wake-up, or an output for the
        sink: all of the step's in one ``put_deltas`` and, with ends or first outputs, one ``put``)."""
        outbox, deltas = self._outbox, self._deltas
        for seq in active:
            k = seq.generated = seq.generated + 1
            if k >= seq.end_at:
                self._end(seq, seq.end_reason)
                continue
            if seq.sunk:
                a, seq.read = seq.read, k
                if seq.queue_time_s is None:
                    deltas.append((seq.request.request_id, seq.ids[a:k], seq.lps[a:k]))
                else:  # its first output, with its time in the queue
                    outbox.append(
                        EngineOutput(seq.request.request_id, seq.ids[a:k], seq.lps[a:k], queue_time_s=seq.queue_time_s)
                    )
                    seq.queue_time_s = None
                continue
            w = seq.waiter
            if w is not None:
                seq.waiter = None
                if not w.done():
                    w.set_result(None)
        self._total_tokens += len(active)
        self._put_outbox()

    def _admit(self) -> None:
        max_batch = self._limits.max_batch_size
        while self._waiting and len(self._active) < max_batch:
            seq = self._waiting.popleft()
            try:
                seq.plan(self.eos_token_id)
            except Exception as exc:  # noqa: BLE001 - one request's failure ends that request, not the engine
                log.exception("planning request %s failed", seq.request.request_id)
                self._end(seq, FinishReason.ERROR, error=f"generation failed: {exc}", code=424)
                continue
            self._active[seq.request.request_id] = seq
            self._groups.setdefault(seq.consumer, {})[seq.request.request_id] = seq
            seq.queue_time_s = asyncio.get_running_loop().time() - seq.queued_at

    async def _run(self) -> None:
        """Steps on the engine's own clock, like a GPU: ``tokens_per_second`` steps a second, each
        one token for every active sequence. When the event loop falls behind that clock, the
        steps that came due meanwhile all happen at once (consumers then read several tokens as
        one delta, as from a real engine's response queue). As fast as possible: one step per
        event-loop pass, after every consumer had its turn, so the engine never runs ahead (None,
        or a rate of ``ASAP_TOKENS_PER_SECOND`` and up); behind a sink, a step holds only the requests whose front
        end took their last outputs, so each front end sets its own requests' pace."""
        loop = asyncio.get_running_loop()
        rate = self.tokens_per_second
        period = 1.0 / rate if rate and rate < ASAP_TOKENS_PER_SECOND else 0.0
        next_step = loop.time()
        active = self._active
        while not self._closed:
            self._admit()
            if not active:
                self._work.clear()
                await self._work.wait()
                next_step = loop.time()
                continue
            if not period:
                # As fast as the consumers take them: each request at the pace of its own (a sink's front ends in
                # other processes say which still have outputs waiting), as a real engine's outputs wait for none.
                sink = self._sink
                ready = [
                    seq
                    for consumer, group in self._groups.items()
                    if consumer is None or not sink.backlogged(consumer)  # type: ignore[union-attr]
                    for seq in group.values()
                ]
                if ready:
                    self._step(ready)
                    await asyncio.sleep(0)  # the step's flush and the consumers run before the next step
                else:  # every request waits for its front end: until one takes its outputs, or a request comes
                    self._work.clear()
                    waits = [asyncio.ensure_future(sink.taken()), asyncio.ensure_future(self._work.wait())]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for wait in waits:
                            wait.cancel()
                continue
            now = loop.time()
            if now < next_step:
                await asyncio.sleep(next_step - now)
                continue
            due = min(int((now - next_step) / period) + 1, _MAX_STEPS_AT_ONCE)
            next_step = max(next_step + due * period, now)  # past the cap, the schedule slips
            for i in range(due):
                if i:
                    self._admit()
                    if not active:
                        break
                self._step(list(active.values()))
            await asyncio.sleep(0)  # consumers run before the next step, even when it is already due
