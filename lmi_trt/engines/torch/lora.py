"""LoRA adapters on the built-in decode loop: the stacked device buffers that let one forward pass apply a different
adapter to each row.

Reading: ``lmi_trt.engines.adapters.read_adapter`` (PEFT's layout, shared with the LLM API engine).

Applying. Each of the decoder's fused projections (``qkv``, ``o``, ``gate_up``, ``down``) gets per layer, of fixed
size whatever is loaded, ``A [G·S·R, in]`` and ``B [G·S·R, out]`` for its ``G`` parts (q, k, v ...),
``S = option.max_loras`` slots and ``R = option.max_lora_rank``; slot ``s`` of part ``g`` holds its adapter's A in
rows ``(g·S + s)·R ...`` (zero past the adapter's rank) and ``scaling · Bᵀ`` in the same rows of B, under part g's
output columns (zero under the other parts': B is block-diagonal over the parts, which costs memory,
``lora_sizes.buffer_bytes``, and buys one matmul per fused projection: q, k and v share their input, so do gate
and up). A is folded into the projection's weight: the decoder allocates each fused weight with A's rows after its
own (``W' = [W; A]``, ``spare_rows``) and its base pass multiplies by the view of W's rows (contiguous: the same
GEMM as on W alone), so a pass with adapters gets the base output and every slot's low-rank activations from one
GEMM (``[T, out + G·S·R]``, a few percent wider; the two are strided views of it). The columns of slots other than
the row's own are zeroed with a mask built once per pass from each token's slot index (-1: the base model, every
column zeroed; the columns repeat their slot every S·R, so a group of G parts reads the first G·S·R columns of the
widest group's mask, a view), and that times B is added into the projection's output (o and down: the base output
and the expand both into the residual stream). So rows of different adapters share the step, a base row's adapter
term is exactly ``+ 0``, and since the shapes never depend on which adapters are loaded, the decode steps' CUDA
graphs are captured once. Punica and S-LoRA gather each row's own A and B instead (``bmm`` over a row→adapter
index, arxiv.org/abs/2310.18547, arxiv.org/abs/2311.03285); with a few slots of small rank, one dense matmul over
all of them reads less memory than gathering a ``[in, R]`` matrix per row. A base row of a step with adapter rows
comes out of the wider GEMM, which may round otherwise than the base GEMM (as another batch size may); steps
without adapter rows run the base model's pass exactly.

Kernels. At decode sizes the FLOPs are negligible and each kernel's launch and latency is the cost, so the count
is what matters. With the decoder's Triton kernels (CUDA) a pass with adapters runs, per projection, the folded
GEMM and ``decode_kernels.lora_expand``, which masks by each token's slot index, multiplies by B and adds into the
output (and, for o and down, adds the base output into the residual stream) in one: 1 kernel more than the base
model per projection, 64 for a 16-layer model; 48 with ``FUSE_SILU``, where gate/up's expand and ``silu_mul`` are
one kernel (``decode_kernels.lora_silu_mul``). With A apart (``FOLD`` off) a separate shrink matmul ran for each,
128 (measured on an H100: 0.64 ms a step over the base model's 1.61, benchmarks/README.md). The torch operations
(the CPU path, the reference) run 3 or 4 per projection (the GEMM, the mask's in-place ``mul_``, the base output's
``add_`` into the residual stream for o and down, the expand ``addmm_``) and 2 per pass for the mask (``eq``, the
cast). A step none of whose rows uses an adapter runs none of them: the decode loop passes no slot indices, and
the decoder's pass is the base model's (decode_loop.py, its own CUDA graphs).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..adapters import LoraAdapter
from ..lora_sizes import GROUPS, group_sizes
from . import decode_kernels

# Where the slots' A matrices live (benchmarks/gpu_lora.py builds engines of both to compare them): True, as rows
# after the fused base projection's own (the module docstring); False, a buffer of their own and a second matmul.
# Read when a decoder is built.
FOLD = True
# With the Triton kernels, the gate/up projection's expand and silu_mul as one kernel (True) or two; read at each
# pass (a CUDA graph keeps what it captured). Also for benchmarks/gpu_lora.py's comparison.
FUSE_SILU = True


def spare_rows(parts: int, slots: int, rank: int, fold: bool) -> int:
    """Rows a fused projection of ``parts`` parts allocates after its own for the slots' A (``fold``), else 0."""
    return parts * slots * rank if fold else 0


@dataclass(frozen=True)
class _Group:
    weight: torch.Tensor  # the base weight [out, in]; folded, [out + G·S·R, in], the slots' A after it
    bias: torch.Tensor | None  # as wide as weight's rows
    a: torch.Tensor  # [G·S·R, in]: slot s of part g holds its adapter's A in rows (g·S + s)·R ...
    b: torch.Tensor  # [G·S·R, out]: and scaling · Bᵀ in the same rows, under part g's columns
    ends: tuple[int, ...]  # each part's last output column + 1


