"""The built-in decode loop's paged KV cache on a GPU (issue 30), in one process and one command.

The ~1.1B Llama-shaped bf16 random-weight model of gpu_torch.py / gpu_decode.py; every request
greedy, ignore_eos, all submitted at once through TorchEngine's engine protocol (no HTTP). Engines
have the issue's 4,096-position limits (max_input_len 3968 + max_output_len 128) and cut prompts
into chunks (option.enable_chunked_context), so option.max_num_tokens bounds every step.

  (a) 256 streams of 1,024 prompt + 128 output tokens, and of 128 + 128 (the ITL reference), at
      each option.max_num_tokens in --budgets (the step budget decode tokens and prompt chunks share):
      tok/s, TTFT p50/p99, ITL p50/p90/p99, and the loop's step counts;
  (b) 64 streams of one shared 1,024-token prefix + distinct 64-token suffixes, 32 output tokens:
      TTFT without prefix caching, then with option.enable_kv_cache_reuse on a cold cache (the first
      request computes the prefix, the others reuse it in the same step) and warm (a second round);
      plus (a)'s 1,024 + 128 with caching on (distinct prompts). Identical outputs are checked in
      fp32 (16 of the shared-prefix streams, caching off, then on): in bf16 a reused prefix's keys
      come from a matmul over another batch than a recomputed one's, and near-ties of the random
      weights flip with such roundings (the bf16 rows are compared too, for the record);
  (c) --c-streams streams (1,024) of 128 + 128 with max_rolling_batch_size as large and the pool
      capped at --c-pool full-length sequences (96 × 4,096 positions): how many streams ran at once
      (the loop's peak, also on /metrics as lmi_engine_peak_running_requests) against how many
      sequences of the full 4,096 positions the pool holds, and preemptions.

--profile also runs each budget's long workload again under torch.profiler (CUDA activity only):
the device's busy time against the wall time, and the kernels that took it; at the first budget
also under torch.profiler with CPU activity (the host's operators and CUDA calls) and under
cProfile in the decode loop's thread.

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/gpu_paged.py --json gpu_paged.json [--profile]

--smoke runs the same on the CPU with a tiny random model and small counts (checks the script).
The JSON is written after every workload; a short table of the issue's targets is printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import logging
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import torch
from gpu_decode import stream, summary
from gpu_torch import build_model, prompts

# The issue's figures for today's loop (through HTTP, H100): 1,024 + 128 at 256 streams.
BASELINE_TOK_S = 12_734


class KvLog(logging.Handler):
    """Keeps the decode loop's start-up line (the pool's size, and what set it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "KV cache of" in message:
            self.lines.append(message)

    @classmethod
    def attached(cls) -> KvLog:
        """One listening to the decode loop's logger (at INFO)."""
        handler = cls()
        logger = logging.getLogger("lmi_trt.engines.torch.decode_loop")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        return handler


