"""HTTP front ends (option.api_server_count): served tokens/s against the engine alone, one command per target.

synthetic — the synthetic engine (no model: the serving layer alone) at 256 streams with N = 1, 2, 4, 8 front
            ends (``--counts``): tokens/s per N, and each against N × the N = 1 figure.

    python benchmarks/frontends.py synthetic --counts 1,2,4,8 -c 256 --json frontends_synthetic.json

gpu       — the ~1.1B Llama-shaped bf16 model of gpu_decode.py (random weights, its vocabulary cut to the test
            tokenizer's so that every token decodes), 128 prompt + 128 output tokens, greedy, ignore_eos. First
            the engine protocol (TorchEngine's built-in decode loop, every request submitted at once, as
            gpu_decode.py's lmi mode), then `lmi-trt serve` with N front ends and `lmi-trt bench` over OpenAI,
            LMI and TGI streams at the same stream counts; served / engine protocol and TTFT p50 per row.

    python benchmarks/frontends.py gpu --counts 1,4 -c 64,256 --json frontends_gpu.json

cost      — a fixed, paced load (the synthetic engine at ``--rate`` tokens/s per stream, ``-c`` streams, far under
            what the host can serve): CPU seconds per 1,000 served tokens in the engine's process and in each front
            end, per N. A per-token cost, so it means something on a 2-core box where throughput scaling does not.

    python benchmarks/frontends.py cost --counts 1,2 -c 64 --rate 50 --duration 10

Each starts one `lmi-trt serve` per front-end count (a free port, /ping 200, SIGTERM at the end) and runs
`lmi-trt bench --url` against it for every stream count (and, on the GPU, API).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]


@contextlib.contextmanager
def serving(serve_args: list[str], work: Path) -> Iterator[tuple[str, int]]:
    """`lmi-trt serve ARGS` (tests/cliserver.py's: a free port, /ping 200, SIGTERM at the end); (its URL, its pid)."""
    from cliserver import serve

    with serve(" ".join(serve_args).split(), work, ready_timeout=900.0) as server:
        yield server.url, server.proc.pid


def bench(server: tuple[str, int], api: str, streams: int, out: Path, extra: list[str]) -> dict:
    """One `lmi-trt bench` level against a running server; its JSON's level."""
    url, pid = server
    cmd = [
        sys.executable,
        "-m",
        "lmi_trt",
        "bench",
        "--url",
        url,
        "--server-pid",
        str(pid),
        "--api",
        api,
        "-c",
        str(streams),
        "--json",
        str(out),
        *extra,
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())["levels"][0]


def _tok_s(level: dict) -> float:
    return float(level["output_tokens_per_s"])


def _ttft_p50(level: dict) -> float | None:
    ttft = level.get("ttft_ms") or {}
    return ttft.get("p50")


def synthetic(args: argparse.Namespace) -> dict:
    from tinymodels import tiny_model

    model = tiny_model("llama")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="frontends-"))
    for n in args.counts:
        serve_args = [
            "--engine synthetic",
            f"--model-id {model}",
            "-o option.synthetic_tokens_per_second=0",
            f"-o option.max_rolling_batch_size={max(args.concurrency)}",
            f"-o option.api_server_count={n}",
        ]
        with serving(serve_args, work) as server:
            for streams in args.concurrency:
                level = bench(
                    server,
                    args.api,
                    streams,
                    work / f"n{n}-c{streams}.json",
                    [
                        "--duration",
                        str(args.duration),
                        "--output-tokens",
                        "256",
                        "--client-procs",
                        str(args.client_procs),
                    ],
                )
                row = {"frontends": n, "streams": streams, "tok_s": _tok_s(level), "ttft_p50_ms": _ttft_p50(level)}
                rows.append(row)
    for row in rows:
        one = next(r["tok_s"] for r in rows if r["frontends"] == 1 and r["streams"] == row["streams"])
        row["vs_n_times_one"] = row["tok_s"] / (row["frontends"] * one) if one else None
    print(f"{'N':>3} {'streams':>8} {'tok/s':>10} {'÷ N×(N=1)':>10} {'TTFT p50 ms':>12}")
    for r in rows:
        print(
            f"{r['frontends']:>3} {r['streams']:>8} {r['tok_s']:>10.0f} {r['vs_n_times_one']:>10.2f} {r['ttft_p50_ms']}"
        )
    return {"mode": "synthetic", "cpus": os.cpu_count(), "rows": rows}


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def cost(args: argparse.Namespace) -> dict:
    import psutil
    from tinymodels import tiny_model

    model = tiny_model("llama")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="frontends-cost-"))
    streams = max(args.concurrency)
    for n in args.counts:
        serve_args = [
            "--engine synthetic",
            f"--model-id {model}",
            f"-o option.synthetic_tokens_per_second={args.rate}",
            f"-o option.max_rolling_batch_size={streams}",
            f"-o option.api_server_count={n}",
        ]
        with serving(serve_args, work) as server:
            engine = psutil.Process(server[1])
            procs = {"engine": engine}
            if n > 1:  # the front ends (multiprocessing's spawn: children named by their command line)
                fronts = [c for c in engine.children() if "spawn_main" in " ".join(c.cmdline())]
                procs.update({f"frontend{i}": c for i, c in enumerate(fronts)})
            before = {k: _cpu(p) for k, p in procs.items()}
            level = bench(
                server,
                args.api,
                streams,
                work / f"cost-n{n}.json",
                ["--duration", str(args.duration), "--output-tokens", "256", "--client-procs", "1"],
            )
            used = {k: _cpu(p) - before[k] for k, p in procs.items()}
        tokens = level["output_tokens"]
        row = {
            "frontends": n,
            "streams": streams,
            "tok_s": _tok_s(level),
            "tokens": tokens,
            "cpu_ms_per_1k_tokens": {k: round(1e6 * v / tokens, 2) for k, v in used.items()},
        }
        row["total_cpu_ms_per_1k_tokens"] = round(sum(row["cpu_ms_per_1k_tokens"].values()), 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"mode": "cost", "cpus": os.cpu_count(), "rate": args.rate, "rows": rows}


