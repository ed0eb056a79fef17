"""The transformers paths' sampler (``continuous`` and ``static``): one token per logits row, with each
request's full history, seed and settings (HF ``generate`` semantics). The built-in decode loop samples on
the device instead (``gpu_sampler``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..base import SamplingParams
from ..guided import allowed_tokens
from .backend import EXCLUDED, Slot, banned_next_tokens, excluded_field


@dataclass(frozen=True)
class Pick:
    token: int
    logprob: float | None = None
    error: str | None = None
    top: list[tuple[int, float]] | None = None  # with top_logprobs: the most likely tokens, best first
    field: str | None = None  # with an error: the request field at fault (a 400), None for a model failure


def _apply_history_processors(row: torch.Tensor, slot: Slot) -> None:
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


def sample_next_tokens(logits: torch.Tensor, slots: Sequence[Slot | None]) -> list[Pick]:
    """Choose one token per row of ``logits`` ([n, vocab] fp32, modified in place).

    A failure in one row's processing becomes that row's error; other rows are unaffected.
    ``None`` slots (requests already gone) get a greedy token that nobody reads.
    """
    n = len(slots)
    logits = logits[:n]
    raw_logprobs = logits.log_softmax(-1) if any(s is not None and s.sampling.logprobs for s in slots) else None
    errors: list[str | None] = [None] * n
    faults: list[str | None] = [None] * n  # the request field at fault for an error (Pick.field)
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
    return [Pick(tokens[i], logprobs[i], errors[i], tops[i], faults[i]) for i in range(n)]
