"""LoRA adapters on the built-in decode loop: the stacked device buffers that let one forward pass apply a different
adapter to each row.

Reading: ``lmi_trt.engines.adapters.read_adapter`` (PEFT's layout, shared with the LLM API engine).

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

from typing import Any

import torch

from ..adapters import LoraAdapter
from ..lora_sizes import GROUPS, group_sizes
from . import decode_kernels


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
