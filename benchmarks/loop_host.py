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
import functools
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
    # Per phase of a decode step: wall seconds (with waits for the GIL, which the event loop holds while it
    # turns outputs into responses) and the loop thread's own CPU seconds; and how many steps.
    spent = {phase: [0.0, 0.0, 0] for phase in ("plan", "launch", "emit")}
    profiling: list[cProfile.Profile] = []  # set once the warm-up is over

    def timed(phase: str, real, decode_only):
        def call(arg):
            wall, cpu = time.perf_counter(), time.thread_time()
            out = real(arg)
            if decode_only(arg, out):
                record = spent[phase]
                record[0] += time.perf_counter() - wall
                record[1] += time.thread_time() - cpu
                record[2] += 1
            return out

        return call

    def plan(real=backend._plan):
        backend._reap()
        return real()

    def iterate(real=backend._iterate):
        if not profiling:
            return real()
        profiling[0].enable()
        try:
            return real()
        finally:
            profiling[0].disable()

    backend._decode_step = lambda *args, **kwargs: None  # the device's work: a graph replay on a GPU
    decode_launches: set[int] = set()
    decode_rows = [0]

    def launched(rows, out) -> bool:
        decode_launches.add(id(out))
        decode_rows[0] += len(rows)
        return True

    # _plan reaps first (the loop's own _reap then finds nothing to do): plan_s's two parts, timed as one.
    backend._plan = functools.partial(timed("plan", lambda _: plan(), lambda _, step: not step.chunks), None)
    backend._launch_decode = timed("launch", backend._launch_decode, launched)
    backend._emit = timed("emit", backend._emit, lambda launch, _: id(launch) in decode_launches)
    backend._iterate = iterate
    batch = [[1] + [(7 * i + j) % 500 + 3 for j in range(prompt - 1)] for i in range(n)]
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 4) for i, ids in enumerate(batch)))
        if profile:
            profiling.append(cProfile.Profile())
        for record in spent.values():
            record[:] = [0.0, 0.0, 0]
        decode_rows[0] = 0
        before = dict(backend.counters)
        t0 = time.perf_counter()
        got = await asyncio.gather(*(stream(engine, f"r{i}", ids, tokens) for i, ids in enumerate(batch)))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    counters = {k: backend.counters[k] - before[k] for k in before}
    steps = counters["decode_steps"]
    rows = decode_rows[0] / max(1, spent["launch"][2])
    result = {
        "streams": n,
        "tokens": sum(got),
        "seconds": round(seconds, 3),
        "decode_steps": steps,
        "prefill_steps": counters["prefill_steps"],
        "rows_per_decode_step": round(rows, 1),
    }
    for i, clock in enumerate(("wall", "cpu")):
        per = {phase: round(1e6 * record[i] / max(1, record[2]), 1) for phase, record in spent.items()}
        per["total"] = round(sum(per.values()), 1)
        result[f"{clock}_us_per_decode_step"] = per
        result[f"{clock}_us_per_row"] = {k: round(v / max(1.0, rows), 3) for k, v in per.items()}
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
