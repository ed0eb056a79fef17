"""HTTP front ends (option.api_server_count): served tokens/s against the engine alone, one command per target.

synthetic — the synthetic engine (no model: the serving layer alone) at 256 streams with N = 1, 2, 4, 8 front
            ends (``--counts``): tokens/s per N, and each against N × the N = 1 figure. The load generator gets
            ``--client-procs`` processes, by default as many as N (4 at least) within the cores the server leaves
            (N front ends and the engine's process): 4 for every N left the client the ceiling at N = 8.

    python benchmarks/frontends.py synthetic --counts 1,2,4,8 -c 256 --json frontends_synthetic.json

gpu       — the ~1.1B Llama-shaped bf16 model of gpu_decode.py (random weights, its vocabulary cut to the test
            tokenizer's so that every token decodes), 128 prompt + 128 output tokens, greedy, ignore_eos. First
            the engine protocol (TorchEngine's built-in decode loop, every request submitted at once, as
            gpu_decode.py's lmi mode), then `lmi-trt serve` with N front ends and `lmi-trt bench` over OpenAI,
            LMI and TGI streams at the same stream counts; served / engine protocol and TTFT p50 per row. Also the
            decode loop in an engine process of its own (``engine_process``): the engine behind the link, as
            `lmi-trt serve` runs it with N > 1, fed by 4 front ends that only submit and acknowledge (no HTTP), each
            figure against the decode bound (gpu_decode.py's: weights and mean KV cache read once per step at the
            measured copy bandwidth).

    python benchmarks/frontends.py gpu --counts 1,4 -c 64,256 --json frontends_gpu.json

loop      — gpu mode's ``engine_process`` alone: the decode loop in an engine process of its own, ``--rounds`` runs of
            one engine per stream count, each with the loop's counters (steps; seconds waiting for the device,
            planning, launching, emitting) and the process's CPU seconds. ``--profile-dir``: py-spy's stacks of
            the engine's process over the rounds (every thread, idle samples too).

    python benchmarks/frontends.py loop -c 256 --rounds 5 --profile-dir loop-profile --json frontends_loop.json

cost      — a fixed, paced load (the synthetic engine at ``--rate`` tokens/s per stream, ``-c`` streams, far under
            what the host can serve): CPU seconds per 1,000 served tokens in the engine's process and in each front
            end, per N. A per-token cost, so it means something on a 2-core box where throughput scaling does not.

    python benchmarks/frontends.py cost --counts 1,2 -c 64 --rate 50 --duration 10

            ``--engine trtllm`` (the fake Executor over an engine folder built from the tiny test model) or
            ``--engine llmapi`` (the fake LLM API on that model) instead: the fake TensorRT-LLM of tests/fakes, which
            really runs the model on the CPU (unpaced: ``--rate`` does not apply), so the engine's figure is the
            model's cost plus the serving path's; compare it before and after a change on the same host.

    python benchmarks/frontends.py cost --engine trtllm --counts 2 -c 8 --duration 20

``--rounds R`` (synthetic, gpu) runs every level R times and keeps the median: in gpu mode the APIs' rounds
interleaved and the engine protocol's R runs of one engine, so that one slow moment of the host does not set a
ratio (two runs of the same tree gave 0.81 and 0.91 at 64 streams for OpenAI with one round each).

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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]


@contextlib.contextmanager
def serving(serve_args: list[str], work: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, int]]:
    """`lmi-trt serve ARGS` (tests/cliserver.py's: a free port, /ping 200, SIGTERM at the end); (its URL, its pid)."""
    from cliserver import serve

    with serve(" ".join(serve_args).split(), work, env=env, ready_timeout=900.0) as server:
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


def client_procs(args: argparse.Namespace, frontends: int) -> int:
    if args.client_procs is not None:
        return args.client_procs
    return max(2, min(max(4, frontends), (os.cpu_count() or 1) - frontends - 1))


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
                runs = []
                for r in range(args.rounds):
                    last = r == args.rounds - 1
                    profile = args.profile_dir if n == max(args.counts) and last else None
                    with cpu_split(server[1], n) as used, profiled(server[1], n, args.duration, profile):
                        level = bench(
                            server,
                            args.api,
                            streams,
                            work / f"n{n}-c{streams}-{r}.json",
                            [
                                "--duration",
                                str(args.duration),
                                "--output-tokens",
                                "256",
                                "--client-procs",
                                str(client_procs(args, n)),
                            ],
                        )
                    runs.append(
                        {
                            "frontends": n,
                            "streams": streams,
                            "tok_s": _tok_s(level),
                            "ttft_p50_ms": _ttft_p50(level),
                            "client_procs": client_procs(args, n),
                            "client_cpu_cores": level.get("client_cpu_cores"),
                            "server_cpu_cores": level.get("server_cpu_cores"),
                            # The server's cores split by its processes' shares of the CPU they used: the engine's
                            # process and the busiest front end.
                            **{
                                key: round(level["server_cpu_cores"] * share, 3) for key, share in _shares(used).items()
                            },
                        }
                    )
                rows.append(_median_run(runs))
    for row in rows:
        one = next((r["tok_s"] for r in rows if r["frontends"] == 1 and r["streams"] == row["streams"]), None)
        row["vs_n_times_one"] = row["tok_s"] / (row["frontends"] * one) if one else None
    print(
        f"{'N':>3} {'streams':>8} {'tok/s':>10} {'÷ N×(N=1)':>10} {'TTFT p50 ms':>12} {'cli procs/cpu':>14} "
        f"{'server cpu':>10} {'engine':>7} {'front':>7}"
    )
    for r in rows:
        print(
            f"{r['frontends']:>3} {r['streams']:>8} {r['tok_s']:>10.0f} {r['vs_n_times_one'] or float('nan'):>10.2f} "
            f"{r['ttft_p50_ms']!s:>12} {r['client_procs']:>5}/{r['client_cpu_cores']} "
            f"{r['server_cpu_cores']!s:>10} {r['engine_cpu_cores']:>7} {r['busiest_frontend_cpu_cores']:>7}"
        )
    return {"mode": "synthetic", "cpus": os.cpu_count(), "rows": rows}


def _median_run(runs: list[dict]) -> dict:
    """The run of median tokens/s (the lower middle one of an even count), with every run's figure beside it."""
    median = sorted(runs, key=lambda r: r["tok_s"])[(len(runs) - 1) // 2]
    return median | {"rounds_tok_s": [round(r["tok_s"], 1) for r in runs]}


def _cpu(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _processes(pid: int, frontends: int) -> dict:
    """The server's processes by role: the engine's (the serve process) and, with N > 1, each front end."""
    import psutil

    engine = psutil.Process(pid)
    procs = {"engine": engine}
    if frontends > 1:  # the front ends (multiprocessing's spawn: children named by their command line)
        fronts = [c for c in engine.children() if "spawn_main" in " ".join(c.cmdline())]
        procs.update({f"frontend{i}": c for i, c in enumerate(fronts)})
    return procs


def _shares(used: dict[str, float]) -> dict[str, float]:
    total = sum(used.values()) or 1.0
    fronts = [v for k, v in used.items() if k != "engine"]
    return {"engine_cpu_cores": used["engine"] / total, "busiest_frontend_cpu_cores": max(fronts, default=0.0) / total}


@contextlib.contextmanager
def cpu_split(pid: int, frontends: int) -> Iterator[dict[str, float]]:
    """CPU seconds each of the server's processes used inside the block (filled in when it ends)."""
    procs = _processes(pid, frontends)
    before = {k: _cpu(p) for k, p in procs.items()}
    used: dict[str, float] = {}
    yield used
    used.update({k: _cpu(p) - before[k] for k, p in procs.items()})


@contextlib.contextmanager
def profiled(pid: int, frontends: int, duration: float, out: Path | None) -> Iterator[None]:
    """With ``out``: py-spy samples the engine's process and front end 0 over the middle half of a ``duration``-second
    level (collapsed stacks, one file each: where a process's CPU goes); py-spy must be installed (``pip install
    py-spy``). Started after bench's own start-up (its client processes, about 3 s)."""
    if out is None:
        yield
        return
    import threading

    out.mkdir(parents=True, exist_ok=True)
    targets = {k: p for k, p in _processes(pid, frontends).items() if k in ("engine", "frontend0")}
    spies: list[subprocess.Popen] = []

    def spy() -> None:
        for name, p in targets.items():
            command = ["py-spy", "record", "--pid", str(p.pid), "--duration", str(max(int(duration / 2), 1))]
            command += ["--rate", "250", "--format", "raw", "--nonblocking"]
            command += ["--output", str(out / f"n{frontends}-{name}.txt")]
            spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))

    timer = threading.Timer(3.0 + duration / 4, spy)
    timer.start()
    try:
        yield
    finally:
        timer.join()
        for s in spies:
            s.wait()


# The fake TensorRT-LLM engines' sizes (cost --engine trtllm/llmapi): prompts and outputs of the bench's sizes fit.
FAKE_OUTPUT_TOKENS = 64
FAKE_SEQ_LEN = 160


def _engine_args(args: argparse.Namespace, model: Path, work: Path, streams: int) -> tuple[list[str], dict | None]:
    """The serve arguments and environment of cost's engine: the paced synthetic one, or a fake TensorRT-LLM's."""
    if args.engine == "synthetic":
        return [
            "--engine synthetic",
            f"--model-id {model}",
            f"-o option.synthetic_tokens_per_second={args.rate}",
        ], None
    from trtllm_testing import fake_server_env, fake_tensorrt_llm, make_engine_dir

    sizes = [
        f"-o option.max_input_len={FAKE_SEQ_LEN - FAKE_OUTPUT_TOKENS}",
        f"-o option.max_output_len={FAKE_OUTPUT_TOKENS}",
    ]
    site = work / "site"
    site.mkdir(exist_ok=True)
    env = fake_server_env(site)
    if args.engine == "llmapi":
        return ["--engine trtllm", f"--model-id {model}", *sizes], env
    engine_dir = work / "engine"
    if not engine_dir.exists():
        with fake_tensorrt_llm():
            make_engine_dir(
                model,
                engine_dir,
                max_batch_size=streams,
                max_input_len=FAKE_SEQ_LEN - FAKE_OUTPUT_TOKENS,
                max_seq_len=FAKE_SEQ_LEN,
            )
    return ["--engine trtllm", f"--model-id {engine_dir}", f"-o option.tokenizer_id={model}", *sizes], env


def cost(args: argparse.Namespace) -> dict:
    from tinymodels import tiny_model

    model = tiny_model("llama")
    rows = []
    work = Path(tempfile.mkdtemp(prefix="frontends-cost-"))
    streams = max(args.concurrency)
    output_tokens = 256 if args.engine == "synthetic" else FAKE_OUTPUT_TOKENS
    for n in args.counts:
        engine_args, env = _engine_args(args, model, work, streams)
        serve_args = [
            *engine_args,
            f"-o option.max_rolling_batch_size={streams}",
            f"-o option.api_server_count={n}",
        ]
        with serving(serve_args, work, env) as server, cpu_split(server[1], n) as used:
            level = bench(
                server,
                args.api,
                streams,
                work / f"cost-n{n}.json",
                [
                    "--duration",
                    str(args.duration),
                    "--output-tokens",
                    str(output_tokens),
                    "--client-procs",
                    str(args.client_procs or 1),
                    *(
                        []
                        if args.engine == "synthetic"
                        else ["--tokenizer", str(model), "--prompt-tokens", "32", "--ignore-eos"]
                    ),
                ],
            )
        tokens = level["output_tokens"]
        row = {
            "engine": args.engine,
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


def _torch_engine(model_dir: Path, prompt: int, out_tokens: int, batch_size: int):
    from lmi_trt.engines.torch import TorchEngine

    return TorchEngine(
        model_dir,
        dtype="bf16",
        device="cuda",
        max_batch_size=batch_size,  # as the server's option.max_rolling_batch_size
        max_input_len=prompt,
        max_new_tokens=out_tokens,
        max_num_tokens=8192,
        decode_loop="builtin",
    )


async def _engine_protocol(
    model_dir: Path, streams: int, prompt: int, out_tokens: int, vocab: int, batch_size: int, rounds: int
) -> dict:
    """tokens/s and TTFT p50 of TorchEngine's built-in loop, every request submitted at once (gpu_decode.py): the
    median of ``rounds`` runs of one engine."""
    from gpu_decode import pct, stream
    from gpu_torch import prompts

    batch = prompts(streams, prompt, vocab=vocab)
    engine = _torch_engine(model_dir, prompt, out_tokens, batch_size)
    await engine.start()
    figures = []
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 8) for i, ids in enumerate(batch)))
        for r in range(rounds):
            t0 = time.perf_counter()
            runs = await asyncio.gather(*(stream(engine, f"r{r}-{i}", ids, out_tokens) for i, ids in enumerate(batch)))
            seconds = time.perf_counter() - t0
            ttft = pct([times[0] - t0 for _, times in runs], 50)
            figures.append(
                {
                    "tok_s": sum(len(g) for g, _ in runs) / seconds,
                    "ttft_p50_ms": 1e3 * ttft if ttft is not None else None,
                }
            )
    finally:
        await engine.close()
    return _median_run(figures)


