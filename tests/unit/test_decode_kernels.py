"""The decode loop's Triton kernels against the torch operations they replace, in Triton's CPU interpreter.

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
from lmi_trt.engines.torch.decode_kernels import decode_attention, rotary_into_cache, silu_mul
torch.manual_seed(0)
b, heads, kv_heads, s, d = 5, 8, 2, 150, 16

# Attention over each slot's first `length` positions, grouped-query heads.
qk = torch.randn(b, heads + kv_heads, d)
q = qk[:, :heads]  # a strided view, as the decoder passes it
k, v = torch.randn(7, kv_heads, s, d), torch.randn(7, kv_heads, s, d)
lengths = torch.tensor([1, 5, 150, 64, 65])
out = decode_attention(q, k, v, lengths, 0.25)
for i in range(b):
    n = int(lengths[i])
    kk = k[i, :, :n].repeat_interleave(heads // kv_heads, 0)
    vv = v[i, :, :n].repeat_interleave(heads // kv_heads, 0)
    ref = torch.stack([torch.softmax(kk[h] @ q[i, h] * 0.25, -1) @ vv[h] for h in range(heads)])
    torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=1e-5)

# Rotary on q and k (transformers' rotate_half form) and the cache writes of k and v.
t = 6
qkv = torch.randn(t, (heads + 2 * kv_heads) * d)
angles = torch.rand(s, d // 2) * 6
cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
signed = torch.cat((-sin[:, : d // 2], sin[:, d // 2:]), -1)
positions, rows = torch.tensor([0, 3, 149, 7, 7, 20]), torch.tensor([0, 0, 6, 2, 3, 4])
k_cache, v_cache = torch.zeros(7, kv_heads, s, d), torch.zeros(7, kv_heads, s, d)
q_out = rotary_into_cache(qkv, cos, signed, positions, rows, k_cache, v_cache, heads)
x = qkv.view(t, heads + 2 * kv_heads, d)
half = d // 2
rotated = x * cos[positions, None] + torch.cat((-x[..., half:], x[..., :half]), -1) * sin[positions, None]
torch.testing.assert_close(q_out, rotated[:, :heads], rtol=1e-5, atol=1e-5)
for i in range(t):
    torch.testing.assert_close(k_cache[rows[i], :, positions[i]], rotated[i, heads:heads + kv_heads])
    torch.testing.assert_close(v_cache[rows[i], :, positions[i]], x[i, heads + kv_heads:])

# silu(gate) * up over a width that is not a multiple of the block.
gate_up = torch.randn(3, 2 * 1500)
torch.testing.assert_close(silu_mul(gate_up), F.silu(gate_up[:, :1500]) * gate_up[:, 1500:], rtol=1e-5, atol=1e-5)

# The whole forward pass with the kernels on (forced, on CPU) against torch operations only.
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM
from lmi_trt.engines.torch.llama_decoder import LlamaDecoder
model = AutoModelForCausalLM.from_pretrained(str(tiny_model("qwen2"))).eval()  # q/k/v biases too
decoder = LlamaDecoder(model, slots=4, max_seq_len=40)
prompts = torch.tensor([[1, 5, 9, 10, 11, 12, 40, 41], [1, 7, 8, 9, 0, 0, 0, 0]])
positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3, 40, 40, 40, 40]])  # 40: padding
results = []
for fused in (False, True):
    decoder.fused_kernels = fused
    for cache in decoder.k_cache + decoder.v_cache:
        cache.zero_()
    with torch.no_grad():
        first = decoder.prefill(prompts, positions, torch.tensor([2, 0]), 8, torch.tensor([7, 11]))
        step = decoder.decode(torch.tensor([5, 6, 7]), torch.tensor([4, 40, 8]))[[0, 2]]  # slot 1 idle
    results.append((first, step))
torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_kernels_match_the_torch_operations():
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
