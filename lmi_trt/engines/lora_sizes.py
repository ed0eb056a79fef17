"""The sizes of LoRA adapters' stacked device buffers (the torch engine's decode loop, engines/torch/lora.py), from
a Llama-shaped model's config alone: what the loop reserves and what ``lmi-trt plan`` reports, without torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The decoder's fused projections and the PEFT modules each is made of, in the order their rows are fused.
GROUPS = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


def _get(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def group_sizes(config: Any) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Each fused projection's (in, parts, each part's output rows), from the model's config (a transformers
    config or config.json's mapping)."""
    heads, hidden = _get(config, "num_attention_heads"), _get(config, "hidden_size")
    head_dim = _get(config, "head_dim") or hidden // heads
    q, kv = heads * head_dim, (_get(config, "num_key_value_heads") or heads) * head_dim
    inner = _get(config, "intermediate_size")
    return {
        "qkv": (hidden, 3, (q, kv, kv)),
        "o": (q, 1, (hidden,)),
        "gate_up": (hidden, 2, (inner, inner)),
        "down": (inner, 1, (hidden,)),
    }


def buffer_bytes(config: Any, slots: int, rank: int, itemsize: int) -> int:
    """Device bytes of the stacked buffers of ``slots`` adapters of rank ≤ ``rank`` (``LoraSlots``)."""
    per_layer = sum(parts * rank * (fan_in + sum(outs)) for fan_in, parts, outs in group_sizes(config).values())
    return _get(config, "num_hidden_layers") * slots * per_layer * itemsize