def _bare_front_ends(
    address: str, batches: list[list[tuple[str, list[int]]]], out_tokens: list[int], results, go
) -> None:
    """Front ends that only submit and acknowledge, over engine_link's protocol (a socket each, as RemoteEngine):
    one round per ``out_tokens`` entry, each when ``go`` says so: every request at once, then the outputs until every
    request has ended; each round's tokens/s and TTFT p50 into ``results``."""
    import pickle
    import selectors
    import socket

    from gpu_decode import pct

    from lmi_trt.engines.base import GenerationRequest, SamplingParams
    from lmi_trt.serving.engine_link import Frames, frame, read_message

    def send(sock: socket.socket, message: tuple) -> None:
        sock.sendall(frame(pickle.dumps(message)))

    socks = []
    for i in range(len(batches)):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        send(sock, ("hello", f"bench-{i}"))
        socks.append(sock)
    frames = {sock: Frames() for sock in socks}

    def receive(sock: socket.socket) -> list[tuple]:
        data = sock.recv(1 << 20)
        if not data:
            raise RuntimeError("the engine closed the link")
        return [read_message(m) for m in frames[sock].feed(data)]

    for sock in socks:
        while not any(m[0] == "state" and m[1].phase == "ready" for m in receive(sock)):
            pass
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    for r, tokens_each in enumerate(out_tokens):
        go.get()
        sampling = SamplingParams(max_new_tokens=tokens_each, ignore_eos=True)
        t0 = time.perf_counter()
        for sock, batch in zip(socks, batches, strict=True):
            for rid, ids in batch:
                send(sock, ("submit", GenerationRequest(f"{r}-{rid}", ids, sampling)))
        first: dict[str, float] = {}
        tokens, left = 0, sum(len(b) for b in batches)
        while left:
            for key, _ in selector.select():
                taken = 0
                for message in receive(key.fileobj):  # type: ignore[arg-type]
                    if message[0] != "outs" or not message[1]:
                        continue
                    taken += 1
                    now = time.perf_counter()
                    for t in message[1]:  # engine_link's wire: (id, tokens, log-probs[, ...finished, reason, error...])
                        if t[1]:
                            first.setdefault(t[0], now)
                            tokens += len(t[1])
                        if len(t) > 5 and t[5]:
                            if t[7]:
                                raise RuntimeError(t[7])
                            left -= 1
                if taken:
                    send(key.fileobj, ("ack", taken))  # type: ignore[arg-type]
        seconds = time.perf_counter() - t0
        ttft = pct([t - t0 for t in first.values()], 50)
        results.put({"tok_s": tokens / seconds, "ttft_p50_ms": 1e3 * ttft if ttft is not None else None})
    for sock in socks:
        sock.close()


