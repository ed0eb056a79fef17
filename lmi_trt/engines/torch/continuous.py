"""The torch engine's ``continuous`` backend: transformers' continuous batching manager (paged KV cache,
requests join and leave between steps), sampling through the engine's hook (see ``engine.py``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable

import torch
from transformers import GenerationConfig, PreTrainedModel

from ..base import FinishReason
from .backend import CLOSE_TIMEOUT_S, Host, Slot, default_max_num_tokens

try:
    from transformers.generation import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import RequestStatus
    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )
    from transformers.generation.logits_process import LogitsProcessorList

    CB_IMPORT_ERROR: str | None = None
except ImportError as exc:  # older transformers: the static path still works
    CB_IMPORT_ERROR = f"this transformers has no usable continuous batching API ({exc})"

log = logging.getLogger(__name__)

# transformers' default page size; flash-attention's paged decode kernel wants multiples of 256.
_PAGE_SIZE = 256


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


if CB_IMPORT_ERROR is None:

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


class ContinuousBackend:
    name = "continuous"

    def __init__(self, engine: Host, model: PreTrainedModel) -> None:
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

    def enqueue(self, slot: Slot) -> None:
        accepted = self._manager.add_request(
            slot.request.prompt_token_ids,
            request_id=slot.key,
            max_new_tokens=slot.sampling.max_new_tokens,
            streaming=False,  # tokens are emitted by the sampler hook, not by the manager
            eos_token_id=list(slot.eos_ids) or -1,
        )
        if accepted is None:
            self._engine.fail(slot, "the continuous batching loop is not accepting requests", 503)

    def cancel(self, slot: Slot) -> None:
        self._manager.cancel_request(slot.key)

    def close(self) -> None:
        self._stopping.set()
        self._manager.stop(block=True, timeout=CLOSE_TIMEOUT_S, hard_stop=True)
        self._manager.destroy()
        self._pump.join(timeout=CLOSE_TIMEOUT_S)

    def stats(self) -> dict[str, float]:
        return {}

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

    def _stop_early(self, slot: Slot, reason: FinishReason) -> None:
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
