"""The embedded ``torch`` engine: transformers models served with the engine protocol.

Two batching paths share one sampler and one delivery mechanism:

* **continuous** — transformers' continuous batching manager (paged KV cache, requests join and
  leave between steps). Its built-in per-request processors only cover temperature/top_k/top_p,
  see only the last token of each row, and share one RNG and one ``do_sample`` flag across the
  batch. So the engine installs its own hook in the manager's logits-processor slot: the hook
  receives every step's logits rows (one per request that gets a token), runs *this module's*
  sampler with the request's full history, seed and settings, and hands back a one-hot score row
  so that the manager's greedy pick is exactly the token chosen here. Every ``SamplingParams``
  field is therefore honoured per request inside CB; nothing is routed elsewhere.
  CUDA graphs, torch.compile and async double-buffering are turned off because the hook is
  Python running between prepare and update of the same step.
* **static** — for models whose ``_supports_attention_backend`` is False (they error or silently
  produce wrong tokens under CB: Falcon, and GPT-J before transformers gave it the attention
  interface), when the installed transformers lacks the CB API or
  its manager cannot be set up (logged), or when ``batching="static"`` is asked for:
  a left-padded batch decoded step by step with ``past_key_values``. Requests that arrive while
  a batch runs wait for the next one; finished or cancelled rows are dropped from the batch (and
  its KV cache) between steps.

Threads: the engine thread (the CB manager's, or the static loop) samples and emits deltas with
one ``loop.call_soon_threadsafe`` per step; all per-request bookkeeping visible to callers lives
on the event loop that ran ``start()``. Use the engine from that loop only.

Log-probabilities are the log-softmax of the raw model logits at the chosen token, before
penalties, masks, temperature or top-k/top-p (vLLM's default ``raw_logprobs`` mode).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from ..compat import dtype_kwargs, reorder_cache, text_config
from .base import (
    MAX_TOP_LOGPROBS,
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    error_output,
    refused,
)
from .guided import Grammars, Guide, allowed_tokens
from .registry import ENGINES

# Constrained decoding needs xgrammar (the torch extra); without it such requests get a 400.
_HAS_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None

try:
    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import RequestStatus
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )
    from transformers.generation.logits_process import LogitsProcessorList

    _CB_IMPORT_ERROR: str | None = None
except ImportError as exc:  # older transformers: the static path still works
    _CB_IMPORT_ERROR = f"this transformers has no usable continuous batching API ({exc})"

log = logging.getLogger(__name__)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_BATCHING = ("auto", "continuous", "static")
EXCLUDED = (
    "every token is excluded: the constraint, bad_words and min_new_tokens together allow none at this step; "
    "loosen one of them"
)
# transformers' default page size; flash-attention's paged decode kernel wants multiples of 256.
_PAGE_SIZE = 256
_CLOSE_TIMEOUT_S = 30.0
_GATHER_S = 0.005  # how long a static batch waits for more of a burst once one request is there
# One from_pretrained at a time per process: transformers (5.x, src/transformers/initialization.py
# no_tie_weights / no_init_weights) patches PreTrainedModel.tie_weights and torch's init functions
# for the duration of a load and restores what it saved, so two overlapping loads (model copies
# starting together) can leave them patched for good: tied lm_heads of every later load are then
# left uninitialized (GPT-2, Falcon: garbage or NaN logits).
_LOAD_LOCK = threading.Lock()


# ----------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | str:
    """``auto`` keeps the checkpoint dtype on accelerators; on CPU half precision is slow, so fp32."""
    if dtype == "auto":
        return "auto" if device.type != "cpu" else torch.float32
    if dtype not in _DTYPES:
        raise EngineError(f"dtype={dtype!r} is not one of auto, {', '.join(_DTYPES)}", code=400)
    return _DTYPES[dtype]


def as_id_list(value: int | Sequence[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def ends_with_any(tokens: Sequence[int], sequences: Sequence[Sequence[int]]) -> bool:
    return any(0 < len(seq) <= len(tokens) and list(tokens[-len(seq) :]) == list(seq) for seq in sequences)


def banned_next_tokens(context: Sequence[int], bad_words: Sequence[Sequence[int]]) -> list[int]:
    """HF ``NoBadWordsLogitsProcessor`` semantics: ban a sequence's last token once the context ends
    with the rest of it (single-token sequences are always banned)."""
    return [seq[-1] for seq in bad_words if ends_with_any(context, [seq[:-1]]) or len(seq) == 1]


def finish_reason(generated: Sequence[int], eos_ids: Sequence[int], request: GenerationRequest) -> FinishReason | None:
    if ends_with_any(generated, request.stop_token_ids):
        return FinishReason.STOP_SEQUENCE
    if generated and generated[-1] in eos_ids:
        return FinishReason.EOS
    if len(generated) >= request.sampling.max_new_tokens:
        return FinishReason.LENGTH
    return None


def check_sampling(params: SamplingParams, max_new_tokens: int) -> None:
    """Reject what the engine cannot honour, naming the parameter (HTTP 400)."""
    problems = []
    if not 1 <= params.max_new_tokens <= max_new_tokens:
        problems.append(f"max_new_tokens={params.max_new_tokens} must be in [1, {max_new_tokens}]")
    if params.beam_width != 1:
        problems.append(f"beam_width={params.beam_width}: the torch engine does not implement beam search")
    if params.do_sample and not params.temperature > 0:
        problems.append(f"temperature={params.temperature} must be > 0 when do_sample is true")
    if params.top_k < 0:
        problems.append(f"top_k={params.top_k} must be >= 0")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p={params.top_p} must be in (0, 1]")
    if not params.repetition_penalty > 0:
        problems.append(f"repetition_penalty={params.repetition_penalty} must be > 0")
    if params.min_new_tokens < 0:
        problems.append(f"min_new_tokens={params.min_new_tokens} must be >= 0")
    if problems:
        raise EngineError("; ".join(problems), code=400)


def check_token_ids(request: GenerationRequest, vocab_size: int, max_input_len: int) -> None:
    prompt = request.prompt_token_ids
    if not prompt:
        raise EngineError("prompt_token_ids is empty", code=400)
    if len(prompt) > max_input_len:
        raise EngineError(f"prompt has {len(prompt)} tokens, more than max_input_len={max_input_len}", code=400)
    named = [("prompt_token_ids", [prompt])]
    named += [("stop_token_ids", request.stop_token_ids), ("bad_words_ids", request.bad_words_ids)]
    for name, sequences in named:
        for seq in sequences:
            if not seq:
                raise EngineError(f"{name} contains an empty sequence", code=400)
            bad = [t for t in seq if not 0 <= t < vocab_size]
            if bad:
                raise EngineError(f"{name} has token ids outside [0, {vocab_size}): {bad[:5]}", code=400)


def default_max_num_tokens(max_batch_size: int, max_input_len: int) -> int:
    """Tokens one step may process: a whole prompt plus a decode token for every other request,
    and at least 2048 so a burst of prompts prefills in a few steps rather than dozens."""
    return max(max_input_len + max_batch_size, 2048)


def cb_config(
    max_batch_size: int, max_input_len: int, max_new_tokens: int, max_num_tokens: int | None = None
) -> ContinuousBatchingConfig:
    """Paged cache sized for ``max_batch_size`` full-length sequences, never from free memory."""
    blocks_per_sequence = math.ceil((max_input_len + max_new_tokens) / _PAGE_SIZE)
    # Older releases (5.17 included) name the page size ``block_size``; same meaning.
    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    page_field = "page_size" if "page_size" in names else "block_size"
    return ContinuousBatchingConfig(
        **{page_field: _PAGE_SIZE},
        num_blocks=max_batch_size * blocks_per_sequence,
        max_batch_tokens=max_num_tokens or default_max_num_tokens(max_batch_size, max_input_len),
        max_requests_per_batch=max_batch_size,
        # The sampler hook runs Python between batch preparation and update: no graphs, no
        # compile, no double-buffering (which would prepare step N+1 before N is sampled).
        use_cuda_graph=False,
        use_async_batching=False,
        default_compile_level=0,
        per_request_processors=False,
        return_logprobs=False,
    )


# ----------------------------------------------------------------------------------------------
# Per-request state and the sampler
# ----------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Slot:
    request: GenerationRequest
    key: str  # unique per submission: a client may reuse a request_id right after cancelling it
    eos_ids: tuple[int, ...]  # empty with ignore_eos
    generator: torch.Generator | None  # per-request RNG when a seed is given
    queue: asyncio.Queue[EngineOutput]
    prompt_set: frozenset[int]
    generated: list[int] = field(default_factory=list)
    # Written by the engine thread only.
    finished: bool = False
    # Written on the event loop only (the engine thread reads ``cancelled``).
    cancelled: bool = False
    closed: bool = False
    started: bool = False
    matcher: Guide | None = None  # a constrained request's grammar matcher (engine thread only)
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


@dataclass(frozen=True)
class _Pick:
    token: int
    logprob: float | None = None
    error: str | None = None
    top: list[tuple[int, float]] | None = None  # with top_logprobs: the most likely tokens, best first
    field: str | None = None  # with an error: the request field at fault (a 400), None for a model failure


def excluded_field(slot: _Slot) -> str:
    """The request field at fault when every token is excluded: the constraint the grammar, bad words and
    min_new_tokens together cannot meet is the client's, a 400 (the grammar where there is one)."""
    return "guided" if slot.matcher is not None else "bad_words"