# The decode loop's counters (decode_loop.py) that say where a round's time went: steps, and host seconds.
LOOP_COUNTERS = (
    "prefill_steps",
    "mixed_steps",
    "decode_steps",
    "decode_rows",
    "wait_s",
    "plan_s",
    "launch_s",
    "emit_s",
)


async def _engine_process(
    model_dir: Path,
    streams: int,
    prompt: int,
    out_tokens: int,
    vocab: int,
    batch_size: int,
    rounds: int = 1,
    fronts: int = 4,
    profile: Path | None = None,
) -> dict:
    """The decode loop in an engine process of its own (frontends.py's EngineServer, no HTTP here): tokens/s and
    TTFT p50 with ``fronts`` bare front ends in another process, the median of ``rounds`` runs of one engine (after
    a warm-up round), each with its decode-loop counters and this process's CPU seconds. With ``profile``: py-spy's
    collapsed stacks of this process over the rounds (every thread, idle samples too; ``pip install py-spy``)."""
    import multiprocessing

    from gpu_torch import prompts

    from lmi_trt.serving.engine_link import EngineServer

    batch = prompts(streams, prompt, vocab=vocab)
    engine = _torch_engine(model_dir, prompt, out_tokens, batch_size)
    await engine.start()
    server = EngineServer(os.path.join(tempfile.mkdtemp(prefix="frontends-link-"), "engine"))
    await server.start()
    server.ready(engine, None)
    spawn = multiprocessing.get_context("spawn")  # this process holds CUDA
    results, go = spawn.Queue(), spawn.Queue()
    batches = [[(str(i), ids) for i, ids in enumerate(batch) if i % fronts == f] for f in range(fronts)]
    proc = spawn.Process(
        target=_bare_front_ends, args=(server.address, batches, [8] + [out_tokens] * rounds, results, go)
    )
    proc.start()
    counters = engine._backend.counters
    runs, spy = [], None
    try:
        for r in range(rounds + 1):  # the first: the warm-up
            if r == 1 and profile is not None:
                spy = _spy(os.getpid(), profile)
            before, cpu = dict(counters), time.process_time()
            go.put(r)
            while proc.is_alive() and results.empty():
                await asyncio.sleep(0.01)
            result = await asyncio.to_thread(results.get, True, 60)
            if r:
                result["cpu_s"] = round(time.process_time() - cpu, 3)
                result["loop"] = {k: round(counters[k] - before[k], 4) for k in LOOP_COUNTERS}
                runs.append(result)
        proc.join()
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled when interrupted
            spy.wait()
        await server.close()
        await engine.close()
    return _median_run(runs) | {"rounds": runs}


