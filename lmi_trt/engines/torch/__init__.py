"""The embedded ``torch`` engine: transformers models behind the engine protocol (``engines/base.py``).

Its modules, each importing only those listed before it:

* ``backend`` — what the batching backends share: the per-request ``Slot``, the ``Backend`` and
  ``Host`` protocols (what a backend is to the engine, and the engine to a backend), the pending
  queue (``QueuedBackend``), finish reasons, bad-word bans, the per-step token budget;
* ``sampler`` — the transformers paths' sampler (HF ``generate`` semantics, per request);
* ``static`` — a left-padded batch decoded with ``past_key_values``;
* ``continuous`` — transformers' continuous batching manager, sampling through the engine's hook;
* ``decode_kernels``, ``llama_decoder``, ``gpu_sampler``, ``kv_blocks``, ``speculation``, ``decode_loop`` —
  the built-in decode loop for Llama-shaped models: Triton kernels, the forward pass over a paged KV
  cache, the on-device sampler, the cache's blocks and prefix keys, speculative decoding's drafts and
  verification, the loop;
* ``engine`` — ``TorchEngine``: loads the model, picks a backend, owns the requests' lifecycle.
"""

from .engine import TorchEngine

__all__ = ["TorchEngine"]
