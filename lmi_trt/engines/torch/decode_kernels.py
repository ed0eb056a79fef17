"""Triton kernels of the built-in decode loop's forward pass, on CUDA.

* ``paged_attention`` — causal attention of a flat batch (a decode token per sequence, or prompt
  chunks, or both) against the paged KV cache, read through each sequence's block table. One
  program per (tile, KV head): a tile is (query token, query head sharing the KV head) rows of
  one sequence, so a decode token's grouped-query heads read each KV byte once; keys are visited
  ``Config.block_n`` positions at a time up to the tile's last query, with an online softmax
  (flash-decoding without the split over the sequence); the scores never reach device memory.
  A batch of decode tokens only runs ``DECODE`` tiles (one token's grouped heads each), a batch
  with prompt chunks ``CHUNKS`` tiles for all its sequences: one launch, in which the decode
  tokens' memory-bound programs run beside the chunks' compute-bound ones (as two launches, one
  after the other, a step of 256 decode tokens and 2 chunks of 1,024 took 0.43 ms a layer
  instead of 0.32 on an H100: benchmarks/gpu_kernels.py).
* ``rotary_into_cache`` — rotary positions on q and k (transformers' ``rotate_half`` form) and the
  cache writes of k and v at each token's cache slot (block, offset), one program per token: five
  kernels of the torch path in one.
* ``silu_mul`` — ``silu(gate) * up`` of the fused gate/up projection in one pass.
* ``lora_silu_mul`` — the gate/up projection's expand and ``silu_mul`` in one (lora.py).
* ``lora_expand`` — a LoRA projection's expand (lora.py): each token's low-rank activations, masked to its
  adapter slot's columns, times the stacked B (only the parts a tile of output columns lies in: B is
  block-diagonal), added into the projection's output in place (with the base output, into the residual
  stream); the torch path's mask multiply, ``add_`` and ``addmm_`` in one, which reads the tokens' slot indices.

The torch operations in ``llama_decoder`` stay the reference and the CPU path; these compute in
fp32 and round once where the torch path rounds after each operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the matmul path runs
    triton = None

_SILU_BLOCK = 1024
_ROTARY_ELEMENTS = 4096  # values of a token one rotary program handles (heads × head_dim)


def available(device: torch.device, head_dim: int) -> bool:
    """Triton present, a CUDA device, and a head size tl.dot takes (a power of two, 16 or more)."""
    return triton is not None and device.type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


if triton is not None:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        tables_ptr,
        seq_start_ptr,
        seq_len_ptr,
        context_ptr,
        tile_seq_ptr,
        tile_row_ptr,
        scale,
        stride_qt,
        stride_qh,
        stride_kb,
        stride_kh,
        stride_ks,
        stride_ot,
        stride_oh,
        stride_table,
        GROUP: tl.constexpr,
        PAGE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        # A tile is BLOCK_M (query token, head of the KV head's group) rows of one sequence.
        tile = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq = tl.load(tile_seq_ptr + tile)
        first = tl.load(tile_row_ptr + tile)
        start = tl.load(seq_start_ptr + seq)
        count = tl.load(seq_len_ptr + seq)
        context = tl.load(context_ptr + seq)
        rows = count * GROUP
        r = first + tl.arange(0, BLOCK_M)
        live = r < rows
        token = r // GROUP
        heads = kv_head * GROUP + r % GROUP
        # Each query sees the keys up to its own position; padding rows see the whole context (no empty row).
        seen = tl.where(live, context - count + token, context - 1)
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(
            q_ptr + (start + token)[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
            mask=live[:, None],
            other=0.0,
        )
        end = context - count + (tl.minimum(first + BLOCK_M, rows) - 1) // GROUP + 1  # keys the tile reads
        table = tables_ptr + seq * stride_table
        best = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
        for n0 in range(0, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            valid = n < end
            page = tl.load(table + n // PAGE, mask=valid, other=0).to(tl.int64)
            where = page * stride_kb + kv_head * stride_kh + (n % PAGE) * stride_ks
            k = tl.load(k_ptr + where[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale
            scores = tl.where(valid[None, :] & (n[None, :] <= seen[:, None]), scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            p = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(p, 1)
            v = tl.load(v_ptr + where[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            best = new_best
        out = acc / total[:, None]
        tl.store(
            out_ptr + (start + token)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=live[:, None],
        )

    @triton.jit
    def _rotary_into_cache_kernel(
        qkv_ptr,
        cos_ptr,
        sin_ptr,
        positions_ptr,
        slots_ptr,
        q_ptr,
        k_ptr,
        v_ptr,
        stride_t,
        stride_qt,
        stride_cb,
        stride_ch,
        stride_cs,
        HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE: tl.constexpr,
        HEAD_BLOCK: tl.constexpr,
    ):
        # HEAD_BLOCK heads of one token: q heads, then k heads, then v heads.
        token = tl.program_id(0)
        h = tl.program_id(1) * HEAD_BLOCK + tl.arange(0, HEAD_BLOCK)[:, None]
        d = tl.arange(0, HEAD_DIM)[None, :]
        position = tl.load(positions_ptr + token)
        slot = tl.load(slots_ptr + token)  # block * PAGE + offset; < 0: not written
        full = d < HEAD_DIM  # masks as wide as the values
        exists = (h < HEADS + 2 * KV_HEADS) & full
        source = qkv_ptr + token * stride_t + h * HEAD_DIM
        x = tl.load(source + d, mask=exists, other=0.0).to(tl.float32)
        swapped = tl.load(source + (d + HEAD_DIM // 2) % HEAD_DIM, mask=exists, other=0.0).to(tl.float32)
        cos = tl.load(cos_ptr + position * HEAD_DIM + d).to(tl.float32)
        sin = tl.load(sin_ptr + position * HEAD_DIM + d).to(tl.float32)  # sign-adjusted
        y = tl.where(h < HEADS + KV_HEADS, x * cos + swapped * sin, x)  # v is not rotated
        tl.store(q_ptr + token * stride_qt + h * HEAD_DIM + d, y.to(q_ptr.dtype.element_ty), mask=(h < HEADS) & full)
        if slot >= 0:
            block = slot // PAGE
            cell = block * stride_cb + (slot - block * PAGE) * stride_cs
            is_k = (h >= HEADS) & (h < HEADS + KV_HEADS) & full
            tl.store(k_ptr + cell + (h - HEADS) * stride_ch + d, y.to(k_ptr.dtype.element_ty), mask=is_k)
            target = v_ptr + cell + (h - HEADS - KV_HEADS) * stride_ch + d
            tl.store(target, y.to(v_ptr.dtype.element_ty), mask=(h >= HEADS + KV_HEADS) & exists)

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, width, stride_x, stride_out, BLOCK: tl.constexpr):
        token = tl.program_id(0)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = i < width
        gate = tl.load(x_ptr + token * stride_x + i, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + token * stride_x + width + i, mask=inside, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + token * stride_out + i, out.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _lora_expand_kernel(
        low_ptr,
        slots_ptr,
        b_ptr,
        out_ptr,
        base_ptr,
        tokens,
        width,
        n_out,
        end0,
        end1,
        stride_low,
        stride_b,
        stride_out,
        stride_base,
        SPAN: tl.constexpr,
        RANK: tl.constexpr,
        HAS_BASE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n0 = tl.program_id(1) * BLOCK_N
        n = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(slots_ptr + m, mask=m < tokens, other=-1)
        # B is block-diagonal over the parts (lora.py): the tile's columns read only their parts' SPAN rows.
        last = tl.minimum(n0 + BLOCK_N, n_out) - 1
        first_part = (n0 >= end0).to(tl.int32) + (n0 >= end1).to(tl.int32)
        last_part = (last >= end0).to(tl.int32) + (last >= end1).to(tl.int32)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(first_part * SPAN, (last_part + 1) * SPAN, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            keep = ((k[None, :] % SPAN) // RANK == slot[:, None]) & (k[None, :] < width)
            low = tl.load(low_ptr + m[:, None] * stride_low + k[None, :], mask=keep, other=0.0)
            b = tl.load(
                b_ptr + k[:, None] * stride_b + n[None, :], mask=(k[:, None] < width) & (n[None, :] < n_out), other=0.0
            )
            acc += tl.dot(low, b)
        inside = (m[:, None] < tokens) & (n[None, :] < n_out)
        if HAS_BASE:
            acc += tl.load(base_ptr + m[:, None] * stride_base + n[None, :], mask=inside, other=0.0).to(tl.float32)
        target = out_ptr + m[:, None] * stride_out + n[None, :]
        out = tl.load(target, mask=inside, other=0.0).to(tl.float32) + acc
        tl.store(target, out.to(out_ptr.dtype.element_ty), mask=inside)

    @triton.jit
    def _lora_silu_mul_kernel(
        base_ptr,
        low_ptr,
        slots_ptr,
        b_ptr,
        out_ptr,
        tokens,
        inner,
        stride_base,
        stride_low,
        stride_b,
        stride_out,
        SPAN: tl.constexpr,
        RANK: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        # gate and up columns n of the tile: each part's expand (its SPAN rows of B), then silu(gate) · up.
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        slot = tl.load(slots_ptr + m, mask=m < tokens, other=-1)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for start in range(0, SPAN, BLOCK_K):
            k = start + tl.arange(0, BLOCK_K)
            keep = (k[None, :] // RANK == slot[:, None]) & (k[None, :] < SPAN)
            rows = low_ptr + m[:, None] * stride_low + k[None, :]
            cols = (k[:, None] < SPAN) & (n[None, :] < inner)
            b_gate = tl.load(b_ptr + k[:, None] * stride_b + n[None, :], mask=cols, other=0.0)
            b_up = tl.load(b_ptr + (SPAN + k[:, None]) * stride_b + inner + n[None, :], mask=cols, other=0.0)
            gate += tl.dot(tl.load(rows, mask=keep, other=0.0), b_gate)
            up += tl.dot(tl.load(rows + SPAN, mask=keep, other=0.0), b_up)
        inside = (m[:, None] < tokens) & (n[None, :] < inner)
        source = base_ptr + m[:, None] * stride_base + n[None, :]
        # Rounded as the expand's output would be before silu_mul reads it: the two kernels' result, in one.
        kind = out_ptr.dtype.element_ty
        gate = (tl.load(source, mask=inside, other=0.0).to(tl.float32) + gate).to(kind).to(tl.float32)
        up = (tl.load(source + inner, mask=inside, other=0.0).to(tl.float32) + up).to(kind).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + m[:, None] * stride_out + n[None, :], out.to(kind), mask=inside)


def rotary_into_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """``qkv`` [T, (heads + 2 kv_heads) · D] (rows contiguous); ``cos``/``sin`` [S, D] tables (``sin``
    with its first half negated); token t is at ``positions[t]`` and its k and v go to cache slot
    ``slots[t]`` (block · block size + offset; negative: not written) of the caches
    [blocks, kv_heads, block size, D] (contiguous, alike). Returns the rotated queries [T, heads, D]."""
    tokens = qkv.size(0)
    kv_heads, page, head_dim = k_cache.size(1), k_cache.size(2), k_cache.size(3)
    q = torch.empty((tokens, heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    all_heads = heads + 2 * kv_heads
    # A program per token (per _ROTARY_ELEMENTS values of it), not per (token, head): a step of
    # 8,192 tokens of a 32 + 2 × 8-head model launched 393,216 programs of 64 values each.
    head_block = min(triton.next_power_of_2(all_heads), max(1, _ROTARY_ELEMENTS // head_dim))
    _rotary_into_cache_kernel[(tokens, triton.cdiv(all_heads, head_block))](
        qkv,
        cos,
        sin,
        positions,
        slots,
        q,
        k_cache,
        v_cache,
        qkv.stride(0),
        q.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HEADS=heads,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        PAGE=page,
        HEAD_BLOCK=head_block,
    )
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2I] (gate, then up) → silu(gate) · up, [T, I]."""
    tokens, width = gate_up.size(0), gate_up.size(1) // 2
    out = torch.empty((tokens, width), device=gate_up.device, dtype=gate_up.dtype)
    _silu_mul_kernel[(tokens, triton.cdiv(width, _SILU_BLOCK))](
        gate_up, out, width, gate_up.stride(0), out.stride(0), BLOCK=_SILU_BLOCK
    )
    return out


