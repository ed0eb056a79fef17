"""The torch engine's built-in decode loop for Llama-shaped models: continuous batching on its own
forward pass (``llama_decoder``) and sampler (``gpu_sampler``), decode steps as CUDA graphs.

One thread runs the loop. Each iteration it

1. frees the cache slots of requests that finished, were cancelled or failed, and admits waiting
   requests into free slots (their sampling state is written to the device in one batch);
2. launches at most one prefill step: waiting prompts, whole (``max_num_tokens`` ≥
   ``max_input_len``, so one always fits), as many as keep prompts × padded length within
   ``max_num_tokens``; each samples its first token;
3. launches one decode step for every request that has a token to extend, as the CUDA graph of the
   smallest captured batch size covering the highest slot in use (idle slots inside it write to a
   scratch cache position and are ignored);
4. only then waits for the *previous* iteration's tokens (a pinned device→host copy and an event)
   and hands them to the server.

The GPU therefore always has the next step queued while the host turns the last one into
outputs; the only synchronisation is that copy of finished tokens. Stop conditions (EOS, stop
sequences) are seen one step late, so a finishing request costs one discarded token of work;
``max_new_tokens`` is known in advance and costs nothing. Multi-token bad words need the newest
token before the next step can ban anything, so while such a request decodes the loop waits for
each step before launching the next.

Failures: a row whose logits are NaN/inf or whose every token is banned ends with an error, the
rest of its batch carries on (the sampler reports a status per row). An exception in a prefill
step fails the requests whose prompts were in it; in a decode step, the requests in that step;
the engine lives on. An exception elsewhere in the loop marks the engine unhealthy.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..base import MAX_TOP_LOGPROBS, EngineError, EngineOutput, error_output
from ..guided import allowed_tokens
from .backend import Host, QueuedBackend, Slot, banned_next_tokens, default_max_num_tokens, finish_reason
from .gpu_sampler import Mode, SamplerState, row_mode, sample, top_logprobs
from .llama_decoder import LlamaDecoder, unsupported_reason

log = logging.getLogger(__name__)

DECODE_LOOPS = ("auto", "builtin", "transformers")
# Fraction of the free device memory the KV cache and the per-slot sampling state may take; the
# rest is left for activations, CUDA graphs and the allocator's slack.
_MEMORY_FRACTION = 0.85
_ERRORS = {1: "the model produced NaN/inf logits", 2: "every token is excluded by bad_words_ids/min_new_tokens"}


def choose_decode_loop(requested: str, batching: str, model: torch.nn.Module, max_seq_len: int) -> tuple[bool, str]:
    """Pure: run the built-in loop? and the sentence saying why (logged at startup)."""
    if requested not in DECODE_LOOPS:
        raise EngineError(f"option.torch_decode_loop={requested!r} is not one of {', '.join(DECODE_LOOPS)}", code=400)
    if requested == "transformers":
        return False, "option.torch_decode_loop=transformers"
    if requested == "auto" and batching != "auto":
        return False, f"option.torch_batching={batching} asks for a transformers batching path"
    problem = unsupported_reason(model, max_seq_len)
    if problem is None:
        return True, f"{type(model).__name__} is Llama-shaped (option.torch_decode_loop={requested})"
    if requested == "builtin":
        raise EngineError(
            f"option.torch_decode_loop=builtin cannot serve this model: {problem}; "
            "set option.torch_decode_loop=auto or transformers",
            code=400,
        )
    return False, f"the built-in decode loop cannot serve it: {problem}"


def plan_slots(max_batch_size: int, bytes_per_slot: int, free_bytes: int | None, workspace_bytes: int) -> int:
    """Pure: how many requests get a cache slot. ``free_bytes`` None (CPU): all of them."""
    if free_bytes is None:
        return max_batch_size
    fits = int((free_bytes * _MEMORY_FRACTION - workspace_bytes) // bytes_per_slot)
    if fits < 1:
        raise EngineError(
            f"the KV cache of one sequence needs {bytes_per_slot / 2**20:.0f} MiB and only "
            f"{free_bytes / 2**20:.0f} MiB of device memory is free: lower option.max_input_len + "
            "option.max_output_len, or set option.torch_decode_loop=transformers",
            code=400,
        )
    return min(max_batch_size, fits)


def graph_batch_sizes(slots: int) -> list[int]:
    """Pure: the batch sizes captured as CUDA graphs (a step runs the smallest one that fits)."""
    sizes = {b for b in (1, 2, 4, 8) if b < slots} | set(range(16, slots, 16)) | {slots}
    return sorted(sizes)


@dataclass(eq=False)
class _Row:
    """A request holding a cache slot."""

    slot: Slot
    index: int
    prompt: list[int]
    single_bad: list[int]
    multi_bad: list[list[int]]
    prefilled: bool = False  # the prompt is in the cache
    launched: int = 0  # tokens whose sampling has been launched

    @property
    def done(self) -> bool:
        return self.slot.finished or self.slot.cancelled or self.slot.closed

    def __post_init__(self) -> None:
        # The mode once min_new_tokens is behind it; computed once, read every step.
        self.settled = row_mode(
            self.slot.sampling,
            self.slot.sampling.min_new_tokens,
            bool(self.single_bad or self.multi_bad or self.slot.matcher is not None),
        )

    def mode(self) -> Mode:
        if self.launched >= self.slot.sampling.min_new_tokens:
            return self.settled
        return max(self.settled, Mode.PROCESSED)


@dataclass
class _Launch:
    """A step on its way: which row each output column belongs to, and the tokens' host copy."""

    rows: list[_Row | None]
    # [3, n] f32: token, raw log-probability, status; with top log-probs 2 * MAX_TOP_LOGPROBS more
    # rows (gpu_sampler.top_logprobs).
    host: torch.Tensor
    event: torch.cuda.Event | None = None


