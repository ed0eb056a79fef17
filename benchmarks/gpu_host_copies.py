"""The decode loop's host↔device copies (lmi_trt/engines/torch/host_copies.py) on a GPU, in one command.

1. Correctness under load: thousands of uploads of random sizes through a small ``Uploads`` ring (so that it
   wraps every few dozen copies) while the GPU is kept busy by matrix products queued ahead of them, then every
   uploaded tensor compared with its source; a half reused before the device had copied it would show here.
2. Host cost per call, side by side in one process: ``Uploads.put`` against ``Tensor.pin_memory().to(...)`` (what
   the loop did before) for a 3 × 256 int64 tensor (a step's block-table writes), and ``Downloads.take``/``give``
   against ``torch.empty(..., pin_memory=True)`` for a 3 × 256 float32 one (a step's tokens), each followed by its
   asynchronous copy; medians of 5 runs of 2,000 calls, with and without a second thread holding the GIL in pure
   Python (as the engine process's event loop does while the loop thread runs).

    PYTHONPATH=$PWD python3 benchmarks/gpu_host_copies.py --json gpu_host_copies.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from lmi_trt.engines.torch.host_copies import Downloads, Uploads


def check_ring(device: torch.device, copies: int = 4000) -> dict:
    uploads = Uploads(device, nbytes=64 << 10)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    sources, results = [], []
    for i in range(copies):
        if i % 200 == 0:
            for _ in range(4):  # ~ms of device work ahead of the next copies
                a = (a @ a).clamp_(-1, 1)
        n = int(torch.randint(1, 2000, (1,), generator=g))
        src = torch.randint(0, 1 << 40, (n,), generator=g, dtype=torch.long)
        sources.append(src)
        results.append(uploads.put(src))
    torch.cuda.synchronize()
    bad = sum(not torch.equal(s, r.cpu()) for s, r in zip(sources, results))
    return {"copies": copies, "mismatched": bad}


def per_call_us(fn, calls: int = 2000, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def costs(device: torch.device) -> dict:
    uploads, downloads = Uploads(device), Downloads()
    table = torch.randint(0, 1000, (3, 256), dtype=torch.long)
    out = torch.zeros(3, 256, device=device)

    def put_pinned() -> None:
        table.pin_memory().to(device, non_blocking=True)

    def put_staged() -> None:
        uploads.put(table)

    def get_pinned() -> None:
        torch.empty(out.shape, dtype=out.dtype, pin_memory=True).copy_(out, non_blocking=True)

    def get_reused() -> None:
        host = downloads.take(out.shape, out.dtype)
        host.copy_(out, non_blocking=True)
        downloads.give(host)

    fns = {"put: pin_memory().to()": put_pinned, "put: Uploads": put_staged}
    fns |= {"get: empty(pinned).copy_()": get_pinned, "get: Downloads": get_reused}
    result = {name: round(per_call_us(fn), 2) for name, fn in fns.items()}
    stop = threading.Event()

    def busy() -> None:  # pure Python: holds the GIL until the interpreter switches threads
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=busy)
    spinner.start()
    try:
        result |= {f"{name}, GIL contended": round(per_call_us(fn, calls=200), 2) for name, fn in fns.items()}
    finally:
        stop.set()
        spinner.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    device = torch.device("cuda")
    report = {"device": torch.cuda.get_device_name(), "ring": check_ring(device), "us_per_call": costs(device)}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    assert report["ring"]["mismatched"] == 0, report["ring"]


if __name__ == "__main__":
    main()
