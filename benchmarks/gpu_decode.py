"""The torch engine's built-in decode loop on a GPU, against transformers' own paths and the decode bound.

One run, one process, the same ~1.1B Llama-shaped bf16 random-weight model as gpu_torch.py
(hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 32000); N requests of
P prompt and O output tokens, all submitted at once, greedy, every request running to O tokens.
For each N:
  * bound        — (weights + the mean step's KV cache) read once per step at the measured copy bandwidth
  * hf_generate  — `model.generate` on one static batch, eager, after an identical warm-up run
  * hf_static_compile — `generate(cache_implementation="static")`, which compiles the decode step
                   (torch.compile, transformers' default compile config), after a warm-up run
  * hf_continuous — `model.generate_batch` (transformers' continuous batching, CUDA graphs, async batching)
  * lmi          — lmi-trt's TorchEngine with the built-in decode loop, through the engine protocol
Each reports output tokens/s (all tokens / wall time from submission to the last token), TTFT and
inter-token latency p50/p99 (static batches: per step; streams: per token arrival). For lmi it also
times the decode step alone (its CUDA graph replayed, and eager), profiles one eager step, fingerprints the
greedy tokens (``generated_sha256``: equal for two versions of lmi_trt whose outputs agree) and runs the same
requests again with eager decode steps (``graph_vs_eager``: every row identical expected).

    python benchmarks/gpu_decode.py --concurrency 64,256,1 --json gpu_decode.json --profile-dir prof/
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import inspect
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import torch
from gpu_torch import build_model, copy_bandwidth, prompts


def pct(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile, q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(tokens: int, seconds: float, ttfts: list[float], itls: list[float]) -> dict:
    def ms(values: list[float], q: float) -> float | None:
        value = pct(values, q)
        return None if value is None else 1e3 * value

    return {
        "tok_s": tokens / seconds,
        "seconds": seconds,
        "tokens": tokens,
        "ttft_p50_ms": ms(ttfts, 50),
        "ttft_p99_ms": ms(ttfts, 99),
        "itl_p50_ms": ms(itls, 50),
        "itl_p90_ms": ms(itls, 90),
        "itl_p99_ms": ms(itls, 99),
    }


def kv_bytes_per_position(layers: int, kv_heads: int = 8, head_dim: int = 64, itemsize: int = 2) -> int:
    return 2 * layers * kv_heads * head_dim * itemsize


def decode_bound(n: int, bandwidth: float, weight_bytes: int, kv_per_pos: int, prompt: int, out: int) -> float:
    """Tokens/s if each step read the weights and the batch's mean KV cache once, nothing else."""
    mean_context = prompt + out / 2
    return n * bandwidth / (weight_bytes + n * mean_context * kv_per_pos)


