"""LoRA adapters on the built-in decode loop: a PEFT adapter folder read into per-layer (A, B) pairs, and the
stacked device buffers that let one forward pass apply a different adapter to each row.

Reading. A PEFT LoRA folder is ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's
``save_pretrained``; huggingface/peft src/peft/utils/save_and_load.py). Its tensors are named
``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight``, A ``[r, in]`` and B ``[out, r]``,
and the layer computes ``W x + scaling · B (A x)`` with ``scaling = lora_alpha / r``, or ``lora_alpha / sqrt(r)``
with ``use_rslora`` (peft src/peft/tuners/lora/layer.py, ``LoraLayer.update_layer``). Only that plain form of the
seven projections of a Llama block is applied here; what would change the math otherwise (DoRA, trained biases,
``modules_to_save``, per-module rank or alpha patterns, fan-in-fan-out weights, other targets such as the
embeddings or lm_head) is refused when the adapter is registered, naming the field, never ignored.

Applying. Each of the decoder's fused projections (``qkv``, ``o``, ``gate_up``, ``down``) gets two buffers per
layer, of fixed size whatever is loaded: ``A [in, G·S·R]`` and ``B [G·S·R, out]`` for its ``G`` parts (q, k, v
...), ``S = option.max_loras`` slots and ``R = option.max_lora_rank``; slot ``s`` of part ``g`` holds its adapter's
``Aᵀ`` in columns ``(g·S + s)·R ...`` (zero past the adapter's rank) and ``scaling · Bᵀ`` in the same rows of B,
under part g's output columns (zero under the other parts': B is block-diagonal over the parts, which costs memory,
``lora_sizes.buffer_bytes``, and buys one matmul per fused projection: q, k and v share their input, so do gate
and up). A pass multiplies every row by all slots' A at once (``[T, G·S·R]``: G·S·R columns more than the model's
own, a few percent of its matmul), zeroes the columns of slots other than the row's own with a mask built once
per pass from each token's slot index (-1: the base model, every column zeroed; the columns repeat their slot
every S·R, so a group of G parts reads the first G·S·R columns of the widest group's mask, a view), and adds that
times B into the projection's output (``addmm_``: the expand and the add are one kernel). So rows of different
adapters share the step, a base row gets exactly ``+ 0``, and since the shapes never depend on which adapters are
loaded, the decode steps' CUDA graphs are captured once. Punica and S-LoRA gather each row's own A and B instead
(``bmm`` over a row→adapter index, arxiv.org/abs/2310.18547, arxiv.org/abs/2311.03285); with a few slots of small
rank, one dense matmul over all of them reads less memory than gathering a ``[in, R]`` matrix per row.

Kernels. At decode sizes the FLOPs are negligible and each kernel's launch and latency is the cost, so the count
is what matters. With the decoder's Triton kernels (CUDA) a pass with adapters runs 2 per projection: the shrink
``mm`` and ``decode_kernels.lora_expand``, which masks by each token's slot index, multiplies by B and adds into
the output in one; 8 per layer, 128 for a 16-layer model. The torch operations (the CPU path, the reference) run
3 per projection (the shrink ``mm``, the mask's in-place ``mul_``, the expand ``addmm_`` into the output) and 2
per pass for the mask (``eq``, the cast): 194. The first version ran 18 per layer and 2 per pass, 290 (two
``repeat`` of the mask, an out-of-place ``mul``, a separate expand ``matmul`` and ``add_``). Counted with
torch.profiler on CPU: top-level operations that launch a kernel.
A step none of whose rows uses an adapter runs none of them: the decode loop passes no slot indices, and the
decoder's pass is the base model's (decode_loop.py, its own CUDA graphs).
"""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from ..base import EngineError
from ..lora_sizes import GROUPS, group_sizes
from . import decode_kernels