def _spy(pid: int, out: Path) -> subprocess.Popen:
    """py-spy sampling process ``pid`` (every thread, idle samples too, without pausing it) until interrupted."""
    out.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--pid", str(pid), "--rate", "500", "--format", "raw", "--nonblocking"]
    command += ["--threads", "--idle", "--output", str(out / "engine-process.txt")]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL)


APIS = ("openai", "lmi", "tgi")


def _gpu_model() -> tuple[Path, int, Callable[[int], float]]:
    """gpu_decode.py's ~1.1B model (16 layers, bf16, the test tokenizer's vocabulary) in a new folder: the folder, the
    vocabulary's size, and the decode bound at n streams of 128 + 128 tokens."""
    import torch
    from gpu_decode import decode_bound, kv_bytes_per_position
    from gpu_torch import build_model, copy_bandwidth
    from tinymodels import build_tokenizer

    model_dir = Path(tempfile.mkdtemp(prefix="frontends-model-"))
    vocab = len(build_tokenizer(model_dir))
    weights = build_model(model_dir, layers=16, dtype=torch.bfloat16, vocab_size=vocab)
    bandwidth = copy_bandwidth()
    return model_dir, vocab, lambda n: decode_bound(n, bandwidth, weights, kv_bytes_per_position(16), 128, 128)


