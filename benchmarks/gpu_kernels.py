"""The built-in decode loop's kernels one by one on a GPU, at the shapes of gpu_paged.py's workloads
(the ~1.1B Llama-shaped model: 32 query heads, 8 KV heads, head size 64, hidden 2048,
intermediate 8192; KV blocks of 16 positions), to choose the attention tiles and to see what a
step's pieces cost against the device's peak:

  * paged attention of prompt chunks (8 sequences × 1,024 new tokens: a step of 8,192) for each
    ``decode_kernels.Config`` in a grid: ms and TFLOP/s;
  * paged attention of decode tokens (256 sequences at contexts of 1,024-1,152) for each Config:
    ms and the cache bytes read per second;
  * a budget-2,048 mixed step's attention (256 decode tokens + 2 chunks of 1,024): one launch of
    ``CHUNKS`` tiles for all (what the loop runs) against two launches, decode tokens in ``DECODE``
    tiles then the chunks;
  * the step's matmuls (cuBLAS through F.linear) at 8,448 and 2,304 rows, rms_norm, the fused
    rotary + cache write, and silu·up.

Every Config's output is checked against the first's. ``triton.testing.do_bench`` times each.

    PYTHONPATH=$PWD python3 benchmarks/gpu_kernels.py --json gpu_kernels.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from lmi_trt.engines.torch import decode_kernels
from lmi_trt.engines.torch.decode_kernels import CHUNKS, DECODE, Config, paged_attention, tile_plan

HEADS, KV_HEADS, D, PAGE, HIDDEN, INTER = 32, 8, 64, 16, 2048, 8192
GROUP = HEADS // KV_HEADS


def paged_batch(counts: list[int], contexts: list[int], blocks: int) -> dict:
    """q and a cache holding every sequence's ``contexts`` positions in scattered blocks."""
    dev = "cuda"
    need = [-(-c // PAGE) for c in contexts]
    order = torch.randperm(blocks, device=dev)[: sum(need)]
    width = max(need)
    tables = torch.zeros(len(counts), width, dtype=torch.long, device=dev)
    used = 0
    for s, n in enumerate(need):
        tables[s, :n] = order[used : used + n]
        used += n
    starts = torch.tensor([0, *torch.tensor(counts).cumsum(0)[:-1].tolist()], device=dev)
    return {
        "q": torch.randn(sum(counts), HEADS, D, device=dev, dtype=torch.bfloat16),
        "k": torch.randn(blocks, KV_HEADS, PAGE, D, device=dev, dtype=torch.bfloat16),
        "v": torch.randn(blocks, KV_HEADS, PAGE, D, device=dev, dtype=torch.bfloat16),
        "tables": tables,
        "seq_start": starts,
        "seq_len": torch.tensor(counts, device=dev),
        "context": torch.tensor(contexts, device=dev),
        "counts": counts,
    }


def attend(b: dict, tiles: tuple[torch.Tensor, torch.Tensor], config: Config) -> torch.Tensor:
    return paged_attention(
        b["q"], b["k"], b["v"], b["tables"], b["seq_start"], b["seq_len"], b["context"], tiles, config, D**-0.5
    )


def plan(counts: list[int], config: Config) -> tuple[torch.Tensor, torch.Tensor]:
    seq, row = tile_plan(counts, GROUP, config)
    return torch.tensor(seq, device="cuda"), torch.tensor(row, device="cuda")


def sweep(b: dict, grid: list[Config], work: float, unit: str, scale: float) -> list[dict]:
    rows, reference = [], None
    for config in grid:
        tiles = plan(b["counts"], config)
        try:
            out = attend(b, tiles, config)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory): skipped
            rows.append({"config": config._asdict(), "error": str(exc)[:200]})
            continue
        reference = out if reference is None else reference
        error = (out.float() - reference.float()).abs().max().item()
        ms = do_bench(lambda: attend(b, tiles, config))  # noqa: B023 - called at once
        rate = work / (ms / 1e3) / scale
        rows.append({"config": config._asdict(), "ms": ms, unit: rate, "max_diff": error})
        print(f"    {config}: {ms:.3f} ms, {rate:.2f} {unit}, max diff {error:.2e}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args()
    torch.manual_seed(0)
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}

    print("prompt chunks: 8 × 1,024 new tokens", flush=True)
    chunks = paged_batch([1024] * 8, [1024] * 8, blocks=8 * 64 + 8)
    flops = 8 * 1024 * 1025 / 2 * D * 4 * HEADS  # causal QK and PV
    warps = ((4, 2), (4, 3), (8, 2), (8, 3))
    grid = [Config(rows, n, w, st) for rows in (64, 128) for n in (32, 64, 128) for w, st in warps]
    report["chunks"] = sweep(chunks, grid, work=flops, unit="TFLOP/s", scale=1e12)

    print("decode tokens: 256 sequences at 1,024-1,152 positions", flush=True)
    contexts = torch.randint(1024, 1153, (256,)).tolist()
    decode = paged_batch([1] * 256, contexts, blocks=256 * 73)
    read = sum(contexts) * KV_HEADS * D * 2 * 2
    warps = ((2, 2), (2, 3), (4, 2), (4, 3), (4, 4), (8, 3))
    grid = [Config(0, n, w, st) for n in (32, 64, 128) for w, st in warps]
    report["decode"] = sweep(decode, grid, work=read, unit="TB/s", scale=1e12)

    print("a budget-2,048 mixed step: 256 decode tokens + 2 chunks of 1,024", flush=True)
    counts = [1] * 256 + [1024, 1024]
    mixed = paged_batch(counts, contexts + [1024, 1024], blocks=256 * 73 + 130)
    whole = plan(counts, CHUNKS)
    singles = plan([1] * 256, DECODE)  # the first 256 sequences
    chunked = plan([0] * 256 + [1024, 1024], CHUNKS)  # the last two

    def two_launches() -> None:
        attend(mixed, singles, DECODE)
        attend(mixed, chunked, CHUNKS)

    report["mixed"] = {
        "one_launch_ms": do_bench(lambda: attend(mixed, whole, CHUNKS)),
        "two_launches_ms": do_bench(two_launches),
    }
    print(f"    {report['mixed']}", flush=True)

    print("the step's other kernels", flush=True)
    parts = {}
    for rows in (8448, 2304):
        x = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(rows, INTER, device="cuda", dtype=torch.bfloat16)
        for name, w, inp in (
            ("qkv", torch.randn(HIDDEN + 2 * KV_HEADS * D, HIDDEN), x),
            ("o", torch.randn(HIDDEN, HIDDEN), x),
            ("gate_up", torch.randn(2 * INTER, HIDDEN), x),
            ("down", torch.randn(HIDDEN, INTER), h),
        ):
            w = w.to("cuda", torch.bfloat16)
            ms = do_bench(lambda: F.linear(inp, w))  # noqa: B023
            parts[f"linear_{name}_{rows}"] = {"ms": ms, "tflops": 2 * rows * w.numel() / ms / 1e9}
        weight = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
        parts[f"rms_norm_{rows}"] = {"ms": do_bench(lambda: F.rms_norm(x, (HIDDEN,), weight, 1e-5))}  # noqa: B023
        qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * D, device="cuda", dtype=torch.bfloat16)
        cos = torch.randn(4096, D, device="cuda", dtype=torch.bfloat16)
        positions = torch.randint(0, 4096, (rows,), device="cuda")
        slots = torch.randperm(rows * 2, device="cuda")[:rows]
        cache = torch.zeros(rows * 2 // PAGE + 1, KV_HEADS, PAGE, D, device="cuda", dtype=torch.bfloat16)
        parts[f"rotary_into_cache_{rows}"] = {
            "ms": do_bench(
                lambda: decode_kernels.rotary_into_cache(qkv, cos, cos, positions, slots, cache, cache, HEADS)  # noqa: B023
            )
        }
        gate_up = torch.randn(rows, 2 * INTER, device="cuda", dtype=torch.bfloat16)
        parts[f"silu_mul_{rows}"] = {"ms": do_bench(lambda: decode_kernels.silu_mul(gate_up))}  # noqa: B023
    report["parts"] = parts
    for name, value in parts.items():
        print(f"    {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in value.items()), flush=True)
    a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