class LoraSlots:
    """The stacked device buffers (see the module docstring) of ``slots`` adapters of rank ≤ ``rank``."""

    def __init__(
        self,
        config: Any,
        weights: list[dict[str, tuple[torch.Tensor, torch.Tensor | None]]],
        *,
        slots: int,
        rank: int,
        fold: bool,
    ) -> None:
        """``config``: the model's (``group_sizes``); ``weights``: per layer, each fused projection's base weight
        and bias, with ``spare_rows`` rows after its own (the slots' A, zeroed) when ``fold``."""
        self.slots, self.rank, self.fold = slots, rank, fold
        self.sizes = sizes = group_sizes(config)
        self.layers: list[dict[str, _Group]] = []
        for layer in weights:
            groups = {}
            for group, (weight, bias) in layer.items():
                fan_in, parts, outs = sizes[group]
                width, n_out = parts * slots * rank, sum(outs)
                if fold:
                    a = weight[n_out:]
                    if bias is not None:
                        bias = torch.cat([bias[:n_out], bias.new_zeros(width)])
                else:
                    a = weight.new_zeros(width, fan_in)
                ends = tuple(itertools.accumulate(outs))
                groups[group] = _Group(weight, bias, a, weight.new_zeros(width, n_out), ends)
            self.layers.append(groups)
        # The slot each column of the widest group belongs to: a token's mask is its slot index compared with it.
        widest = max(parts for _, parts, _ in sizes.values())
        device = weights[0]["o"][0].device
        self._column_slot = torch.arange(widest * slots * rank, device=device) % (slots * rank) // rank
        self.dtype = weights[0]["o"][0].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for g in layer.values() for t in (g.a, g.b))

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        """Put ``adapter`` into ``slot`` (every module it lacks: zeros, the base weights alone)."""
        span = self.slots * self.rank
        for index, layer in enumerate(self.layers):
            for group, g in layer.items():
                out_start = 0
                for part, (module, end) in enumerate(zip(GROUPS[group], g.ends)):
                    rows = slice(part * span + slot * self.rank, part * span + (slot + 1) * self.rank)
                    g.a[rows] = 0
                    g.b[rows] = 0
                    pair = adapter.weights.get((index, module))
                    if pair is not None:
                        a, b = pair
                        r = a.shape[0]
                        g.a[rows.start : rows.start + r] = a.to(g.a.device)
                        g.b[rows.start : rows.start + r, out_start:end] = b.t().to(g.b.device)
                    out_start = end

    def mask(self, token_slots: torch.Tensor) -> torch.Tensor:
        """[T, G·S·R] (G: the widest group's parts) ones in the columns of each token's slot, in every part (none
        for -1: the base model); a group of fewer parts reads its leading columns. Built once per pass."""
        return (token_slots.unsqueeze(1) == self._column_slot).to(self.dtype)

    def _outputs(self, g: _Group, x: torch.Tensor, residual: torch.Tensor | None):
        """The base projection's output (into ``residual`` when given), the low-rank activations, and the base output
        the expand still adds into ``residual`` (folded: the GEMM's; else None, already added)."""
        n_out = g.b.size(1)
        if self.fold:  # one GEMM: the base output, then every slot's low-rank activations (strided views)
            both = F.linear(x, g.weight, g.bias)
            out, low = both[:, :n_out], both[:, n_out:]
            return (out, low, None) if residual is None else (residual, low, out)
        low = torch.mm(x, g.a.t())
        if residual is None:
            return F.linear(x, g.weight, g.bias), low, None
        if g.bias is None:
            return residual.addmm_(x, g.weight.t()), low, None
        return residual.add_(F.linear(x, g.weight, g.bias)), low, None

    def project(
        self, index: int, group: str, x: torch.Tensor, rows: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``group``'s projection of ``x`` in layer ``index`` (bias included) plus what each token's adapter adds;
        added into ``residual`` in place when given (o, down: the residual stream). ``rows``: the tokens' slot
        indices [T] (the Triton expand, CUDA) or their ``mask`` [T, G·S·R] (the torch operations, the reference);
        kernels: the module docstring."""
        g = self.layers[index][group]
        out, low, base = self._outputs(g, x, residual)
        if rows.dim() == 1:
            return decode_kernels.lora_expand(low, rows, g.b, out, self.slots * self.rank, self.rank, g.ends, base)
        low.mul_(rows[:, : low.size(1)])
        if base is not None:
            out.add_(base)
        return out.addmm_(low, g.b)

    def project_silu(self, index: int, x: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
        """``silu(gate) · up`` of layer ``index``'s gate/up ``project`` (the Triton path: ``token_slots`` [T]), its
        expand and ``silu_mul`` one kernel."""
        g = self.layers[index]["gate_up"]
        out, low, _ = self._outputs(g, x, None)
        return decode_kernels.lora_silu_mul(out, low, token_slots, g.b, self.slots * self.rank, self.rank)
