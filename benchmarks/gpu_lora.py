"""LoRA adapters in the torch engine's built-in decode loop on a GPU (issue 27), in one process and one command.

The ~1.1B Llama-shaped bf16 random-weight model of gpu_torch.py / gpu_paged.py and 4 PEFT LoRA adapters of rank 16
on all seven projections (peft's get_peft_model with random A and B, save_pretrained); every request greedy with
ignore_eos, 128-token prompts, 256 new tokens, all of a workload submitted at once through TorchEngine's engine
protocol (no HTTP).

First the expand kernel alone (``kernels``): for each tile configuration of ``TILE_GRID`` and each of the model's
4 projections at 64 rows, ``decode_kernels.lora_expand`` against the torch operations on the GPU (bf16 tolerance,
base rows exactly untouched, each slot's rows identical to a batch of that slot alone), then its time inside a
CUDA graph of the 16 layers' launches; beside it, the base GEMM on the plain weight, on the weight with the slots'
A rows folded after it (both outputs at once) and on the view of its base rows, and the separate shrink matmul.

Then engines, each in turn in this process:

  base — option.enable_lora off: 64 streams of the base model (the reference);
  one lora engine per entry of ``VARIANTS`` (lora.FOLD and decode_kernels.LORA_TILES, set before it starts:
  its CUDA graphs keep them) — option.enable_lora=true, max_loras=4, max_lora_rank=16, the 4 adapters registered:
         base_64  — the same 64 base-model streams (what the adapter slots cost rows that use none),
         mixed_64 — 64 streams, 16 per adapter, interleaved (every decode step mixes the 4 adapters);
                    --runs runs (3), the median counts (the first also writes the 4 adapters into their slots);
                    the issue's target: mixed_64 tokens/s ≥ 0.8 × the base engine's;
         half_64  — 64 streams, every other one of the base model, the rest of the 4 adapters;
         {adapter}_alone — the same 64 prompts, every row of one adapter.

Outputs: base_64 on a lora engine is compared with the base engine's row by row (a step of base rows only runs the
base model's pass: identical), and each adapter's 16 rows of mixed_64 with the same prompts' rows of its _alone run.
Both runs have the same batch shape, so the base GEMMs sum alike and the rows must be identical: on this random
model, bf16 rounding of another shape (16 rows alone against 64 mixed, as before) changes most rows after a few
tokens, which said nothing about the adapters. half_64's base rows against the base engine's are reported, not
required: folded, a step with adapter rows computes the base rows' projections in the wider GEMM, which may round
otherwise (as another batch size may).

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/gpu_lora.py --json gpu_lora.json

--smoke runs the same on the CPU with a tiny random model and small counts (checks the script).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_paged import KvLog, agreement, print_targets, session
from gpu_torch import build_model, prompts

from lmi_trt.engines.lora_sizes import group_sizes
from lmi_trt.engines.torch import decode_kernels, lora
from lmi_trt.engines.torch.decode_kernels import LoraTiles

ADAPTERS = ("sql", "chat", "code", "math")
MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT = (lora.FOLD, lora.FUSE_SILU, decode_kernels.LORA_TILES)
# The engines compared: (name, lora.FOLD, lora.FUSE_SILU, the expand's tiles). The first is the layout and tiles
# before the fold; the default is marked in the table.
VARIANTS = [
    ("stacked k32 n64 w4", False, False, LoraTiles(32, 64, 4)),
    ("folded k64 n64 w4", True, False, LoraTiles(64, 64, 4)),
    ("folded+silu k64 n64 w4", True, True, LoraTiles(64, 64, 4)),
    ("folded+silu k64 n32 w2", True, True, LoraTiles(64, 32, 2)),
    ("folded k64 n32 w4", True, False, LoraTiles(64, 32, 4)),
    ("folded+silu k64 n32 w4", True, True, LoraTiles(64, 32, 4)),
    ("folded+silu k64 n128 w4", True, True, LoraTiles(64, 128, 4)),
]
TILE_GRID = [LoraTiles(k, n, w) for k in (32, 64) for n in (32, 64, 128) for w in (2, 4)]


def make_adapters(model_dir: Path, out: Path, rank: int, dtype: torch.dtype) -> dict[str, str]:
    """PEFT LoRA adapters with random A and B (peft's init_lora_weights=False), saved as folders."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folders = {}
    for i, name in enumerate(ADAPTERS):
        torch.manual_seed(100 + i)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=MODULES, init_lora_weights=False)
        peft_model = get_peft_model(model, config)
        folders[name] = str(out / name)
        peft_model.save_pretrained(folders[name])
        del model, peft_model
    return folders


