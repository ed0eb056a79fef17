#!/usr/bin/env python
"""The built-in decode loop's host cost per decode step, without a GPU.

The real ``TorchEngine`` with the built-in loop (lmi_trt/engines/torch/decode_loop.py) serves the tiny
Llama of tests/tinymodels.py on CPU: ``--concurrency`` greedy streams (ignore_eos) of ``--prompt`` +
``--tokens`` tokens, as benchmarks/gpu_decode.py runs them on a GPU. Only the device work of a decode
step is gone: ``_decode_step`` (the forward pass and the sampler, one CUDA-graph replay on a GPU) is
replaced by nothing, and before each decode step its output buffer is given each row's next token of an
ordinary continuation (one that repeats nothing of its prompt or of itself: the prompt's run of consecutive
ids, continued); planning, the decode step's input preparation, the hand-over of its tokens and their
emission run the real code. Prefill steps run for real. ``--speculative ngram`` serves them with n-gram
speculation (benchmarks/gpu_spec.py's: 6 draft tokens, the default max_concurrency), whose drafts find
nothing to repeat: what speculation costs the host where it does not pay (gpu_spec.py's ``ordinary_64``
runs with ``--max-num-tokens 2048``, its engine's budget: prompts admitted over four steps).

Reported per decode step, and per row of it: host µs planning (``plan_s``, the loop's counter), launching
a decode step (``_launch_decode`` less the stubbed device step) and emitting a decode step's tokens
(``_emit``). Per step with prompt tokens (prefill and mixed steps, eager on a GPU too): planning, launching
less the forward pass (``_launch_mixed``'s packing, uploads, sampler, copies), emitting, and the forward
pass's own CPU time (compute here; its ~200 kernel launches on a GPU), with the number of torch operations
the step dispatches outside the forward pass (each one a kernel launch or copy on a GPU). For the whole run:
the loop thread's CPU and the event loop's (the main thread: 256 consumers turning outputs into tokens),
per output token. With ``--profile N`` the top N functions of the loop thread by own time (cProfile).

``--trees OLD,NEW`` runs this script once per tree and round, interleaved, each with that tree first on
``PYTHONPATH`` (a folder holding an ``lmi_trt``), and prints the medians side by side.

    python benchmarks/loop_host.py                          # 256 and 64 streams
    python benchmarks/loop_host.py -c 256 --profile 25 --json loop_host.json
    git archive main lmi_trt | tar -x -C /tmp/before        # the version to compare against
    python benchmarks/loop_host.py -c 256 --trees /tmp/before,$PWD --rounds 5
    python benchmarks/loop_host.py -c 64 --max-num-tokens 2048 --speculative off,ngram --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

from interleaved import interleaved

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


class _Ops:
    """Counts the aten operations a step dispatches, inside and outside the forward pass (loop thread only)."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.counts[counter.bucket] += 1
                return func(*args, **(kwargs or {}))

        self.mode, self.bucket = Mode, "outside"
        self.counts = {"outside": 0, "forward": 0}
        self.steps = 0


