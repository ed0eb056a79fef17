"""A Llama-shaped decoder forward pass over a transformers model's own weights, with a paged KV cache.

Llama, Mistral, Qwen2 and Qwen3 share one block: RMSNorm → attention with rotary positions and
grouped KV heads (Qwen2 adds q/k/v biases, Qwen3 a per-head RMSNorm on q and k) → RMSNorm →
SiLU-gated MLP. This module runs that block over a flat list of tokens (a ``Batch``) grouped into
sequences: each sequence brings the tokens it adds this step (one for a decode step, a chunk of
its prompt, or more when several tokens are checked at once) and attends to every earlier position
of its own, read through its block table. One function therefore serves decode steps (one token per
slot for slots ``0..B-1``: fixed shapes, captured as a CUDA graph per batch size) and steps that mix
decode tokens with prompt chunks (run eagerly).

The KV cache is ``num_blocks`` blocks of ``block_size`` positions per layer, ``[blocks, kv_heads,
block_size, head_dim]``; a token's k and v go to its cache slot (block · block_size + offset), and
one extra block is scratch, where the torch path writes tokens that must not be kept (idle slots).
Attention: on CUDA the Triton kernel of ``decode_kernels`` (reads the blocks in place); elsewhere
each sequence's blocks are gathered into a row and SDPA runs under a causal mask.

The math follows transformers' modeling_llama / modeling_qwen3 (release 5.x): RMSNorm in fp32,
cos/sin tables from the model's own rotary module (so every static RoPE scaling type is honoured),
``rotate_half`` rotation, scaling ``head_dim ** -0.5``, repeat_kv head order (query head h reads
KV head h // group).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..lora_sizes import group_sizes
from . import decode_kernels
from . import lora as lora_slots
from .lora import LoraSlots, spare_rows

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
        if not all(type(m) is nn.Linear for m in _projections(layer)):
            return "its projections are not plain nn.Linear layers (quantized or adapted weights)"
    if not isinstance(getattr(model, "lm_head", None), nn.Linear):
        return "no plain lm_head"
    return None


def _projections(layer: nn.Module) -> list[nn.Module]:
    attn, mlp = layer.self_attn, layer.mlp
    return [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]


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


def _fuse(modules: list[nn.Linear], device: torch.device, spare: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) row-wise on ``device``, with ``spare`` zeroed rows after them (returned,
    the biases not); the modules then view into the fused tensor, so the model holds no second copy."""
    with torch.no_grad():
        first = modules[0].weight
        weight = torch.cat([m.weight for m in modules] + [first.new_zeros(spare, first.size(1))]).to(device)
        bias = None
        if any(m.bias is not None for m in modules):
            parts = [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in modules]
            bias = torch.cat(parts).to(device)
        start = 0
        for m in modules:
            end = start + m.out_features
            m.weight.data = weight[start:end]
            if m.bias is not None:
                m.bias.data = bias[start:end]
            start = end
    return weight, bias


@dataclass
class Batch:
    """One forward pass: ``T`` tokens in ``S`` sequences, each sequence's tokens consecutive."""

    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slots: torch.Tensor  # [T] cache slot of each token's k and v (block · block_size + offset); < 0: not kept
    seq_start: torch.Tensor  # [S] index of the sequence's first token in the batch
    seq_len: torch.Tensor  # [S] its tokens in this pass
    context: torch.Tensor  # [S] its positions once this pass is written (its last token's keys)
    tables: torch.Tensor  # [S, M] block tables (int64)
    tile_seq: torch.Tensor  # the Triton attention programs: sequence and first row (decode_kernels.tile_plan)
    tile_row: torch.Tensor
    max_q: int  # the largest seq_len (decode_kernels.config_for: the programs' tiles)
    max_context: int  # an upper bound of context: how far the torch path gathers
    pad_index: torch.Tensor | None = None  # [T] each token's row in [S, max_q] (needed when max_q > 1)
    logits_at: torch.Tensor | None = None  # tokens to compute logits for; None: every token
    lora: torch.Tensor | None = None  # [T] each token's adapter slot (-1: the base model); None: no LoRA kernels at all


# Batch's index tensors that batch_layout plans on the host, and its sizes.
LAYOUT = ("positions", "slots", "seq_start", "seq_len", "context", "tile_seq", "tile_row", "pad_index")


