"""How a host's cores scale for pure-Python work: k processes at once, each counting in a loop for a few seconds; the
count per process and in all for each k. On a host whose cores slow down as more of them work (a shared CPU's
clock, a VM's cores), a program of N processes cannot scale N-fold however it is written: the front-end benchmark's
ratios (frontends.py synthetic) are read against this.

    python benchmarks/cpu_scaling.py --counts 1,2,4,8,10,12,16
"""

from __future__ import annotations

import argparse
import multiprocessing
import time


def _count(seconds: float, results) -> None:
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    results.put(n / seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--counts", default="1,2,4,8,16", help="processes at once, comma-separated")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    for k in (int(x) for x in args.counts.split(",")):
        results = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=_count, args=(args.seconds, results)) for _ in range(k)]
        for p in procs:
            p.start()
        rates = [results.get() for _ in procs]
        for p in procs:
            p.join()
        print(f"k={k:2d}: per process {sum(rates) / k / 1e6:6.2f} M/s, all {sum(rates) / 1e6:7.2f} M/s", flush=True)


if __name__ == "__main__":
    main()
