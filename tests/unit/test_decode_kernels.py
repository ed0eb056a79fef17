"""The decode loop's Triton kernels (paged attention, rotary + KV write, SiLU·up) against the torch
operations they replace, in Triton's CPU interpreter.

Triton comes with the test extra (PyPI's wheel installs beside the CPU torch); the kernels run
interpreted in a subprocess (TRITON_INTERPRET is read when kernels are defined).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHECK = """
import torch
import torch.nn.functional as F
from lmi_trt.engines.torch.decode_kernels import config_for, paged_attention, rotary_into_cache, silu_mul, tile_plan
torch.manual_seed(0)
heads, kv_heads, d, page, blocks = 8, 2, 16, 8, 40
group = heads // kv_heads

# Causal attention through block tables: decode tokens (one query) and prompt chunks (several),
# contexts across block boundaries, blocks scattered over the cache.
k_cache, v_cache = torch.randn(blocks, kv_heads, page, d), torch.randn(blocks, kv_heads, page, d)
seqs = [(1, 1), (1, 13), (5, 5), (17, 70), (3, 150)]  # (queries this pass, context after it)
order, tables = torch.randperm(blocks), torch.zeros(len(seqs), 19, dtype=torch.long)
used = 0
for s, (_, context) in enumerate(seqs):
    n = -(-context // page)
    tables[s, :n] = order[used : used + n]
    used += n
total = sum(n for n, _ in seqs)
qk = torch.randn(total, heads + kv_heads, d)
q = qk[:, :heads]  # a strided view, as the decoder passes it
starts = torch.tensor([0, 1, 2, 7, 24])
seq_len, context = torch.tensor([n for n, _ in seqs]), torch.tensor([c for _, c in seqs])
for max_q in (17, 1):  # a mixed step's tiles, then a decode step's (the sequences of one query)
    pick = [s for s, (n, _) in enumerate(seqs) if n <= max_q]
    config = config_for(max_q)
    tile_seq, tile_row = tile_plan([seqs[s][0] for s in pick], group, config)
    index = torch.tensor(pick)
    out = paged_attention(
        q, k_cache, v_cache, tables[index], starts[index], seq_len[index], context[index],
        (torch.tensor(tile_seq), torch.tensor(tile_row)), config, 0.25,
    )
    for s in pick:
        n, c = seqs[s]
        keys = k_cache[tables[s, : -(-c // page)]].transpose(0, 1).flatten(1, 2)[:, :c].repeat_interleave(group, 0)
        values = v_cache[tables[s, : -(-c // page)]].transpose(0, 1).flatten(1, 2)[:, :c].repeat_interleave(group, 0)
        for i in range(n):
            t, seen = int(starts[s]) + i, c - n + i + 1
            ref = torch.stack(
                [torch.softmax(keys[h, :seen] @ q[t, h] * 0.25, -1) @ values[h, :seen] for h in range(heads)]
            )
            torch.testing.assert_close(out[t], ref, rtol=1e-5, atol=1e-5)

# Rotary on q and k (transformers' rotate_half form) and the cache writes of k and v at each
# token's cache slot (block * page + offset; -1: not written).
t, s = 6, 150
qkv = torch.randn(t, (heads + 2 * kv_heads) * d)
angles = torch.rand(s, d // 2) * 6
cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
signed = torch.cat((-sin[:, : d // 2], sin[:, d // 2:]), -1)
positions, slots = torch.tensor([0, 3, 149, 7, 7, 20]), torch.tensor([0, 3, 317, -1, 58, 161])
import lmi_trt.engines.torch.decode_kernels as kernels
x = qkv.view(t, heads + 2 * kv_heads, d)
half = d // 2
rotated = x * cos[positions, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[positions, None]
for per_program in (4096, 4 * d):  # every head of a token in one program, then 4 heads per program
    kernels._ROTARY_ELEMENTS = per_program
    k_cache, v_cache = torch.zeros(blocks, kv_heads, page, d), torch.zeros(blocks, kv_heads, page, d)
    q_out = rotary_into_cache(qkv, cos, signed, positions, slots, k_cache, v_cache, heads)
    torch.testing.assert_close(q_out, rotated[:, :heads], rtol=1e-5, atol=1e-5)
    for i in range(t):
        if slots[i] >= 0:
            block, offset = divmod(int(slots[i]), page)
            torch.testing.assert_close(k_cache[block, :, offset], rotated[i, heads:heads + kv_heads])
            torch.testing.assert_close(v_cache[block, :, offset], x[i, heads + kv_heads:])
    assert int((k_cache != 0).any(-1).sum()) == 5 * kv_heads  # the -1 token wrote nothing
kernels._ROTARY_ELEMENTS = 4096

# silu(gate) * up over a width that is not a multiple of the block.
gate_up = torch.randn(3, 2 * 1500)
torch.testing.assert_close(silu_mul(gate_up), F.silu(gate_up[:, :1500]) * gate_up[:, 1500:], rtol=1e-5, atol=1e-5)

# The whole forward pass with the kernels on (forced, on CPU) against torch operations only: a
# prompt whole and another's first chunk, then its second chunk beside the first's decode token,
# then a decode step with an idle slot (cache slot -1, as the decode loop's graphs run them).
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM
from lmi_trt.engines.torch.llama_decoder import LAYOUT, Batch, LlamaDecoder, batch_layout
model = AutoModelForCausalLM.from_pretrained(str(tiny_model("qwen2"))).eval()  # q/k/v biases too
decoder = LlamaDecoder(model, num_blocks=12, block_size=4, max_seq_len=40)
a_table, b_table = [5, 2, 9], [0, 7, 3]
a, b = [1, 5, 9, 10, 11, 12, 40, 41], [1, 7, 8, 9, 20, 21, 22, 23]

def flat(spans, tokens, logits_at):
    layout, sizes = batch_layout(spans, 4, decoder.group)
    width = max(len(t) for t, _, _ in spans)
    tables = torch.tensor([t + [0] * (width - len(t)) for t, _, _ in spans])
    named = {name: layout[name] for name in LAYOUT}
    return Batch(tokens=torch.tensor(tokens), tables=tables, logits_at=torch.tensor(logits_at), **named, **sizes)

results = []
for fused in (False, True):
    decoder.fused_kernels = fused
    for cache in decoder.k_cache + decoder.v_cache:
        cache.zero_()
    with torch.no_grad():
        first = decoder.forward(flat([(a_table, 0, 8), (b_table, 0, 3)], a + b[:3], [7]))
        second = decoder.forward(flat([(a_table, 8, 1), (b_table, 3, 5)], [50] + b[3:], [0, 5]))
        rows = torch.arange(3)
        idle = Batch(
            tokens=torch.tensor([51, 0, 52]),
            positions=torch.tensor([9, 0, 8]),
            slots=torch.tensor([9 * 4 + 1, -1, 3 * 4]),
            seq_start=rows,
            seq_len=torch.ones(3, dtype=torch.long),
            context=torch.tensor([10, 1, 9]),
            tables=torch.tensor([a_table, b_table, b_table]),
            tile_seq=rows,
            tile_row=torch.zeros(3, dtype=torch.long),
            max_q=1,
            max_context=12,
        )
        idle.tables[1] = torch.tensor([4, 4, 4])  # a stale table: read, never written
        third = decoder.forward(idle)[[0, 2]]
    results.append((first, second, third))
torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)

# LoRA's expand (lora.py): each token's slot's columns of the low-rank activations times the stacked B (block-
# diagonal over 3 parts: a tile of output columns reads only its parts' rows), added in place, with the base output
# too when given (o, down: into the residual stream); a token of no adapter (-1) gets exactly + 0. 37 tokens, 3
# parts of 4 slots of rank 6 (72 columns) and ends 30, 55, 100: no size a multiple of the tiles, tiles across parts;
# the activations a strided view after a base output, as the folded projection's GEMM leaves them.
from lmi_trt.engines.torch.decode_kernels import LORA_TILES, LoraTiles, lora_expand
span, rank, ends = 4 * 6, 6, (30, 55, 100)
both, up = torch.randn(37, 100 + 3 * span), torch.randn(3 * span, 100)
for part, (start, end) in enumerate(zip((0,) + ends, ends)):
    rows = up[part * span : (part + 1) * span]
    rows[:, :start], rows[:, end:] = 0, 0
base, low = both[:, :100], both[:, 100:]
token_slots = torch.arange(37) % 5 - 1
kept = token_slots[:, None] == torch.arange(3 * span) % span // rank
before = torch.randn(37, 100)
for tiles in (LORA_TILES, LoraTiles(block_k=16, block_n=32, num_warps=2)):
    kernels.LORA_TILES = tiles
    for added in (None, base):
        out = before.clone()
        assert lora_expand(low, token_slots, up, out, span, rank, ends, added) is out
        want = before + (0 if added is None else base)
        torch.testing.assert_close(out, want + (low * kept) @ up, rtol=1e-5, atol=1e-5)
        assert torch.equal(out[token_slots < 0], want[token_slots < 0])
    # The gate/up projection's expand and silu_mul in one: part 0 (gate) and part 1 (up) of 2, inner width 50.
    two = up[: 2 * span].clone()
    two[:span, 50:], two[span:, :50] = 0, 0
    gate_up = base.clone()
    lora_expand(low[:, : 2 * span], token_slots, two, gate_up, span, rank, (50, 100))
    fused = kernels.lora_silu_mul(base, low[:, : 2 * span], token_slots, two, span, rank)
    torch.testing.assert_close(fused, F.silu(gate_up[:, :50]) * gate_up[:, 50:], rtol=1e-5, atol=1e-5)
kernels.LORA_TILES = LORA_TILES
# The first pass again with adapters (random slots, 2 of rank 4, B zero outside each part's columns as written):
# the kernel against the torch path, each with the slots' A folded into the base projections and apart.
import lmi_trt.engines.torch.lora as lora_module
adapted = {}
for fold in (True, False):
    lora_module.FOLD = fold
    torch.manual_seed(1)
    with_lora = LlamaDecoder(model, num_blocks=12, block_size=4, max_seq_len=40, lora=(2, 4))
    for layer in with_lora.lora.layers:
        for g in layer.values():
            g.a.normal_(std=0.2)
            g.b.normal_(std=0.2)
            for part, (start, end) in enumerate(zip((0,) + g.ends, g.ends)):
                g.b[part * 8 : (part + 1) * 8, :start], g.b[part * 8 : (part + 1) * 8, end:] = 0, 0
    for fused, silu in ((False, False), (True, False), (True, True)):  # the torch path; the kernels, silu apart or not
        with_lora.fused_kernels, lora_module.FUSE_SILU = fused, silu
        batch = flat([(a_table, 0, 8), (b_table, 0, 3)], a + b[:3], [7, 10])
        batch.lora = torch.tensor([1] * 8 + [0, -1, 0])
        with torch.no_grad():
            adapted[fold, fused, silu] = with_lora.forward(batch)
lora_module.FOLD = lora_module.FUSE_SILU = True
for key, logits in adapted.items():
    torch.testing.assert_close(logits, adapted[True, False, False], rtol=1e-5, atol=1e-5)
assert not torch.allclose(adapted[True, True, True][0], results[0][0][0])  # the adapter changed the logits

# A verification step (speculative decoding): each of 3 sequences feeds its last token and 3 drafts, k + 1 = 4
# queries of a sequence sharing each KV head's 2 query heads, the positions past a sequence's drafts padding
# (cache slot -1). The drafts are the model's own greedy tokens (each found from the position before it), one
# of them changed: the kernels must give the torch operations' logits on every kept position, and keep the
# same drafts, as the decode loop's CUDA graphs of these steps run them on a GPU.
from lmi_trt.engines.torch.speculation import accepted_counts
tables = [[5, 2, 9, 11], [0, 7, 3, 10], [1, 4, 6, 8]]
prompts = [a[:7], b[:5], [1, 30, 31, 32, 33, 34, 35, 36, 37]]
proposed, width = torch.tensor([3, 3, 1]), 4
keep = (torch.arange(width) <= proposed[:, None]).flatten()
caches = decoder.k_cache + decoder.v_cache

def verify_step(tokens, fused):
    decoder.fused_kernels = fused
    for cache, saved in zip(caches, prefilled[fused]):
        cache.copy_(saved)
    step = flat([(t, len(p), width) for t, p in zip(tables, prompts)], tokens.flatten().tolist(), list(range(12)))
    step.slots = torch.where(keep, step.slots, -1)
    with torch.no_grad():
        return decoder.forward(step)

prefilled, last = {}, {}
ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
for fused in (False, True):
    decoder.fused_kernels = fused
    for cache in caches:
        cache.zero_()
    with torch.no_grad():
        last[fused] = decoder.forward(flat([(t, 0, len(p)) for t, p in zip(tables, prompts)], sum(prompts, []), ends))
    prefilled[fused] = [cache.clone() for cache in caches]
torch.testing.assert_close(last[True], last[False], rtol=1e-5, atol=1e-5)
tokens = torch.zeros(3, width, dtype=torch.long)
tokens[:, 0] = last[False].argmax(-1)
for j in range(1, width):
    tokens[:, j] = verify_step(tokens, False).argmax(-1).view(3, width)[:, j - 1]
tokens[1, 2] = (tokens[1, 2] + 1) % 512  # the second sequence's second draft is wrong: 1 of its 3 kept
logits = {fused: verify_step(tokens, fused) for fused in (False, True)}
torch.testing.assert_close(logits[True][keep], logits[False][keep], rtol=1e-5, atol=1e-5)
for fused in (False, True):
    targets = logits[fused].argmax(-1).view(3, width)
    assert accepted_counts(targets, tokens[:, 1:], proposed).tolist() == [3, 1, 1], fused
print("ok")
"""


def test_kernels_match_the_torch_operations():
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