def graph_us(launch, count: int, device: str) -> float | None:
    """Microseconds of one replay of a CUDA graph of ``launch(i)`` for i < count (None off CUDA)."""
    if device != "cuda":
        for i in range(count):
            launch(i)
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(count):  # compiles, autotunes
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(count):
            launch(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(50):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / 50


def gemm_times(x: torch.Tensor, folded: list[torch.Tensor], n_out: int, device: str) -> dict:
    """A projection's GEMM in each layout (µs for ``len(folded)`` layers in a graph): the plain weight, the folded one
    (base and low-rank outputs at once), the view of its base rows, and the separate shrink; and whether the folded
    GEMM's base output is the plain one's bit for bit."""
    plain = [w[:n_out].clone() for w in folded]
    a_apart = [w[n_out:].clone() for w in folded]
    layers = len(folded)
    return {
        "plain": graph_us(lambda i: F.linear(x, plain[i]), layers, device),
        "folded": graph_us(lambda i: F.linear(x, folded[i]), layers, device),
        "view of base rows": graph_us(lambda i: F.linear(x, folded[i][:n_out]), layers, device),
        "shrink apart": graph_us(lambda i: torch.mm(x, a_apart[i].t()), layers, device),
        "folded base output identical to plain": torch.equal(F.linear(x, folded[0])[:, :n_out], F.linear(x, plain[0])),
    }


def silu_times(base, low, token_slots, ups, expand, span: int, rank: int, device: str) -> dict:
    """gate/up's expand and silu_mul in one kernel (``lora_silu_mul``) against the two (checked), and the times of
    it and of ``silu_mul`` alone (which the base model runs too)."""
    gate_up = base.clone()
    expand(ups[0], token_slots, gate_up)
    inner = base.size(1) // 2
    fused = decode_kernels.lora_silu_mul(base, low, token_slots, ups[0], span, rank)
    if device == "cuda":
        two = decode_kernels.silu_mul(gate_up)
    else:
        two = F.silu(gate_up[:, :inner]) * gate_up[:, inner:]
    torch.testing.assert_close(fused.float(), two.float(), rtol=1.6e-2, atol=1e-2)
    layers = len(ups)
    return {
        "gate_up+silu": graph_us(
            lambda i: decode_kernels.lora_silu_mul(base, low, token_slots, ups[i], span, rank), layers, device
        ),
        "silu_mul": graph_us(lambda i: decode_kernels.silu_mul(gate_up), layers, device) if device == "cuda" else None,
    }


def kernels(config, layers: int, slots: int, rank: int, tokens: int, device: str, dtype: torch.dtype) -> dict:
    """The expand kernel of each ``TILE_GRID`` entry against the torch operations, and the times of it and of the
    projections' GEMMs in CUDA graphs of ``layers`` launches (the module docstring). Raises on a wrong result."""
    torch.manual_seed(7)
    span = slots * rank
    token_slots = (torch.arange(tokens) % (slots + 1) - 1).to(device)  # every slot and the base model (-1)
    report: dict = {"checked": [], "expand_us": {}, "gemm_us": {}}
    shapes = {}
    for group, (fan_in, parts, outs) in group_sizes(config).items():
        n_out, width = sum(outs), parts * span
        ends = tuple(torch.tensor(outs).cumsum(0).tolist())
        ups = []
        for _ in range(layers):
            up = torch.randn(width, n_out, device=device, dtype=dtype) * 0.05
            for part, (start, end) in enumerate(zip((0, *ends), ends)):
                up[part * span : (part + 1) * span, :start] = 0
                up[part * span : (part + 1) * span, end:] = 0
            ups.append(up)
        both = torch.randn(tokens, n_out + width, device=device, dtype=dtype)
        residual = torch.randn(tokens, n_out, device=device, dtype=dtype)
        shapes[group] = (n_out, width, ends, ups, both, residual, group in ("o", "down"))
        # The GEMMs: plain weight, folded weight (base and low-rank outputs at once), its base rows' view; the shrink.
        x = torch.randn(tokens, fan_in, device=device, dtype=dtype)
        folded = [torch.randn(n_out + width, fan_in, device=device, dtype=dtype) * 0.02 for _ in range(layers)]
        report["gemm_us"][group] = gemm_times(x, folded, n_out, device)
    for tiles in TILE_GRID:
        decode_kernels.LORA_TILES = tiles
        times = {}
        for group, (n_out, width, ends, ups, both, residual, into_residual) in shapes.items():
            low = both[:, n_out:]
            kept = (token_slots[:, None] == torch.arange(width, device=device) % span // rank).float()
            delta = (low.float() * kept) @ ups[0].float()

            def expand(up, rows, out, low=low, ends=ends, base=both[:, :n_out] if into_residual else None):
                return decode_kernels.lora_expand(low, rows, up, out, span, rank, ends, base)

            start = residual if into_residual else both[:, :n_out]
            want = start.float() + (both[:, :n_out].float() if into_residual else 0) + delta
            got = expand(ups[0], token_slots, start.clone())
            torch.testing.assert_close(got.float(), want, rtol=1.6e-2, atol=1e-2)
            base_rows = token_slots < 0
            unchanged = start.float() + (both[:, :n_out].float() if into_residual else 0)
            assert torch.equal(got[base_rows].float(), unchanged[base_rows].to(dtype).float()), (tiles, group)
            for slot in range(slots):  # a slot's rows as in a batch of that slot alone
                alone = expand(ups[0], torch.full_like(token_slots, slot), start.clone())
                rows = token_slots == slot
                assert torch.equal(got[rows], alone[rows]), (tiles, group, slot)
            out = start.clone()
            times[group] = graph_us(lambda i, e=expand, o=out, ups=ups: e(ups[i], token_slots, o), layers, device)
            if group == "gate_up":
                times |= silu_times(both[:, :n_out], low, token_slots, ups, expand, span, rank, device)
        report["checked"].append(str(tiles))
        report["expand_us"][str(tiles)] = times
    decode_kernels.LORA_TILES = DEFAULT[2]
    return report


def print_kernels(report: dict, layers: int) -> None:
    groups = list(report["gemm_us"])
    columns = [*groups, "gate_up+silu", "silu_mul"]
    print(f"\nexpand kernel, {layers} launches in a CUDA graph, µs (checked against torch: {len(report['checked'])})")
    print("step: the 4 expands; step, silu fused: qkv, o, down and gate_up+silu less silu_mul (the base model's)")
    print("| tiles | " + " | ".join(columns) + " | step | step, silu fused |")
    print("| --- |" + " ---: |" * (len(columns) + 2))
    for tiles, times in report["expand_us"].items():
        if None in times.values():
            continue
        mark = " (default)" if tiles == str(DEFAULT[2]) else ""
        cells = " | ".join(f"{times[c]:.1f}" for c in columns)
        step = sum(times[g] for g in groups)
        fused = step - times["gate_up"] + times["gate_up+silu"] - times["silu_mul"]
        print(f"| {tiles}{mark} | {cells} | {step:.1f} | {fused:.1f} |")
    print(f"\nprojection GEMMs, {layers} launches in a CUDA graph, µs")
    print("| GEMM | " + " | ".join(groups) + " |")
    print("| --- |" + " ---: |" * len(groups))
    for what in ("plain", "folded", "view of base rows", "shrink apart", "folded base output identical to plain"):
        cells = [report["gemm_us"][g][what] for g in groups]
        print(f"| {what} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where the results go")
    ap.add_argument("--smoke", action="store_true", help="CPU, a tiny random model, small counts")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--variants", help="comma-separated names of VARIANTS to run (default: all)")
    ap.add_argument("--runs", type=int, default=3, help="runs of base_64 and mixed_64, the median counts")
    a = ap.parse_args()
    variants = [v for v in VARIANTS if a.variants is None or v[0] in a.variants.split(",")]
    clock = time.perf_counter()
    log = KvLog.attached()
    if a.smoke:
        device, streams, prompt_len, out = "cpu", 8, 16, 16
        shape = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
        shape |= {"vocab_size": 512}
        layers, limit = 2, {"max_input_len": 64, "max_new_tokens": 32}
        torch.set_num_threads(1)
    else:
        device, streams, prompt_len, out = "cuda", 64, 128, 256
        shape, layers, limit = {}, a.layers, {"max_input_len": 1024, "max_new_tokens": 512}
    vocab = shape.get("vocab_size", 32000)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "shapes": {"streams": streams, "prompt": prompt_len, "out": out, "rank": a.rank, "adapters": len(ADAPTERS)},
        "variants": {name: {"fold": f, "fuse_silu": u, "tiles": str(t)} for name, f, u, t in variants},
    }

    def save() -> None:
        a.json.write_text(json.dumps(report, indent=2, default=str))

    if device == "cuda" or decode_kernels.triton is not None and a.smoke and _interpreted():
        from transformers import LlamaConfig

        config = LlamaConfig(**({"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8} | shape))
        config.intermediate_size = shape.get("intermediate_size", 8192)
        report["kernels"] = kernels(config, layers, len(ADAPTERS), a.rank, streams, device, dtype)
        if device == "cuda":  # its tensors, before the engines size their KV caches from free memory
            torch.cuda.empty_cache()
        print_kernels(report["kernels"], layers)
        save()

    batch = prompts(streams, prompt_len, seed=2, vocab=vocab)
    mixed = [ADAPTERS[i % len(ADAPTERS)] for i in range(streams)]
    half = [None if i % 2 == 0 else ADAPTERS[i // 2 % len(ADAPTERS)] for i in range(streams)]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "llama"
        report["weight_bytes"] = build_model(model_dir, layers=layers, dtype=dtype, device=device, **shape)
        folders = make_adapters(model_dir, Path(tmp) / "adapters", a.rank, dtype)
        base = {"max_batch_size": streams, **limit}
        print("base engine", flush=True)
        report["base"] = asyncio.run(session(model_dir, device, base, [("base_64", batch, out, a.runs)], log))
        save()

        async def lora_workloads(engine) -> list[tuple]:
            for name, folder in folders.items():
                await engine.register_adapter(name, folder, folder)
            alone = [(f"{n}_alone", batch, out, 1, [n] * streams) for n in ADAPTERS]
            runs = [
                ("base_64", batch, out, a.runs),
                ("mixed_64", batch, out, a.runs, mixed),
                ("half_64", batch, out, 1, half),
            ]
            return runs + alone

        settings = base | {"enable_lora": True, "max_loras": len(ADAPTERS), "max_lora_rank": a.rank}
        for name, *variant in variants:
            print(f"lora engine: {name}{' (default)' if tuple(variant) == DEFAULT else ''}", flush=True)
            lora.FOLD, lora.FUSE_SILU, decode_kernels.LORA_TILES = variant
            try:
                report[name] = asyncio.run(session(model_dir, device, settings, lora_workloads, log))
            finally:
                lora.FOLD, lora.FUSE_SILU, decode_kernels.LORA_TILES = DEFAULT
            save()

    ref = report["base"]["base_64"]
    report["agreement"], report["targets"] = {}, []
    for variant, *_ in variants:
        runs = report[variant]
        checks = report["agreement"][variant] = {
            "base rows vs the base engine": agreement(runs["base_64"]["generated"], ref["generated"])
        }
        for name in ADAPTERS:
            pick = [i for i, m in enumerate(mixed) if m == name]  # the same prompts in both runs
            checks[f"{name} mixed vs alone"] = agreement(
                [runs["mixed_64"]["generated"][i] for i in pick], [runs[f"{name}_alone"]["generated"][i] for i in pick]
            )
        pick = [i for i, m in enumerate(half) if m is None]
        checks["half_64's base rows vs the base engine (reported)"] = agreement(
            [runs["half_64"]["generated"][i] for i in pick], [ref["generated"][i] for i in pick]
        )
        checks["adapters change the output"] = agreement(runs["mixed_64"]["generated"], ref["generated"])
        ratio = runs["mixed_64"]["tok_s"] / ref["tok_s"]
        same = sum(checks[f"{name} mixed vs alone"]["rows_identical"] for name in ADAPTERS)
        untouched = checks["base rows vs the base engine"]["rows_identical"]
        report["targets"] += [
            (
                f"{variant}: {streams} streams mixing {len(ADAPTERS)} adapters ≥ 0.8 × the base model's tokens/s",
                f"{runs['mixed_64']['tok_s']:,.0f} vs {ref['tok_s']:,.0f} tok/s ({ratio:.2f} ×)",
                "met" if ratio >= 0.8 else "not met",
            ),
            (
                f"{variant}: base rows untouched by the adapter slots",
                f"{untouched}/{streams} rows identical; {runs['base_64']['tok_s']:,.0f} tok/s on the lora engine",
                "met" if untouched == streams else "see JSON",
            ),
            (
                f"{variant}: each adapter's rows in the mixed batch as in a batch of that adapter alone",
                f"{same}/{streams} rows identical",
                "met" if same == streams else "see JSON",
            ),
        ]
    for engine in ["base"] + [name for name, *_ in variants]:
        for value in report[engine].values():
            if isinstance(value, dict):
                value.pop("generated", None)
    report["wall_s"] = time.perf_counter() - clock
    save()
    print(f"\n{report['device']}, {report['wall_s']:.0f} s", flush=True)
    for line in log.lines:
        print(f"  {line.split('; ')[-1]}")
    print("\n| engine | workload | streams | tok/s | runs | ITL p50 ms | ITL p99 ms | TTFT p50 ms |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |")
    for engine in ["base"] + [name for name, *_ in variants]:
        for name, r in report[engine].items():
            if isinstance(r, dict) and "tok_s" in r:
                each = ", ".join(f"{t:,.0f}" for t in r.get("tok_s_runs", []))
                print(
                    f"| {engine} | {name} | {r['streams']} | {r['tok_s']:,.0f} | {each} | {r['itl_p50_ms'] or 0:.2f} | "
                    f"{r['itl_p99_ms'] or 0:.2f} | {r['ttft_p50_ms'] or 0:.1f} |"
                )
    for variant, checks in report["agreement"].items():
        for what, value in checks.items():
            print(f"  {variant}: {what}: {value['rows_identical']}/{value['rows']} rows identical")
    if "kernels" in report:  # again, beside the engines' figures
        print_kernels(report["kernels"], layers)
    default = [name for name, *variant in variants if tuple(variant) == DEFAULT]
    print(f"\nthe default (lora.FOLD, lora.FUSE_SILU, decode_kernels.LORA_TILES): {default or DEFAULT}")
    print_targets(report["targets"])


def _interpreted() -> bool:
    """Triton's CPU interpreter is on (TRITON_INTERPRET=1): --smoke checks the kernels through it too."""
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


if __name__ == "__main__":
    main()
