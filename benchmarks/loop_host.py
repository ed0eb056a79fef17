#!/usr/bin/env python
"""The built-in decode loop's host cost per decode step, without a GPU.

The real ``TorchEngine`` with the built-in loop (lmi_trt/engines/torch/decode_loop.py) serves the tiny
Llama of tests/tinymodels.py on CPU: ``--concurrency`` greedy streams (ignore_eos) of ``--prompt`` +
``--tokens`` tokens, as benchmarks/gpu_decode.py runs them on a GPU. Only the device work of a decode
step is gone: ``_decode_step`` (the forward pass and the sampler, one CUDA-graph replay on a GPU) is
replaced by nothing, so its output buffer keeps whatever it holds; planning, the decode step's input
preparation, the hand-over of its tokens and their emission run the real code. Prefill steps run for real.

Reported per decode step, and per row of it: host µs planning (``plan_s``, the loop's counter), launching
a decode step (``_launch_decode`` less the stubbed device step) and emitting a decode step's tokens
(``_emit``); and with ``--profile N`` the top N functions of the loop thread by own time (cProfile).

    python benchmarks/loop_host.py                          # 256 and 64 streams
    python benchmarks/loop_host.py -c 256 --profile 25 --json loop_host.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tiny models (this checkout's)


async def stream(engine, rid: str, ids: list[int], tokens: int) -> int:
    from lmi_trt.engines.base import GenerationRequest, SamplingParams

    got = 0
    async for delta in engine.submit(
        GenerationRequest(rid, ids, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
    ):
        if delta.error:
            raise RuntimeError(delta.error)
        got += len(delta.token_ids)
    return got


async def measure(model_dir: Path, n: int, prompt: int, tokens: int, profile: int) -> dict:
    import torch

    from lmi_trt.engines.torch import TorchEngine

    torch.set_num_threads(1)
    engine = TorchEngine(
        model_dir, max_batch_size=n, max_input_len=prompt, max_new_tokens=tokens, decode_loop="builtin"
    )
    await engine.start()
    backend = engine._backend
    assert type(backend).__name__ == "DecodeLoopBackend", engine.batching
    spent = {"launch_s": 0.0, "emit_s": 0.0, "emits": 0}
    profiling: list[cProfile.Profile] = []  # set once the warm-up is over

    def launch_decode(rows, real=backend._launch_decode):
        started = time.perf_counter()
        out = real(rows)
        spent["launch_s"] += time.perf_counter() - started
        return out

    def emit(launch, real=backend._emit):
        started = time.perf_counter()
        real(launch)
        if len(launch.rows) >= len(backend._rows) // 2:  # a decode step's, not a prefill's few rows
            spent["emit_s"] += time.perf_counter() - started
            spent["emits"] += 1

    def iterate(real=backend._iterate):
        if not profiling:
            return real()
        profiling[0].enable()
        try:
            return real()
        finally:
            profiling[0].disable()

    backend._decode_step = lambda *args, **kwargs: None  # the device's work: a graph replay on a GPU
    backend._launch_decode, backend._emit, backend._iterate = launch_decode, emit, iterate
    batch = [[1] + [(7 * i + j) % 500 + 3 for j in range(prompt - 1)] for i in range(n)]
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 4) for i, ids in enumerate(batch)))
        if profile:
            profiling.append(cProfile.Profile())
        for key in spent:
            spent[key] = 0 * spent[key]
        before = dict(backend.counters)
        t0 = time.perf_counter()
        got = await asyncio.gather(*(stream(engine, f"r{i}", ids, tokens) for i, ids in enumerate(batch)))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    counters = {k: backend.counters[k] - before[k] for k in before}
    steps = counters["decode_steps"]
    rows = counters["decode_rows"] / max(1, steps + counters["mixed_steps"])

    def us(total: float, count: int) -> float:
        return round(1e6 * total / max(1, count), 1)

    result = {
        "streams": n,
        "tokens": sum(got),
        "seconds": round(seconds, 3),
        "decode_steps": steps,
        "prefill_steps": counters["prefill_steps"],
        "rows_per_step": round(rows, 1),
        "us_per_decode_step": {
            "plan": us(counters["plan_s"], steps + counters["prefill_steps"]),
            "launch": us(spent["launch_s"], steps),
            "emit": us(spent["emit_s"], spent["emits"]),
        },
    }
    per = result["us_per_decode_step"]
    per["total"] = round(per["plan"] + per["launch"] + per["emit"], 1)
    result["us_per_row"] = {k: round(v / max(1.0, rows), 3) for k, v in per.items()}
    if profiling:
        text = io.StringIO()
        pstats.Stats(profiling[0], stream=text).sort_stats("tottime").print_stats(profile)
        result["profile"] = text.getvalue()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--concurrency", default="256,64", help="streams, comma-separated")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the loop thread's top N functions")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from tinymodels import tiny_model

    model_dir = tiny_model("llama")
    results = []
    for n in (int(c) for c in args.concurrency.split(",")):
        result = asyncio.run(measure(model_dir, n, args.prompt, args.tokens, args.profile))
        profile = result.pop("profile", None)
        print(json.dumps(result))
        if profile:
            print(profile)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
