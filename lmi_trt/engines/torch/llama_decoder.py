"""A Llama-shaped decoder forward pass over a transformers model's own weights, with a per-slot KV cache.

Llama, Mistral, Qwen2 and Qwen3 share one block: RMSNorm → attention with rotary positions and
grouped KV heads (Qwen2 adds q/k/v biases, Qwen3 a per-head RMSNorm on q and k) → RMSNorm →
SiLU-gated MLP. This module runs that block over a flat list of tokens, each tagged with the cache
slot (row) and position it belongs to, so one function serves both:

* **decode** — one token per slot for slots ``0..B-1``; fixed shapes, so a step can be captured
  as a CUDA graph per batch size. Attention: on CUDA the fused kernel of ``decode_kernels``
  (each slot's row up to its length); elsewhere matmuls over each whole row under a length mask.
* **prefill** — prompts padded to one length; attention through SDPA over the slots' rows up to
  the longest prompt.

The KV cache is one row of ``max_seq_len + 1`` positions (rounded up to 16) per slot and layer;
position ``max_seq_len`` is scratch, where padding tokens and idle slots write so that they never touch real entries.
The math follows transformers' modeling_llama / modeling_qwen3 (release 5.x): RMSNorm in fp32,
cos/sin tables from the model's own rotary module (so every static RoPE scaling type is honoured),
``rotate_half`` rotation, scaling ``head_dim ** -0.5``, repeat_kv head order (query head h reads
KV head h // group).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import decode_kernels

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
# RoPE types whose tables depend on the current sequence length cannot be precomputed once.
_LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def unsupported_reason(model: nn.Module, max_seq_len: int) -> str | None:
    """Why this model cannot run on this decoder (``None`` when it can)."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not Llama-shaped ({', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act={config.hidden_act!r} (only silu is implemented)"
    window = getattr(config, "sliding_window", None)
    if model_type in ("qwen2", "qwen3") and not getattr(config, "use_sliding_window", False):
        window = None
    if window is not None and window < max_seq_len:
        return f"sliding_window={window} is shorter than max_input_len + max_output_len = {max_seq_len}"
    body = getattr(model, "model", None)
    rotary = getattr(body, "rotary_emb", None)
    if rotary is None:
        return "no rotary embedding module at model.model.rotary_emb"
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type in _LENGTH_DEPENDENT_ROPE:
        return f"rope_type={rope_type!r} depends on the sequence length"
    for layer in getattr(body, "layers", []):
        attn, mlp = layer.self_attn, layer.mlp
        linears = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        if not all(type(m) is nn.Linear for m in linears):
            return "its projections are not plain nn.Linear layers (quantized or adapted weights)"
    if not isinstance(getattr(model, "lm_head", None), nn.Linear):
        return "no plain lm_head"
    return None


@dataclass
class _Layer:
    in_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: torch.Tensor  # [q; k; v] rows of the three projections, one matmul
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor  # [gate; up]
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # Qwen3
    k_norm: torch.Tensor | None


