#!/usr/bin/env python
"""Detokenization cost per token as the output grows: incremental vs naive full re-decode.

For each output length L (default 1, 1024, 8192) it measures the cost of producing the text
of tokens L-w+1..L (w = min(L, --window)), i.e. the per-token cost *at* that length, and the
mean per-token cost over the whole output 1..L, for:

* ``incremental``: lmi_trt.serving.detok.IncrementalDetokenizer (the server's), one
  ``step(token_id)`` per token, ``finish()`` at the end;
* ``naive``: decode all ids so far at every token and emit the new suffix (O(L) per token).

The incremental cost should stay flat with L; the naive one grows linearly. Both are checked
to produce exactly ``decode(all ids)``.

    python benchmarks/detok_bench.py                      # the tests' tiny byte-level BPE tokenizer
    python benchmarks/detok_bench.py --tokenizer DIR --json detok.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

TEXT = (
    "The quick brown fox jumps over the lazy dog. Large language models generate text one token at a time. "
    "Grüße aus München! Ça va? Überall schöne Straßen. 日本語のテキストもトークン化できます。東京は大きい都市です。 "
    "Emoji test: 🚀🔥✨ and math: ∑ ∫ √ π ≈ 3.14159\ndef hello(name):\n    return f'Hello, {name}!'\n"
)


def load_tokenizer(path: str | None):
    from transformers import AutoTokenizer

    if path is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from tinymodels import tiny_model

        path = str(tiny_model("llama"))
    return AutoTokenizer.from_pretrained(path), path


def token_stream(tok, n: int) -> tuple[list[int], list[int]]:
    """(prompt ids, n output ids) from a multilingual text repeated as needed."""
    ids: list[int] = []
    i = 0
    while len(ids) < n + 16:
        ids += tok.encode(f"{TEXT} {i} ", add_special_tokens=False)
        i += 1
    return ids[:16], ids[16 : 16 + n]


def naive_pieces(decode, ids: list[int], times: list[float]) -> list[str]:
    """Naive streaming: decode everything so far at each token (holding back an incomplete
    character, as a server must) and emit the new suffix. Appends each token's seconds to times."""
    pieces: list[str] = []
    prev = ""
    perf = time.perf_counter
    for k in range(len(ids)):
        t0 = perf()
        text = decode(ids[: k + 1])
        if text.endswith("\ufffd"):
            piece = ""
        else:
            piece = text[len(prev) :]
            prev = text
        times.append(perf() - t0)
        pieces.append(piece)
    final = decode(ids)
    if len(final) > len(prev):
        pieces.append(final[len(prev) :])
    return pieces


def incremental_pieces(make, ids: list[int], times: list[float]) -> list[str]:
    detok = make()
    pieces: list[str] = []
    perf = time.perf_counter
    step = detok.step
    for t in ids:
        t0 = perf()
        piece = step(t)
        times.append(perf() - t0)
        pieces.append(piece)
    pieces.append(detok.finish())
    return pieces


def measure(fn, ids: list[int], window: int, repeats: int) -> dict:
    """Per-token cost over the last ``window`` tokens (at L) and over all of them (best of repeats)."""
    n = len(ids)
    w = min(n, window)
    at_end, mean_all = [], []
    text = None
    for _ in range(repeats):
        times: list[float] = []
        pieces = fn(ids, times)
        at_end.append(sum(times[n - w :]) / w)
        mean_all.append(sum(times) / n)
        text = "".join(pieces)
    return {
        "us_per_token_at_end": min(at_end) * 1e6,
        "us_per_token_mean": min(mean_all) * 1e6,
        "us_per_token_at_end_median": statistics.median(at_end) * 1e6,
        "window": w,
        "text": text,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", help="tokenizer folder (default: the tests' tiny llama tokenizer)")
    ap.add_argument("--lengths", default="1,1024,8192", help="output lengths in tokens")
    ap.add_argument("--window", type=int, default=256, help="tokens timed at the end of each length")
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--skip-naive-above", type=int, default=16384, help="naive is O(L^2) overall; skip it above")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]

    tok, tok_path = load_tokenizer(args.tokenizer)
    try:
        from lmi_trt.serving.detok import IncrementalDetokenizer, make_decode
    except ImportError as e:
        IncrementalDetokenizer = None  # noqa: N806
        print(f"note: lmi_trt.serving.detok is not importable ({e}); measuring the naive decoder only")

        def make_decode(tokenizer, skip_special_tokens):  # noqa: ANN001
            return lambda ids: tokenizer.decode(
                ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
            )

    decode = make_decode(tok, True)
    prompt_ids, all_ids = token_stream(tok, max(lengths))
    rows = []
    for n in lengths:
        ids = all_ids[:n]
        expected = decode(ids)
        row: dict = {"tokens": n}
        if IncrementalDetokenizer is not None:
            m = measure(
                lambda ids_, times: incremental_pieces(
                    lambda: IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens=True), ids_, times
                ),
                ids,
                args.window,
                args.repeats,
            )
            # the prompt context only affects the first piece's leading space; compare stripped
            row["incremental"] = {k: v for k, v in m.items() if k != "text"}
            row["incremental"]["matches_decode"] = m["text"].strip() == expected.strip()
        if n <= args.skip_naive_above:
            m = measure(lambda ids_, times: naive_pieces(decode, ids_, times), ids, args.window, args.repeats)
            row["naive"] = {k: v for k, v in m.items() if k != "text"}
            row["naive"]["matches_decode"] = m["text"] == expected
        rows.append(row)

    head = [
        "tokens",
        "incremental us/tok at L",
        "incremental us/tok mean",
        "naive us/tok at L",
        "naive us/tok mean",
        "naive/incr at L",
        "exact text",
    ]
    lines = [head]
    for r in rows:
        inc, nai = r.get("incremental"), r.get("naive")
        ratio = (nai["us_per_token_at_end"] / inc["us_per_token_at_end"]) if inc and nai else None
        ok = all(x["matches_decode"] for x in (inc, nai) if x)
        lines.append(
            [
                f"{r['tokens']:,}",
                f"{inc['us_per_token_at_end']:.1f}" if inc else "-",
                f"{inc['us_per_token_mean']:.1f}" if inc else "-",
                f"{nai['us_per_token_at_end']:.1f}" if nai else "-",
                f"{nai['us_per_token_mean']:.1f}" if nai else "-",
                f"{ratio:.1f}x" if ratio else "-",
                "yes" if ok else "NO",
            ]
        )
    widths = [max(len(line[c]) for line in lines) for c in range(len(head))]
    out = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    print(f"tokenizer: {tok_path} ({type(tok).__name__}, vocab {len(tok)})")
    print("\n".join(out))
    if args.json:
        import platform

        Path(args.json).write_text(
            json.dumps(
                {
                    "kind": "lmi-trt-detok-bench",
                    "tokenizer": tok_path,
                    "python": platform.python_version(),
                    "window": args.window,
                    "repeats": args.repeats,
                    "rows": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if all(x["matches_decode"] for r in rows for x in (r.get("incremental"), r.get("naive")) if x) else 1


if __name__ == "__main__":
    sys.exit(main())
