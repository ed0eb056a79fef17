"""The embedded torch engine on a GPU, side by side with transformers' own `generate` and the decode bound.

A ~1.1B Llama-shaped model with random weights (hidden 2048, 16 layers, 32 heads, 8 KV heads,
intermediate 8192, vocab 32000) in bf16; N concurrent requests of P prompt and O output tokens.
In one run, for each N:
  * bound      — decode can't beat reading every weight once per step: N × copy_bandwidth ÷ weight_bytes
  * hf_generate — transformers `model.generate` on one static batch of N (eager), what a script would do
  * engine_<mode> — lmi-trt's TorchEngine through its engine protocol (N requests submitted at once),
                   continuous batching and the static-batch path

    python benchmarks/gpu_torch.py --concurrency 64,256 --prompt-tokens 128 --output-tokens 128 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import torch


def build_model(out: Path, *, layers: int, dtype: torch.dtype, device: str = "cuda", **shape) -> int:
    """The ~1.1B Llama-shaped model (``shape`` overrides its config: a tiny one for CPU checks)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    cfg = LlamaConfig(
        **{
            "hidden_size": 2048,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 8192,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        }
        | shape,
        num_hidden_layers=layers,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(out)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return weight_bytes


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (the same convention as the issue's 3.0 TB/s)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def prompts(n: int, length: int, seed: int = 0, vocab: int = 32000) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, length), generator=g).tolist()


def hf_generate(model_dir: Path, batch: list[list[int]], out_tokens: int) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, device_map="cuda").eval()
    ids = torch.tensor(batch, device="cuda")
    kw = dict(max_new_tokens=out_tokens, min_new_tokens=out_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    generated = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    del model
    torch.cuda.empty_cache()
    return generated / seconds


async def engine_run(model_dir: Path, batch: list[list[int]], out_tokens: int, batching: str) -> dict:
    from lmi_trt.engines.base import GenerationRequest, SamplingParams
    from lmi_trt.engines.torch import TorchEngine

    n, plen = len(batch), len(batch[0])
    engine = TorchEngine(
        model_dir,
        dtype="bf16",
        device="cuda",
        max_batch_size=n,
        max_input_len=plen,
        max_new_tokens=out_tokens,
        batching=batching,
    )
    await engine.start()
    sampling = SamplingParams(max_new_tokens=out_tokens, ignore_eos=True)

    async def one(i: int, ids: list[int], t0: float) -> tuple[int, float]:
        first, count = None, 0
        async for delta in engine.submit(GenerationRequest(f"r{i}", ids, sampling)):
            if delta.token_ids and first is None:
                first = time.perf_counter() - t0
            count += len(delta.token_ids)
        return count, first or 0.0

    try:
        await asyncio.gather(*(one(i, ids[:16], time.perf_counter()) for i, ids in enumerate(batch[:4])))  # warm-up
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(i, ids, t0) for i, ids in enumerate(batch)))
        seconds = time.perf_counter() - t0
    finally:
        await engine.close()
    engine = None  # drop the last reference before emptying the CUDA cache
    torch.cuda.empty_cache()
    ttfts = sorted(r[1] for r in results)
    return {
        "tok_s": sum(r[0] for r in results) / seconds,
        "seconds": seconds,
        "ttft_p50_s": ttfts[len(ttfts) // 2],
        "tokens": sum(r[0] for r in results),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--modes", default="hf_generate,engine_continuous,engine_static")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    modes = a.modes.split(",")
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import transformers

    report["transformers"] = transformers.__version__
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama-1b"
        report["weight_bytes"] = build_model(model_dir, layers=a.layers, dtype=torch.bfloat16)
        report["copy_bandwidth_Bps"] = bw = copy_bandwidth()
        print(
            f"{report['device']}: weights {report['weight_bytes'] / 1e9:.2f} GB, copy bandwidth {bw / 1e12:.2f} TB/s",
            flush=True,
        )
        rows = []
        for n in (int(x) for x in a.concurrency.split(",")):
            batch = prompts(n, a.prompt_tokens)
            row = {"concurrency": n, "bound_tok_s": n * bw / report["weight_bytes"]}
            if "hf_generate" in modes:
                row["hf_generate_tok_s"] = hf_generate(model_dir, batch, a.output_tokens)
                print(f"  N={n} hf_generate {row['hf_generate_tok_s']:,.0f} tok/s", flush=True)
            for mode in ("continuous", "static"):
                if f"engine_{mode}" in modes:
                    r = asyncio.run(engine_run(model_dir, batch, a.output_tokens, mode))
                    row[f"engine_{mode}_tok_s"] = r["tok_s"]
                    row[f"engine_{mode}_ttft_p50_s"] = r["ttft_p50_s"]
                    print(
                        f"  N={n} engine {mode}: {r['tok_s']:,.0f} tok/s, TTFT p50 {r['ttft_p50_s']:.3f} s", flush=True
                    )
            rows.append(row)
        report["rows"] = rows
    print(json.dumps(report, indent=2))
    if a.json:
        a.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
