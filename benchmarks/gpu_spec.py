"""Speculative decoding in the torch engine's built-in decode loop on a GPU (issue 29), in one process and one command.

The ~1.1B Llama-shaped bf16 random-weight model of gpu_torch.py / gpu_decode.py / gpu_paged.py; every
request greedy with ignore_eos, all of a workload submitted at once through TorchEngine's engine
protocol (no HTTP). One engine per configuration:

  off     — no speculation (the reference, and the source of the repeating prompts);
  ngram   — n-gram drafts (prompt lookup), --draft-len tokens, the default limit of 32 requests;
  draft   — a draft model: the model's first 2 layers with its embeddings and head (same vocabulary).
            With random weights its drafts rarely agree with the 16-layer model, so most are rejected
            and the loop stops drafting: this row measures what a poor draft model costs, not what a
            trained one gains;
  forced  — n-gram with speculation allowed at 64 requests (max_concurrency 64): what the default limit
            saves at 64 streams.

Workloads:

  repeat   — prompts that contain the model's own greedy continuation: a random 32-token prompt P, the
             off engine's 512-token greedy continuation G of it (random weights fall into loops), and
             the prompt P + G[:256], whose continuation is G[256:], for 16 seeds P: 1 stream (the one
             whose G repeats with the shortest period; the issue's target: ≥ 2 × the tokens/s without
             speculation) and 16 streams;
  ordinary — random 128-token prompts, 128 new tokens: 1 stream, and 64 streams (the issue's target:
             ≥ 0.95 × without speculation).

Single-stream runs are repeated 3 times (the median counts). Outputs are compared with the off engine's,
row by row, and the repeating ones with G[256:] as well (bf16: where two logits are within rounding,
another shape of the same computation may pick the other; CPU fp32 tests check identity exactly).

    PYTHONPATH=$PWD:$PWD/benchmarks python3 benchmarks/gpu_spec.py --json gpu_spec.json

--smoke runs the same on the CPU with tiny random models and small counts (checks the script). The JSON
is written after every engine; a short table of the workloads and one of the issue's targets are printed last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import torch
from gpu_paged import KvLog, agreement, print_targets, run_batch, session
from gpu_torch import build_model, prompts


def acceptance(result: dict) -> float | None:
    """Draft tokens kept ÷ draft tokens verified in a workload (None: nothing was drafted)."""
    loop = result["loop"]
    drafted = loop.get("spec_decode_num_draft_tokens", 0)
    return loop["spec_decode_num_accepted_tokens"] / drafted if drafted else None


def truncated_copy(model_dir: Path, out: Path, layers: int) -> int:
    """The model's first ``layers`` layers with its embeddings, final norm and head: a draft model that
    shares the vocabulary (weight bytes returned)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(out)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    return weight_bytes