class Stamps:
    """A generate streamer that only records when each step's tokens came out."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_static_batch(model, ids: torch.Tensor, out_tokens: int, **extra) -> dict:
    """Tokens/s from a plain timed run; TTFT and ITL from a second run with a timestamping streamer
    (its per-step host copy would slow the first)."""
    kw = dict(max_new_tokens=out_tokens, min_new_tokens=out_tokens, do_sample=False, pad_token_id=0, **extra)
    with torch.no_grad():
        model.generate(ids, **kw)  # identical warm-up (compiles, when the static cache is asked for)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        stamps = Stamps()
        s0 = time.perf_counter()
        model.generate(ids, streamer=stamps, **kw)
        torch.cuda.synchronize()
    steps = stamps.times[1:]  # the first put is the prompt
    n = ids.shape[0]
    result = summary(
        n * (out.shape[1] - ids.shape[1]), seconds, [steps[0] - s0] * n, [b - a for a, b in zip(steps, steps[1:])]
    )
    result["generated"] = out[:, ids.shape[1] :].tolist()
    return result


def hf_continuous(model, batch: list[list[int]], out_tokens: int) -> dict:
    import dataclasses

    from transformers import GenerationConfig
    from transformers.generation import ContinuousBatchingConfig

    names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    page = "page_size" if "page_size" in names else "block_size"
    # A cache sized for the batch (2 pages of 256 a request), not from free memory: sized from
    # free memory it took 75 GB next to the other models here and ran out of memory.
    config = ContinuousBatchingConfig(
        **{page: 256},
        num_blocks=2 * len(batch) + 8,
        max_batch_tokens=8192,
        max_requests_per_batch=len(batch),
        use_cuda_graph=True,
        use_async_batching=True,
    )
    gen = GenerationConfig(
        max_new_tokens=out_tokens, min_new_tokens=out_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    accepted = inspect.signature(model.generate_batch).parameters
    kw = {"record_timestamps": True} if "record_timestamps" in accepted else {}
    model.generate_batch(batch, generation_config=gen, continuous_batching_config=config, **kw)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    results = model.generate_batch(batch, generation_config=gen, continuous_batching_config=config, **kw)
    seconds = time.perf_counter() - t0
    tokens = sum(len(r.generated_tokens) for r in results.values())
    ttfts, itls = [], []
    for r in results.values():
        stamps = getattr(r, "timestamps", None) or []
        if stamps:
            ttfts.append(stamps[0] - t0)
            itls += [b - a for a, b in zip(stamps, stamps[1:])]
    result = summary(tokens, seconds, ttfts, itls)
    result["errors"] = sum(r.error is not None for r in results.values())
    return result


async def stream(
    engine, rid: str, ids: list[int], tokens: int, adapter: str | None = None
) -> tuple[list[int], list[float]]:
    """One greedy request for ``tokens`` new tokens (ignore_eos), with LoRA ``adapter`` if named: its tokens, and
    when each arrived."""
    from lmi_trt.engines.base import GenerationRequest, SamplingParams

    got, times = [], []
    sampling = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    async for delta in engine.submit(GenerationRequest(rid, ids, sampling, adapter=adapter)):
        if delta.error:
            raise RuntimeError(delta.error)
        got += delta.token_ids
        times += [time.perf_counter()] * len(delta.token_ids)
    return got, times


async def lmi_run(
    model_dir: Path, batch: list[list[int]], out_tokens: int, max_num_tokens: int, profile_dir: Path | None
) -> dict:
    from lmi_trt.engines.torch import TorchEngine
    from lmi_trt.engines.torch.gpu_sampler import Mode

    n, plen = len(batch), len(batch[0])
    started = time.perf_counter()
    engine = TorchEngine(
        model_dir,
        dtype="bf16",
        device="cuda",
        max_batch_size=n,
        max_input_len=plen,
        max_new_tokens=out_tokens,
        max_num_tokens=max_num_tokens,
        decode_loop="builtin",
    )
    await engine.start()
    result: dict = {"startup_s": time.perf_counter() - started}

    backend = engine._backend
    try:
        await asyncio.gather(*(stream(engine, f"w{i}", ids, 8) for i, ids in enumerate(batch)))
        before = dict(backend.counters)
        t0 = time.perf_counter()
        runs = await asyncio.gather(*(stream(engine, f"r{i}", ids, out_tokens) for i, ids in enumerate(batch)))
        seconds = time.perf_counter() - t0
        counters = {k: backend.counters[k] - before[k] for k in before}
        ttfts = [times[0] - t0 for _, times in runs]
        itls = [b - a for _, times in runs for a, b in zip(times, times[1:])]
        result.update(summary(sum(len(g) for g, _ in runs), seconds, ttfts, itls))
        result["generated"] = generated = [g for g, _ in runs]
        # The same tokens from another version of the loop (another lmi_trt on PYTHONPATH): equal fingerprints.
        result["generated_sha256"] = hashlib.sha256(json.dumps(generated).encode()).hexdigest()
        result["loop"] = counters | {"wall_per_decode_step_ms": 1e3 * seconds / max(1, counters["decode_steps"])}
        # GPU-only: the decode steps as CUDA graphs give the tokens the same steps give eagerly (the graphs
        # advance the rows' positions and counts on the device between steps of the same rows).
        graphs, backend._graphs = backend._graphs, {}
        try:
            eager = await asyncio.gather(*(stream(engine, f"e{i}", ids, out_tokens) for i, ids in enumerate(batch)))
        finally:
            backend._graphs = graphs
        result["graph_vs_eager"] = prefix_agreement(generated, [g for g, _ in eager])

        # The decode step alone, at this batch size: its CUDA graph, and eager. Every slot is put back, before
        # each step, where the run's last decode step had its rows (a step may advance them on the device).
        size = next(s for s in backend._sizes if s >= n)
        park = parked(backend, size, plen + out_tokens - 2, plen)
        greedy = backend._graphs[size, Mode.GREEDY]
        result["step_graph_ms"] = time_it(lambda: (park(), greedy.replay()))
        result["step_eager_ms"] = time_it(lambda: (park(), backend._decode_step(size, Mode.GREEDY)), repeats=10)
        decoder = backend._decoder
        if decoder.fused_kernels:  # the Triton kernels against the torch operations, same inputs
            positions = torch.randint(0, plen + out_tokens - 1, (size,), device="cuda")
            with torch.inference_mode():
                # Random tokens at random positions of the rows' last block tables; nothing written.
                backend._next[:size] = torch.randint(10, 32000, (size,), device="cuda")
                backend._meta[0, :size], backend._meta[1, :size], backend._meta[2, :size] = positions, -1, positions + 1
                fused = decoder.forward(backend._decode_batch(size))
                decoder.fused_kernels = False
                plain = decoder.forward(backend._decode_batch(size))
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    backend._decode_step(size, Mode.GREEDY)
                decoder.fused_kernels = True
            result["fused_vs_torch_logits_rel_err"] = float((fused - plain).norm() / plain.norm())
            result["step_graph_torch_ops_ms"] = time_it(graph.replay)
            del graph
        sampled = backend._graphs.get((size, Mode.SAMPLED))
        result["step_graph_sampled_ms"] = time_it(lambda: (park(), sampled.replay())) if sampled is not None else None
        if profile_dir is not None:
            step = functools.partial(backend._decode_step, size, Mode.GREEDY)
            result["profile"] = profile_step(lambda: (park(), step()), profile_dir / f"lmi_step_{n}.txt")
        result["checks"] = await sampling_checks(engine, batch[0])
    finally:
        await engine.close()
    engine = backend = None  # drop the last references before emptying the CUDA cache
    torch.cuda.empty_cache()
    return result


def parked(backend, size: int, position: int, prompt: int):
    """A function putting slots ``0..size-1`` of the decode steps' inputs (``backend._meta``) at ``position``,
    live (its cache slot from the slot's block table), ``position - prompt`` tokens generated."""
    with torch.inference_mode():
        block = backend._pool.block_size
        cells = backend._tables[:size, position // block] * block + position % block
        state = torch.stack((torch.full_like(cells, position), cells, torch.full_like(cells, position + 1)))
        state = torch.cat((state, torch.full_like(cells, position - prompt).unsqueeze(0)))

    def park() -> None:
        backend._meta[:, :size].copy_(state)

    return park


def time_it(fn, repeats: int = 50) -> float:
    with torch.inference_mode():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def profile_step(step, out: Path) -> list[dict]:
    """Kernel time of one eager decode ``step`` by operator (a graph replays the same kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.inference_mode():
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    events = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0))
    return [
        {"op": e.key, "count": e.count // 3, "device_ms_per_step": e.self_device_time_total / 3 / 1e3}
        for e in events[:15]
    ]


async def sampling_checks(engine, prompt: list[int]) -> dict:
    """Mixed parameters in one batch on the GPU: seeded draws repeat, bans hold, nothing errors."""
    from lmi_trt.engines.base import GenerationRequest, SamplingParams

    async def run(rid: str, **kw) -> list[int]:
        bad = kw.pop("bad_words_ids", [])
        request = GenerationRequest(
            rid, prompt, SamplingParams(max_new_tokens=16, ignore_eos=True, **kw), bad_words_ids=bad
        )
        out = []
        async for delta in engine.submit(request):
            if delta.error:
                raise RuntimeError(f"{rid}: {delta.error}")
            out += delta.token_ids
        return out

    greedy, s1, s2, s3, pen, bad = await asyncio.gather(
        run("g"),
        run("s1", do_sample=True, temperature=0.8, top_k=40, top_p=0.9, seed=5),
        run("s2", do_sample=True, temperature=0.8, top_k=40, top_p=0.9, seed=5),
        run("s3", do_sample=True, temperature=1.3, seed=6, logprobs=True),
        run("pen", repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, min_new_tokens=4),
        run("bad", bad_words_ids=[[t] for t in range(100, 200)]),
    )
    return {
        "seeded_repeat": s1 == s2,
        "seeded_differs_from_greedy": s1 != greedy,
        "bans_hold": not any(100 <= t < 200 for t in bad),
        "penalty_changed_output": pen != greedy,
        "lengths": [len(x) for x in (greedy, s1, s2, s3, pen, bad)],
    }


def prefix_agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    def common(x, y):
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        return k

    lengths = [common(x, y) for x, y in zip(a, b)]
    return {
        "rows_identical": sum(x == y for x, y in zip(a, b)),
        "rows": len(lengths),
        "mean_common_prefix": statistics.mean(lengths),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="64,256,1")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--max-num-tokens", type=int, default=8192, help="option.max_num_tokens of the lmi engine")
    ap.add_argument("--modes", default="lmi,hf_generate,hf_continuous,hf_static_compile")
    ap.add_argument("--budget-s", type=float, default=540, help="skip the slow modes once this much time has passed")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile-dir", type=Path)
    a = ap.parse_args()
    clock = time.perf_counter()
    modes = a.modes.split(",")
    import transformers

    report: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prompt_tokens": a.prompt_tokens,
        "output_tokens": a.output_tokens,
        "lmi_max_num_tokens": a.max_num_tokens,
        "rows": [],
    }

    def save() -> None:
        if a.json:
            a.json.write_text(json.dumps(report, indent=2))

    def attempt(row: dict, name: str, fn, *args) -> None:
        if time.perf_counter() - clock > a.budget_s:
            row[name] = {"skipped": "time budget"}
            return
        try:
            row[name] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - one failed mode must not lose the others
            traceback.print_exc()
            row[name] = {"error": f"{type(exc).__name__}: {exc}"}
        brief = {k: round(v, 2) for k, v in row[name].items() if isinstance(v, float)}
        print(f"  N={row['concurrency']} {name}: {brief or row[name]}", flush=True)
        save()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama-1b"
        report["weight_bytes"] = weights = build_model(model_dir, layers=a.layers, dtype=torch.bfloat16)
        report["copy_bandwidth_Bps"] = bw = copy_bandwidth()
        kv = kv_bytes_per_position(a.layers)
        print(f"{report['device']}: weights {weights / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda").eval()
        for n in (int(x) for x in a.concurrency.split(",")):
            batch = prompts(n, a.prompt_tokens)
            ids = torch.tensor(batch, device="cuda")
            row = {"concurrency": n, "bound_tok_s": decode_bound(n, bw, weights, kv, a.prompt_tokens, a.output_tokens)}
            report["rows"].append(row)
            print(f"N={n}: decode bound {row['bound_tok_s']:,.0f} tok/s", flush=True)
            if "lmi" in modes:
                attempt(
                    row,
                    "lmi",
                    lambda batch=batch: asyncio.run(
                        lmi_run(model_dir, batch, a.output_tokens, a.max_num_tokens, a.profile_dir)
                    ),
                )
            if "hf_generate" in modes:
                attempt(row, "hf_generate", hf_static_batch, hf, ids, a.output_tokens)
            if (
                "lmi" in modes
                and "hf_generate" in modes
                and "generated" in row["lmi"]
                and "generated" in row["hf_generate"]
            ):
                row["lmi_vs_generate_greedy"] = prefix_agreement(
                    row["lmi"]["generated"], row["hf_generate"]["generated"]
                )
                print(f"  greedy agreement with generate (bf16): {row['lmi_vs_generate_greedy']}", flush=True)
            if "hf_static_compile" in modes:
                attempt(
                    row,
                    "hf_static_compile",
                    lambda ids=ids: hf_static_batch(hf, ids, a.output_tokens, cache_implementation="static"),
                )
            for mode in ("lmi", "hf_generate"):
                row.get(mode, {}).pop("generated", None)
            save()
        # Last: in the first run its memory sizing took the process down.
        for row in report["rows"] if "hf_continuous" in modes else []:
            attempt(
                row, "hf_continuous", hf_continuous, hf, prompts(row["concurrency"], a.prompt_tokens), a.output_tokens
            )
    report["wall_s"] = time.perf_counter() - clock
    save()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