def _apply_history_processors(row: torch.Tensor, slot: _Slot) -> None:
    """Penalties and masks that need the request's history, in HF ``generate``'s order, in place."""
    params = slot.sampling
    if params.logit_bias:
        ids, values = zip(*params.logit_bias)
        row[torch.tensor(ids, device=row.device)] += torch.tensor(values, dtype=row.dtype, device=row.device)
    if params.repetition_penalty != 1.0:
        ids = torch.tensor(sorted(slot.prompt_set.union(slot.generated)), device=row.device)
        scores = row[ids]
        row[ids] = torch.where(scores < 0, scores * params.repetition_penalty, scores / params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and slot.generated:
        ids, counts = torch.tensor(slot.generated, device=row.device).unique(return_counts=True)
        row[ids] -= params.presence_penalty + params.frequency_penalty * counts.to(row.dtype)
    banned = banned_next_tokens(slot.request.prompt_token_ids + slot.generated, slot.request.bad_words_ids)
    if len(slot.generated) < params.min_new_tokens:
        banned += slot.eos_ids
    if banned:
        row[torch.tensor(banned, device=row.device)] = float("-inf")


def _warp(scores: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature → top-k → top-p per row (HF semantics), then probabilities."""
    device, vocab = scores.device, scores.size(-1)
    scores = scores / torch.tensor([p.temperature for p in params], device=device).unsqueeze(-1)
    if any(p.top_k > 0 for p in params):
        ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
        kth = scores.sort(dim=-1, descending=True).values.gather(-1, (ks - 1).unsqueeze(-1))
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device).unsqueeze(-1)
        ordered, order = scores.sort(dim=-1)
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[:, -1] = False  # always keep the most likely token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores.softmax(-1)


def sample_next_tokens(logits: torch.Tensor, slots: Sequence[_Slot | None]) -> list[_Pick]:
    """Choose one token per row of ``logits`` ([n, vocab] fp32, modified in place).

    A failure in one row's processing becomes that row's error; other rows are unaffected.
    ``None`` slots (requests already gone) get a greedy token that nobody reads.
    """
    n = len(slots)
    logits = logits[:n]
    raw_logprobs = logits.log_softmax(-1) if any(s is not None and s.sampling.logprobs for s in slots) else None
    errors: list[str | None] = [None] * n
    faults: list[str | None] = [None] * n  # the request field at fault for an error (_Pick.field)
    for i, slot in enumerate(slots):
        if slot is not None:
            try:
                _apply_history_processors(logits[i], slot)
            except Exception as exc:  # noqa: BLE001 - isolate the row, report it to its client
                errors[i] = f"logits processing failed: {exc}"
    guided = [i for i in range(n) if slots[i] is not None and slots[i].matcher is not None and errors[i] is None]
    if guided:  # constrained decoding: what the grammar cannot take next is banned
        try:
            allowed = allowed_tokens([slots[i].matcher for i in guided], logits.size(-1)).to(logits.device)
            logits[guided] = logits[guided].masked_fill(~allowed, float("-inf"))
        except Exception as exc:  # noqa: BLE001 - those rows fail, the batch goes on
            for i in guided:
                errors[i] = f"constrained decoding failed: {exc}"
        for i in guided:  # a grammar too slow to follow fails its own request (guided.STEP_CPU_S)
            if slots[i].matcher.error is not None:
                errors[i], faults[i] = slots[i].matcher.error, "guided"
    # NaN or +inf would poison the softmax of a whole batched draw: fail those rows instead.
    broken = torch.isnan(logits).any(-1) | torch.isposinf(logits).any(-1)
    broken, all_masked = torch.stack((broken, ~torch.isfinite(logits).any(-1))).tolist()
    for i in range(n):
        if errors[i] is None and broken[i]:
            errors[i] = "the model produced NaN/inf logits"
        elif errors[i] is None and all_masked[i]:
            errors[i], faults[i] = EXCLUDED, excluded_field(slots[i])

    tokens = [0] * n
    ok = [i for i in range(n) if errors[i] is None]
    greedy = [i for i in ok if slots[i] is None or not slots[i].sampling.do_sample]
    sampled = [i for i in ok if slots[i] is not None and slots[i].sampling.do_sample]
    if greedy:
        best = logits.argmax(-1).tolist()
        for i in greedy:
            tokens[i] = best[i]
    if sampled:
        probs = _warp(logits[sampled], [slots[i].sampling for i in sampled])
        # A row whose probabilities the arithmetic broke (NaN, inf, all zero: an extreme
        # temperature or penalty) would make the batched draw raise for every row: fail it alone.
        valid = (torch.isfinite(probs).all(-1) & (probs >= 0).all(-1) & (probs.sum(-1) > 0)).tolist()
        for j, i in enumerate(sampled):
            if not valid[j]:
                errors[i] = "sampling produced invalid probabilities (NaN/inf) for this request's settings"
        # Unseeded rows share one draw; a seeded row draws from its own generator only, so its
        # tokens do not depend on what else is in the batch.
        draws = torch.zeros(len(sampled), dtype=torch.long, device=logits.device)
        unseeded = [j for j, i in enumerate(sampled) if valid[j] and slots[i].generator is None]
        if unseeded:
            draws[unseeded] = torch.multinomial(probs[unseeded], 1).squeeze(-1)
        for j, i in enumerate(sampled):
            if valid[j] and slots[i].generator is not None:
                draws[j] = torch.multinomial(probs[j], 1, generator=slots[i].generator)[0]
        for j, (i, token) in enumerate(zip(sampled, draws.tolist())):
            tokens[i] = token if valid[j] else 0

    logprobs: list[float | None] = [None] * n
    tops: list[list[tuple[int, float]] | None] = [None] * n
    if raw_logprobs is not None:
        chosen = raw_logprobs[torch.arange(n, device=logits.device), torch.tensor(tokens, device=logits.device)]
        for i, value in enumerate(chosen.tolist()):
            if slots[i] is not None and slots[i].sampling.logprobs and errors[i] is None:
                logprobs[i] = value
        want = [i for i in range(n) if slots[i] is not None and slots[i].sampling.top_logprobs and errors[i] is None]
        if want:
            values, ids = raw_logprobs[want].topk(max(slots[i].sampling.top_logprobs for i in want), dim=-1)
            for i, row_ids, row_values in zip(want, ids.tolist(), values.tolist()):
                k = slots[i].sampling.top_logprobs
                tops[i] = list(zip(row_ids[:k], row_values[:k]))
    return [_Pick(tokens[i], logprobs[i], errors[i], tops[i], faults[i]) for i in range(n)]


# ----------------------------------------------------------------------------------------------
# Batching backends
# ----------------------------------------------------------------------------------------------


class _Backend(Protocol):
    """What the engine needs from a batching path; each runs its own thread."""

    name: str

    def enqueue(self, slot: _Slot) -> None: ...

    def cancel(self, slot: _Slot) -> None: ...

    def close(self) -> None: ...


if _CB_IMPORT_ERROR is None:

    class _SamplerHook(ContinuousBatchingLogitsProcessorList):
        """Sits where the CB manager keeps its logits processors and samples with the engine.

        ``prepare_tensor_args`` runs while the batch is prepared and is handed the batch's
        requests in row order; ``__call__`` then receives those rows' logits in the same step.
        """

        def __init__(
            self, sample: Callable[[list[str], torch.Tensor], torch.Tensor], scheduled: Callable[[list[str]], None]
        ) -> None:
            super().__init__(LogitsProcessorList())
            self.do_processing = True  # an empty processor list would otherwise be skipped
            self._sample = sample
            self._scheduled = scheduled
            self._row_keys: list[str] = []

        def prepare_tensor_args(self, requests_in_batch, arg_storage: torch.Tensor) -> torch.Tensor:
            # Every request of the batch, prefilling ones too: the first batch a request is in
            # ends its queue time.
            self._scheduled([r.state.request_id for r in requests_in_batch])
            self._row_keys = [r.state.request_id for r in requests_in_batch if r.has_new_token]
            return arg_storage

        def __call__(self, input_ids, scores: torch.Tensor, logits_processor_args) -> torch.Tensor:
            return self._sample(self._row_keys, scores)


class _ContinuousBackend:
    name = "continuous"

    def __init__(self, engine: TorchEngine, model: PreTrainedModel) -> None:
        self._engine = engine
        generation_config = GenerationConfig(
            do_sample=False,  # the hook returns one-hot rows: the manager's argmax is our pick
            max_new_tokens=engine.max_new_tokens,
            eos_token_id=list(engine.eos_token_ids) or -1,
            pad_token_id=engine.pad_token_id,
        )
        self._manager = model.init_continuous_batching(
            generation_config=generation_config,
            continuous_batching_config=cb_config(
                engine.max_batch_size, engine.max_input_len, engine.max_new_tokens, engine.max_num_tokens
            ),
        )
        # Replaces the processors the manager derived from the generation config; the batch
        # processor picks this attribute up when the generation thread starts.
        self._manager.logit_processor = _SamplerHook(self._sample, self._scheduled)
        self._manager.start()
        self._stopping = threading.Event()
        self._pump = threading.Thread(target=self._watch, name="torch-engine-cb-pump", daemon=True)
        self._pump.start()

    def enqueue(self, slot: _Slot) -> None:
        accepted = self._manager.add_request(
            slot.request.prompt_token_ids,
            request_id=slot.key,
            max_new_tokens=slot.sampling.max_new_tokens,
            streaming=False,  # tokens are emitted by the sampler hook, not by the manager
            eos_token_id=list(slot.eos_ids) or -1,
        )
        if accepted is None:
            self._engine.fail(slot, "the continuous batching loop is not accepting requests", 503)

    def cancel(self, slot: _Slot) -> None:
        self._manager.cancel_request(slot.key)

    def close(self) -> None:
        self._stopping.set()
        self._manager.stop(block=True, timeout=_CLOSE_TIMEOUT_S, hard_stop=True)
        self._manager.destroy()
        self._pump.join(timeout=_CLOSE_TIMEOUT_S)

    def _scheduled(self, keys: list[str]) -> None:
        for key in keys:
            slot = self._engine.slot_by_key(key)
            if slot is not None:
                slot.scheduled()

    def _sample(self, keys: list[str], scores: torch.Tensor) -> torch.Tensor:
        slots = [self._engine.slot_by_key(k) for k in keys]
        try:
            # Rows come in request order; trailing rows are padding for requests still prefilling.
            if scores.size(0) < len(keys):
                raise RuntimeError(f"{scores.size(0)} logits rows for {len(keys)} requests")
            tokens = self._engine.advance(slots, scores, self._stop_early)
        except Exception as exc:  # noqa: BLE001 - a raise here would kill the whole CB loop
            log.exception("sampling failed for a continuous batch of %d requests", len(keys))
            for slot in slots:
                if slot is not None:
                    self._engine.fail(slot, f"sampling failed: {exc}", 424)
                    self._manager.cancel_request(slot.key)
            return scores
        one_hot = torch.full_like(scores, float("-inf"))
        one_hot[torch.arange(len(tokens), device=scores.device), torch.tensor(tokens, device=scores.device)] = 0.0
        return one_hot

    def _stop_early(self, slot: _Slot, reason: FinishReason) -> None:
        # The manager finishes EOS and LENGTH itself (it was given the same EOS ids and
        # max_new_tokens); stop sequences and errors need an explicit cancel to free the cache.
        if reason not in (FinishReason.EOS, FinishReason.LENGTH):
            self._manager.cancel_request(slot.key)

    def _watch(self) -> None:
        """Relay requests the manager failed, and notice when its thread dies."""
        while not self._stopping.is_set():
            result = self._manager.get_result(timeout=0.1)
            if result is None:
                if not self._manager.is_running() and not self._stopping.is_set():
                    self._engine.die("the continuous batching thread stopped unexpectedly")
                    return
                continue
            slot = self._engine.slot_by_key(result.request_id)
            if slot is not None and result.status == RequestStatus.FAILED:
                self._engine.fail(slot, f"generation failed: {result.error}", 424)


class QueuedBackend:
    """A backend whose own thread (``_run``) takes requests from a pending queue."""

    def _start(self, thread_name: str) -> None:
        self._pending: deque[_Slot] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    def enqueue(self, slot: _Slot) -> None:
        with self._wake:
            self._pending.append(slot)
            self._wake.notify()

    def cancel(self, slot: _Slot) -> None:
        with self._wake:
            if slot in self._pending:
                self._pending.remove(slot)
            self._wake.notify()

    def close(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=_CLOSE_TIMEOUT_S)


class _StaticBackend(QueuedBackend):
    name = "static"

    def __init__(self, engine: TorchEngine, model: PreTrainedModel) -> None:
        self._engine = engine
        self._model = model
        self._device = model.device
        self._keep_last_logits = bool(getattr(model, "_supports_logits_to_keep", lambda: False)())
        self._start("torch-engine-static")

    def _next_batch(self) -> list[_Slot] | None:
        """The next batch (never empty), or None once stopping."""
        with self._wake:
            while not self._stopping:
                while not self._pending and not self._stopping:
                    self._wake.wait()
                # Requests of a burst arrive one event-loop turn apart: let them join this batch.
                deadline = time.monotonic() + _GATHER_S
                while len(self._pending) < self._engine.max_batch_size and not self._stopping:
                    if not self._wake.wait(timeout=max(0.0, deadline - time.monotonic())):
                        break
                batch = []
                while self._pending and len(batch) < self._engine.max_batch_size and not self._stopping:
                    batch.append(self._pending.popleft())
                    batch[-1].scheduled()
                if batch:  # empty when every gathered request was cancelled meanwhile: wait again
                    return batch
            return None

    def _run(self) -> None:
        try:
            if self._device.type == "cuda" and self._device.index is not None:
                torch.cuda.set_device(self._device)
            while (batch := self._next_batch()) is not None:
                try:
                    with torch.inference_mode():
                        self._decode(batch)
                except Exception as exc:  # noqa: BLE001 - the batch fails, the engine lives on
                    log.exception("static batch of %d requests failed", len(batch))
                    for slot in batch:
                        self._engine.fail(slot, f"generation failed: {exc}", 424)
        except BaseException as exc:
            log.exception("static batching thread died")
            self._engine.die(f"the static batching thread died: {exc}")

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        kwargs = {"logits_to_keep": 1} if self._keep_last_logits else {}
        out = self._model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **kwargs,
        )
        return out.logits[:, -1, :].float(), out.past_key_values

    def _decode(self, slots: list[_Slot]) -> None:
        prompts = [s.request.prompt_token_ids for s in slots]
        width = max(map(len, prompts))
        pad = self._engine.pad_token_id
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self._device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, positions, None)
        while True:
            tokens = self._engine.advance(slots, logits, lambda slot, reason: None)
            keep = [i for i, s in enumerate(slots) if not (s.finished or s.cancelled)]
            if not keep or self._stopping:
                return
            if len(keep) < len(slots):
                index = torch.tensor(keep, device=self._device)
                cache = reorder_cache(cache, index)
                mask, positions = mask[index], positions[index]
                slots, tokens = [slots[i] for i in keep], [tokens[i] for i in keep]
            ids = torch.tensor(tokens, device=self._device).unsqueeze(-1)
            mask = torch.cat([mask, mask.new_ones(len(slots), 1)], dim=-1)
            positions = positions[:, -1:] + 1
            logits, cache = self._forward(ids, mask, positions, cache)


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


class TorchEngine:
    """transformers on CPU or CUDA behind the engine protocol (see the module docstring)."""

    name = "torch"

    def __init__(
        self,
        model_path: Path,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int = ENGINES["torch"].default_batch,  # the registry's, for direct construction
        max_input_len: int = 1024,
        max_new_tokens: int = 512,
        trust_remote_code: bool = False,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
        batching: str = "auto",
        max_num_tokens: int | None = None,
        decode_loop: str = "auto",
        grammar_compile_timeout: float = 10.0,
    ) -> None:
        if batching not in _BATCHING:
            raise EngineError(f"batching={batching!r} is not one of {', '.join(_BATCHING)}", code=400)
        for option, value in (
            ("max_batch_size", max_batch_size),
            ("max_input_len", max_input_len),
            ("max_new_tokens", max_new_tokens),
        ):
            if value < 1:
                raise EngineError(f"{option}={value} must be >= 1", code=400)
        self.model_path = Path(model_path)
        self.dtype = dtype
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_input_len = max_input_len
        self.max_new_tokens = max_new_tokens
        if max_num_tokens is not None and max_num_tokens < max_input_len:
            raise EngineError(
                f"option.max_num_tokens={max_num_tokens} is below option.max_input_len={max_input_len}: "
                "a prompt of max_input_len tokens could never be scheduled; raise it",
                code=400,
            )
        self.max_num_tokens = max_num_tokens
        self.trust_remote_code = trust_remote_code
        self.requested_batching = batching
        self.decode_loop = decode_loop  # auto | builtin | transformers (see decode_loop.py)
        self.grammar_compile_timeout = grammar_compile_timeout  # seconds (guided.Grammars)
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids or ())
        self._explicit_eos = eos_token_ids is not None
        self.pad_token_id = pad_token_id
        self.batching: str | None = None  # "continuous" | "static" once started
        self._backend: _Backend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._vocab_size = 0
        self._grammars: Grammars | None = None  # once loaded
        self._model_device = torch.device("cpu")
        self._score_lock = threading.Lock()
        self._healthy = False
        self._closed = False
        self._slots: dict[str, _Slot] = {}  # open requests by request_id (event loop only)
        self._by_key: dict[str, _Slot] = {}  # the same by internal key (read by engine threads)
        self._keys = itertools.count()
        self._total_requests = 0
        self._total_tokens = 0
        self._sampled_rows = 0  # engine-side work, including rows nobody listens to any more

    # -- protocol ------------------------------------------------------------------------------

    @property
    def limits(self) -> EngineLimits:
        return EngineLimits(
            max_batch_size=self.max_batch_size,
            max_input_len=self.max_input_len,
            max_seq_len=self.max_input_len + self.max_new_tokens,
            max_new_tokens=self.max_new_tokens,
            max_beam_width=1,
            supports_logprobs=True,
            max_top_logprobs=MAX_TOP_LOGPROBS,
            supports_prompt_logprobs=True,
            supports_guided_decoding=_HAS_XGRAMMAR,
            supports_logit_bias=True,
        )

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def start(self) -> None:
        if self._backend is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._backend = await asyncio.to_thread(self._load)
        self.batching = self._backend.name
        self._healthy = True

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        """Validate now (a refusal is the request's one, final output: base.py's contract), stream
        deltas once iterated.

        Nothing is enqueued until the iterator is first awaited, so an iterator that is never
        consumed never occupies a slot. Closing it early cancels the request.
        """
        try:
            self._check_ready()
            check_sampling(request.sampling, self.max_new_tokens)
            check_token_ids(request, self._vocab_size, self.max_input_len)
            if request.sampling.guided is not None and request.sampling.ignore_eos:
                raise EngineError(
                    "ignore_eos cannot be combined with constrained decoding: the grammar ends the "
                    "output with EOS; leave ignore_eos out",
                    code=400,
                )
        except EngineError as exc:
            return refused(request.request_id, exc)
        return self._stream(request)

    async def cancel(self, request_id: str) -> None:
        slot = self._slots.get(request_id)
        if slot is not None:
            self._push(slot, EngineOutput(request_id, [], finished=True, finish_reason=FinishReason.CANCELLED))
            self._backend.cancel(slot)

    def stats(self) -> EngineStats:
        active = sum(s.started for s in self._slots.values())  # closed slots are forgotten at once
        return EngineStats(
            active_requests=active,
            queued_requests=len(self._slots) - active,
            max_batch_size=self.max_batch_size,
            total_requests=self._total_requests,
            total_generated_tokens=self._total_tokens,
            extra={
                "continuous_batching": float(self.batching in ("continuous", "decode_loop")),
                "sampled_rows": self._sampled_rows,
            },
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        # End the streams first, so that what the stopping threads report is not relayed.
        self._fail_open("the engine was shut down", 503)
        if self._backend is not None:
            await asyncio.to_thread(self._backend.close)
        if self._grammars is not None:
            self._grammars.close()

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> _Backend:
        if not self.model_path.is_dir():
            raise EngineError(f"model folder {self.model_path} does not exist", code=400)
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        kwargs = {"device_map": str(device)} if device.type != "cpu" else {}
        try:
            with _LOAD_LOCK:
                model = AutoModelForCausalLM.from_pretrained(
                    str(self.model_path), **dtype_kwargs(dtype), trust_remote_code=self.trust_remote_code, **kwargs
                ).eval()
        except ValueError as exc:
            if self.trust_remote_code or "trust_remote_code" not in str(exc):
                raise
            raise EngineError(
                f"the model in {self.model_path} needs its own Python code (auto_map in config.json), which is not "
                "run unless you allow it: set option.trust_remote_code=true (HF_MODEL_TRUST_REMOTE_CODE=true) if "
                "you trust that code",
                code=400,
            ) from exc
        self._configure_tokens(model)
        self._check_positions(model)
        self._vocab_size = model.get_input_embeddings().num_embeddings
        if _HAS_XGRAMMAR:
            self._grammars = Grammars(
                self.model_path, self._vocab_size, self.eos_token_ids, timeout_s=self.grammar_compile_timeout
            )
        self._model_device = model.device
        self._model = model  # prompt log-probs score the prompt with it (_score_prompt)
        from .decode_loop import DecodeLoopBackend, choose_decode_loop  # it imports this module

        builtin, why = choose_decode_loop(
            self.decode_loop, self.requested_batching, model, self.max_input_len + self.max_new_tokens
        )
        if builtin:
            log.info(
                "torch engine: %s on %s (%s), the built-in decode loop because %s",
                type(model).__name__,
                model.device,
                model.dtype,
                why,
            )
            return DecodeLoopBackend(self, model)
        batching, reason = self._choose_batching(model)
        log.info(
            "torch engine: %s on %s (%s), transformers %s batching because %s; not the built-in decode loop: %s",
            type(model).__name__,
            model.device,
            model.dtype,
            batching,
            reason,
            why,
        )
        if batching == "static":
            return _StaticBackend(self, model)
        try:
            return _ContinuousBackend(self, model)
        except Exception as exc:
            if self.requested_batching == "continuous":
                raise EngineError(f"continuous batching could not be set up: {exc}", code=424) from exc
            log.warning("continuous batching could not be set up (%s): using static batching", exc, exc_info=True)
            return _StaticBackend(self, model)

    def _configure_tokens(self, model: PreTrainedModel) -> None:
        """EOS and pad ids: explicit options, else generation_config.json, else config.json."""

        def ids(name: str) -> list[int]:
            return as_id_list(getattr(model.generation_config, name, None)) or as_id_list(
                getattr(model.config, name, None)
            )

        if not self._explicit_eos:
            self.eos_token_ids = tuple(ids("eos_token_id"))
        if self.pad_token_id is None:
            self.pad_token_id = (ids("pad_token_id") or list(self.eos_token_ids) or [0])[0]
        if not self.eos_token_ids:
            log.warning("no EOS token id in the model config: requests end on max_new_tokens or stop tokens only")

    def _check_positions(self, model: PreTrainedModel) -> None:
        config = text_config(model.config)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if limit and self.max_input_len + self.max_new_tokens > limit:
            out = max(1, min(self.max_new_tokens, limit // 4))
            raise EngineError(
                f"option.max_input_len={self.max_input_len} + option.max_output_len={self.max_new_tokens} = "
                f"{self.max_input_len + self.max_new_tokens} exceeds the model's {limit} positions "
                f"(max_position_embeddings); set them to fit, e.g. option.max_input_len={limit - out} "
                f"option.max_output_len={out}",
                code=400,
            )

    def _choose_batching(self, model: PreTrainedModel) -> tuple[str, str]:
        supported = bool(getattr(model, "_supports_attention_backend", False))
        if self.requested_batching == "static":
            return "static", "batching=static was requested"
        if _CB_IMPORT_ERROR is not None:
            problem = _CB_IMPORT_ERROR
        elif not supported:
            problem = (
                f"{type(model).__name__} does not support transformers' attention backends "
                "(_supports_attention_backend=False), which paged continuous batching needs"
            )
        else:
            return "continuous", "the model supports paged attention"
        if self.requested_batching == "continuous":
            raise EngineError(f"batching=continuous is not possible: {problem}", code=400)
        return "static", problem

    # -- request lifecycle (event loop) --------------------------------------------------------

    def _check_ready(self) -> None:
        if self._backend is None or self._closed:
            raise EngineError("the torch engine is not started", code=503)
        if not self._healthy:
            raise EngineError("the torch engine has failed", code=503)

    def _open(self, request: GenerationRequest, matcher: Guide | None) -> _Slot:
        self._check_ready()
        if request.request_id in self._slots:
            raise EngineError(f"request_id {request.request_id!r} is already in flight", code=400)
        generator = None
        if request.sampling.seed is not None:
            generator = torch.Generator(device=self._model_device)
            generator.manual_seed(request.sampling.seed)
        slot = _Slot(
            request=request,
            key=f"{request.request_id}#{next(self._keys)}",
            eos_ids=() if request.sampling.ignore_eos else self.eos_token_ids,
            generator=generator,
            queue=asyncio.Queue(),
            prompt_set=frozenset(request.prompt_token_ids),
            matcher=matcher,
        )
        self._slots[request.request_id] = slot
        self._by_key[slot.key] = slot
        self._total_requests += 1
        return slot

    def _release(self, slot: _Slot) -> None:
        if not slot.closed:  # the consumer left before the end: client gone, task cancelled
            slot.closed = slot.cancelled = True
            self._backend.cancel(slot)
        self._forget(slot)

    def _forget(self, slot: _Slot) -> None:
        if self._slots.get(slot.request.request_id) is slot:
            del self._slots[slot.request.request_id]
        self._by_key.pop(slot.key, None)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        try:  # checked again when first awaited: the engine may have closed, the id may be taken by now
            guided = request.sampling.guided  # compiled off the event loop, within its time bound
            slot = self._open(request, await self._grammars.guide(guided) if guided is not None else None)
        except EngineError as exc:
            yield error_output(request.request_id, str(exc), exc.code, exc.field)
            return
        prompt_lps: list[float | None] | None = None
        try:
            if request.sampling.prompt_logprobs:
                try:
                    prompt_lps = await asyncio.to_thread(self._score_prompt, request.prompt_token_ids)
                except Exception as exc:  # noqa: BLE001 — this request's failure, not the engine's
                    yield error_output(request.request_id, f"scoring the prompt failed: {exc}", 424)
                    return
            if not slot.closed:  # cancelled or failed while its prompt was scored: its end is queued already
                self._backend.enqueue(slot)
            tokens: list[int] = []
            logprobs: list[float] = []
            tops: list[list[tuple[int, float]]] = []
            queue_time: float | None = None
            while True:
                out = await slot.queue.get()
                if prompt_lps is not None and (request.streaming or out.finished):
                    out.prompt_logprobs, prompt_lps = prompt_lps, None  # on the request's first output
                if request.streaming:
                    yield out
                else:  # one aggregated output at the end
                    tokens += out.token_ids
                    logprobs += out.logprobs or []
                    tops += out.top_logprobs or []
                    queue_time = queue_time if queue_time is not None else out.queue_time_s
                    if out.finished:
                        out.token_ids, out.logprobs = tokens, (logprobs if request.sampling.logprobs else None)
                        out.top_logprobs = tops if request.sampling.top_logprobs else None
                        out.queue_time_s = queue_time
                        yield out
                if out.finished:
                    return
        finally:
            self._release(slot)

    def _score_prompt(self, ids: list[int]) -> list[float | None]:
        """Each prompt token's log-prob given the ones before it (None for the first), from the model's raw
        logits: one forward pass over the prompt beside the batch (read-only use of the weights), one at a
        time so that long prompts do not stack their activations."""
        with self._score_lock, torch.inference_mode():
            x = torch.tensor([ids], device=self._model_device)
            logits = self._model(x).logits[0, :-1].float()
            scores = logits.log_softmax(-1).gather(1, x[0, 1:, None])[:, 0]
        return [None, *scores.tolist()]

    def _push(self, slot: _Slot, out: EngineOutput) -> None:
        """The only place outputs reach a client; runs on the loop, so ordering is total."""
        if slot.closed:
            return
        if out.token_ids:
            slot.started = True
            self._total_tokens += len(out.token_ids)
        if out.finished:
            slot.closed = True
            slot.cancelled = slot.cancelled or out.finish_reason == FinishReason.CANCELLED
            self._forget(slot)
        slot.queue.put_nowait(out)

    def _push_many(self, items: list[tuple[_Slot, EngineOutput]]) -> None:
        for slot, out in items:
            self._push(slot, out)

    def _fail_open(self, message: str, code: int) -> None:
        for slot in list(self._slots.values()):
            self._push(slot, error_output(slot.request.request_id, message, code))

    # -- called from engine threads ------------------------------------------------------------

    def slot_by_key(self, key: str) -> _Slot | None:
        return self._by_key.get(key)

    def _deliver(self, items: list[tuple[_Slot, EngineOutput]]) -> None:
        if not items:
            return
        try:
            self._loop.call_soon_threadsafe(self._push_many, items)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.debug("dropping %d outputs: event loop closed", len(items))

    def advance(
        self,
        slots: Sequence[_Slot | None],
        logits: torch.Tensor,
        on_finished: Callable[[_Slot, FinishReason], None],
    ) -> list[int]:
        """Sample one step for ``slots`` (rows of ``logits``), emit the deltas, return the tokens."""
        picks = sample_next_tokens(logits, slots)
        self._sampled_rows += len(picks)  # one engine thread writes it
        items = []
        for slot, pick in zip(slots, picks):
            if slot is None or slot.finished or slot.cancelled:
                continue
            if pick.error is None and slot.matcher is not None:
                slot.matcher.accept(pick.token)
                if slot.matcher.error is not None:
                    pick = _Pick(pick.token, error=slot.matcher.error, field="guided")
            if pick.error is not None:
                slot.finished = True
                code = 424 if pick.field is None else 400
                items.append((slot, error_output(slot.request.request_id, pick.error, code, pick.field)))
                on_finished(slot, FinishReason.ERROR)
                continue
            slot.generated.append(pick.token)
            reason = finish_reason(slot.generated, slot.eos_ids, slot.request)
            slot.finished = reason is not None
            logprobs = [pick.logprob] if pick.logprob is not None else None
            items.append(
                (
                    slot,
                    EngineOutput(
                        slot.request.request_id,
                        [pick.token],
                        logprobs,
                        [pick.top] if pick.top is not None else None,
                        finished=slot.finished,
                        finish_reason=reason,
                        queue_time_s=slot.take_queue_time(),
                    ),
                )
            )
            if reason is not None:
                on_finished(slot, reason)
        self._deliver(items)
        return [p.token for p in picks]

    def fail(self, slot: _Slot, message: str, code: int, field: str | None = None) -> None:
        slot.finished = True
        self._deliver([(slot, error_output(slot.request.request_id, message, code, field))])

    def die(self, message: str) -> None:
        log.error("torch engine is unhealthy: %s", message)
        self._healthy = False
        try:
            self._loop.call_soon_threadsafe(self._fail_open, message, 424)
        except RuntimeError:
            log.debug("event loop closed: no open request to fail")