def period(tokens: list[int]) -> int | None:
    """The shortest period of the last half of ``tokens`` (None: it does not repeat)."""
    tail = tokens[len(tokens) // 2 :]
    for p in range(1, len(tail) // 2 + 1):
        if all(tail[i] == tail[i + p] for i in range(len(tail) - p)):
            return p
    return None


def targets(report: dict) -> list[tuple[str, str, str]]:
    off, ngram = report["off"], report["ngram"]
    one, many = (
        ngram["repeat_1"]["tok_s"] / off["repeat_1"]["tok_s"],
        ngram["ordinary_64"]["tok_s"] / off["ordinary_64"]["tok_s"],
    )
    same = [report["agreement"][f"ngram/{w}"] for w in ("repeat_1", "repeat_16", "ordinary_1", "ordinary_64")]
    rows, identical = sum(s["rows"] for s in same), sum(s["rows_identical"] for s in same)
    return [
        (
            "single stream, repeating prompt: n-gram ≥ 2 × without",
            f"{ngram['repeat_1']['tok_s']:,.0f} vs {off['repeat_1']['tok_s']:,.0f} tok/s ({one:.2f} ×), "
            f"acceptance {acceptance(ngram['repeat_1']) or 0:.0%}",
            "met" if one >= 2 else "not met",
        ),
        (
            "64 streams, ordinary prompts: n-gram ≥ 0.95 × without",
            f"{ngram['ordinary_64']['tok_s']:,.0f} vs {off['ordinary_64']['tok_s']:,.0f} tok/s ({many:.2f} ×)",
            "met" if many >= 0.95 else "not met",
        ),
        (
            "greedy outputs identical with n-gram speculation",
            f"{identical}/{rows} rows identical to the engine without speculation",
            "met" if identical == rows else "see note",
        ),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, required=True, help="where the results go")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny random models, small counts")
    ap.add_argument("--draft-len", type=int, default=6, help="n-gram draft tokens per step")
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args()
    clock = time.perf_counter()
    log = KvLog.attached()
    if a.smoke:
        device, seed_len, continuation, cut, out, ordinary_len, many = "cpu", 16, 96, 48, 32, 16, 8
        shape = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
        shape |= {"vocab_size": 512}
        layers, draft_layers, limit = 2, 1, {"max_input_len": 128, "max_new_tokens": 96}
        torch.set_num_threads(1)
    else:
        device, seed_len, continuation, cut, out, ordinary_len, many = "cuda", 32, 512, 256, 256, 128, 64
        shape, layers, draft_layers = {}, a.layers, 2
        limit = {"max_input_len": 1024, "max_new_tokens": 512}
    vocab = shape.get("vocab_size", 32000)
    report: dict = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "draft_len": a.draft_len,
        "shapes": {"seed": seed_len, "continuation": continuation, "cut": cut, "out": out, "ordinary": ordinary_len},
    }

    def save() -> None:
        a.json.write_text(json.dumps(report, indent=2, default=str))

    from lmi_trt.speculative import Speculation

    with tempfile.TemporaryDirectory() as tmp:
        model_dir, draft_dir = Path(tmp) / "llama", Path(tmp) / "draft"
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        report["weight_bytes"] = build_model(model_dir, layers=layers, dtype=dtype, device=device, **shape)
        report["draft_weight_bytes"] = truncated_copy(model_dir, draft_dir, draft_layers)
        base = {"max_batch_size": many, **limit}
        seeds = prompts(16, seed_len, seed=1, vocab=vocab)
        ordinary = prompts(many, ordinary_len, seed=2, vocab=vocab)
        expected: dict[str, list[list[int]]] = {}  # the repeating workloads' continuations, G[cut:]
        workloads: list[tuple] = []

        async def repeating(engine) -> list[tuple]:
            """The off engine's greedy continuations of the seeds, cut into the repeating prompts; the
            single stream takes the one that repeats with the shortest period (the first if none does)."""
            grown = (await run_batch(engine, seeds, continuation, "generate"))["generated"]
            report["periods"] = [period(g) for g in grown]  # how each continuation repeats itself
            prompts_ = [p + g[:cut] for p, g in zip(seeds, grown)]
            rest = [g[cut : cut + out] for g in grown]
            one = min(range(len(grown)), key=lambda i: (report["periods"][i] is None, report["periods"][i] or 0, i))
            report["repeat_1_seed"] = one
            expected.update(repeat_1=rest[one : one + 1], repeat_16=rest)
            workloads.extend(
                [
                    ("repeat_1", prompts_[one : one + 1], out, 3),
                    ("repeat_16", prompts_, out, 1),
                    ("ordinary_1", ordinary[:1], out // 2, 3),
                    ("ordinary_64", ordinary, out // 2, 1),
                ]
            )
            return workloads

        runs = {
            "off": None,
            "ngram": Speculation(method="ngram", max_draft_len=a.draft_len),
            "draft": Speculation(method="draft_model", max_draft_len=4, draft_model=str(draft_dir)),
            "forced": Speculation(method="ngram", max_draft_len=a.draft_len, max_concurrency=many),
        }
        report["agreement"] = {}
        for name, spec in runs.items():
            print(f"{name}: {spec}", flush=True)
            if name == "off":
                chosen = repeating
            elif name == "forced":
                chosen = [w for w in workloads if w[0] in ("repeat_16", "ordinary_64")]
            else:
                chosen = workloads
            report[name] = asyncio.run(session(model_dir, device, base | {"speculative": spec}, chosen, log))
            for workload, *_ in workloads:
                if workload not in report[name]:
                    continue
                got = report[name][workload]["generated"]
                if name != "off":
                    report["agreement"][f"{name}/{workload}"] = agreement(got, report["off"][workload]["generated"])
                if workload in expected:
                    report["agreement"][f"{name}/{workload} vs G"] = agreement(got, expected[workload])
            save()

    for name in runs:
        for value in report[name].values():
            if isinstance(value, dict):
                value.pop("generated", None)
    report["wall_s"] = time.perf_counter() - clock
    report["targets"] = targets(report)
    save()
    print(f"\n{report['device']}, {report['wall_s']:.0f} s; continuation periods {report['periods']}", flush=True)
    for line in log.lines:
        print(f"  {line.split('; ')[-1]}")
    print(
        "\n| workload | streams | off tok/s | n-gram (×, acceptance) | draft model (×, acceptance) | forced at 64 (×) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    off = report["off"]
    for workload, batch, _, _ in workloads:
        cells = []
        for name in ("ngram", "draft", "forced"):
            r = report[name].get(workload)
            if r is None:
                cells.append("—")
                continue
            accepted = acceptance(r)
            rate = "" if name == "forced" else f", {accepted:.0%}" if accepted is not None else ", no drafts"
            cells.append(f"{r['tok_s']:,.0f} ({r['tok_s'] / off[workload]['tok_s']:.2f} ×{rate})")
        print(f"| {workload} | {len(batch)} | {off[workload]['tok_s']:,.0f} | " + " | ".join(cells) + " |")
    print_targets(report["targets"])


if __name__ == "__main__":
    main()