async def _engine_protocol(
    model_dir: Path, streams: int, prompt: int, out_tokens: int, vocab: int, batch_size: int
) -> dict:
    """tokens/s and TTFT p50 of TorchEngine's built-in loop, every request submitted at once (gpu_decode.py)."""
    from gpu_decode import pct, stream
    from gpu_torch import prompts

    from lmi_trt.engines.torch import TorchEngine

    batch = prompts(streams, prompt, vocab=vocab)
    engine = TorchEngine(
        model_dir,
        dtype="bf16",
        device="cuda",
        max_batch_size=batch_size,  # as the server's option.max_rolling_batch_size
        max_input_len=prompt,
        max_new_tokens=out_tokens,
        max_num_tokens=8192,
        decode_loop="builtin",
    )
    await engine.start()
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 8) for i, ids in enumerate(batch)))
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(stream(engine, f"r{i}", ids, out_tokens) for i, ids in enumerate(batch)))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    ttft = pct([times[0] - t0 for _, times in runs], 50)
    return {"tok_s": sum(len(g) for g, _ in runs) / seconds, "ttft_p50_ms": 1e3 * ttft if ttft is not None else None}


def gpu(args: argparse.Namespace) -> dict:
    import torch
    from gpu_torch import build_model
    from tinymodels import build_tokenizer

    model_dir = Path(tempfile.mkdtemp(prefix="frontends-model-"))
    tokenizer = build_tokenizer(model_dir)
    vocab = len(tokenizer)
    build_model(model_dir, layers=16, dtype=torch.bfloat16, vocab_size=vocab)
    rows = []
    top = max(args.concurrency)
    engine = {c: asyncio.run(_engine_protocol(model_dir, c, 128, 128, vocab, top)) for c in args.concurrency}
    torch.cuda.empty_cache()
    work = model_dir / "bench"
    work.mkdir()
    for n in args.counts:
        serve_args = [
            "--engine torch",
            f"--model-dir {model_dir}",
            "-o option.dtype=bf16",
            "-o option.device=cuda",
            f"-o option.max_rolling_batch_size={top}",
            "-o option.max_input_len=128",
            "-o option.max_output_len=128",
            "-o option.max_num_tokens=8192",
            f"-o option.api_server_count={n}",
        ]
        with serving(serve_args, work) as server:
            for streams, api in itertools.product(args.concurrency, ("openai", "lmi", "tgi")):
                level = bench(
                    server,
                    api,
                    streams,
                    work / f"{api}-n{n}-c{streams}.json",
                    [
                        "--prompt-tokens",
                        "128",
                        "--output-tokens",
                        "128",
                        "--ignore-eos",
                        "--tokenizer",
                        str(model_dir),
                        "-n",
                        str(4 * streams),
                        "--client-procs",
                        str(args.client_procs),
                    ],
                )
                tok_s = _tok_s(level)
                rows.append(
                    {
                        "frontends": n,
                        "streams": streams,
                        "api": api,
                        "tok_s": tok_s,
                        "engine_tok_s": engine[streams]["tok_s"],
                        "served_vs_engine": tok_s / engine[streams]["tok_s"],
                        "ttft_p50_ms": _ttft_p50(level),
                    }
                )
    print(f"{'N':>3} {'streams':>8} {'api':>7} {'tok/s':>10} {'engine':>10} {'ratio':>6} {'TTFT p50 ms':>12}")
    for r in rows:
        print(
            f"{r['frontends']:>3} {r['streams']:>8} {r['api']:>7} {r['tok_s']:>10.0f} {r['engine_tok_s']:>10.0f} "
            f"{r['served_vs_engine']:>6.2f} {r['ttft_p50_ms']}"
        )
    return {"mode": "gpu", "cpus": os.cpu_count(), "engine_protocol": engine, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("synthetic", "gpu", "cost"))
    ap.add_argument("--counts", default="1,2,4,8", help="front-end counts (option.api_server_count)")
    ap.add_argument("-c", "--concurrency", default="256", help="streams, comma-separated")
    ap.add_argument("--api", default="openai", choices=("openai", "lmi", "tgi"), help="synthetic: the streams' API")
    ap.add_argument("--duration", type=float, default=15.0, help="synthetic: seconds per level")
    ap.add_argument("--client-procs", type=int, default=4, help="load-generator processes (lmi-trt bench)")
    ap.add_argument("--rate", type=float, default=50.0, help="cost: the synthetic engine's tokens/s per stream")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.counts = [int(x) for x in args.counts.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    doc = {"synthetic": synthetic, "gpu": gpu, "cost": cost}[args.mode](args)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
