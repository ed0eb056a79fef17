#!/usr/bin/env python
"""lmi-trt (synthetic engine) against the bare aiohttp baseline, under the same load.

Starts two servers, each one process pinned with taskset to the same single core (when the
host allows more than one CPU and has taskset): benchmarks/bare_server.py, and
``python -m lmi_trt serve --engine synthetic -o option.synthetic_tokens_per_second=0``
(tokens as fast as possible: one engine step, one token for every stream, per event-loop
pass, so every delta carries one token, as the bare server writes one event per pass; pass
a per-sequence rate in --serve-args to model a GPU's pace instead). The client runs
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
# 0: the synthetic engine steps once per event-loop pass, never ahead of its consumers (as fast
# as possible, lock-step). Older trees read 1e9 the same way; the current one reads any rate
# below 1e6 tokens/s per sequence as a clock to keep (several tokens per delta when behind).
AS_FAST_AS_POSSIBLE = 0


def default_model_dir() -> Path:
    """The tests' tiny llama folder (a tokenizer is all the synthetic engine needs)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import tiny_model

    return tiny_model("llama")


def per_cpu(level: dict) -> float | None:
    """Output tokens per second of server CPU time: what a shared (noisy) host still measures
    fairly when the servers do not get their core to themselves."""
    cpu = level.get("server_cpu_cores")
    return level["output_tokens_per_s"] / cpu if cpu else None


def ratio_rows(bare: list[dict], ours: list[dict]) -> list[list[str]]:
    f = bench._fmt
    rows = [
        [
            "conc",
            "bare tok/s",
            "lmi-trt tok/s",
            "ratio",
            "tok/cpu-s b/o",
            "cpu ratio",
            "bare TTFT p50",
            "lmi-trt TTFT p50/p99 ms",
            "lmi-trt ITL p50/p99 ms",
            "err b/o",
            "cli cpu b/o",
            "srv cpu b/o",
        ]
    ]
    for b, o in zip(bare, ours):
        ratio = (o["output_tokens_per_s"] / b["output_tokens_per_s"]) if b["output_tokens_per_s"] else None
        pb, po = per_cpu(b), per_cpu(o)
        rows.append(
            [
                str(o["concurrency"]),
                f(b["output_tokens_per_s"]),
                f(o["output_tokens_per_s"]),
                f(ratio, 3) if ratio is not None else "-",
                f"{f(pb)}/{f(po)}",
                f(po / pb, 3) if pb and po else "-",
                f(b["ttft_ms"]["p50"]),
                f"{f(o['ttft_ms']['p50'])}/{f(o['ttft_ms']['p99'])}",
                f"{f(o['itl_ms']['p50'], 2)}/{f(o['itl_ms']['p99'], 2)}",
                f"{b['errors']}/{o['errors']}",
                f"{f(b['client_cpu_cores'], 2)}/{f(o['client_cpu_cores'], 2)}",
                f"{f(b['server_cpu_cores'], 2)}/{f(o['server_cpu_cores'], 2)}",
            ]
        )
    return rows


def target_verdict(bare: list[dict], ours: list[dict]) -> str | None:
    for b, o in zip(bare, ours):
        if o["concurrency"] != TARGET_CONCURRENCY:
            continue
        tps = o["output_tokens_per_s"]
        ratio = tps / b["output_tokens_per_s"] if b["output_tokens_per_s"] else 0.0
        ok = tps >= TARGET_TOKENS_PER_S and ratio >= TARGET_RATIO and o["errors"] == 0
        return (
            f"target at {TARGET_CONCURRENCY} streams: {tps:,.0f} tok/s (want >= {TARGET_TOKENS_PER_S:,}), "
            f"{ratio:.3f} x bare (want >= {TARGET_RATIO}), {o['errors']} errors: {'MET' if ok else 'NOT MET'}"
        )
    return None


def best_of(rounds: list[list[dict]]) -> list[dict]:
    """Per level, the round with the highest output tokens/s."""
    return [max(levels, key=lambda r: r["output_tokens_per_s"]) for levels in zip(*rounds)]


