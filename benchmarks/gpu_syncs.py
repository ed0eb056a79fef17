"""Where the built-in decode loop's host waits for the GPU, on a GPU, in one command.

The loop keeps one step queued ahead of the device (decode_loop.py): any call in its thread that
synchronizes with the device (an implicit cudaStreamSynchronize: a copy from pageable memory,
``.item()``, a boolean mask, ...) lets the device run dry while the host plans and launches the
next step. torch.profiler found such calls in every mixed step (gpu_paged.py --profile). This
runs steps of every kind — prompt chunks beside decode tokens, decode steps, prefix-cache hits —
under ``torch.cuda.set_sync_debug_mode("warn")`` and prints each distinct Python stack that
synchronized, with how often; the waits the loop means to make (its drain of a finished step's
tokens, ``Event.synchronize``) are among them.

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/gpu_syncs.py
"""

from __future__ import annotations

import asyncio
import collections
import tempfile
import traceback
import warnings
from pathlib import Path

import torch
from gpu_decode import stream
from gpu_torch import build_model, prompts


async def run(model_dir: Path) -> collections.Counter:
    from lmi_trt.engines.torch import TorchEngine

    engine = TorchEngine(
        model_dir,
        dtype="bf16",
        device="cuda",
        decode_loop="builtin",
        max_batch_size=32,
        max_input_len=1024,
        max_new_tokens=16,
        max_num_tokens=512,
        enable_chunked_context=True,
        enable_kv_cache_reuse=True,
    )
    await engine.start()
    stacks: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        stacks["".join(traceback.format_stack(limit=14)[:-1]) + f"  -> {message}\n"] += 1

    try:
        shared = prompts(1, 200, seed=3)[0]
        batch = prompts(32, 300, seed=1) + [shared + p for p in prompts(8, 40, seed=4)]
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 4) for i, ids in enumerate(batch[:4])))  # warm-up
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            await asyncio.gather(*(stream(engine, f"r{i}", ids, 16) for i, ids in enumerate(batch)))
        finally:
            torch.cuda.set_sync_debug_mode(0)
        print(f"steps: {engine._backend.counters}", flush=True)
    finally:
        await engine.close()
    return stacks


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama"
        build_model(model_dir, layers=2, dtype=torch.bfloat16)
        stacks = asyncio.run(run(model_dir))
    print(f"{sum(stacks.values())} synchronizing calls, {len(stacks)} places", flush=True)
    for stack, count in stacks.most_common():
        print(f"--- {count}×\n{stack}", flush=True)


if __name__ == "__main__":
    main()
