#!/usr/bin/env python
"""Soak: minutes of mixed traffic against `lmi-trt serve` (torch engine by default), watching the
server process for leaks. A script to run by hand or nightly, not part of CI.

Traffic, from --concurrency workers with a seeded mix, until --minutes pass or --max-requests
have been sent (a hard bound either way):
  json      LMI /invocations, non-streamed: 200 and a generated_text
  jsonl     LMI /invocations, jsonlines stream: 200, tokens, a final record without an error
  cancel    a jsonlines stream dropped after its first token (the client goes away)
  bad       bad requests (invalid JSON, a prompt over max_input_len, a negative temperature,
            an unknown route, a body over max_request_size): the expected 4xx, JSON, naming the field

Every --sample-every seconds the server's RSS, open file descriptors and threads are sampled.
After a warm-up (the first --warmup fraction of the run) RSS and fds must be flat: the RSS
trend (least squares) under --rss-slope MiB/min and within --rss-growth MiB end to end, open fds
within --fd-growth. At the end the server must be idle (no request in the system, no engine
slot in use) and exit 0 on SIGTERM. The report (text, and JSON with --json) gives counts by kind
and status, failures with examples, the samples and the verdicts; the exit status is 0 only when
there was no failure and both series are flat.

    python benchmarks/soak.py                       # 10 minutes, torch engine, tiny test model
    python benchmarks/soak.py --minutes 1 --json soak.json
    python benchmarks/soak.py --model-id /path/to/model --serve-args "-o option.max_rolling_batch_size=16"
    python benchmarks/soak.py --engine synthetic --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAX_INPUT = 64
MAX_OUTPUT = 48
MAX_REQUEST = 256 * 1024
PROMPTS = [
    "The quick brown fox",
    "Large language models generate text",
    "Grüße aus München! Ça va?",
    "日本語のテキスト",
    "def hello(name):",
    "Once upon a time there was",
]
MIX = {"json": 0.35, "jsonl": 0.3, "cancel": 0.15, "bad": 0.2}


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    threads: int


@dataclass
class Report:
    minutes: float
    engine: str
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rss_slope_mib_per_min: float = 0.0
    rss_growth_mib: float = 0.0
    fd_growth: int = 0
    rss_flat: bool = True
    fds_flat: bool = True
    idle_at_end: bool = True
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and self.rss_flat and self.fds_flat and self.idle_at_end and self.exit_code == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_model() -> str:
    sys.path.insert(0, str(ROOT / "tests"))
    from tinymodels import tiny_model  # builds the tiny random-weight test model once, offline

    return str(tiny_model("llama"))


async def _one(
    session: Any, kind: str, rng: random.Random, counts: Counter, failures: defaultdict, examples: list[str]
) -> None:
    import aiohttp

    prompt = rng.choice(PROMPTS)
    params = {"max_new_tokens": rng.randint(1, MAX_OUTPUT)}
    status = "-"

    def fail(why: str) -> None:
        failures[kind] += 1
        if len(examples) < 20:
            examples.append(f"{kind}: {why}"[:500])

    try:
        if kind == "json":
            async with session.post("/invocations", json={"inputs": prompt, "parameters": params}) as r:
                status, body = r.status, await r.read()
                if r.status != 200 or not isinstance(json.loads(body).get("generated_text"), str):
                    fail(f"{r.status} {body[:200]!r}")
        elif kind in ("jsonl", "cancel"):
            body = {
                "inputs": prompt,
                "parameters": {**params, "max_new_tokens": max(params["max_new_tokens"], 8)},
                "stream": True,
            }
            async with session.post("/invocations", json=body) as r:
                status = r.status
                if r.status != 200:
                    fail(f"{r.status} {(await r.read())[:200]!r}")
                elif kind == "cancel":
                    line = await r.content.readline()
                    if not line.strip():
                        fail("no first token before the cancel")
                    r.close()  # drop the connection mid-stream
                else:
                    lines = [json.loads(x) for x in (await r.read()).splitlines() if x.strip()]
                    if not lines or "generated_text" not in lines[-1] or "error" in lines[-1]:
                        fail(f"bad stream end: {lines[-1:]}")
        else:
            case = rng.randrange(5)
            path, data, want, names = "/invocations", None, 400, ("",)
            if case == 0:
                data, names = b'{"inputs": "x", "parameters": ', ("JSON",)
            elif case == 1:
                data, names = json.dumps({"inputs": "word " * (MAX_INPUT * 2)}).encode(), ("max_input_len",)
            elif case == 2:
                data, names = (
                    json.dumps({"inputs": prompt, "parameters": {"temperature": -1}}).encode(),
                    ("temperature",),
                )
            elif case == 3:
                path, data, want, names = "/no/such/route", b"{}", 404, ("no route",)
            else:
                data, want, names = b'{"inputs": "' + b"x" * MAX_REQUEST + b'"}', 413, ("max_request_size",)
            async with session.post(path, data=data, headers={"Content-Type": "application/json"}) as r:
                status, text = r.status, await r.text()
                if r.status != want or not any(n in text for n in names):
                    fail(f"case {case}: {r.status} {text[:200]!r}")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        fail(f"{type(e).__name__}: {e}")
    counts[f"{kind} {status}"] += 1


async def _traffic(url: str, args: argparse.Namespace, report: Report, proc: Any) -> None:
    import aiohttp

    kinds, weights = zip(*MIX.items(), strict=True)
    counts: Counter = Counter()
    failures: defaultdict = defaultdict(int)
    examples: list[str] = []
    sent = 0
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60
    stop = asyncio.Event()

    async def sampler() -> None:
        while not stop.is_set():
            with proc.oneshot():
                report.samples.append(
                    Sample(
                        round(time.monotonic() - t0, 1),
                        proc.memory_info().rss / 2**20,
                        proc.num_fds(),
                        proc.num_threads(),
                    )
                )
            try:
                await asyncio.wait_for(stop.wait(), args.sample_every)
            except asyncio.TimeoutError:
                pass

    async def worker(i: int) -> None:
        nonlocal sent
        wrng = random.Random(args.seed * 1000 + i)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(url, timeout=timeout) as session:
            while time.monotonic() < deadline and sent < args.max_requests:
                sent += 1
                kind = wrng.choices(kinds, weights)[0]
                await _one(session, kind, wrng, counts, failures, examples)

    sampling = asyncio.ensure_future(sampler())
    await asyncio.gather(*(worker(i) for i in range(args.concurrency)))
    stop.set()
    await sampling
    report.requests = sent
    report.by_kind = dict(Counter(k.split()[0] for k in counts.elements()))
    report.statuses = dict(sorted(counts.items()))
    report.failures = dict(failures)
    report.failure_examples = examples


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def _judge(report: Report, args: argparse.Namespace) -> None:
    if not report.samples:
        return
    start = report.samples[-1].t * args.warmup
    steady = [s for s in report.samples if s.t >= start] or report.samples
    report.rss_slope_mib_per_min = _slope([s.t / 60 for s in steady], [s.rss_mib for s in steady])
    report.rss_growth_mib = steady[-1].rss_mib - steady[0].rss_mib
    report.fd_growth = max(s.fds for s in steady[-3:]) - min(s.fds for s in steady[:3])
    report.rss_flat = report.rss_slope_mib_per_min <= args.rss_slope and report.rss_growth_mib <= args.rss_growth
    report.fds_flat = report.fd_growth <= args.fd_growth


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--max-requests", type=int, default=50_000, help="hard bound on requests sent (default 50000)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--engine", default="torch", choices=["torch", "synthetic", "trtllm", "auto"])
    p.add_argument("--model-id", help="default: the tiny random-weight test model (tests/tinymodels.py)")
    p.add_argument("--serve-args", default="", help="more arguments for `lmi-trt serve`")
    p.add_argument("--sample-every", type=float, default=2.0, help="seconds between RSS/fd samples")
    p.add_argument("--warmup", type=float, default=0.25, help="fraction of the run left out of the flatness check")
    p.add_argument("--rss-slope", type=float, default=2.0, help="max RSS trend after warm-up, MiB/min")
    p.add_argument("--rss-growth", type=float, default=32.0, help="max RSS growth after warm-up, MiB")
    p.add_argument("--fd-growth", type=int, default=4, help="max growth of open fds after warm-up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)

    import psutil
    import requests

    model = args.model_id or _default_model()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"lmi-trt-soak-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "lmi_trt",
        "serve",
        "--model-id",
        model,
        "--engine",
        args.engine,
        "--port",
        str(port),
        "-o",
        f"option.max_input_len={MAX_INPUT}",
        "-o",
        f"option.max_output_len={MAX_OUTPUT}",
        "-o",
        f"max_request_size={MAX_REQUEST}",
        *shlex.split(args.serve_args),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    report = Report(minutes=args.minutes, engine=args.engine)
    with open(log_path, "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                print(log_path.read_text()[-3000:], file=sys.stderr)
                return 2
            try:
                if requests.get(url + "/ping", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                print("the server did not become ready in 300 s", file=sys.stderr)
                return 2
            time.sleep(0.2)
        print(
            f"soak: {args.minutes:g} min of mixed traffic on the {args.engine} engine ({model}), "
            f"{args.concurrency} workers, at most {args.max_requests} requests; server log {log_path}"
        )
        asyncio.run(_traffic(url, args, report, psutil.Process(server.pid)))
        for _ in range(50):  # idle: nothing in the system, no engine slot held
            metrics = requests.get(url + "/metrics", timeout=10).text
            busy = _metric(metrics, "lmi_requests_in_system") + _metric(metrics, "lmi_engine_active_requests")
            if busy == 0:
                break
            time.sleep(0.1)
        report.idle_at_end = busy == 0
        _judge(report, args)
        server.send_signal(signal.SIGTERM)
        report.exit_code = server.wait(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    _print(report)
    if args.json:
        out = asdict(report)
        out["ok"] = report.ok
        args.json.write_text(json.dumps(out, indent=1))
    return 0 if report.ok else 1


def _print(r: Report) -> None:
    first, last = (r.samples[0], r.samples[-1]) if r.samples else (None, None)
    print(f"requests: {r.requests} ({', '.join(f'{k} {v}' for k, v in sorted(r.by_kind.items()))})")
    print(f"statuses: {', '.join(f'{k}: {v}' for k, v in r.statuses.items())}")
    print(f"failures: {sum(r.failures.values())} {r.failures or ''}")
    for example in r.failure_examples[:5]:
        print(f"  {example}")
    if first and last:
        print(
            f"RSS: {first.rss_mib:.0f} → {last.rss_mib:.0f} MiB; after warm-up {r.rss_growth_mib:+.1f} MiB, "
            f"trend {r.rss_slope_mib_per_min:+.2f} MiB/min: {'flat' if r.rss_flat else 'NOT FLAT'}"
        )
        print(
            f"open fds: {first.fds} → {last.fds}; "
            f"after warm-up {r.fd_growth:+d}: {'flat' if r.fds_flat else 'NOT FLAT'}"
            f"; threads {first.threads} → {last.threads}"
        )
    print(f"idle at the end: {r.idle_at_end}; exit code after SIGTERM: {r.exit_code}")
    print("SOAK OK" if r.ok else "SOAK FAILED")


if __name__ == "__main__":
    sys.exit(main())
