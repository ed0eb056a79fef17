"""TensorRT-LLM's LoRA tensors, both ways: per (layer, module) ``A [r, in]`` and scaled ``B [out, r]`` ⇄ the rows
of ``lora_weights`` and ``lora_config`` that the Executor's ``LoraConfig`` and Triton's tensorrt_llm model take.

The layout (NVIDIA/TensorRT-LLM ``tensorrt_llm/lora_manager.py``, a 1.x copy, ``LoraManager.load_from_hf``): one
row per (layer, module), ``A`` flattened then ``B · scale`` flattened, in the model's dtype, zero-padded to the
longest row; its config row int32 ``[module id, layer, rank]`` with the ids of ``LoraManager.LORA_MODULE_IDS`` and
the Hugging Face names of ``get_default_trtllm_modules_to_hf_modules``. Triton's tensors are the same with a
leading batch dimension of 1 (triton-inference-server/tensorrtllm_backend ``docs/lora.md``: ``lora_weights``
``[1, num_lora_modules_layers, D x Hi + Ho x D]``, ``lora_config`` ``[1, num_lora_modules_layers, 3]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import EngineError
from .lora_sizes import group_sizes

if TYPE_CHECKING:
    import torch

# HF (PEFT) module → (TensorRT-LLM lora module, LoraManager.LORA_MODULE_IDS id), lora_manager.py.
MODULES = {
    "q_proj": ("attn_q", 1),
    "k_proj": ("attn_k", 2),
    "v_proj": ("attn_v", 3),
    "o_proj": ("attn_dense", 4),
    "gate_proj": ("mlp_h_to_4h", 5),
    "down_proj": ("mlp_4h_to_h", 6),
    "up_proj": ("mlp_gate", 7),
}
BY_ID = {module_id: name for name, (_, module_id) in MODULES.items()}

Weights = dict[tuple[int, str], tuple["torch.Tensor", "torch.Tensor"]]


def module_dims(config: Any) -> dict[str, tuple[int, int]]:
    """Each PEFT module's (in, out) features in a Llama-shaped model (its config, or config.json's mapping)."""
    sizes = group_sizes(config)
    dims = {}
    for group, parts in (("qkv", ("q_proj", "k_proj", "v_proj")), ("gate_up", ("gate_proj", "up_proj"))):
        fan_in, _, outs = sizes[group]
        dims.update({m: (fan_in, out) for m, out in zip(parts, outs, strict=True)})
    dims["o_proj"] = (sizes["o"][0], sizes["o"][2][0])
    dims["down_proj"] = (sizes["down"][0], sizes["down"][2][0])
    return dims


def encode(weights: Weights) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (layer, module) ``(A, scaled B)`` as (weights [rows, longest], config int32 [rows, 3])."""
    import torch

    rows, keys = [], []
    for (layer, module), (a, b) in sorted(weights.items()):
        rows.append(torch.cat([a.contiguous().flatten(), b.contiguous().flatten()]))
        keys.append([MODULES[module][1], layer, a.shape[0]])
    longest = max(r.numel() for r in rows)
    stacked = torch.stack([torch.nn.functional.pad(r, (0, longest - r.numel())) for r in rows])
    return stacked, torch.tensor(keys, dtype=torch.int32)


def _bad(field: str, why: str) -> EngineError:
    return EngineError(f"{field}: {why}", code=400, field=field)


def decode(
    weights: torch.Tensor, config: torch.Tensor, dims: Mapping[str, tuple[int, int]], num_layers: int
) -> Weights:
    """``encode``'s inverse for 2-D rows (a leading batch dimension of 1 already dropped); a 400 naming
    ``lora_weights`` or ``lora_config`` for rows that are not that layout for this model."""
    if weights.dim() != 2 or config.dim() != 2 or config.shape[1] != 3:
        raise _bad(
            "lora_config",
            f"lora_weights {list(weights.shape)} and lora_config {list(config.shape)}: expected [1, rows, D] and "
            "[1, rows, 3] (module id, layer, adapter size)",
        )
    if weights.shape[0] != config.shape[0] or weights.shape[0] == 0:
        raise _bad(
            "lora_weights", f"{weights.shape[0]} rows for lora_config's {config.shape[0]}: one row per config row"
        )
    out: Weights = {}
    for row, (module_id, layer, rank) in enumerate(config.tolist()):
        module = BY_ID.get(module_id)
        if module is None:
            known = ", ".join(f"{i} ({MODULES[m][0]})" for i, m in sorted(BY_ID.items()))
            raise _bad("lora_config", f"row {row}: module id {module_id} is not one this server applies: {known}")
        if not 0 <= layer < num_layers:
            raise _bad("lora_config", f"row {row}: layer {layer}, the model has layers 0..{num_layers - 1}")
        if rank <= 0:
            raise _bad("lora_config", f"row {row}: adapter size {rank}; it must be > 0")
        if (layer, module) in out:
            raise _bad("lora_config", f"row {row}: layer {layer} module id {module_id} is given twice")
        fan_in, fan_out = dims[module]
        if rank * (fan_in + fan_out) > weights.shape[1]:
            raise _bad(
                "lora_weights",
                f"row {row} ({MODULES[module][0]}, rank {rank}) needs {rank * (fan_in + fan_out)} values "
                f"({rank}×{fan_in} + {fan_out}×{rank}); rows have {weights.shape[1]}",
            )
        flat = weights[row]
        out[layer, module] = (
            flat[: rank * fan_in].reshape(rank, fan_in),
            flat[rank * fan_in : rank * (fan_in + fan_out)].reshape(fan_out, rank),
        )
    return out