async def measure(
    model_dir: Path, n: int, prompt: int, tokens: int, max_num_tokens: int, profile: int, speculative: str = "off"
) -> dict:
    import torch

    from lmi_trt.engines.torch import TorchEngine
    from lmi_trt.speculative import Speculation

    spec = Speculation(method="ngram", max_draft_len=6) if speculative == "ngram" else None

    torch.set_num_threads(1)
    engine = TorchEngine(
        model_dir,
        max_batch_size=n,
        max_input_len=prompt,
        max_new_tokens=tokens,
        max_num_tokens=max_num_tokens,
        decode_loop="builtin",
        speculative=spec,
    )
    await engine.start()
    backend = engine._backend
    assert type(backend).__name__ == "DecodeLoopBackend", engine.batching
    # Per phase of a decode step (and of a step with prompt tokens): wall seconds (with waits for the GIL,
    # which the event loop holds while it turns outputs into responses) and the loop thread's own CPU
    # seconds; and how many steps.
    phases = ("plan", "launch", "emit", "prefill_plan", "prefill_launch", "prefill_forward", "prefill_emit")
    spent = {phase: [0.0, 0.0, 0] for phase in (*phases, "propose")}
    loop_cpu = [0.0]  # the loop thread's CPU in _iterate
    profiling: list[cProfile.Profile] = []  # set once the warm-up is over
    ops: list[_Ops] = [_Ops()]  # counting during the warm-up round only (it slows what it counts)

    def timed(real, phase_of):
        def call(arg):
            wall, cpu = time.perf_counter(), time.thread_time()
            out = real(arg)
            phase = phase_of(arg, out)
            if phase:
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
        cpu = time.thread_time()
        if profiling:
            profiling[0].enable()
        try:
            return real()
        finally:
            if profiling:
                profiling[0].disable()
            loop_cpu[0] += time.thread_time() - cpu

    def forward(batch, real=backend._decoder.forward):
        wall, cpu = time.perf_counter(), time.thread_time()
        if ops:
            ops[0].bucket = "forward"
        try:
            return real(batch)
        finally:
            if ops:
                ops[0].bucket = "outside"
            record = spent["prefill_forward"]
            record[0] += time.perf_counter() - wall
            record[1] += time.thread_time() - cpu
            record[2] += 1

    def mixed(step, real=backend._launch_mixed):
        if not ops:
            return real(step)
        ops[0].steps += 1
        with ops[0].mode():
            return real(step)

    backend._decode_step = lambda *args, **kwargs: None  # the device's work: a graph replay on a GPU
    stub_cpu = [0.0]  # the loop thread's CPU writing the stub's tokens (not the loop's: taken off its figure)

    def ordinary(rows, real):
        """Each row's next token, where the stubbed step would have put it: the prompt's run of ids continued
        (``batch`` below: no id twice in a row's prompt and continuation)."""
        cpu = time.thread_time()
        index = torch.tensor([r.index for r in rows])
        backend._out[0, index] = torch.tensor([(r.prompt[-1] - 2 + r.launched) % 500 + 3 for r in rows]).float()
        stub_cpu[0] += time.thread_time() - cpu
        return real(rows)

    decode_launches: set[int] = set()
    decode_rows = [0]

    def launched(rows, out) -> str:
        decode_launches.add(id(out))
        decode_rows[0] += len(rows)
        return "launch"

    # _plan reaps first (the loop's own _reap then finds nothing to do): plan_s's two parts, timed as one.
    backend._plan = functools.partial(
        timed(lambda _: plan(), lambda _, step: "prefill_plan" if step.chunks else "plan"), None
    )
    backend._launch_decode = functools.partial(ordinary, real=timed(backend._launch_decode, launched))
    backend._launch_mixed = timed(mixed, lambda *_: "prefill_launch")
    backend._decoder.forward = forward  # the decode step's is stubbed: only steps with prompt tokens run it
    backend._emit = timed(backend._emit, lambda launch, _: "emit" if id(launch) in decode_launches else "prefill_emit")
    backend._iterate = iterate
    # Steps planned or launched after waiting for the steps in flight (speculation needs the newest tokens
    # to draft): on a GPU the device idles while the host plans and launches each of them.
    waits, launching = [0], [False]

    def drain(more, real=backend._drain):
        waits[0] += bool(backend._inflight) and not launching[0]
        return real(more)

    def launching_then(real):
        def call(*args):
            launching[0] = True
            return real(*args)

        return call

    def fresh(real=iterate):
        launching[0] = False
        return real()

    backend._drain = drain
    if spec is not None:  # drafting's host CPU: the n-gram lookups (each row's index built at its first)
        backend._propose = timed(backend._propose, lambda *_: "propose")
    backend._guarded = launching_then(backend._guarded)
    backend._launch_guarded = launching_then(backend._launch_guarded)
    backend._iterate = fresh
    batch = [[1] + [(7 * i + j) % 500 + 3 for j in range(prompt - 1)] for i in range(n)]
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 4) for i, ids in enumerate(batch)))
        counted = ops.pop()
        if profile:
            profiling.append(cProfile.Profile())
        for record in spent.values():
            record[:] = [0.0, 0.0, 0]
        decode_rows[0], loop_cpu[0], stub_cpu[0], waits[0] = 0, 0.0, 0.0, 0
        before = dict(backend.counters)
        t0, main_cpu = time.perf_counter(), time.thread_time()
        got = await asyncio.gather(*(stream(engine, f"r{i}", ids, tokens) for i, ids in enumerate(batch)))
        seconds, main_cpu = time.perf_counter() - t0, time.thread_time() - main_cpu
    finally:
        await engine.close()
    counters = {k: backend.counters[k] - before[k] for k in before}
    steps = counters["decode_steps"]
    rows = decode_rows[0] / max(1, spent["launch"][2])
    total = sum(got)
    result = {
        "speculative": speculative,
        "streams": n,
        "tokens": total,
        "seconds": round(seconds, 3),
        "decode_steps": steps,
        "prefill_steps": counters["prefill_steps"],
        "verify_steps": counters.get("verify_steps", 0),
        "draft_tokens": counters.get("spec_decode_num_draft_tokens", 0),
        "steps_after_a_wait": waits[0],
        "propose_calls": spent["propose"][2],
        "propose_cpu_us": round(1e6 * spent["propose"][1], 1),
        "rows_per_decode_step": round(rows, 1),
    }
    for i, clock in enumerate(("wall", "cpu")):
        per = {phase: round(1e6 * spent[phase][i] / max(1, spent[phase][2]), 1) for phase in phases[:3]}
        per["total"] = round(sum(per.values()), 1)
        result[f"{clock}_us_per_decode_step"] = per
        result[f"{clock}_us_per_row"] = {k: round(v / max(1.0, rows), 3) for k, v in per.items()}
        # Steps with prompt tokens: launch less the forward pass (whose own time is given apart).
        prefill = {phase: spent[f"prefill_{phase}"][i] for phase in ("plan", "launch", "forward", "emit")}
        prefill["launch"] -= prefill["forward"]
        per = {phase: round(1e6 * value / max(1, counters["prefill_steps"]), 1) for phase, value in prefill.items()}
        result[f"{clock}_us_per_prefill_step"] = per
    result["aten_ops_per_prefill_step"] = {k: round(v / max(1, counted.steps)) for k, v in counted.counts.items()}
    # The whole run's host CPU per output token: the loop thread's (less the CPU forward passes, device work
    # on a GPU) and the event loop's.
    result["run_cpu_us_per_token"] = {
        "loop_thread": round(1e6 * (loop_cpu[0] - spent["prefill_forward"][1] - stub_cpu[0]) / total, 2),
        "event_loop": round(1e6 * main_cpu / total, 2),
    }
    if profiling:
        text = io.StringIO()
        pstats.Stats(profiling[0], stream=text).sort_stats("tottime").print_stats(profile)
        result["profile"] = text.getvalue()
    return result


