"""The torch engine's ``static`` backend: a left-padded batch decoded step by step with
``past_key_values``, for models transformers' continuous batching cannot serve (see ``engine.py``)."""

from __future__ import annotations

import logging
import time

import torch
from transformers import PreTrainedModel

from ...compat import cache_kwargs, reorder_cache, returned_cache
from .backend import Host, QueuedBackend, Slot

log = logging.getLogger(__name__)

_GATHER_S = 0.005  # how long a static batch waits for more of a burst once one request is there


class StaticBackend(QueuedBackend):
    name = "static"

    def __init__(self, engine: Host, model: PreTrainedModel) -> None:
        self._engine = engine
        self._model = model
        self._device = model.device
        self._keep_last_logits = bool(getattr(model, "_supports_logits_to_keep", lambda: False)())
        self._start("torch-engine-static")

    def _next_batch(self) -> list[Slot] | None:
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
            use_cache=True,
            **cache_kwargs(cache),
            **kwargs,
        )
        return out.logits[:, -1, :].float(), returned_cache(out)

    def _decode(self, slots: list[Slot]) -> None:
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