def batch_layout(
    spans: Sequence[tuple[Sequence[int], int, int]], block_size: int, group: int
) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """Pure: the ``LAYOUT`` tensors (host, int64) and sizes (``max_q``, ``max_context``) of a batch
    whose sequences are given as (block table, first position, token count), each adding
    ``count`` tokens at positions ``first..first+count-1``. Built in ``array``s from ranges: a step
    of thousands of tokens costs the host a few hundred microseconds."""
    seq_len = [count for _, _, count in spans]
    max_q = max(seq_len)
    tile_seq, tile_row = decode_kernels.tile_plan(seq_len, group, decode_kernels.config_for(max_q))
    out = {name: array("q") for name in LAYOUT}
    positions, slots, pad_index = out["positions"], out["slots"], out["pad_index"]
    seq_start, context = out["seq_start"], out["context"]
    start = 0
    for s, (table, first, count) in enumerate(spans):
        end = first + count
        if count == 1:  # a decode token: most spans of a step, so the short way
            block, offset = divmod(first, block_size)
            positions.append(first)
            slots.append(table[block] * block_size + offset)
            pad_index.append(s * max_q)
            seq_start.append(start)
            context.append(end)
            start += 1
            continue
        positions.extend(range(first, end))
        position = first
        while position < end:  # one run of cache slots per block the span touches
            block, offset = divmod(position, block_size)
            run = min(end - position, block_size - offset)
            cell = table[block] * block_size + offset
            slots.extend(range(cell, cell + run))
            position += run
        pad_index.extend(range(s * max_q, s * max_q + count))
        seq_start.append(start)
        context.append(end)
        start += count
    out["seq_len"].extend(seq_len)
    out["tile_seq"].extend(tile_seq)
    out["tile_row"].extend(tile_row)
    tensors = {name: torch.frombuffer(values, dtype=torch.long) for name, values in out.items()}
    return tensors, {"max_q": max_q, "max_context": max(out["context"])}


