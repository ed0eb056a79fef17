"""The decode loop's device→host copy of a step's tokens (lmi_trt/engines/torch/host_copies.py) on a GPU.

Host cost per call, side by side in one process, for a 3 × 256 float32 tensor (a 256-row step's tokens, log-probs
and statuses): ``Downloads.take`` / ``give`` around the asynchronous copy against ``torch.empty(..., pin_memory=True)``
(what the loop did before); medians of 5 runs of 2,000 calls, and of 200 calls with a second thread holding the GIL
in pure Python (as the engine process's event loop may while the loop thread runs: each torch call releases the GIL,
and taking it back waits for the other thread to let go).

    PYTHONPATH=$PWD python3 benchmarks/gpu_host_copies.py --json gpu_host_copies.json

Uploads were measured the same way at commit be6e947 (a staging buffer pinned once, since removed): 32.1 µs a call
against 22.7 µs for ``Tensor.pin_memory().to(...)``, so uploads stay as they were.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

import torch

from lmi_trt.engines.torch.host_copies import Downloads


def per_call_us(fn, calls: int, runs: int = 5) -> float:
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
    downloads = Downloads()
    out = torch.zeros(3, 256, device=device)

    def fresh() -> None:
        torch.empty(out.shape, dtype=out.dtype, pin_memory=True).copy_(out, non_blocking=True)

    def reused() -> None:
        host = downloads.take(out.shape, out.dtype)
        host.copy_(out, non_blocking=True)
        downloads.give(host)

    fns = {"empty(pinned).copy_()": fresh, "Downloads": reused}
    result = {name: round(per_call_us(fn, 2000), 2) for name, fn in fns.items()}
    stop = threading.Event()

    def busy() -> None:  # pure Python: holds the GIL until the interpreter switches threads
        x = 0
        while not stop.is_set():
            x += 1

    spinner = threading.Thread(target=busy)
    spinner.start()
    try:
        result |= {f"{name}, GIL contended": round(per_call_us(fn, 200), 2) for name, fn in fns.items()}
    finally:
        stop.set()
        spinner.join()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), "us_per_call": costs(torch.device("cuda"))}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
