#!/usr/bin/env python
"""The TensorRT-LLM adapter's own overhead: how many tokens/s TrtllmEngine delivers to asyncio consumers.

The engine under test is the real ``lmi_trt.engines.trtllm.TrtllmEngine`` code path: the
Executor built from an engine folder, ``enqueue_request``, the response-pump thread blocking in
``await_responses``, dispatch onto the event loop, per-request streams, and ``--concurrency``
consumer tasks each iterating ``engine.submit(request)`` (closed loop: a consumer submits its
next request when one ends). Only the model is gone: the fake ``tensorrt_llm``'s Executor
(tests/fakes) runs its real in-flight-batching loop, request bookkeeping, Result/Response
objects and ``await_responses`` semantics, but its per-step forward pass is replaced by a
trivial token source (token k of a request is its prompt's token k mod len), so a step costs
what the fake's scheduling costs, not a model's. ``--step-us`` adds a GPU-like pause per step.

Everything runs in one process (the fake executor is a Python thread sharing the GIL: on a real
host it is C++ and a GPU), so the figures are a floor for the adapter. Reported: tokens/s to
consumers, outputs (deltas) per second and tokens per delta, and CPU seconds per thread
(the fake executor's step thread = the "GPU"; the pump thread and the event loop = the adapter).

    python benchmarks/pump_bench.py                      # 256 requests in flight, 256 tokens each
    python benchmarks/pump_bench.py -c 1,64,256 --tokens 512 --seconds 10 --json pump.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))  # the fake tensorrt_llm and the tiny models (this checkout's)

TARGET_CONCURRENCY = 256
TARGET_TOKENS_PER_S = 50_000


def thread_cpu_seconds(native_id: int | None) -> float | None:
    """utime + stime of one thread of this process, from /proc (Linux)."""
    if native_id is None:
        return None
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def install_trivial_model(step_us: float) -> None:
    """Swap the fake Executor's model for a trivial token source (everything else stays the fake's)."""
    from tensorrt_llm import _runtime

    class TrivialTokens(_runtime.ExecutorImpl):
        step_seconds = step_us / 1e6

        def _loop(self) -> None:
            type(self).native_id = threading.get_native_id()
            super()._loop()

        def _step(self, seq, admitted, out) -> None:
            if self.step_seconds and getattr(self, "_slept_at", None) != self._iter:
                self._slept_at = self._iter  # the first sequence of a step: one "forward pass" per
                time.sleep(self.step_seconds)  # step, outside the executor's lock, GIL released
            if seq.beam_width > 1:
                raise NotImplementedError("pump_bench: greedy requests only")
            k = len(seq.generated)
            reason = self._advance(seq, seq.prompt[k % len(seq.prompt)], -0.25 * (k % 4 + 1))
            if reason is not None or seq.streaming:
                out.append(self._result(seq, reason))

    _runtime.ExecutorImpl = TrivialTokens
    _runtime._load_model = lambda hf_dir: None


def build_engine_dir(out: Path, max_batch_size: int, max_seq_len: int) -> Path:
    from tinymodels import tiny_model
    from trtllm_testing import make_engine_dir

    return make_engine_dir(
        tiny_model("llama"), out, max_batch_size=max_batch_size, max_input_len=64, max_seq_len=max_seq_len
    )


async def run_level(engine_dir: Path, concurrency: int, tokens: int, seconds: float, warmup: float) -> dict:
    from tensorrt_llm import _runtime

    from lmi_trt.engines.base import GenerationRequest, SamplingParams
    from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings

    engine = TrtllmEngine(
        engine_dir,
        TrtllmSettings(max_batch_size=max(concurrency, 1)),
        eos_token_ids=[2],
        pad_token_id=0,
        gpu_available=lambda: True,
    )
    await engine.start()
    loop_tid = threading.get_native_id()
    prompts = [[1] + [10 + (i * 7 + j) % 400 for j in range(31)] for i in range(64)]  # no eos (2) inside
    state = {"measuring": False, "stop": False, "tokens": 0, "outputs": 0, "requests": 0, "errors": 0}
    ids = iter(range(1 << 62))

    async def consumer(c: int) -> None:
        n = 0
        while not state["stop"]:
            request = GenerationRequest(
                f"c{c}-{next(ids)}",
                prompts[(c + n) % len(prompts)],
                SamplingParams(max_new_tokens=tokens, ignore_eos=True),
            )
            n += 1
            got = outs = 0
            async for out in engine.submit(request):
                got += len(out.token_ids)
                outs += 1
                if out.error is not None:
                    state["errors"] += 1
            if state["measuring"]:
                state["tokens"] += got
                state["outputs"] += outs
                state["requests"] += 1

    tasks = [asyncio.ensure_future(consumer(c)) for c in range(concurrency)]
    await asyncio.sleep(warmup)
    impl_tid = getattr(_runtime.ExecutorImpl, "native_id", None)
    pump_tid = engine._pump.native_id if engine._pump is not None else None
    cpu0 = {
        name: thread_cpu_seconds(tid)
        for name, tid in (("executor_step_thread", impl_tid), ("pump_thread", pump_tid), ("event_loop", loop_tid))
    }
    proc0, t0 = time.process_time(), time.perf_counter()
    state["measuring"] = True
    await asyncio.sleep(seconds)
    state["measuring"] = False
    wall = time.perf_counter() - t0
    proc = time.process_time() - proc0
    cpu = {
        name: (thread_cpu_seconds(tid) - c0 if c0 is not None else None)
        for (name, c0), tid in zip(cpu0.items(), (impl_tid, pump_tid, loop_tid))
    }
    # Counted are requests that ended inside the window (their tokens may have started before it);
    # over many requests per consumer the difference is small, and a partial request is never counted.
    state["stop"] = True
    await asyncio.gather(*tasks)
    await engine.close()
    return {
        "concurrency": concurrency,
        "tokens_per_request": tokens,
        "seconds": round(wall, 3),
        "requests": state["requests"],
        "errors": state["errors"],
        "tokens_per_s": state["tokens"] / wall,
        "outputs_per_s": state["outputs"] / wall,
        "tokens_per_output": state["tokens"] / state["outputs"] if state["outputs"] else None,
        "process_cpu_cores": proc / wall,
        "thread_cpu_cores": {k: (v / wall if v is not None else None) for k, v in cpu.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-c", "--concurrency", default="256", help="requests in flight, e.g. 1,64,256")
    ap.add_argument("--tokens", type=int, default=256, help="max_new_tokens per request (ignore_eos)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured window per level")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window")
    ap.add_argument("--rounds", type=int, default=1, help="repeat each level; the median round is reported")
    ap.add_argument(
        "--step-us",
        type=float,
        default=0.0,
        help="sleep this long in each executor step, a GPU's forward pass (default 0: unlimited rate)",
    )
    ap.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="import lmi_trt from this checkout (e.g. an older revision, for before/after); "
        "the fake and the tests' helpers always come from this one",
    )
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.tree.resolve()))
    levels = [int(x) for x in args.concurrency.split(",")]

    from trtllm_testing import fake_tensorrt_llm

    results = []
    with fake_tensorrt_llm(), tempfile.TemporaryDirectory(prefix="pump-bench-") as tmp:
        install_trivial_model(args.step_us)
        engine_dir = build_engine_dir(Path(tmp) / "engine", max(levels), 64 + args.tokens)
        for conc in levels:
            rounds = []
            for r in range(max(1, args.rounds)):
                res = asyncio.run(run_level(engine_dir, conc, args.tokens, args.seconds, args.warmup))
                rounds.append(res)
                t = res["thread_cpu_cores"]
                print(
                    f"  concurrency {conc} round {r + 1}: {res['tokens_per_s']:,.0f} tok/s, "
                    f"{res['outputs_per_s']:,.0f} outputs/s ({res['tokens_per_output'] or 0:.2f} tok/output), "
                    f"cpu: executor {t['executor_step_thread'] or 0:.2f}, pump {t['pump_thread'] or 0:.2f}, "
                    f"loop {t['event_loop'] or 0:.2f}, process {res['process_cpu_cores']:.2f}, "
                    f"{res['errors']} errors",
                    file=sys.stderr,
                    flush=True,
                )
            best = sorted(rounds, key=lambda x: x["tokens_per_s"])[(len(rounds) - 1) // 2]
            best["all_rounds"] = [x["tokens_per_s"] for x in rounds]
            results.append(best)
    print(
        f"{'conc':>5} {'tok/s':>10} {'outputs/s':>10} {'tok/out':>8} {'exec cpu':>9} {'pump cpu':>9} "
        f"{'loop cpu':>9} {'proc cpu':>9}"
    )
    for res in results:
        t = res["thread_cpu_cores"]
        print(
            f"{res['concurrency']:>5} {res['tokens_per_s']:>10,.0f} {res['outputs_per_s']:>10,.0f} "
            f"{res['tokens_per_output'] or 0:>8.2f} {t['executor_step_thread'] or 0:>9.2f} "
            f"{t['pump_thread'] or 0:>9.2f} {t['event_loop'] or 0:>9.2f} {res['process_cpu_cores']:>9.2f}"
        )
    verdict = None
    for res in results:
        if res["concurrency"] == TARGET_CONCURRENCY:
            ok = res["tokens_per_s"] >= TARGET_TOKENS_PER_S and res["errors"] == 0
            verdict = (
                f"target at {TARGET_CONCURRENCY} requests: {res['tokens_per_s']:,.0f} tok/s to asyncio consumers "
                f"(want >= {TARGET_TOKENS_PER_S:,}): {'MET' if ok else 'NOT MET'}"
            )
            print(verdict)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "kind": "lmi-trt-pump-bench",
                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "command": " ".join(
                        [sys.executable, *(sys.argv if argv is None else ["benchmarks/pump_bench.py", *argv])]
                    ),
                    "machine": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "platform": platform.platform(),
                    },
                    "tree": str(args.tree.resolve()),
                    "lmi_trt": str(Path(sys.modules["lmi_trt"].__file__).parent),
                    "target": verdict,
                    "levels": results,
                },
                indent=2,
            )
        )
    return 0 if all(r["errors"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