class LlamaDecoder:
    """The forward pass and the paged KV cache (``num_blocks`` blocks of ``block_size`` positions)
    for sequences of up to ``max_seq_len`` positions."""

    def __init__(
        self,
        model: nn.Module,
        *,
        num_blocks: int,
        block_size: int,
        max_seq_len: int,
        lora: tuple[int, int] | None = None,
    ) -> None:
        """``lora``: (slots, rank) of the LoRA adapters applied to every batch that names slots (``LoraSlots``)."""
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
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_seq_len = max_seq_len
        self.scratch_slot = num_blocks * block_size  # the extra block's first position
        self.embed = body.embed_tokens.weight
        self.final_norm = body.norm.weight
        self.lm_head = model.lm_head.weight
        self.lm_head_bias = model.lm_head.bias
        self.layers = []
        # With LoRA folded (lora.FOLD), every fused projection carries the slots' A in rows after its own, so o and
        # down are copied too (the model's modules then view the copies): the layer's weight is a view of its rows.
        fold = lora is not None and lora_slots.FOLD
        spare = {g: spare_rows(parts, *lora, fold) if fold else 0 for g, (_, parts, _) in group_sizes(config).items()}
        if fold and self.device.type == "cuda":
            # Replaced one by one, the projections would leave holes between tensors still live (the embeddings,
            # the norms, what the loader put beside them) that the wider copies do not fit; moved to the host first,
            # the device memory they held is freed at once, and the copies reuse it.
            for layer in body.layers:
                for m in _projections(layer):
                    m.weight.data = m.weight.data.cpu()
                    if m.bias is not None:
                        m.bias.data = m.bias.data.cpu()
            torch.cuda.empty_cache()
        full = []  # per layer, each fused projection's whole weight and its bias (LoraSlots)
        for layer in body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj], self.device, spare["qkv"])
            gate_up, gate_up_bias = _fuse([mlp.gate_proj, mlp.up_proj], self.device, spare["gate_up"])
            if fold:
                o, o_bias = _fuse([attn.o_proj], self.device, spare["o"])
                down, down_bias = _fuse([mlp.down_proj], self.device, spare["down"])
            else:
                o, o_bias = attn.o_proj.weight, attn.o_proj.bias
                down, down_bias = mlp.down_proj.weight, mlp.down_proj.bias
            pairs = {
                "qkv": (qkv, qkv_bias),
                "o": (o, o_bias),
                "gate_up": (gate_up, gate_up_bias),
                "down": (down, down_bias),
            }
            full.append(pairs)
            view = {g: w[: w.size(0) - spare[g]] for g, (w, _) in pairs.items()}
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.layers.append(
                _Layer(
                    in_norm=layer.input_layernorm.weight,
                    post_norm=layer.post_attention_layernorm.weight,
                    qkv=view["qkv"],
                    qkv_bias=qkv_bias,
                    o=view["o"],
                    o_bias=o_bias,
                    gate_up=view["gate_up"],
                    gate_up_bias=gate_up_bias,
                    down=view["down"],
                    down_bias=down_bias,
                    q_norm=q_norm.weight if q_norm is not None else None,
                    k_norm=k_norm.weight if k_norm is not None else None,
                )
            )
        self.lora = None if lora is None else LoraSlots(config, full, slots=lora[0], rank=lora[1], fold=fold)
        positions = torch.arange(max_seq_len, device=self.device).unsqueeze(0)
        with torch.no_grad():
            probe = torch.empty(1, device=self.device, dtype=self.dtype)
            cos, sin = body.rotary_emb(probe, positions)
        # rotate_half(x) * sin == swap_halves(x) * sin_signed, with sin's first half negated.
        half = self.head_dim // 2
        self.cos = cos[0].contiguous()  # [max_seq_len, head_dim]
        self.sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1)
        # Zeroed: the torch path reads whole blocks (masked), and a masked weight times NaN is still NaN.
        shape = (num_blocks + 1, self.kv_heads, block_size, self.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        # The Triton kernels where they can run (CUDA); torch operations otherwise (CPU, CI).
        self.fused_kernels = decode_kernels.available(self.device, self.head_dim)

    @staticmethod
    def block_bytes(model: nn.Module, block_size: int) -> int:
        """Device memory of one KV block, every layer's k and v."""
        config = model.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        itemsize = torch.empty(0, dtype=model.dtype).element_size()
        return 2 * config.num_hidden_layers * kv_heads * block_size * head_dim * itemsize

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

    def _linear(
        self, index: int, group: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, adapters
    ) -> torch.Tensor:
        """``x @ weight.T (+ bias)``, plus each token's adapter (``adapters``: LoraSlots.project's rows)."""
        return F.linear(x, weight, bias) if adapters is None else self.lora.project(index, group, x, adapters)

    def _queries(
        self,
        layer: _Layer,
        index: int,
        x: torch.Tensor,
        batch: Batch,
        cells: tuple[torch.Tensor, torch.Tensor] | None,
        adapters: torch.Tensor | None,
    ) -> torch.Tensor:
        """Project and rotate; k and v go into the cache at the tokens' slots (``cells``: block and
        offset, the torch path's); q [T, heads, D]."""
        if self.fused_kernels and layer.q_norm is None:
            qkv = self._linear(index, "qkv", self._norm(x, layer.in_norm), layer.qkv, layer.qkv_bias, adapters)
            return decode_kernels.rotary_into_cache(
                qkv,
                self.cos,
                self.sin,
                batch.positions,
                batch.slots,
                self.k_cache[index],
                self.v_cache[index],
                self.heads,
            )
        cos, sin = self.cos[batch.positions].unsqueeze(1), self.sin[batch.positions].unsqueeze(1)
        q, k, v = self._qkv(layer, x, cos, sin, index, adapters)
        blocks, offsets = cells
        self.k_cache[index][blocks, :, offsets] = k
        self.v_cache[index][blocks, :, offsets] = v
        return q

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos, sin, index: int, adapters: torch.Tensor | None):
        t = x.size(0)
        qkv = self._linear(index, "qkv", self._norm(x, layer.in_norm), layer.qkv, layer.qkv_bias, adapters)
        q_end, k_end = self.heads * self.head_dim, (self.heads + self.kv_heads) * self.head_dim
        q = qkv[:, :q_end].view(t, self.heads, self.head_dim)
        k = qkv[:, q_end:k_end].view(t, self.kv_heads, self.head_dim)
        v = qkv[:, k_end:].view(t, self.kv_heads, self.head_dim)
        if layer.q_norm is not None:
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
            return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v
        qk = self._rotate(qkv[:, :k_end].view(t, self.heads + self.kv_heads, self.head_dim), cos, sin)
        return qk[:, : self.heads], qk[:, self.heads :], v

    def _masks(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The torch path's masks, shared by every layer: the gathered positions each sequence
        wrote [S, L], and the keys hidden from each query [S, 1, 1, max_q, L]."""
        keys = torch.arange(batch.max_context, device=batch.context.device)
        written = keys < batch.context.unsqueeze(1)
        queries = torch.arange(batch.max_q, device=keys.device)
        seen = (batch.context - batch.seq_len).unsqueeze(1) + queries  # each query's position
        hidden = (keys > seen.unsqueeze(2)) | ~written.unsqueeze(1)
        return written, hidden[:, None, None]

    def _attend(
        self, index: int, q: torch.Tensor, batch: Batch, masks: tuple[torch.Tensor, torch.Tensor] | None
    ) -> torch.Tensor:
        """[T, heads, D] attention outputs of the batch's queries."""
        k_cache, v_cache = self.k_cache[index], self.v_cache[index]
        if masks is None:
            return decode_kernels.paged_attention(
                q,
                k_cache,
                v_cache,
                batch.tables,
                batch.seq_start,
                batch.seq_len,
                batch.context,
                (batch.tile_seq, batch.tile_row),
                decode_kernels.config_for(batch.max_q),
                self.scale,
            )
        # Each sequence's blocks gathered into a row [S, kv_heads, L, D]; a KV head's group of query
        # heads (and a chunk's queries) share one matmul against it, so keys are never expanded.
        written, hidden = masks
        s, width, length = batch.tables.size(0), batch.max_q, batch.max_context
        pages = batch.tables[:, : -(-length // self.block_size)]
        keys = k_cache[pages].transpose(1, 2).flatten(2, 3)[:, :, :length]
        values = v_cache[pages].transpose(1, 2).flatten(2, 3)[:, :, :length]
        # Positions a sequence never wrote hold whatever the block held before; a weight of 0
        # times NaN would still be NaN (their scores are masked below, which replaces NaN).
        values = torch.where(written[:, None, :, None], values, 0.0)
        shape = (s, self.kv_heads, self.group, width, self.head_dim)
        if width == 1:
            queries = q.reshape(shape)
        else:
            padded = q.new_zeros(s * width, self.heads, self.head_dim).index_copy_(0, batch.pad_index, q)
            queries = padded.view(s, width, self.kv_heads, self.group, self.head_dim).permute(0, 2, 3, 1, 4)
        scores = torch.matmul(queries.flatten(2, 3), keys.transpose(-1, -2)) * self.scale
        scores = scores.view(s, self.kv_heads, self.group, width, length).masked_fill(hidden, float("-inf"))
        probs = scores.softmax(-1)  # accumulates in fp32 whatever the input dtype
        out = torch.matmul(probs.flatten(2, 3), values).view(shape)
        out = out.permute(0, 3, 1, 2, 4).reshape(s * width, self.heads, self.head_dim)
        return out if width == 1 else out[batch.pad_index]

    @staticmethod
    def _add_linear(
        residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``residual + x @ weight.T (+ bias)``; without a bias the add rides on the matmul, into
        ``residual`` itself (the residual stream is the pass's own tensor, read by nothing after
        this: an out-of-place addmm copied it first, 2 copies a layer)."""
        if bias is None:
            return residual.addmm_(x, weight.t())
        return residual + F.linear(x, weight, bias)

    def _mlp_residual(
        self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor, index: int, adapters: torch.Tensor | None
    ) -> torch.Tensor:
        if adapters is None:
            x = self._add_linear(x, attn, layer.o, layer.o_bias)
        else:
            x = self.lora.project(index, "o", attn, adapters, residual=x)
        normed = self._norm(x, layer.post_norm)
        if self.fused_kernels and adapters is not None and lora_slots.FUSE_SILU:
            hidden = self.lora.project_silu(index, normed, adapters)  # the gate/up expand and silu_mul in one
        else:
            gate_up = self._linear(index, "gate_up", normed, layer.gate_up, layer.gate_up_bias, adapters)
            if self.fused_kernels:
                hidden = decode_kernels.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                hidden = F.silu(gate) * up
        if adapters is None:
            return self._add_linear(x, hidden, layer.down, layer.down_bias)
        return self.lora.project(index, "down", hidden, adapters, residual=x)

    # -- the pass --------------------------------------------------------------------------------

    def forward(self, batch: Batch) -> torch.Tensor:
        """Writes the batch's k and v into the cache and returns fp32 logits ``[L, vocab]`` for the
        tokens ``batch.logits_at`` (every token when None). Shapes depend on T, S and the tables'
        width only: a decode step of fixed size is capturable as a CUDA graph."""
        cells = None
        if not (self.fused_kernels and all(layer.q_norm is None for layer in self.layers)):
            kept = torch.where(batch.slots >= 0, batch.slots, self.scratch_slot)
            cells = (kept // self.block_size, kept % self.block_size)
        masks = None if self.fused_kernels else self._masks(batch)
        adapters = None  # LoraSlots.project's rows: slot indices for the Triton kernel, else the torch path's mask
        if self.lora is not None and batch.lora is not None:
            adapters = batch.lora if self.fused_kernels else self.lora.mask(batch.lora)
        x = F.embedding(batch.tokens, self.embed)
        for index, layer in enumerate(self.layers):
            q = self._queries(layer, index, x, batch, cells, adapters)
            attn = self._attend(index, q, batch, masks)
            x = self._mlp_residual(layer, x, attn.reshape(x.size(0), self.heads * self.head_dim), index, adapters)
        if batch.logits_at is not None:
            x = x[batch.logits_at]
        return F.linear(self._norm(x, self.final_norm), self.lm_head, self.lm_head_bias).float()
