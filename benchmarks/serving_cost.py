#!/usr/bin/env python
"""The serving layer's own CPU per request and per streamed token, in one process, without a second one's noise.

The app of `lmi-trt serve` (every protocol's routes) over the synthetic engine, unpaced, in this process, with an
aiohttp client on loopback in the same process: ``--requests`` streams of 2 tokens, then as many of ``--tokens``,
8 at a time, over one API (OpenAI completions, LMI jsonlines or TGI SSE streams). The process's CPU time per
short request is the per-request figure; the long streams' CPU time less that, per token, the per-token one. Both
count the client's share and the synthetic engine's (the same in every version of the serving code), not the
link of ``option.api_server_count`` > 1 (``benchmarks/frontends.py cost`` measures a front end as it runs), so
they are for comparing two versions of the serving layer on one host: a 2-core box's noise, which makes
``frontends.py cost`` differ by ±10 % between runs of one tree, touches them far less.

``--trees OLD,NEW`` runs this script once per tree and round, interleaved, each with that tree first on
``PYTHONPATH`` (a folder holding an ``lmi_trt``), and prints the medians side by side.

    python benchmarks/serving_cost.py --api openai
    git archive main lmi_trt | tar -x -C /tmp/before        # the version to compare against
    python benchmarks/serving_cost.py --api openai,lmi,tgi --trees /tmp/before,$PWD --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from interleaved import interleaved

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic app and the tiny tokenizer (this checkout's)

PROMPT = "The quick brown fox jumps over the lazy dog"
CONCURRENT = 8


def request_of(api: str, tokens: int) -> tuple[str, dict]:
    """(path, body) of one streamed request for ``tokens`` new tokens (the synthetic engine makes exactly that
    many for a prompt without its eos token)."""
    if api == "openai":
        return "/v1/completions", {"prompt": PROMPT, "max_tokens": tokens, "stream": True}
    if api == "lmi":
        return "/invocations", {"inputs": PROMPT, "parameters": {"max_new_tokens": tokens}, "stream": True}
    return "/generate_stream", {"inputs": PROMPT, "parameters": {"max_new_tokens": tokens}}


async def measure(api: str, requests: int, tokens: int) -> dict[str, float]:
    import aiohttp
    from aiohttp.test_utils import TestServer
    from serverproc import SyntheticApp, wait_until

    from lmi_trt.config import LmiConfig
    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

    app = SyntheticApp(LmiConfig(max_input_len=64, max_output_len=max(tokens, 2)), adapters=DEFAULT_ADAPTERS)
    async with TestServer(app.app, host="127.0.0.1") as server, aiohttp.ClientSession(str(server.make_url(""))) as s:

        async def ready() -> bool:
            async with s.get("/ping") as r:
                return r.status == 200

        assert await wait_until(ready, timeout=60)

        async def run(n: int, new_tokens: int) -> float:
            """CPU seconds of this process for ``n`` streams."""
            path, body = request_of(api, new_tokens)

            async def one() -> None:
                async with s.post(path, json=body) as r:
                    text = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{path}: {r.status} {text[:300]!r}")

            cpu = time.process_time()
            for _ in range(n // CONCURRENT):
                await asyncio.gather(*(one() for _ in range(CONCURRENT)))
            return time.process_time() - cpu

        await run(4 * CONCURRENT, 2)  # warm-up: caches, first-use imports
        n = requests // CONCURRENT * CONCURRENT
        short, long = await run(n, 2), await run(n, tokens)
    per_request = short / n
    return {
        "us_per_request": 1e6 * per_request,
        "us_per_token": 1e6 * (long - n * per_request) / (n * (tokens - 2)),
    }


def compare(trees: list[str], apis: list[str], rounds: int, extra: list[str]) -> None:
    """This script once per round, tree and API, interleaved, each tree's ``lmi_trt`` first on the path; medians."""
    pairs = [(api, tree) for api in apis for tree in trees]
    variants = {f"{api} {tree}": (tree, ["--api", api, "--print-json", *extra]) for api, tree in pairs}
    outputs = interleaved(__file__, variants, rounds)  # each run's figures: its last line
    runs = {(tree, api): [json.loads(out.splitlines()[-1]) for out in outputs[f"{api} {tree}"]] for api, tree in pairs}
    print(f"median of {rounds} interleaved rounds")
    print("| API | figure | " + " | ".join(trees) + " |")
    print("| --- | --- |" + " ---: |" * len(trees))
    for api in apis:
        for figure in ("us_per_request", "us_per_token"):
            medians = [statistics.median(run[figure] for run in runs[tree, api]) for tree in trees]
            spread = [
                f"{min(r[figure] for r in runs[t, api]):.1f}–{max(r[figure] for r in runs[t, api]):.1f}" for t in trees
            ]
            cells = [f"{m:,.1f} ({s})" for m, s in zip(medians, spread, strict=True)]
            print(f"| {api} | {figure} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", default="openai", help="openai, lmi or tgi; comma-separated with --trees")
    ap.add_argument("--requests", type=int, default=800, help="streams of each length")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens of each long stream")
    ap.add_argument("--trees", help="comma-separated folders holding an lmi_trt: compare them (see above)")
    ap.add_argument("--rounds", type=int, default=3, help="with --trees: interleaved rounds")
    ap.add_argument("--print-json", action="store_true", help="print the figures as one JSON line")
    args = ap.parse_args()
    apis = args.api.split(",")
    if not set(apis) <= {"openai", "lmi", "tgi"}:
        ap.error(f"--api={args.api}: openai, lmi or tgi")
    if args.trees:
        compare(args.trees.split(","), apis, args.rounds, [f"--requests={args.requests}", f"--tokens={args.tokens}"])
        return
    if len(apis) > 1:
        ap.error("several APIs need --trees")
    figures = asyncio.run(measure(apis[0], args.requests, args.tokens))
    if args.print_json:
        print(json.dumps(figures))
    else:
        print(f"{apis[0]}: {figures['us_per_request']:.1f} µs CPU per request, {figures['us_per_token']:.2f} per token")


if __name__ == "__main__":
    main()
