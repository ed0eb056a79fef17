#!/usr/bin/env python
"""lmi-trt (synthetic engine) against the bare aiohttp baseline, under the same load.

Starts two servers, each one process pinned with taskset to the same single core (when the
host allows more than one CPU and has taskset): benchmarks/bare_server.py, and
``python -m lmi_trt serve --engine synthetic -o option.synthetic_tokens_per_second=1e9``
(tokens as fast as possible; pass another rate in --serve-args to override). The client runs
in this process (or --client-procs processes) pinned to the other cores. For each
concurrency level (and round), the same pre-encoded requests go to the bare server and then
to ours; the table shows both, and ours as a ratio of the bare baseline.

The issue's target (reported, not asserted): at 256 concurrent streams, ≥ 20,000 streamed
output tokens/s through lmi-trt and ≥ 0.5 × the bare baseline of the same run.

    python benchmarks/compare.py --concurrency 1,16,64,256 --output-tokens 256 \\
        --json compare.json --plot compare.png
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from lmi_trt import bench  # noqa: E402

TARGET_CONCURRENCY = 256
TARGET_TOKENS_PER_S = 20_000
TARGET_RATIO = 0.5
# The synthetic engine's step period is 1/rate; at this rate it never sleeps (as fast as possible).
AS_FAST_AS_POSSIBLE = 1_000_000_000


def default_model_dir() -> Path:
    """The tests' tiny llama folder (a tokenizer is all the synthetic engine needs)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import tiny_model

    return tiny_model("llama")


def ratio_rows(bare: list[dict], ours: list[dict]) -> list[list[str]]:
    f = bench._fmt
    rows = [["conc", "bare tok/s", "lmi-trt tok/s", "ratio", "bare TTFT p50", "lmi-trt TTFT p50/p99 ms",
             "lmi-trt ITL p50/p99 ms", "err b/o", "cli cpu b/o", "srv cpu b/o"]]
    for b, o in zip(bare, ours):
        ratio = (o["output_tokens_per_s"] / b["output_tokens_per_s"]) if b["output_tokens_per_s"] else None
        rows.append([
            str(o["concurrency"]), f(b["output_tokens_per_s"]), f(o["output_tokens_per_s"]),
            f(ratio, 3) if ratio is not None else "-", f(b["ttft_ms"]["p50"]),
            f"{f(o['ttft_ms']['p50'])}/{f(o['ttft_ms']['p99'])}",
            f"{f(o['itl_ms']['p50'], 2)}/{f(o['itl_ms']['p99'], 2)}",
            f"{b['errors']}/{o['errors']}",
            f"{f(b['client_cpu_cores'], 2)}/{f(o['client_cpu_cores'], 2)}",
            f"{f(b['server_cpu_cores'], 2)}/{f(o['server_cpu_cores'], 2)}",
        ])
    return rows


def target_verdict(bare: list[dict], ours: list[dict]) -> str | None:
    for b, o in zip(bare, ours):
        if o["concurrency"] != TARGET_CONCURRENCY:
            continue
        tps = o["output_tokens_per_s"]
        ratio = tps / b["output_tokens_per_s"] if b["output_tokens_per_s"] else 0.0
        ok = tps >= TARGET_TOKENS_PER_S and ratio >= TARGET_RATIO and o["errors"] == 0
        return (f"target at {TARGET_CONCURRENCY} streams: {tps:,.0f} tok/s (want >= {TARGET_TOKENS_PER_S:,}), "
                f"{ratio:.3f} x bare (want >= {TARGET_RATIO}), {o['errors']} errors: {'MET' if ok else 'NOT MET'}")
    return None