def flat(result: dict, prefix: str = "") -> dict[str, float]:
    """The figures of a result, by dotted name."""
    out: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        elif isinstance(value, int | float):
            out[prefix + key] = value
    return out


def compare(trees: list[str], speculative: list[str], concurrency: str, rounds: int, extra: list[str]) -> None:
    """This script once per round, tree and speculation setting, interleaved, each tree's ``lmi_trt`` first on
    the path; medians."""
    variants = [(tree, spec) for tree in trees for spec in speculative]
    names = [
        " ".join(filter(None, (tree, f"speculative={spec}" if len(speculative) > 1 else ""))) for tree, spec in variants
    ]
    commands = {
        name: (tree, ["-c", concurrency, "--speculative", spec, *extra]) for name, (tree, spec) in zip(names, variants)
    }
    outputs = interleaved(__file__, commands, rounds)
    # Each run prints one JSON line per level of concurrency, last.
    levels = len(concurrency.split(","))
    runs = {
        name: [[json.loads(line) for line in out.splitlines()[-levels:]] for out in outputs[name]] for name in names
    }
    for i, n in enumerate(concurrency.split(",")):
        figures = {name: [flat(run[i]) for run in runs[name]] for name in names}
        print(f"\n{n} streams, median of {rounds} interleaved rounds")
        print("| figure | " + " | ".join(names) + " |")
        print("| --- |" + " ---: |" * len(names))
        for figure in figures[names[0]][0]:
            medians = [statistics.median(f[figure] for f in figures[name]) for name in names]
            print(f"| {figure} | " + " | ".join(f"{m:,.1f}" for m in medians) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--concurrency", default="256,64", help="streams, comma-separated")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--max-num-tokens", type=int, default=8192, help="option.max_num_tokens (gpu_decode.py's)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the loop thread's top N functions")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--trees", help="comma-separated folders holding an lmi_trt: compare them (see above)")
    ap.add_argument(
        "--speculative", default="off", help="off or ngram; both (off,ngram): compare them (as --trees does)"
    )
    ap.add_argument("--rounds", type=int, default=3, help="with --trees or two --speculative: interleaved rounds")
    args = ap.parse_args()
    speculative = args.speculative.split(",")
    if not set(speculative) <= {"off", "ngram"}:
        ap.error(f"--speculative={args.speculative}: use off, ngram or off,ngram")
    if args.trees or len(speculative) > 1:
        compare(
            args.trees.split(",") if args.trees else [""],
            speculative,
            args.concurrency,
            args.rounds,
            [f"--prompt={args.prompt}", f"--tokens={args.tokens}", f"--max-num-tokens={args.max_num_tokens}"],
        )
        return
    from tinymodels import tiny_model

    model_dir = tiny_model("llama")
    results = []
    for n in (int(c) for c in args.concurrency.split(",")):
        result = asyncio.run(
            measure(model_dir, n, args.prompt, args.tokens, args.max_num_tokens, args.profile, speculative[0])
        )
        profile = result.pop("profile", None)
        print(json.dumps(result))
        if profile:
            print(profile)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