def loop(args: argparse.Namespace) -> dict:
    """The decode loop in an engine process of its own alone (gpu mode's ``engine_process``), ``--rounds`` runs per
    stream count with the loop's counters per run; ``--profile-dir``: py-spy's stacks of the engine's process."""
    model_dir, vocab, bound = _gpu_model()
    top = max(args.concurrency)
    own = {}
    for c in args.concurrency:
        profile = args.profile_dir / f"c{c}" if args.profile_dir else None
        own[c] = asyncio.run(_engine_process(model_dir, c, 128, 128, vocab, top, args.rounds, profile=profile))
        own[c]["bound_tok_s"], own[c]["of_bound"] = bound(c), own[c]["tok_s"] / bound(c)
        print(f"{c} streams: {own[c]['tok_s']:,.0f} tok/s = {own[c]['of_bound']:.1%} of the decode bound", flush=True)
        for run in own[c]["rounds"]:
            print(f"  {run['tok_s']:,.0f} tok/s ({run['tok_s'] / bound(c):.1%}), cpu {run['cpu_s']} s, {run['loop']}")
    return {"mode": "loop", "cpus": os.cpu_count(), "engine_process": own}


def gpu(args: argparse.Namespace) -> dict:
    import torch

    model_dir, vocab, bound = _gpu_model()
    rows = []
    top = max(args.concurrency)
    engine = {
        c: asyncio.run(_engine_protocol(model_dir, c, 128, 128, vocab, top, args.rounds)) for c in args.concurrency
    }
    own = {c: asyncio.run(_engine_process(model_dir, c, 128, 128, vocab, top, args.rounds)) for c in args.concurrency}
    for c in args.concurrency:
        for figure in (engine[c], own[c]):
            figure["bound_tok_s"], figure["of_bound"] = bound(c), figure["tok_s"] / bound(c)
        print(
            f"{c} streams: decode bound {bound(c):,.0f} tok/s; engine protocol {engine[c]['tok_s']:,.0f} "
            f"({engine[c]['of_bound']:.0%}), in an engine process of its own {own[c]['tok_s']:,.0f} "
            f"({own[c]['of_bound']:.0%}), TTFT p50 {own[c]['ttft_p50_ms']} ms",
            flush=True,
        )
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
            for streams in args.concurrency:
                # The APIs' rounds interleaved (openai, lmi, tgi, openai, ...), so that a slow moment of the host
                # falls on each alike; the median round counts, as the engine protocol's.
                levels: dict[str, list[dict]] = {api: [] for api in APIS}
                for r, api in itertools.product(range(args.rounds), APIS):
                    level = bench(
                        server,
                        api,
                        streams,
                        work / f"{api}-n{n}-c{streams}-{r}.json",
                        [
                            "--prompt-tokens",
                            "128",
                            "--output-tokens",
                            "128",
                            "--ignore-eos",
                            "--tokenizer",
                            str(model_dir),
                            # lmi-trt bench's default request count (8 per stream): the level's tail, where streams
                            # run out of requests while the engine protocol's all end together, is an eighth of it
                            "--client-procs",
                            str(client_procs(args, n)),
                        ],
                    )
                    levels[api].append({"tok_s": _tok_s(level), "ttft_p50_ms": _ttft_p50(level)})
                for api, runs in levels.items():
                    median = _median_run(runs)
                    rows.append(
                        {
                            "frontends": n,
                            "streams": streams,
                            "api": api,
                            **median,
                            "engine_tok_s": engine[streams]["tok_s"],
                            "served_vs_engine": median["tok_s"] / engine[streams]["tok_s"],
                        }
                    )
    print(f"{'N':>3} {'streams':>8} {'api':>7} {'tok/s':>10} {'engine':>10} {'ratio':>6} {'TTFT p50 ms':>12}")
    for r in rows:
        print(
            f"{r['frontends']:>3} {r['streams']:>8} {r['api']:>7} {r['tok_s']:>10.0f} {r['engine_tok_s']:>10.0f} "
            f"{r['served_vs_engine']:>6.2f} {r['ttft_p50_ms']}"
        )
    return {"mode": "gpu", "cpus": os.cpu_count(), "engine_protocol": engine, "engine_process": own, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("synthetic", "gpu", "loop", "cost"))
    ap.add_argument("--counts", default="1,2,4,8", help="front-end counts (option.api_server_count)")
    ap.add_argument("-c", "--concurrency", default="256", help="streams, comma-separated")
    ap.add_argument("--api", default="openai", choices=("openai", "lmi", "tgi"), help="synthetic: the streams' API")
    ap.add_argument("--duration", type=float, default=15.0, help="synthetic: seconds per level")
    ap.add_argument(
        "--client-procs",
        type=int,
        default=None,
        help="load-generator processes (lmi-trt bench; cost: 1); default as many as N, 4 at least, within the cores",
    )
    ap.add_argument("--rate", type=float, default=50.0, help="cost: the synthetic engine's tokens/s per stream")
    ap.add_argument(
        "--engine",
        default="synthetic",
        choices=("synthetic", "trtllm", "llmapi"),
        help="cost: the engine (trtllm: the fake Executor; llmapi: the fake LLM API; tests/fakes)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="synthetic, gpu, loop: runs per level (gpu: per API, interleaved; the engine protocol's and the engine "
        "process's too); the median counts",
    )
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--profile-dir",
        type=Path,
        default=None,
        help="synthetic: py-spy's collapsed stacks of the engine's process and front end 0 at the largest N; loop: of "
        "the engine's process over its rounds, every thread, idle samples too",
    )
    args = ap.parse_args()
    args.counts = [int(x) for x in args.counts.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    doc = {"synthetic": synthetic, "gpu": gpu, "loop": loop, "cost": cost}[args.mode](args)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