MODULES = tuple(m for parts in GROUPS.values() for m in parts)
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_TENSOR = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(MODULES) + r")\.lora_([AB])\.weight"
)
# adapter_config.json fields that change the math when set, and the value that leaves it plain LoRA.
_PLAIN = {
    "use_dora": False,
    "bias": "none",
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layer_replication": None,
    "trainable_token_indices": None,
    "lora_bias": False,
    "use_qalora": False,
    "alora_invocation_tokens": None,
    "arrow_config": None,
}


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter read into host memory: per (layer, module) its ``A [r, in]`` and ``scaling · B [out, r]``."""

    name: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    # Unique per load: the prefix cache keys an adapter's blocks by it (a name registered again with other
    # weights must not find the old weights' keys and values).
    key: bytes = field(default_factory=lambda: secrets.token_bytes(16))

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def _refuse(name: str, folder: Path, why: str) -> EngineError:
    return EngineError(f"LoRA adapter {name!r} ({folder}): {why}", code=400, field="adapter")


def read_adapter(name: str, folder: Path, *, max_rank: int, num_layers: int, dtype: torch.dtype) -> LoraAdapter:
    """The adapter in ``folder`` (PEFT's layout), checked against what the decoder applies; an ``EngineError``
    (400) names what cannot be served and what would."""
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise _refuse(name, folder, f"a PEFT LoRA adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise _refuse(name, folder, f"{CONFIG_FILE} is not JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise _refuse(name, folder, f"peft_type={config.get('peft_type')!r}: only LORA adapters are served")
    for key, plain in _PLAIN.items():
        if config.get(key, plain) not in (plain, None, [], {}):
            raise _refuse(name, folder, f"{key}={config[key]!r} is not applied here; adapters with {key}={plain!r}")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise _refuse(name, folder, f"r={rank!r}, lora_alpha={alpha!r}: a positive integer rank and a number alpha")
    if rank > max_rank:
        raise _refuse(name, folder, f"rank {rank} is above option.max_lora_rank={max_rank}; raise it to {rank}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in load_file(str(weights_path)).items():
        found = _TENSOR.fullmatch(tensor_name)
        if found is None:
            raise _refuse(
                name, folder, f"tensor {tensor_name!r} is not a LoRA A or B of {', '.join(MODULES)} in a decoder layer"
            )
        layer = int(found.group(1))
        if layer >= num_layers:
            raise _refuse(name, folder, f"tensor {tensor_name!r}: the model has {num_layers} layers")
        pairs.setdefault((layer, found.group(2)), {})[found.group(3)] = tensor
    weights = {}
    for (layer, module), pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise _refuse(name, folder, f"layer {layer} {module} has lora_{''.join(pair)} without its pair")
        a, b = pair["A"], pair["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise _refuse(name, folder, f"layer {layer} {module}: A {tuple(a.shape)}, B {tuple(b.shape)} for r={rank}")
        weights[layer, module] = (a.to(dtype), (b.float() * scaling).to(dtype))
    if not weights:
        raise _refuse(name, folder, f"{WEIGHTS_FILE} holds no LoRA weights")
    return LoraAdapter(name, rank, weights)


class LoraSlots:
    """The stacked device buffers (see the module docstring) of ``slots`` adapters of rank ≤ ``rank``."""

    def __init__(self, config: Any, *, slots: int, rank: int, device: torch.device, dtype: torch.dtype) -> None:
        """``config``: the model's (``group_sizes``)."""
        self.slots, self.rank = slots, rank
        self.sizes = sizes = group_sizes(config)
        num_layers = config.num_hidden_layers
        self.buffers = [
            {
                group: (
                    torch.zeros(fan_in, parts * slots * rank, device=device, dtype=dtype),
                    torch.zeros(parts * slots * rank, sum(outs), device=device, dtype=dtype),
                )
                for group, (fan_in, parts, outs) in sizes.items()
            }
            for _ in range(num_layers)
        ]
        # The slot each column of the widest group belongs to: a token's mask is its slot index compared with it.
        widest = max(parts for _, parts, _ in sizes.values())
        self._column_slot = torch.arange(widest * slots * rank, device=device) % (slots * rank) // rank
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.buffers for pair in layer.values() for t in pair)

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` into ``slot`` (every module it lacks: zeros, the base weights alone)."""
        span = self.slots * self.rank
        for index, layer in enumerate(self.buffers):
            for group, (a_buf, b_buf) in layer.items():
                _, _, outs = self.sizes[group]
                out_start = 0
                for part, module in enumerate(GROUPS[group]):
                    cols = slice(part * span + slot * self.rank, part * span + (slot + 1) * self.rank)
                    a_buf[:, cols] = 0
                    b_buf[cols, :] = 0
                    pair = adapter.weights.get((index, module))
                    if pair is not None:
                        a, b = pair
                        r = a.shape[0]
                        a_buf[:, cols.start : cols.start + r] = a.t().to(a_buf.device)
                        b_buf[cols.start : cols.start + r, out_start : out_start + outs[part]] = b.t().to(b_buf.device)
                    out_start += outs[part]

    def mask(self, token_slots: torch.Tensor) -> torch.Tensor:
        """[T, G·S·R] (G: the widest group's parts) ones in the columns of each token's slot, in every part (none
        for -1: the base model); a group of fewer parts reads its leading columns. Built once per pass."""
        return (token_slots.unsqueeze(1) == self._column_slot).to(self.dtype)

    def add_delta(self, index: int, group: str, x: torch.Tensor, out: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``out`` [T, out] plus, in place, what the tokens' adapters add to ``group``'s projection of ``x`` in
        layer ``index``. ``rows``: the tokens' slot indices [T] (the Triton expand, CUDA) or their ``mask``
        [T, G·S·R] (the torch operations, the reference); kernels: the module docstring."""
        a, b = self.buffers[index][group]
        low = torch.mm(x, a)
        if rows.dim() == 1:
            return decode_kernels.lora_expand(low, rows, b, out, self.slots * self.rank, self.rank)
        low.mul_(rows[:, : low.size(1)])
        return out.addmm_(low, b)