def _lora_tiles(tokens: int, columns: int, span: int) -> tuple[tuple[int, int], dict[str, int]]:
    """A LoRA kernel's grid over ``tokens`` × ``columns`` and its tiles (``LORA_TILES``, read now)."""
    # A decode step's tokens in one row tile where they fit (B is read once per tile); tl.dot's smallest is 16.
    block_m = min(64, max(16, triton.next_power_of_2(tokens)))
    tiles = LORA_TILES
    grid = (triton.cdiv(tokens, block_m), triton.cdiv(columns, tiles.block_n))
    block_k = min(tiles.block_k, max(16, triton.next_power_of_2(span)))
    return grid, {"BLOCK_M": block_m, "BLOCK_K": block_k, "BLOCK_N": tiles.block_n, "num_warps": tiles.num_warps}


def lora_expand(
    low: torch.Tensor,
    slots: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    span: int,
    rank: int,
    ends: Sequence[int],
    base: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out`` [T, N] (+= ``base`` [T, N] when given) += (``low`` [T, W] with the columns ``c`` of token t whose
    ``(c % span) // rank`` is not ``slots[t]`` zeroed; -1: all) @ ``b`` [W, N], in place, with one rounding (rows of
    the tensors may be strided views, their last dimension contiguous). ``b`` is block-diagonal: part p (its
    ``span`` rows from ``p · span``) is zero outside output columns ``ends[p - 1]:ends[p]`` (at most 3 parts), which
    a tile of columns does not read. A token of no adapter gets exactly ``+ 0``."""
    tokens, width, n_out = low.size(0), low.size(1), b.size(1)
    grid, tiles = _lora_tiles(tokens, n_out, span)
    end0, end1 = (list(ends[:-1]) + [n_out, n_out])[:2]
    strides = (low.stride(0), b.stride(0), out.stride(0), 0 if base is None else base.stride(0))
    _lora_expand_kernel[grid](
        low,
        slots,
        b,
        out,
        out if base is None else base,
        tokens,
        width,
        n_out,
        end0,
        end1,
        *strides,
        SPAN=span,
        RANK=rank,
        HAS_BASE=base is not None,
        **tiles,
    )
    return out


def lora_silu_mul(
    base: torch.Tensor, low: torch.Tensor, slots: torch.Tensor, b: torch.Tensor, span: int, rank: int
) -> torch.Tensor:
    """``silu_mul`` of the fused gate/up projection ``base`` [T, 2I] plus each token's adapter, ``lora_expand``'s
    (``low`` [T, 2·span], ``b`` [2·span, 2I] block-diagonal over gate and up) without writing it back: [T, I]. Rows
    of the inputs may be strided views, their last dimension contiguous."""
    tokens, inner = base.size(0), base.size(1) // 2
    out = torch.empty((tokens, inner), device=base.device, dtype=base.dtype)
    grid, tiles = _lora_tiles(tokens, inner, span)
    _lora_silu_mul_kernel[grid](
        base,
        low,
        slots,
        b,
        out,
        tokens,
        inner,
        *(t.stride(0) for t in (base, low, b, out)),
        SPAN=span,
        RANK=rank,
        **tiles,
    )
    return out


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    seq_start: torch.Tensor,
    seq_len: torch.Tensor,
    context: torch.Tensor,
    tiles: tuple[torch.Tensor, torch.Tensor],
    config: Config,
    scale: float,
) -> torch.Tensor:
    """Causal attention of a flat batch of queries against the paged cache.

    ``q`` [T, heads, D] (last dim contiguous): sequence s owns rows ``seq_start[s]`` onwards,
    ``seq_len[s]`` of them, the last at position ``context[s] - 1``; its keys are the first
    ``context[s]`` positions of the blocks listed in ``tables[s]``. Caches [blocks, kv_heads, block
    size, D] contiguous, alike. ``tiles`` (``tile_plan`` with ``config``'s rows) lists each
    program's sequence and first (token, grouped head) row. Returns [T, heads, D]."""
    tokens, heads, head_dim = q.shape
    kv_heads, page = k_cache.size(1), k_cache.size(2)
    out = torch.empty((tokens, heads, head_dim), device=q.device, dtype=q.dtype)
    tile_seq, tile_row = tiles
    _paged_attention_kernel[(tile_seq.size(0), kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        tables,
        seq_start,
        seq_len,
        context,
        tile_seq,
        tile_row,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(1),
        tables.stride(0),
        GROUP=heads // kv_heads,
        PAGE=page,
        BLOCK_M=block_rows(heads // kv_heads, config),
        BLOCK_N=config.block_n,
        HEAD_DIM=head_dim,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


class LoraTiles(NamedTuple):
    """``lora_expand``'s tiles: ``block_k`` low-rank columns per iteration (at most the slots' span), ``block_n``
    output columns per program, Triton's ``num_warps``."""

    block_k: int
    block_n: int
    num_warps: int


# Read at each launch: benchmarks/gpu_lora.py sets others to compare them (a CUDA graph keeps what it captured).
LORA_TILES = LoraTiles(block_k=64, block_n=32, num_warps=4)


class Config(NamedTuple):
    """An attention launch's tiles: ``rows`` (query token, grouped head) rows per program (0: one
    decode token's grouped heads), ``block_n`` cache positions per iteration, and Triton's
    ``num_warps`` and ``num_stages``."""

    rows: int
    block_n: int
    num_warps: int
    num_stages: int


# The fastest of benchmarks/gpu_kernels.py's grid on an H100 (bf16, head size 64, groups of 4):
# 256 decode tokens at 1,024-1,152 positions read the cache at 2.8 TB/s (0.21 ms a layer; the
# defaults, 4 warps and 3 stages, took 0.23); for 8 chunks of 1,024 tokens the grid's best were
# within 3 % of each other (0.235-0.242 ms a layer), these among them.
DECODE = Config(rows=0, block_n=64, num_warps=2, num_stages=2)
CHUNKS = Config(rows=64, block_n=64, num_warps=4, num_stages=3)


def config_for(max_q: int) -> Config:
    """The tiles of a batch whose longest sequence adds ``max_q`` tokens."""
    return DECODE if max_q == 1 else CHUNKS


def block_rows(group: int, config: Config) -> int:
    """Pure: rows per program, a power of two of at least 16 (what tl.dot takes) holding whole tokens."""
    rows = max(group, config.rows)
    return max(16, 1 << (rows - 1).bit_length())


def tile_plan(seq_len: Sequence[int], group: int, config: Config) -> tuple[list[int], list[int]]:
    """Pure: the (sequence, first row) of every attention program, each sequence's ``seq_len ×
    group`` rows cut into ``block_rows(group, config)``-row tiles."""
    rows = block_rows(group, config)
    tile_seq, tile_row = [], []
    for s, count in enumerate(seq_len):
        for first in range(0, count * group, rows):
            tile_seq.append(s)
            tile_row.append(first)
    return tile_seq, tile_row
