"""Triton kernels of the built-in decode loop's forward pass, on CUDA.

* ``decode_attention`` — one program per (slot, KV head): the group of query heads that share the
  KV head (grouped-query attention) against that slot's cache row, block by block up to the row's
  length, with an online softmax (flash-decoding without the split over the sequence). Each KV
  byte is read once and only up to each slot's length; the scores never reach device memory.
* ``rotary_into_cache`` — rotary positions on q and k (transformers' ``rotate_half`` form) and the
  cache writes of k and v, one program per (token, head): five kernels of the torch path in one.
* ``silu_mul`` — ``silu(gate) * up`` of the fused gate/up projection in one pass.

The torch operations in ``llama_decoder`` stay the reference and the CPU path; these compute in
fp32 and round once where the torch path rounds after each operation.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the matmul path runs
    triton = None

_BLOCK_N = 64  # cache positions per iteration


_SILU_BLOCK = 1024


def available(device: torch.device, head_dim: int) -> bool:
    """Triton present, a CUDA device, and a head size tl.dot takes (a power of two, 16 or more)."""
    return triton is not None and device.type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


if triton is not None:

    @triton.jit
    def _decode_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        lengths_ptr,
        scale,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_kh,
        stride_ks,
        stride_ob,
        stride_oh,
        GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr,
    ):
        slot = tl.program_id(0)
        kv_head = tl.program_id(1)
        length = tl.load(lengths_ptr + slot)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, HEAD_DIM)
        heads = kv_head * GROUP + g
        in_group = (g < GROUP)[:, None]
        q = tl.load(q_ptr + slot * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=in_group, other=0.0)
        k_row = k_ptr + slot * stride_kb + kv_head * stride_kh
        v_row = v_ptr + slot * stride_kb + kv_head * stride_kh
        best = tl.full([BLOCK_G], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        for start in range(0, length, BLOCK_N):
            n = start + tl.arange(0, BLOCK_N)
            valid = n < length
            k = tl.load(k_row + n[:, None] * stride_ks + d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(k)) * scale
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, 1))
            p = tl.exp(scores - new_best[:, None])
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(p, 1)
            v = tl.load(v_row + n[:, None] * stride_ks + d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v)
            best = new_best
        out = acc / total[:, None]
        tl.store(
            out_ptr + slot * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=in_group,
        )

    @triton.jit
    def _rotary_into_cache_kernel(
        qkv_ptr,
        cos_ptr,
        sin_ptr,
        positions_ptr,
        rows_ptr,
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
    ):
        token = tl.program_id(0)
        head = tl.program_id(1)  # q heads, then k heads, then v heads
        position = tl.load(positions_ptr + token)
        row = tl.load(rows_ptr + token)
        d = tl.arange(0, HEAD_DIM)
        source = qkv_ptr + token * stride_t + head * HEAD_DIM
        x = tl.load(source + d).to(tl.float32)
        if head < HEADS + KV_HEADS:
            swapped = tl.load(source + (d + HEAD_DIM // 2) % HEAD_DIM).to(tl.float32)
            cos = tl.load(cos_ptr + position * HEAD_DIM + d).to(tl.float32)
            sin = tl.load(sin_ptr + position * HEAD_DIM + d).to(tl.float32)  # sign-adjusted
            y = x * cos + swapped * sin
            if head < HEADS:
                tl.store(q_ptr + token * stride_qt + head * HEAD_DIM + d, y.to(q_ptr.dtype.element_ty))
            else:
                target = k_ptr + row * stride_cb + (head - HEADS) * stride_ch + position * stride_cs
                tl.store(target + d, y.to(k_ptr.dtype.element_ty))
        else:
            target = v_ptr + row * stride_cb + (head - HEADS - KV_HEADS) * stride_ch + position * stride_cs
            tl.store(target + d, x.to(v_ptr.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(x_ptr, out_ptr, width, stride_x, stride_out, BLOCK: tl.constexpr):
        token = tl.program_id(0)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = i < width
        gate = tl.load(x_ptr + token * stride_x + i, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + token * stride_x + width + i, mask=inside, other=0.0).to(tl.float32)
        out = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(out_ptr + token * stride_out + i, out.to(out_ptr.dtype.element_ty), mask=inside)


def rotary_into_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """``qkv`` [T, (heads + 2 kv_heads) · D] (rows contiguous); ``cos``/``sin`` [S, D] tables (``sin``
    with its first half negated); token t goes to cache slot ``rows[t]`` at ``positions[t]`` (caches
    [slots, kv_heads, S, D] contiguous, alike). Returns the rotated queries [T, heads, D]."""
    tokens = qkv.size(0)
    kv_heads, head_dim = k_cache.size(1), k_cache.size(3)
    q = torch.empty((tokens, heads, head_dim), device=qkv.device, dtype=qkv.dtype)
    _rotary_into_cache_kernel[(tokens, heads + 2 * kv_heads)](
        qkv,
        cos,
        sin,
        positions,
        rows,
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


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q`` [B, heads, D] (last dim contiguous), caches [≥B, kv_heads, S, D] contiguous, ``lengths``
    [B] (≥ 1, ≤ S): softmax(q kᵀ · scale) v over each slot's first ``length`` positions → [B, heads, D].
    The value cache must have the key cache's strides."""
    b, heads, head_dim = q.shape
    kv_heads = k_cache.size(1)
    group = heads // kv_heads
    out = torch.empty((b, heads, head_dim), device=q.device, dtype=q.dtype)
    _decode_attention_kernel[(b, kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        lengths,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=_BLOCK_N,
        HEAD_DIM=head_dim,
    )
    return out