def _fuse(modules: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) row-wise; the modules then view into the fused tensor,
    so the model holds no second copy."""
    with torch.no_grad():
        weight = torch.cat([m.weight for m in modules])
        bias = None
        if any(m.bias is not None for m in modules):
            bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules])
        start = 0
        for m in modules:
            end = start + m.out_features
            m.weight.data = weight[start:end]
            if m.bias is not None:
                m.bias.data = bias[start:end]
            start = end
    return weight, bias


class LlamaDecoder:
    """The forward pass and the KV cache of ``slots`` sequences of up to ``max_seq_len`` positions."""

    def __init__(self, model: nn.Module, *, slots: int, max_seq_len: int) -> None:
        config = model.config
        body = model.model
        self.device = model.device
        self.dtype = model.dtype
        self.hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.heads
        self.group = self.heads // self.kv_heads
        self.scale = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        self.vocab = model.lm_head.out_features
        self.slots = slots
        self.max_seq_len = max_seq_len
        self.scratch = max_seq_len  # the extra cache position
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.lm_head = model.lm_head.weight
        self.lm_head_bias = model.lm_head.bias
        self.layers = []
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj])
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    in_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    qkv=qkv,
                    qkv_bias=qkv_bias,
                    o=attn.o_proj.weight,
                    o_bias=attn.o_proj.bias,
                    gate_up=gate_up,
                    gate_up_bias=gate_up_bias,
                    down=mlp.down_proj.weight,
                    down_bias=mlp.down_proj.bias,
                    q_norm=q_norm.weight if q_norm is not None else None,
                    k_norm=k_norm.weight if k_norm is not None else None,
                )
            )
        # Cache rows of max_seq_len + 1 positions (the last is scratch), rounded up so that each
        # row starts 16-element aligned: an odd row length sends cuBLAS to slow unaligned kernels.
        length = -(-(max_seq_len + 1) // 16) * 16
        positions = torch.arange(length, device=self.device).unsqueeze(0)
        with torch.no_grad():
            probe = torch.empty(1, device=self.device, dtype=self.dtype)
            cos, sin = body.rotary_emb(probe, positions)
        # rotate_half(x) * sin == swap_halves(x) * sin_signed, with sin's first half negated.
        half = self.head_dim // 2
        self.cos = cos[0].contiguous()  # [length, head_dim]
        self.sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        shape = (slots, self.kv_heads, length, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.key_positions = torch.arange(length, device=self.device)
        # The Triton kernels where they can run (CUDA); torch operations otherwise (CPU, CI).
        self.fused_kernels = decode_kernels.available(self.device, self.head_dim)

    @staticmethod
    def cache_bytes_per_slot(model: nn.Module, max_seq_len: int) -> int:
        config = model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        itemsize = torch.empty(0, dtype=model.dtype).element_size()
        return 2 * config.num_hidden_layers * kv_heads * (max_seq_len + 16) * head_dim * itemsize

    # -- pieces ----------------------------------------------------------------------------------

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:  # one fused kernel; accumulates in fp32 like the reference below
            return F.rms_norm(x, (x.size(-1),), weight, self.eps)
        # transformers' LlamaRMSNorm, operation for operation (CPU greedy must match generate).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """transformers' apply_rotary_pos_emb (x * cos + rotate_half(x) * sin) on [T, heads, D] with
        [T, 1, D] tables, in three kernels: ``sin`` is the sign-adjusted table."""
        swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)
        return torch.addcmul(x * cos, swapped, sin)

    def _queries(
        self, layer: _Layer, index: int, x: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Project and rotate; k and v go into the cache at (``rows``, ``positions``); q [T, heads, D]."""
        if self.fused_kernels and layer.q_norm is None:
            qkv = F.linear(self._norm(x, layer.in_norm), layer.qkv, layer.qkv_bias)
            return decode_kernels.rotary_into_cache(
                qkv, self.cos, self.sin, positions, rows, self.k_cache[index], self.v_cache[index], self.heads
            )
        cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
        q, k, v = self._qkv(layer, x, cos, sin)
        self.k_cache[index][rows, :, positions] = k
        self.v_cache[index][rows, :, positions] = v
        return q

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos, sin):
        t = x.size(0)
        qkv = F.linear(self._norm(x, layer.in_norm), layer.qkv, layer.qkv_bias)
        q_end, k_end = self.heads * self.head_dim, (self.heads + self.kv_heads) * self.head_dim
        q = qkv[:, :q_end].view(t, self.heads, self.head_dim)
        k = qkv[:, q_end:k_end].view(t, self.kv_heads, self.head_dim)
        v = qkv[:, k_end:].view(t, self.kv_heads, self.head_dim)
        if layer.q_norm is not None:
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v
        qk = self._rotate(qkv[:, :k_end].view(t, self.heads + self.kv_heads, self.head_dim), cos, sin)
        return qk[:, : self.heads], qk[:, self.heads :], v

    @staticmethod
    def _add_linear(
        residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``residual + x @ weight.T (+ bias)``; without a bias the add rides on the matmul (addmm)."""
        if bias is None:
            return torch.addmm(residual, x, weight.t())
        return residual + F.linear(x, weight, bias)

    def _mlp_residual(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = self._add_linear(x, attn, layer.o, layer.o_bias)
        gate_up = F.linear(self._norm(x, layer.post_norm), layer.gate_up, layer.gate_up_bias)
        if self.fused_kernels:
            hidden = decode_kernels.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        return self._add_linear(x, hidden, layer.down, layer.down_bias)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.final_norm), self.lm_head, self.lm_head_bias).float()

    # -- the two passes --------------------------------------------------------------------------

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of slots ``0..B-1`` at ``positions`` (``scratch`` for idle slots).

        Returns fp32 logits ``[B, vocab]``. Shapes depend on B only: capturable as a CUDA graph.
        """
        b = tokens.size(0)
        rows = torch.arange(b, device=tokens.device)
        if self.fused_kernels:
            lengths = positions + 1
        else:
            # Additive mask over each slot's cache row, shared by every layer: [B * kv_heads, group, S].
            visible = self.key_positions.unsqueeze(0) <= positions.unsqueeze(1)
            bias = torch.zeros(visible.shape, device=tokens.device, dtype=self.dtype)
            bias = bias.masked_fill_(~visible, float("-inf"))[:, None, None, :]
            bias = bias.expand(b, self.kv_heads, self.group, -1).reshape(b * self.kv_heads, self.group, -1)
        x = F.embedding(tokens, self.embed)
        for index, layer in enumerate(self.layers):
            q = self._queries(layer, index, x, positions, rows)
            k_cache, v_cache = self.k_cache[index][:b], self.v_cache[index][:b]
            if self.fused_kernels:
                attn = decode_kernels.decode_attention(q, k_cache, v_cache, lengths, self.scale)
            else:
                n, s = b * self.kv_heads, k_cache.size(2)
                scores = torch.baddbmm(
                    bias,
                    q.reshape(n, self.group, self.head_dim),
                    k_cache.view(n, s, self.head_dim).transpose(1, 2),
                    alpha=self.scale,
                )
                probs = scores.softmax(-1)  # accumulates in fp32 whatever the input dtype
                attn = torch.bmm(probs, v_cache.view(n, s, self.head_dim))  # [(B, kv head), group, D]
            x = self._mlp_residual(layer, x, attn.reshape(b, self.heads * self.head_dim))
        return self._logits(x)

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, keys: int, last: torch.Tensor
    ) -> torch.Tensor:
        """Prompts: ``tokens``/``positions`` ``[n, L]`` (padding at position ``scratch``), one cache
        slot per prompt in ``rows`` ``[n]``, ``keys`` = 1 + the largest real position. Returns fp32
        logits ``[len(last), vocab]`` at the flat token indices ``last`` (each prompt's last token)."""
        n, length = tokens.shape
        flat_pos = positions.reshape(-1)
        flat_rows = rows.repeat_interleave(length)
        key_pos = self.key_positions[:keys]
        mask = key_pos.view(1, 1, 1, keys) <= positions.view(n, 1, length, 1)  # padding sees all: no NaN
        x = F.embedding(tokens.reshape(-1), self.embed)
        for index, layer in enumerate(self.layers):
            q = self._queries(layer, index, x, flat_pos, flat_rows)
            keys_k = self.k_cache[index][rows, :, :keys]
            keys_v = self.v_cache[index][rows, :, :keys]
            if self.group > 1:  # expanded copies keep SDPA on its fused, mask-capable kernels
                keys_k = keys_k.repeat_interleave(self.group, dim=1)
                keys_v = keys_v.repeat_interleave(self.group, dim=1)
            q = q.view(n, length, self.heads, self.head_dim).transpose(1, 2)
            attn = F.scaled_dot_product_attention(q, keys_k, keys_v, attn_mask=mask, scale=self.scale)
            x = self._mlp_residual(layer, x, attn.transpose(1, 2).reshape(n * length, self.heads * self.head_dim))
        return self._logits(x[last])