def median_of(rounds: list[list[dict]]) -> list[dict]:
    """Per level, the round with the median output tokens/s (the lower middle one for an even count)."""
    out = []
    for levels in zip(*rounds):
        ordered = sorted(levels, key=lambda r: r["output_tokens_per_s"])
        out.append(ordered[(len(ordered) - 1) // 2])
    return out


def _tps(level: dict) -> float | None:
    return level["output_tokens_per_s"]


def median_ratio(rounds_bare: list[list[dict]], rounds_ours: list[list[dict]], value=_tps) -> list[float | None]:
    """Per level, the median over rounds of value(ours) / value(bare) measured in the same round
    (``value``: output tokens/s, or ``per_cpu``)."""
    out: list[float | None] = []
    for bare, ours in zip(zip(*rounds_bare), zip(*rounds_ours)):
        ratios = sorted(value(o) / value(b) for b, o in zip(bare, ours) if value(b) and value(o))
        if not ratios:
            out.append(None)
            continue
        mid = len(ratios) // 2
        out.append(ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2)
    return out


def parse_variant(text: str) -> tuple[str, str]:
    label, sep, cmd = text.partition("=")
    if not sep or not label.strip() or not cmd.strip():
        raise argparse.ArgumentTypeError(f"--variant wants LABEL=COMMAND, got {text!r}")
    return label.strip(), cmd.strip()


def server_loop() -> str:
    """The event loop `lmi-trt serve` runs on here: uvloop when it is importable (see serving.app)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--model-dir", type=Path, help="tokenizer folder for our server (default: the tests' tiny llama)")
    ap.add_argument(
        "--serve-args",
        default="",
        help='extra `lmi-trt serve` arguments, e.g. "-o option.synthetic_tokens_per_second=50"',
    )
    ap.add_argument("--serve-cmd", help='command instead of `python -m lmi_trt serve` (e.g. "lmi-trt serve")')
    ap.add_argument(
        "--bare-args",
        default="",
        help="extra bare_server.py arguments; without a --loop here the bare server runs on the loop "
        "lmi-trt serve picks (uvloop when installed), so the two are like for like",
    )
    ap.add_argument("--server-cpus", help="CPUs for each server (default: the first allowed CPU)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin servers or client")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="alternate bare/ours this many times; --summary picks the reported round per level",
    )
    ap.add_argument(
        "--summary",
        choices=("best", "median"),
        default="best",
        help="per level: the best round, or the median round (and the median of the per-round ratios)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        type=parse_variant,
        default=[],
        metavar="LABEL=COMMAND",
        help="another lmi-trt server measured in the same rounds, COMMAND instead of `python -m lmi_trt "
        'serve` (same serve args), e.g. "before=env PYTHONPATH=/tmp/old python -m lmi_trt serve"',
    )
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--out-dir", type=Path, help="server logs go here (default: a temporary folder)")
    ap.add_argument("--json", metavar="FILE", help="write both series, the ratios and the setup")
    ap.add_argument("--plot", metavar="FILE.png", help="tokens/s of both vs concurrency, with the ratio")
    bench.add_load_arguments(ap)
    ap.set_defaults(
        concurrency=bench.parse_concurrency(bench.DEFAULT_CONCURRENCY), output_tokens=bench.LengthDist(256, 256)
    )
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
    bare_args = shlex.split(args.bare_args)
    if not any(a == "--loop" or a.startswith("--loop=") for a in bare_args):
        bare_args += ["--loop", server_loop()]
    bare = bench.ServerProcess(
        [sys.executable, str(HERE / "bare_server.py"), "--port", str(bare_port), *bare_args],
        bare_port,
        cpus=server_cpus,
        name="bare server",
        log_path=out_dir / "bare_server.log",
    )
    serve_args = f"--engine synthetic --model-dir {shlex.quote(str(model_dir))} {args.serve_args}"
    if "synthetic_tokens_per_second" not in serve_args:
        serve_args += f" -o option.synthetic_tokens_per_second={AS_FAST_AS_POSSIBLE}"
    ours_argv = bench.serve_argv(serve_args, ours_port, args.serve_cmd)
    ours = bench.ServerProcess(
        ours_argv, ours_port, cpus=server_cpus, name="lmi-trt serve", log_path=out_dir / "lmi_trt_serve.log"
    )
    servers = [("lmi-trt", ours)]
    for label, cmd in args.variant:
        port = bench.free_port()
        servers.append(
            (
                label,
                bench.ServerProcess(
                    bench.serve_argv(serve_args, port, cmd),
                    port,
                    cpus=server_cpus,
                    name=label,
                    log_path=out_dir / f"{label}_serve.log",
                ),
            )
        )
    print(f"bare:    {shlex.join(bare.argv)}", file=sys.stderr)
    for label, server in servers:
        print(f"{label}: {shlex.join(server.argv)}", file=sys.stderr)
    print(f"client:  cpus {client_cpus or 'any'}, {cfg.client_procs} process(es); logs in {out_dir}", file=sys.stderr)

    rounds_bare: list[list[dict]] = []
    rounds_by: dict[str, list[list[dict]]] = {label: [] for label, _ in servers}
    try:
        bare.start()
        for _, server in servers:
            server.start()
        bare.wait_ready(args.start_timeout)
        for _, server in servers:
            server.wait_ready(args.start_timeout)
        model = cfg.model or (bench.openai_model_name(ours.url) if cfg.api == "openai" else "model")
        wl = cfg.workload(model)
        for r in range(max(1, args.rounds)):
            rb: list[dict] = []
            ro: dict[str, list[dict]] = {label: [] for label, _ in servers}
            for conc in cfg.concurrency:
                b = bench.run_series(bare.url, cfg, wl, conc, bare.pid)
                rb.append(b)
                line = f"  round {r + 1} concurrency {conc}: bare {b['output_tokens_per_s']:,.0f} tok/s"
                for label, server in servers:
                    o = bench.run_series(server.url, cfg, wl, conc, server.pid)
                    ro[label].append(o)
                    ratio = o["output_tokens_per_s"] / b["output_tokens_per_s"] if b["output_tokens_per_s"] else 0.0
                    line += f", {label} {o['output_tokens_per_s']:,.0f} tok/s (ratio {ratio:.3f})"
                print(line, file=sys.stderr, flush=True)
            rounds_bare.append(rb)
            for label in ro:
                rounds_by[label].append(ro[label])
    finally:
        for _, server in reversed(servers):
            server.stop()
        bare.stop()

    pick = median_of if args.summary == "median" else best_of
    bare_levels = pick(rounds_bare)
    levels_by = {label: pick(rounds) for label, rounds in rounds_by.items()}
    ours_levels = levels_by["lmi-trt"]
    rounds_ours = rounds_by["lmi-trt"]
    for label, levels in levels_by.items():
        if len(servers) > 1:
            print(f"\n{label}")
        print(bench._render(ratio_rows(bare_levels, levels)))
        if args.summary == "median" and args.rounds > 1:
            for what, value in (("ratios", _tps), ("cpu ratios", per_cpu)):
                ratios = median_ratio(rounds_bare, rounds_by[label], value)
                print(
                    f"median of per-round {what}: "
                    + ", ".join(
                        f"{o['concurrency']}: {'-' if r is None else f'{r:.3f}'}" for o, r in zip(levels, ratios)
                    )
                )
        verdict = target_verdict(bare_levels, levels)
        if verdict:
            print(verdict)
        for w in bench.client_warnings(levels):
            print(f"note ({label}): " + w)
    for w in bench.client_warnings(bare_levels):
        print("note (bare): " + w)
    verdict = target_verdict(bare_levels, ours_levels)
    if args.json:
        doc = {
            "kind": "lmi-trt-compare",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": shlex.join([sys.executable, *sys.argv]) if argv is None else shlex.join(argv),
            "servers": {"bare": shlex.join(bare.argv), **{label: shlex.join(sv.argv) for label, sv in servers}},
            "client_cpus": client_cpus,
            "server_cpus": server_cpus,
            "config": bench._config_doc(cfg, wl),
            "machine": bench.machine_facts(),
            "rounds": args.rounds,
            "summary": args.summary,
            "ratio": {
                str(o["concurrency"]): (
                    o["output_tokens_per_s"] / b["output_tokens_per_s"] if b["output_tokens_per_s"] else None
                )
                for b, o in zip(bare_levels, ours_levels)
            },
            "median_ratio": {
                str(o["concurrency"]): r for o, r in zip(ours_levels, median_ratio(rounds_bare, rounds_ours))
            },
            "median_cpu_ratio": {
                str(o["concurrency"]): r for o, r in zip(ours_levels, median_ratio(rounds_bare, rounds_ours, per_cpu))
            },
            "target": verdict,
            "bare": bare_levels,
            "lmi-trt": ours_levels,
            "all_rounds": {"bare": rounds_bare, **rounds_by},
        }
        if len(servers) > 1:
            doc["variants"] = {
                label: {
                    "levels": levels_by[label],
                    "median_ratio": {
                        str(o["concurrency"]): r
                        for o, r in zip(levels_by[label], median_ratio(rounds_bare, rounds_by[label]))
                    },
                    "median_cpu_ratio": {
                        str(o["concurrency"]): r
                        for o, r in zip(levels_by[label], median_ratio(rounds_bare, rounds_by[label], per_cpu))
                    },
                }
                for label, _ in servers[1:]
            }
        bench.write_json(args.json, doc)
    if args.plot:
        bench.plot_throughput(
            args.plot,
            {
                "bare aiohttp": bare_levels,
                "lmi-trt synthetic": ours_levels,
                **{label: levels_by[label] for label, _ in servers[1:]},
            },
            title=f"{cfg.api} stream, output {wl.output_dist} tokens, one server core",
            ratio_of=("lmi-trt synthetic", "bare aiohttp"),
        )
    return 1 if any(r["ok"] == 0 for r in bare_levels + [lv for v in levels_by.values() for lv in v]) else 0


if __name__ == "__main__":
    sys.exit(main())