@dataclass
class _Plan:
    rows: list[_Row] = field(default_factory=list)  # whole prompts, padded to ``width``
    width: int = 0


class DecodeLoopBackend(QueuedBackend):
    """The ``Backend`` of ``TorchEngine`` that runs the built-in loop (see the module docstring)."""

    name = "decode_loop"

    def __init__(self, engine: Host, model: torch.nn.Module) -> None:
        self._engine = engine
        self._device = model.device
        self._cuda = self._device.type == "cuda"
        self._max_seq = engine.max_input_len + engine.max_new_tokens
        self._budget = engine.max_num_tokens or default_max_num_tokens(engine.max_batch_size, engine.max_input_len)
        vocab = model.lm_head.out_features
        free = None
        if self._cuda:
            torch.cuda.set_device(self._device)
            free = torch.cuda.mem_get_info(self._device)[0]
        config = model.config
        per_slot = LlamaDecoder.cache_bytes_per_slot(model, self._max_seq) + SamplerState.bytes_per_slot(vocab)
        # Prefill activations (hidden, q/k/v, MLP, expanded K/V) and a few fp32 [slots, vocab] temporaries.
        workspace = self._budget * (6 * config.hidden_size + 3 * config.intermediate_size) * 2 * 2
        self.slots = plan_slots(engine.max_batch_size, per_slot + 16 * vocab, free, workspace)
        if self.slots < engine.max_batch_size:
            log.warning(
                "built-in decode loop: device memory holds %d of option.max_rolling_batch_size=%d sequences "
                "of %d positions; the rest wait for a free slot",
                self.slots,
                engine.max_batch_size,
                self._max_seq,
            )
        self._decoder = LlamaDecoder(model, slots=self.slots, max_seq_len=self._max_seq)
        self._state = SamplerState(self.slots, vocab, self._device, engine.eos_token_ids)
        self._pad = engine.pad_token_id or 0
        # Device buffers the decode graphs read and write at fixed addresses.
        self._next = torch.zeros(self.slots, dtype=torch.long, device=self._device)  # next input token per slot
        self._step = torch.zeros(2, self.slots, dtype=torch.long, device=self._device)  # positions, generated
        self._step[0] = self._decoder.scratch
        self._out = torch.zeros(3 + 2 * MAX_TOP_LOGPROBS, self.slots, dtype=torch.float32, device=self._device)
        self._sizes = graph_batch_sizes(self.slots) if self._cuda else []
        self._graphs: dict[tuple[int, Mode], torch.cuda.CUDAGraph] = {}
        if self._cuda:
            self._capture()
        # Where the loop's time goes (read by benchmarks/gpu_decode.py): steps launched, rows they
        # decoded, seconds spent waiting for the device versus everything else.
        self.counters = {"prefill_steps": 0, "decode_steps": 0, "decode_rows": 0, "wait_s": 0.0}
        self._free = list(range(self.slots))
        self._rows: list[_Row] = []  # admission order
        self._inflight: list[_Launch] = []
        log.info(
            "built-in decode loop: %d slots of %d positions, %d tokens per prefill step, %s, %s",
            self.slots,
            self._max_seq,
            self._budget,
            f"CUDA graphs for batch sizes {self._sizes}" if self._cuda else "eager (no CUDA graphs on CPU)",
            "Triton kernels" if self._decoder.fused_kernels else "torch operations only",
        )
        self._start("torch-engine-decode-loop")

    # -- the device steps ------------------------------------------------------------------------

    def _decode_step(self, size: int, mode: Mode, top: bool = False, bias: torch.Tensor | None = None) -> None:
        """Everything a decode step does on the device, for slots ``0..size-1`` (graph-capturable).
        ``top``: also the top log-probs; ``bias``: logit_bias per slot (eager steps only: few
        requests ask, the graphs stay lean)."""
        positions, generated = self._step[0, :size], self._step[1, :size]
        valid = positions < self._decoder.scratch
        logits = self._decoder.decode(self._next[:size], positions)
        tokens, logprobs, status = sample(
            logits, self._state.rows(slice(0, size)), generated, self._state.eos, mode, bias
        )
        self._record(torch.arange(size, device=self._device), tokens, valid)
        self._out[:3, :size] = torch.stack((tokens.float(), logprobs, status.float()))
        if top:
            self._out[3:, :size] = top_logprobs(logits, MAX_TOP_LOGPROBS)

    def _record(self, slots: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The sampled token becomes the slot's next input and joins its history (valid rows only)."""
        self._next[slots] = torch.where(valid, tokens, self._next[slots])
        self._state.counts[slots, tokens] += valid.float()

    def _capture(self) -> None:
        with torch.inference_mode():
            for mode in Mode:  # warm-up: cuBLAS handles and lazy initialisation stay out of capture
                self._decode_step(self.slots, mode)
            torch.cuda.synchronize()
            pool = None
            for mode in Mode:
                for size in reversed(self._sizes):  # largest first: smaller graphs reuse its memory
                    graph = torch.cuda.CUDAGraph()
                    try:
                        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                            self._decode_step(size, mode)
                    except RuntimeError:
                        # Such steps then run eagerly: slower, still correct.
                        log.warning(
                            "built-in decode loop: %s steps cannot be captured as CUDA graphs", mode.name, exc_info=True
                        )
                        torch.cuda.synchronize()
                        break
                    pool = graph.pool()
                    self._graphs[size, mode] = graph
            torch.cuda.synchronize()

    def _put(self, values: list) -> torch.Tensor:
        cpu = torch.tensor(values, dtype=torch.long)
        if self._cuda:
            return cpu.pin_memory().to(self._device, non_blocking=True)
        return cpu

    def _to_host(self, out: torch.Tensor, rows: list[_Row | None]) -> _Launch:
        if not self._cuda:
            return _Launch(rows, out.clone())
        host = torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
        host.copy_(out, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _Launch(rows, host, event)

    def _bias(self, rows: Sequence[_Row | None]) -> torch.Tensor | None:
        """[len(rows), vocab] logit_bias of a step's rows, or None when no row has one."""
        if not any(r is not None and r.slot.sampling.logit_bias for r in rows):
            return None
        dense = torch.zeros(len(rows), self._state.vocab)
        for i, r in enumerate(rows):
            if r is not None and r.slot.sampling.logit_bias:
                ids, values = zip(*r.slot.sampling.logit_bias)
                dense[i, list(ids)] = torch.tensor(values)
        return dense.to(self._device)

    def _step_bans(self, rows: Sequence[_Row], value: bool) -> None:
        """Set (before a step) or clear (after it) the bans of multi-token bad words whose prefix
        ends the row's context, transformers' NoBadWordsLogitsProcessor rule, and of every token a
        constrained row's grammar cannot take next."""
        guided = [r for r in rows if r.slot.matcher is not None]
        if guided:
            index = self._put([r.index for r in guided])
            if value:
                allowed = allowed_tokens([r.slot.matcher for r in guided], self._state.vocab)
                self._state.banned_now[index] = ~allowed.to(self._device)
            else:
                self._state.banned_now[index] = False
        rows = [r for r in rows if r.multi_bad]
        if rows:
            bans = [banned_next_tokens(r.prompt + r.slot.generated, r.multi_bad) for r in rows]
            self._state.mark(self._state.banned_now, [r.index for r in rows], bans, value)

    def _launch_prefill(self, plan: _Plan) -> _Launch:
        scratch, width, ending = self._decoder.scratch, plan.width, plan.rows
        tokens = [row.prompt + [self._pad] * (width - len(row.prompt)) for row in ending]
        positions = [list(range(len(row.prompt))) + [scratch] * (width - len(row.prompt)) for row in ending]
        last = self._put([i * width + len(row.prompt) - 1 for i, row in enumerate(ending)])
        slots = self._put([row.index for row in ending])
        keys = max(len(row.prompt) for row in ending)
        logits = self._decoder.prefill(self._put(tokens), self._put(positions), slots, keys, last)
        self.counters["prefill_steps"] += 1
        for row in ending:
            row.prefilled = True
        self._step_bans(ending, True)
        generated = torch.zeros(len(ending), dtype=torch.long, device=self._device)
        mode = max(row.mode() for row in ending)
        tokens_out, logprobs, status = sample(
            logits, self._state.rows(slots), generated, self._state.eos, mode, self._bias(ending)
        )
        self._record(slots, tokens_out, torch.ones_like(slots, dtype=torch.bool))
        self._step_bans(ending, False)
        for row in ending:
            row.launched = 1
        out = torch.stack((tokens_out.float(), logprobs, status.float()))
        if any(row.slot.sampling.top_logprobs for row in ending):
            out = torch.cat((out, top_logprobs(logits, MAX_TOP_LOGPROBS)))
        return self._to_host(out, list(ending))

    def _launch_decode(self, rows: list[_Row]) -> _Launch:
        top = max(r.index for r in rows) + 1
        size = next(s for s in self._sizes if s >= top) if self._cuda else top
        step = [[self._decoder.scratch] * size, [0] * size]
        columns: list[_Row | None] = [None] * size
        for r in rows:
            step[0][r.index] = len(r.prompt) + r.launched - 1
            step[1][r.index] = r.launched
            columns[r.index] = r
        self._step[:, :size].copy_(self._put(step), non_blocking=True)
        mode = max(r.mode() for r in rows)
        self._step_bans(rows, True)
        top = any(r.slot.sampling.top_logprobs for r in rows)
        bias = self._bias(columns)
        graph = None if top or bias is not None else self._graphs.get((size, mode))
        if graph is not None:
            graph.replay()
        else:
            self._decode_step(size, mode, top, bias)
        self._step_bans(rows, False)
        for r in rows:
            r.launched += 1
        self.counters["decode_steps"] += 1
        self.counters["decode_rows"] += len(rows)
        return self._to_host(self._out[:, :size] if top else self._out[:3, :size], columns)

    # -- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self._device)
            with torch.inference_mode():
                while self._wait_for_work():
                    self._iterate()
        except BaseException as exc:
            log.exception("the built-in decode loop died")
            self._engine.die(f"the decode loop died: {exc}")

    def _wait_for_work(self) -> bool:
        with self._wake:
            while not (self._stopping or self._pending or self._rows or self._inflight):
                self._wake.wait()
            return not self._stopping

    def _iterate(self) -> None:
        self._reap()
        self._admit()
        launched: list[_Launch] = []
        plan = self._plan_prefill()
        if plan.rows:
            launched += self._guarded(self._launch_prefill, plan, plan.rows, "prefill")
        decoding = self._decodable()
        if decoding and any(r.multi_bad or r.slot.matcher is not None for r in decoding):
            self._drain(launched)  # the bans and grammars need the newest token of each row
            launched = []
            decoding = self._decodable()
        if decoding:
            launched += self._guarded(self._launch_decode, decoding, decoding, "decode")
        self._drain([])
        self._inflight = launched

    def _guarded(self, launch, argument, rows: Sequence[_Row], what: str) -> list[_Launch]:
        try:
            result = launch(argument)
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, the loop goes on
            log.exception("a %s step of %d requests failed", what, len(rows))
            for row in rows:
                if not row.done:
                    self._engine.fail(row.slot, f"generation failed: {exc}", 424)
            return []
        return [result]

    def _decodable(self) -> list[_Row]:
        return [r for r in self._rows if not r.done and 0 < r.launched < r.slot.sampling.max_new_tokens]

    def _reap(self) -> None:
        keep = []
        for row in self._rows:
            if row.done:
                self._free.append(row.index)
            else:
                keep.append(row)
        self._rows = keep
        self._free.sort(reverse=True)  # pop() hands out the lowest slot: the batch stays compact

    def _admit(self) -> None:
        admitted: list[_Row] = []
        with self._wake:
            while self._pending and self._free:
                slot = self._pending.popleft()
                if slot.cancelled or slot.closed:
                    continue
                slot.scheduled()
                bad = slot.request.bad_words_ids
                admitted.append(
                    _Row(
                        slot,
                        self._free.pop(),
                        list(slot.request.prompt_token_ids),
                        single_bad=[w[0] for w in bad if len(w) == 1],
                        multi_bad=[list(w) for w in bad if len(w) > 1],
                    )
                )
        if not admitted:
            return
        seeds = [r.slot.sampling.seed if r.slot.sampling.seed is not None else secrets.randbits(63) for r in admitted]
        self._state.admit(
            [r.index for r in admitted],
            [r.slot.sampling for r in admitted],
            seeds,
            [bool(r.slot.eos_ids) for r in admitted],
            [r.prompt for r in admitted],
            [r.single_bad for r in admitted],
        )
        self._rows += admitted

    def _plan_prefill(self) -> _Plan:
        plan = _Plan()
        for row in self._rows:
            if row.done or row.prefilled:
                continue
            # A whole prompt always fits (max_num_tokens >= max_input_len); prompts share a step
            # while prompts × padded length stays within it.
            width = max(plan.width, len(row.prompt))
            if plan.rows and (len(plan.rows) + 1) * width > self._budget:
                break
            plan.rows.append(row)
            plan.width = width
        return plan

    def _drain(self, more: list[_Launch]) -> None:
        """Hand the tokens of every launch in flight (then of ``more``) to the server, in order."""
        launches, self._inflight = self._inflight + more, []
        for launch in launches:
            if launch.event is not None:
                started = time.perf_counter()
                launch.event.synchronize()
                self.counters["wait_s"] += time.perf_counter() - started
            self._emit(launch)

    def _emit(self, launch: _Launch) -> None:
        tokens, logprobs, status, *top = launch.host.tolist()
        items: list[tuple[Slot, EngineOutput]] = []
        for column, row in enumerate(launch.rows):
            if row is None or row.done:
                continue
            slot = row.slot
            if status[column]:
                slot.finished = True
                items.append((slot, error_output(slot.request.request_id, _ERRORS[int(status[column])], 424)))
                continue
            token = int(tokens[column])
            slot.generated.append(token)
            if slot.matcher is not None:
                slot.matcher.accept_token(token)
            reason = finish_reason(slot.generated, slot.eos_ids, slot.request)
            slot.finished = reason is not None
            k = slot.sampling.top_logprobs
            alternatives = [[(int(top[j][column]), top[MAX_TOP_LOGPROBS + j][column]) for j in range(k)]] if k else None
            items.append(
                (
                    slot,
                    EngineOutput(
                        slot.request.request_id,
                        [token],
                        [logprobs[column]] if slot.sampling.logprobs else None,
                        alternatives,
                        finished=slot.finished,
                        finish_reason=reason,
                        queue_time_s=slot.take_queue_time(),
                    ),
                )
            )
        self._engine.sampled_rows += len(items)  # only this thread writes it
        self._engine.deliver(items)