async def run_batch(
    engine,
    batch: list[list[int]],
    out_tokens: int,
    tag: str,
    profile: str | None = None,
    adapters: list[str | None] | None = None,
) -> dict:
    """The requests at once (row i with LoRA adapter ``adapters[i]`` where given); ``profile``: "device"
    (torch.profiler, CUDA activity: busy time and kernels), "host" (CPU and CUDA activity: the host's operators
    and CUDA calls by their own time) or "python" (cProfile in the decode loop's thread: its functions by their
    own time)."""
    backend = engine._backend
    peaks = ("peak_rows", "largest_step")  # maxima, reset per workload; the other counters are totals
    for name in peaks:
        backend.counters[name] = 0
    before = dict(backend.counters)
    profiler = python = None
    if profile in ("device", "host"):
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if profile == "host" else [])
        extra = {}
        if profile == "host":  # the loop's own thread, and the CUDA calls that wait for the device
            try:
                config = torch._C._profiler._ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=True)
                extra = {"experimental_config": config}
            except (AttributeError, TypeError):  # a torch without them: the CUDA runtime calls still show
                pass
        profiler = torch_profile(activities=activities, **extra)
        profiler.__enter__()
    elif profile == "python":
        python = cProfile.Profile()
        iterate = backend._iterate

        def traced() -> None:  # enabled in the loop's own thread: cProfile follows one thread
            python.enable()
            try:
                iterate()
            finally:
                python.disable()

        backend._iterate = traced
    t0 = time.perf_counter()
    named = adapters or [None] * len(batch)
    runs = await asyncio.gather(
        *(stream(engine, f"{tag}{i}", ids, out_tokens, named[i]) for i, ids in enumerate(batch))
    )
    seconds = time.perf_counter() - t0
    if profiler is not None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        profiler.__exit__(None, None, None)
    if python is not None:
        del backend._iterate
    ttfts = [times[0] - t0 for _, times in runs]
    itls = [b - a for _, times in runs for a, b in zip(times, times[1:])]
    result = summary(sum(len(g) for g, _ in runs), seconds, ttfts, itls)
    result["streams"] = len(batch)
    result["loop"] = {k: v if k in peaks else v - before[k] for k, v in backend.counters.items()}
    result["generated"] = [g for g, _ in runs]
    try:
        if profile == "device":
            result["profile"] = device_time(profiler, seconds)
        elif profile == "host":
            result["profile"] = host_time(profiler)
        elif profile == "python":
            text = io.StringIO()
            stats = pstats.Stats(python, stream=text)
            stats.sort_stats("tottime").print_stats(35)
            stats.sort_stats("cumulative").print_stats(25)
            result["profile"] = {"text": text.getvalue()}
    except Exception as exc:  # noqa: BLE001 - a profiler that reports otherwise: the run still counts
        result["profile"] = {"error": repr(exc)}
    return result


def device_time(profiler, seconds: float) -> dict:
    """The kernels' busy time (their intervals' union) against the wall time, and the top kernels."""
    kernels = [e for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy, end = 0.0, float("-inf")
    for start, stop in sorted((e.time_range.start, e.time_range.end) for e in kernels):
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    names: dict[str, list[float]] = {}
    for e in kernels:
        names.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    top = sorted(names.items(), key=lambda kv: -sum(kv[1]))[:20]
    return {
        "wall_s": seconds,
        "device_busy_s": busy / 1e6,
        "kernels": len(kernels),
        "top": [{"kernel": name[:120], "count": len(t), "ms": sum(t) / 1e3} for name, t in top],
    }


def host_time(profiler) -> dict:
    """The host-side operators and CUDA runtime calls that took the most time of their own."""
    events = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:40]
    return {"top": [{"op": e.key[:100], "count": e.count, "self_ms": e.self_cpu_time_total / 1e3} for e in events]}


async def session(
    model_dir: Path,
    device: str,
    settings: dict,
    workloads,
    log: KvLog,
    dtype: str | None = None,
    profile: tuple[str, ...] = (),
) -> dict:
    """One engine: start it, warm it up, run each (name, prompts, output tokens[, repetitions: the
    the median run counts]), close it. ``workloads`` may be a coroutine function of the engine that
    returns them (it may run workloads of its own first); "long" runs again under each profiler
    named in ``profile`` (run_batch)."""
    from lmi_trt.engines.torch import TorchEngine

    started = time.perf_counter()
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    engine = TorchEngine(model_dir, dtype=dtype, device=device, decode_loop="builtin", **settings)
    await engine.start()
    out: dict = {"settings": settings, "startup_s": time.perf_counter() - started, "kv_cache": log.lines[-1]}
    try:
        vocab = engine._vocab_size
        await run_batch(engine, prompts(8, 32, seed=99, vocab=vocab), 8, "warm")  # graphs, allocator, kernels
        if callable(workloads):
            workloads = await workloads(engine)
        for name, batch, out_tokens, *more in workloads:  # [repetitions[, each row's LoRA adapter]]
            reps, adapters = (more + [None, None])[:2]
            runs = [
                await run_batch(engine, batch, out_tokens, f"{name}.{r}.", adapters=adapters) for r in range(reps or 1)
            ]
            # The median run's figures (TTFT, ITL, the loop's counters) with its tok/s (of an even number of
            # runs, the faster middle one), not the first run's, which may include compiling kernels for the
            # workload's shapes.
            out[name] = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
            if reps:
                out[name]["tok_s_runs"] = [r["tok_s"] for r in runs]
            brief = {k: round(v, 1) for k, v in out[name].items() if isinstance(v, float)}
            loop = {k: round(v, 3) if isinstance(v, float) else v for k, v in out[name]["loop"].items()}
            print(f"  {name}: {brief} loop={loop}", flush=True)
            for mode in profile if name == "long" and device == "cuda" else ():
                traced = await run_batch(engine, batch, out_tokens, f"{name}.{mode}.", profile=mode)
                out[f"{name}_{mode}_profile"] = {k: v for k, v in traced.items() if k != "generated"}
                show_profile(name, mode, traced)
        out["stats"] = engine.stats().extra
    finally:
        await engine.close()
    engine = None
    gc.collect()  # the loop's graphs and cache, before the next engine sizes its pool from free memory
    if device == "cuda":
        torch.cuda.empty_cache()
    out["wall_s"] = time.perf_counter() - started
    return out


