"""Per-request sampling for a whole batch as tensor operations on the model's device.

Every ``SamplingParams`` field lives in a per-slot tensor, so one batch mixes greedy and sampled
rows, different temperatures, top-k/top-p, penalties, seeds, min_new_tokens and bad words, with no
Python per row and no host synchronisation: the functions here are plain tensor code that a CUDA
graph can capture.

The processing order and meaning are transformers' ``generate`` (generation/logits_process.py,
release 5.x): RepetitionPenaltyLogitsProcessor (prompt and generated tokens), then OpenAI-style
presence/frequency penalties on generated tokens, NoBadWordsLogitsProcessor and
MinNewTokensLengthLogitsProcessor (banned tokens → -inf); greedy rows take the argmax of that.
Sampled rows then go through TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper
(min_tokens_to_keep=1) and draw from the softmax.

Random draws: no shared generator. Each row draws with the exponential race (the argmax of
``p / E`` with ``E ~ Exp(1)`` is a sample of ``p``), its uniforms a counter-based hash of (the
request's seed, the number of tokens it generated so far, the token id). A seeded request's
tokens therefore depend on its seed only, never on what else is in the batch; unseeded requests
get a random seed when admitted.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ..base import SamplingParams

_MASK32 = 0xFFFFFFFF
# Multipliers below 2**31, so that a 32-bit value times one fits an int64 without overflow.
_MIX_A, _MIX_B = 0x7FEB352D, 0x5BD1E995


class Mode(enum.IntEnum):
    """How much of the sampler a step needs (the batch's most demanding row decides)."""

    GREEDY = 0  # argmax of the raw logits
    PROCESSED = 1  # penalties and bans, then argmax
    SAMPLED = 2  # penalties and bans, then temperature/top-k/top-p and a draw for do_sample rows


def row_mode(params: SamplingParams, generated: int, has_bad_words: bool) -> Mode:
    if params.do_sample:
        return Mode.SAMPLED
    if (
        params.repetition_penalty != 1.0
        or params.presence_penalty
        or params.frequency_penalty
        or has_bad_words
        or generated < params.min_new_tokens
    ):
        return Mode.PROCESSED
    return Mode.GREEDY


@dataclass
class Rows:
    """Sampling state of some slots: views of ``SamplerState`` (a slice) or gathered copies."""

    temperature: torch.Tensor  # [n] f32
    top_k: torch.Tensor  # [n] i64, 0 = off
    top_p: torch.Tensor  # [n] f32
    repetition: torch.Tensor  # [n] f32
    presence: torch.Tensor  # [n] f32
    frequency: torch.Tensor  # [n] f32
    do_sample: torch.Tensor  # [n] bool
    min_new: torch.Tensor  # [n] i64
    eos_applies: torch.Tensor  # [n] bool: False with ignore_eos
    seed: torch.Tensor  # [n] i64
    counts: torch.Tensor  # [n, vocab] f32: how often each token was generated
    prompt_seen: torch.Tensor  # [n, vocab] bool
    banned: torch.Tensor  # [n, vocab] bool: single-token bad words
    banned_now: torch.Tensor  # [n, vocab] bool: last tokens of multi-token bad words whose prefix just matched


class SamplerState(Rows):
    """``Rows`` for every slot, allocated once on the device; ``eos`` marks the engine's EOS ids."""

    def __init__(self, slots: int, vocab: int, device: torch.device, eos_ids: Sequence[int]) -> None:
        def vec(dtype: torch.dtype, fill: float | int | bool = 0) -> torch.Tensor:
            return torch.full((slots,), fill, dtype=dtype, device=device)

        def table(dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(slots, vocab, dtype=dtype, device=device)

        super().__init__(
            temperature=vec(torch.float32, 1.0),
            top_k=vec(torch.long),
            top_p=vec(torch.float32, 1.0),
            repetition=vec(torch.float32, 1.0),
            presence=vec(torch.float32),
            frequency=vec(torch.float32),
            do_sample=vec(torch.bool),
            min_new=vec(torch.long),
            eos_applies=vec(torch.bool),
            seed=vec(torch.long),
            counts=table(torch.float32),
            prompt_seen=table(torch.bool),
            banned=table(torch.bool),
            banned_now=table(torch.bool),
        )
        self.device = device
        self.vocab = vocab
        self.eos = torch.zeros(vocab, dtype=torch.bool, device=device)
        if eos_ids:
            self.eos[list(eos_ids)] = True

    @staticmethod
    def bytes_per_slot(vocab: int) -> int:
        return vocab * (4 + 1 + 1 + 1) + 64

    def rows(self, index: slice | torch.Tensor) -> Rows:
        return Rows(**{f.name: getattr(self, f.name)[index] for f in fields(Rows)})

    def admit(
        self,
        slots: Sequence[int],
        params: Sequence[SamplingParams],
        seeds: Sequence[int],
        eos_applies: Sequence[bool],
        prompts: Sequence[Sequence[int]],
        single_bans: Sequence[Sequence[int]],
        generated: Sequence[Sequence[int]] = (),
    ) -> None:
        """Reset the state of ``slots`` for new requests (a handful of batched device writes);
        ``generated``: the tokens each has generated already (a request resumed after preemption)."""
        index = self._put(torch.tensor(slots))
        floats = self._put(
            torch.tensor(
                [
                    [
                        p.temperature if p.do_sample else 1.0,
                        p.top_p,
                        p.repetition_penalty,
                        p.presence_penalty,
                        p.frequency_penalty,
                    ]
                    for p in params
                ],
                dtype=torch.float32,
            )
        )
        ints = self._put(
            torch.tensor(
                [
                    [p.top_k, p.min_new_tokens, seed, p.do_sample, eos]
                    for p, seed, eos in zip(params, seeds, eos_applies)
                ],
                dtype=torch.long,
            )
        )
        for column, name in enumerate(("temperature", "top_p", "repetition", "presence", "frequency")):
            getattr(self, name)[index] = floats[:, column]
        for column, name in enumerate(("top_k", "min_new", "seed", "do_sample", "eos_applies")):
            target = getattr(self, name)
            target[index] = ints[:, column].to(target.dtype)
        # index_fill_ and index_add_ with a Python number, never ``table[index] = 0``: that copies the
        # number to the device from pageable memory and waits for it (torch.cuda.set_sync_debug_mode
        # flagged it; benchmarks/gpu_syncs.py), and the decode loop admits requests while the
        # previous step still runs.
        for table in (self.counts, self.prompt_seen, self.banned, self.banned_now):
            table.index_fill_(0, index, 0)
        self.mark(self.prompt_seen, slots, prompts, True)
        self.mark(self.banned, slots, single_bans, True)
        cells = self._cells(slots, generated)
        if cells is not None:
            self.counts.view(-1).index_add_(0, cells, torch.ones(cells.size(0), device=self.device))

    def mark(self, table: torch.Tensor, slots: Sequence[int], tokens: Sequence[Sequence[int]], value: bool) -> None:
        """``table[slot, token] = value`` for every token listed for each slot (without waiting for the device)."""
        cells = self._cells(slots, tokens)
        if cells is not None:
            table.view(-1).index_fill_(0, cells, value)

    def _cells(self, slots: Sequence[int], tokens: Sequence[Sequence[int]]) -> torch.Tensor | None:
        """The flat index (slot · vocab + token) of every token listed for each slot in a [slots,
        vocab] table, on the device; None when none is."""
        # Whole prompts at admission (thousands of tokens a step): ids and offsets gathered in arrays and added by
        # torch, not one Python int per token.
        ids, offsets = array("q"), array("q")
        for slot, listed in zip(slots, tokens):  # ``generated`` may be () for every slot
            ids.extend(listed)
            offsets.extend([slot * self.vocab] * len(listed))
        if not ids:
            return None
        return self._put(torch.frombuffer(ids, dtype=torch.long) + torch.frombuffer(offsets, dtype=torch.long))

    def _put(self, cpu: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":  # pinned: an asynchronous copy that never waits for the GPU
            return cpu.pin_memory().to(self.device, non_blocking=True)
        return cpu.to(self.device)


def process(logits: torch.Tensor, rows: Rows, generated: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    """Penalties and bans on fp32 ``logits`` [n, vocab] (a new tensor). ``generated``: [n] counts."""
    used = rows.counts > 0
    rep = rows.repetition.unsqueeze(1)
    scores = torch.where(rows.prompt_seen | used, torch.where(logits < 0, logits * rep, logits / rep), logits)
    scores = scores - rows.presence.unsqueeze(1) * used - rows.frequency.unsqueeze(1) * rows.counts
    eos_banned = ((generated < rows.min_new) & rows.eos_applies).unsqueeze(1) & eos
    return scores.masked_fill(rows.banned | rows.banned_now | eos_banned, float("-inf"))


def warp(scores: torch.Tensor, rows: Rows) -> torch.Tensor:
    """Temperature → top-k → top-p per row, transformers' semantics (top_k=0 and top_p=1: off)."""
    vocab = scores.size(-1)
    scores = scores / rows.temperature.unsqueeze(1)
    keep = torch.where((rows.top_k > 0) & (rows.top_k < vocab), rows.top_k, vocab)
    ordered, order = scores.sort(dim=-1)
    kth = ordered.gather(1, (vocab - keep).unsqueeze(1))
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    drop = ordered.softmax(-1).cumsum(-1) <= (1 - rows.top_p).unsqueeze(1)
    drop[:, -1] = False
    drop = torch.zeros_like(drop).scatter_(1, order, drop)
    return scores.masked_fill(drop | (scores < kth), float("-inf"))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * _MIX_A) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MIX_B) & _MASK32
    return x ^ (x >> 16)


def uniforms(seed: torch.Tensor, counter: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, vocab] floats in (0, 1), a pure function of (seed, counter, column)."""
    base = _mix32((seed & _MASK32) ^ _mix32(((seed >> 32) & _MASK32) ^ _mix32(counter & _MASK32)))
    columns = torch.arange(vocab, device=seed.device)
    bits = _mix32(_mix32(base.unsqueeze(1) ^ columns) ^ columns)
    return ((bits >> 8).float() + 0.5) * (1.0 / (1 << 24))


def top_logprobs(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[2k, n] f32 for fp32 ``logits`` [n, vocab]: each row's k most likely token ids (exact in
    f32 below 2**24), then their raw log-probabilities, best first."""
    values, ids = logits.topk(k, dim=-1)
    return torch.cat((ids.float(), values - logits.logsumexp(-1, keepdim=True)), dim=1).T


def sample(
    logits: torch.Tensor,
    rows: Rows | None,
    generated: torch.Tensor,
    eos: torch.Tensor,
    mode: Mode,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One token per row of fp32 ``logits``: (tokens i64, raw log-probabilities f32, status i64).

    Status 0 is fine, 1 means NaN/+inf logits, 2 means every token is banned; the token of a row
    with a non-zero status is meaningless. Log-probabilities are the raw model's (vLLM's default
    ``raw_logprobs``), before penalties, bans and warping. ``bias`` ([n, vocab]) is added to the
    scores the token is chosen from (OpenAI logit_bias). GREEDY mode reads no ``rows`` (None will do).
    """
    total = logits.logsumexp(-1)
    broken = total.isnan() | (total == float("inf"))
    if mode == Mode.GREEDY:
        scores = logits
    else:
        scores = process(logits, rows, generated, eos)
    if bias is not None:
        scores = scores + bias
    tokens = scores.argmax(-1)
    if mode == Mode.SAMPLED:
        probs = warp(scores, rows).softmax(-1)
        race = probs / -uniforms(rows.seed, generated, logits.size(-1)).log()
        tokens = torch.where(rows.do_sample, race.argmax(-1), tokens)
    empty = scores.amax(-1) == float("-inf")
    status = torch.where(broken, 1, torch.where(empty, 2, 0))
    logprobs = logits.gather(1, tokens.unsqueeze(1)).squeeze(1) - total
    return tokens, logprobs, status
