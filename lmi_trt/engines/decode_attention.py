"""Decode attention as one Triton kernel, for the built-in decode loop on CUDA.

One program per (slot, KV head): the group of query heads that share the KV head (grouped-query
attention) against that slot's cache row, block by block up to the row's length, with an online
softmax (flash-decoding without the split over the sequence). Each KV byte is read once and only
up to each slot's length; the scores never reach device memory. The matmul path in
``llama_decoder`` reads every row to its full capacity in three kernels; it stays the reference
and the CPU path.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs: the matmul path runs
    triton = None

_BLOCK_N = 64  # cache positions per iteration


def available(device: torch.device, head_dim: int) -> bool:
    """Triton present, a CUDA device, and a head size tl.dot takes (a power of two, 16 or more)."""
    return triton is not None and device.type == "cuda" and head_dim >= 16 and head_dim & (head_dim - 1) == 0


if triton is not None:

    @triton.jit
    def _decode_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lengths_ptr, scale,
                                 stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_ob, stride_oh,
                                 GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                                 HEAD_DIM: tl.constexpr):
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
        tl.store(out_ptr + slot * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=in_group)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """``q`` [B, heads, D] (last dim contiguous), caches [≥B, kv_heads, S, D] contiguous, ``lengths``
    [B] (≥ 1, ≤ S): softmax(q kᵀ · scale) v over each slot's first ``length`` positions → [B, heads, D]."""
    b, heads, head_dim = q.shape
    kv_heads = k_cache.size(1)
    group = heads // kv_heads
    out = torch.empty((b, heads, head_dim), device=q.device, dtype=q.dtype)
    _decode_attention_kernel[(b, kv_heads)](
        q, k_cache, v_cache, out, lengths, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0),
        out.stride(1), GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=_BLOCK_N,
        HEAD_DIM=head_dim)
    return out