def show_profile(name: str, mode: str, traced: dict) -> None:
    p = traced["profile"]
    print(f"  {name} again, {mode} profile: {traced['tok_s']:,.0f} tok/s, loop={traced['loop']}", flush=True)
    if "error" in p:
        print(f"    {p['error']}", flush=True)
    elif mode == "device":
        print(f"    device busy {p['device_busy_s']:.3f} s of {p['wall_s']:.3f} s, {p['kernels']} kernels", flush=True)
        for row in p["top"]:
            print(f"    {row['ms']:9.1f} ms {row['count']:6d}× {row['kernel']}", flush=True)
    elif mode == "host":
        for row in p["top"]:
            print(f"    {row['self_ms']:9.1f} ms {row['count']:7d}× {row['op']}", flush=True)
    else:
        print(p["text"], flush=True)


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    def common(x: list[int], y: list[int]) -> int:
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        return k

    return {
        "rows": len(a),
        "rows_identical": sum(x == y for x, y in zip(a, b)),
        "first_tokens_identical": sum(x[:1] == y[:1] for x, y in zip(a, b)),
        "mean_common_prefix": statistics.mean(common(x, y) for x, y in zip(a, b)),
    }


def targets(report: dict) -> list[tuple[str, str, str]]:
    """(target, figure, verdict) rows for the issue's targets: (a) at every budget, (b) and (c)
    at the first."""
    rows = []
    shapes = report["shapes"]
    for a in report["a"]:
        long, short, budget = a["long"], a["short"], a["settings"]["max_num_tokens"]
        rows.append(
            (
                f"(a) {shapes['long'][0]:,}+{shapes['long'][1]} @ {long['streams']}, "
                f"budget {budget}: ≥ 2 × {BASELINE_TOK_S:,} tok/s",
                f"{long['tok_s']:,.0f} tok/s ({long['tok_s'] / BASELINE_TOK_S:.2f} ×)",
                "met" if long["tok_s"] >= 2 * BASELINE_TOK_S else "not met",
            )
        )
        rows.append(
            (
                f"(a) budget {budget}: ITL p90 ≤ 2 × the {shapes['short'][0]}+{shapes['short'][1]} workload's",
                f"{long['itl_p90_ms']:.1f} ms vs {short['itl_p90_ms']:.1f} ms "
                f"({long['itl_p90_ms'] / short['itl_p90_ms']:.2f} ×)",
                "met" if long["itl_p90_ms"] <= 2 * short["itl_p90_ms"] else "not met",
            )
        )
    b = report["b"]
    off, cold, warm = b["off"]["shared"], b["on"]["cold"], b["on"]["warm"]
    ratio = cold["ttft_p50_ms"] / off["ttft_p50_ms"]
    rows.append(
        (
            "(b) TTFT p50 with caching ≤ 0.5 × without",
            f"{cold['ttft_p50_ms']:.0f} ms cold, {warm['ttft_p50_ms']:.0f} ms warm vs {off['ttft_p50_ms']:.0f} ms "
            f"({ratio:.2f} ×)",
            "met" if ratio <= 0.5 else "not met",
        )
    )
    exact, bf16 = b["fp32_cold_vs_off"], b["cold_vs_off"]
    rows.append(
        (
            "(b) identical outputs (fp32; caching on vs off)",
            f"{exact['rows_identical']}/{exact['rows']} rows identical in fp32 "
            f"(bf16: {bf16['rows_identical']}/{bf16['rows']}, {bf16['first_tokens_identical']} first tokens, "
            f"{bf16['mean_common_prefix']:.1f} tokens in common on average)",
            "met" if exact["rows_identical"] == exact["rows"] else "not met",
        )
    )
    c = report["c"]
    rows.append(
        (
            "(c) streams at once set by tokens in use",
            f"{c['peak_running']} running at once (/metrics: {c['metrics_peak']:.0f}), {c['preemptions']} preempted; "
            f"the pool holds {c['pool_tokens']:,} tokens = {c['full_length_sequences']} sequences of "
            f"{c['max_positions']:,} positions",
            "met" if c["peak_running"] > c["full_length_sequences"] else "not met",
        )
    )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where the results go")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny random model, small counts")
    ap.add_argument("--budgets", default="2048,8192", help="option.max_num_tokens values for (a)")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--c-streams", type=int, default=1024)
    ap.add_argument("--c-pool", type=int, default=96, help="(c)'s pool in sequences of the full length")
    ap.add_argument("--profile", action="store_true", help="each budget's long workload again, profiled")
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args()
    clock = time.perf_counter()
    log = KvLog.attached()
    if a.smoke:
        device, n, c_streams, long_prompt, short_prompt, out_tokens = "cpu", 8, 24, 64, 16, 8
        prefix_len, suffix_len, shared_out, shared_streams, positions = 64, 8, 4, 8, 256
        budgets, shape, vocab = [64, 128], {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}, 512
        shape |= {"intermediate_size": 128, "vocab_size": vocab}
        c_pool, exact_streams = 4, 4
        torch.set_num_threads(1)
    else:
        device, n, c_streams, long_prompt, short_prompt, out_tokens = "cuda", a.streams, a.c_streams, 1024, 128, 128
        prefix_len, suffix_len, shared_out, shared_streams, positions = 1024, 64, 32, 64, 4096
        budgets, shape, vocab = [int(x) for x in a.budgets.split(",")], {}, 32000
        c_pool, exact_streams = a.c_pool, 16
    limits = {"max_input_len": positions - out_tokens, "max_new_tokens": out_tokens}
    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shapes": {
            "long": [long_prompt, out_tokens],
            "short": [short_prompt, out_tokens],
            "shared": [prefix_len, suffix_len, shared_out],
            "max_positions": positions,
        },
    }

    def save() -> None:
        a.json.write_text(json.dumps(report, indent=2))

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        report["weight_bytes"] = build_model(
            model_dir, layers=2 if a.smoke else a.layers, dtype=dtype, device=device, **shape
        )
        long_batch = prompts(n, long_prompt, seed=1, vocab=vocab)
        short_batch = prompts(n, short_prompt, seed=2, vocab=vocab)
        prefix = prompts(1, prefix_len, seed=3, vocab=vocab)[0]
        shared = [prefix + s for s in prompts(shared_streams, suffix_len, seed=4, vocab=vocab)]
        # Chunked prompts: the budget bounds every step, below max_input_len too.
        base = {"max_batch_size": n, **limits, "enable_chunked_context": True}

        print("(a) long prompts mixed into decode steps; (b) without prefix caching", flush=True)
        report["a"] = []
        for i, budget in enumerate(budgets):
            workloads = [("short", short_batch, out_tokens), ("long", long_batch, out_tokens)]
            if i == 0:
                workloads.append(("shared", shared, shared_out))
            profile = (("device", "host", "python") if i == 0 else ("device",)) if a.profile else ()
            settings = base | {"max_num_tokens": budget}
            result = asyncio.run(session(model_dir, device, settings, workloads, log, profile=profile))
            report["a"].append(result)
            save()

        print("(b) with prefix caching", flush=True)
        cached = base | {"max_num_tokens": budgets[0], "enable_kv_cache_reuse": True}
        workloads = [("cold", shared, shared_out), ("warm", shared, shared_out), ("long", long_batch, out_tokens)]
        on = asyncio.run(session(model_dir, device, cached, workloads, log))
        off = report["a"][0]
        # Identity where roundings cannot flip near-ties: the same requests in fp32, off then on.
        exact = [("shared", shared[:exact_streams], shared_out)]
        fp32 = {
            caching: asyncio.run(
                session(model_dir, device, cached | {"enable_kv_cache_reuse": caching}, exact, log, dtype="fp32")
            )
            for caching in (False, True)
        }
        report["b"] = {
            "off": {"shared": off["shared"]},
            "on": on,
            "cold_vs_off": agreement(on["cold"]["generated"], off["shared"]["generated"]),
            "warm_vs_off": agreement(on["warm"]["generated"], off["shared"]["generated"]),
            "long_cached_vs_off": agreement(on["long"]["generated"], off["long"]["generated"]),
            "fp32_cold_vs_off": agreement(fp32[True]["shared"]["generated"], fp32[False]["shared"]["generated"]),
            "fp32_prefix_cache_hits": fp32[True]["shared"]["loop"]["prefix_cache_hits"],
        }
        print(f"  fp32, caching on vs off: {report['b']['fp32_cold_vs_off']}", flush=True)
        save()

        print(f"(c) {c_streams} streams with {positions:,}-position limits, a pool of {c_pool} of them", flush=True)
        many = prompts(c_streams, short_prompt, seed=5, vocab=vocab)
        settings = base | {
            "max_batch_size": c_streams,
            "max_num_tokens": max(budgets),
            "max_tokens_in_paged_kv_cache": c_pool * positions,
        }
        c = asyncio.run(session(model_dir, device, settings, [("run", many, out_tokens)], log))
        stats = c["stats"]
        pool_tokens = int(stats["kv_cache_max_blocks"] * stats["kv_cache_block_size"])
        report["c"] = {
            "session": c,
            "run": c["run"],
            "peak_running": c["run"]["loop"]["peak_rows"],
            "metrics_peak": stats["peak_running_requests"],  # what /metrics exports
            "preemptions": c["run"]["loop"]["num_preemptions"],
            "pool_tokens": pool_tokens,
            "max_positions": positions,
            "full_length_sequences": pool_tokens // positions,
            "slots_times_max_length_tokens": c_streams * positions,
        }
        save()

    for part in report["a"] + [on, c, *fp32.values()]:
        for value in part.values():
            if isinstance(value, dict):
                value.pop("generated", None)
    report["wall_s"] = time.perf_counter() - clock
    report["targets"] = targets(report)
    save()
    print(f"\n{report['device']}, {report['wall_s']:.0f} s; KV pools: " + " | ".join(log.lines), flush=True)
    print("| workload | budget | tok/s | TTFT p50 / p99 ms | ITL p50 / p90 / p99 ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for part in report["a"]:
        for name in ("short", "long"):
            r = part[name]
            print(
                f"| {name} ({r['streams']} streams) | {part['settings']['max_num_tokens']} | {r['tok_s']:,.0f} | "
                f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
                f"{r['itl_p50_ms']:.1f} / {r['itl_p90_ms']:.1f} / {r['itl_p99_ms']:.1f} |"
            )
    print_targets(report["targets"])


def print_targets(rows: list[tuple[str, str, str]]) -> None:
    print("\n| target | figure | |")
    print("| --- | --- | --- |")
    for target, figure, verdict in rows:
        print(f"| {target} | {figure} | {verdict} |")


if __name__ == "__main__":
    main()