def best_of(rounds: list[list[dict]]) -> list[dict]:
    """Per level, the round with the highest output tokens/s."""
    return [max(levels, key=lambda r: r["output_tokens_per_s"]) for levels in zip(*rounds)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="tokenizer folder for our server (default: the tests' tiny llama)")
    ap.add_argument("--serve-args", default="",
                    help="extra `lmi-trt serve` arguments, e.g. \"-o option.synthetic_tokens_per_second=50\"")
    ap.add_argument("--serve-cmd", help="command instead of `python -m lmi_trt serve` (e.g. \"lmi-trt serve\")")
    ap.add_argument("--bare-args", default="", help="extra bare_server.py arguments, e.g. \"--loop uvloop\"")
    ap.add_argument("--server-cpus", help="CPUs for each server (default: the first allowed CPU)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers or client")
    ap.add_argument("--rounds", type=int, default=1, help="alternate bare/ours this many times; best of per level")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", type=Path, help="server logs go here (default: a temporary folder)")
    ap.add_argument("--json", metavar="FILE", help="write both series, the ratios and the setup")
    ap.add_argument("--plot", metavar="FILE.png", help="tokens/s of both vs concurrency, with the ratio")
    bench.add_load_arguments(ap)
    ap.set_defaults(concurrency=bench.parse_concurrency(bench.DEFAULT_CONCURRENCY),
                    output_tokens=bench.LengthDist(256, 256))
    args = ap.parse_args(argv)
    cfg = bench.config_from_args(args)

    server_cpus, client_cpus = (None, None) if args.no_pin else bench.default_pinning()
    if args.server_cpus:
        server_cpus = bench.parse_cpus(args.server_cpus)
    if cfg.client_cpus:
        client_cpus = cfg.client_cpus
    cfg.client_cpus = client_cpus
    if client_cpus and not args.no_pin:
        import os

        os.sched_setaffinity(0, set(client_cpus))

    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="lmi-trt-compare-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    model_dir = args.model_dir or default_model_dir()

    bare_port, ours_port = bench.free_port(), bench.free_port()
    bare = bench.ServerProcess([sys.executable, str(HERE / "bare_server.py"), "--port", str(bare_port),
                                *shlex.split(args.bare_args)], bare_port, cpus=server_cpus, name="bare server",
                               log_path=out_dir / "bare_server.log")
    serve_args = f"--engine synthetic --model-dir {shlex.quote(str(model_dir))} {args.serve_args}"
    if "synthetic_tokens_per_second" not in serve_args:
        serve_args += f" -o option.synthetic_tokens_per_second={AS_FAST_AS_POSSIBLE}"
    ours_argv = bench.serve_argv(serve_args, ours_port, args.serve_cmd)
    ours = bench.ServerProcess(ours_argv, ours_port, cpus=server_cpus, name="lmi-trt serve",
                               log_path=out_dir / "lmi_trt_serve.log")
    print(f"bare:    {shlex.join(bare.argv)}", file=sys.stderr)
    print(f"lmi-trt: {shlex.join(ours.argv)}", file=sys.stderr)
    print(f"client:  cpus {client_cpus or 'any'}, {cfg.client_procs} process(es); logs in {out_dir}", file=sys.stderr)

    rounds_bare: list[list[dict]] = []
    rounds_ours: list[list[dict]] = []
    try:
        bare.start()
        ours.start()
        bare.wait_ready(args.start_timeout)
        ours.wait_ready(args.start_timeout)
        model = cfg.model or (bench.openai_model_name(ours.url) if cfg.api == "openai" else "model")
        wl = cfg.workload(model)
        for r in range(max(1, args.rounds)):
            rb, ro = [], []
            for conc in cfg.concurrency:
                b = bench.run_series(bare.url, cfg, wl, conc, bare.pid)
                o = bench.run_series(ours.url, cfg, wl, conc, ours.pid)
                rb.append(b)
                ro.append(o)
                ratio = o["output_tokens_per_s"] / b["output_tokens_per_s"] if b["output_tokens_per_s"] else 0.0
                print(f"  round {r + 1} concurrency {conc}: bare {b['output_tokens_per_s']:,.0f} tok/s, "
                      f"lmi-trt {o['output_tokens_per_s']:,.0f} tok/s, ratio {ratio:.3f}", file=sys.stderr, flush=True)
            rounds_bare.append(rb)
            rounds_ours.append(ro)
    finally:
        ours.stop()
        bare.stop()

    bare_levels, ours_levels = best_of(rounds_bare), best_of(rounds_ours)
    print(bench._render(ratio_rows(bare_levels, ours_levels)))
    verdict = target_verdict(bare_levels, ours_levels)
    if verdict:
        print(verdict)
    for w in bench.client_warnings(bare_levels):
        print("note (bare): " + w)
    for w in bench.client_warnings(ours_levels):
        print("note (lmi-trt): " + w)
    if args.json:
        bench.write_json(args.json, {
            "kind": "lmi-trt-compare", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
            "servers": {"bare": shlex.join(bare.argv), "lmi-trt": shlex.join(ours.argv)},
            "client_cpus": client_cpus, "server_cpus": server_cpus, "config": bench._config_doc(cfg, wl),
            "machine": bench.machine_facts(), "rounds": args.rounds,
            "ratio": {str(o["concurrency"]): (o["output_tokens_per_s"] / b["output_tokens_per_s"]
                                              if b["output_tokens_per_s"] else None)
                      for b, o in zip(bare_levels, ours_levels)},
            "target": verdict, "bare": bare_levels, "lmi-trt": ours_levels,
            "all_rounds": {"bare": rounds_bare, "lmi-trt": rounds_ours},
        })
    if args.plot:
        bench.plot_throughput(args.plot, {"bare aiohttp": bare_levels, "lmi-trt synthetic": ours_levels},
                              title=f"{cfg.api} stream, output {wl.output_dist} tokens, one server core",
                              ratio_of=("lmi-trt synthetic", "bare aiohttp"))
    return 1 if any(r["ok"] == 0 for r in bare_levels + ours_levels) else 0


if __name__ == "__main__":
    sys.exit(main())
