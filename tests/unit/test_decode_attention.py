"""The fused decode-attention kernel (Triton) against plain attention, in Triton's CPU interpreter.

Triton is not part of the CPU install; where it is importable the kernel runs interpreted in a
subprocess (TRITON_INTERPRET is read when kernels are defined), otherwise the test is skipped.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHECK = """
import torch
from lmi_trt.engines.decode_attention import decode_attention
torch.manual_seed(0)
b, heads, kv_heads, s, d = 5, 8, 2, 150, 16
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
print("ok")
"""


def test_kernel_matches_plain_attention():
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    done = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
