"""lmi_trt.bench: stream parsers, summary math, and a tiny end-to-end run against the bare server."""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_trt import bench
from lmi_trt.bench import LengthDist, LmiParser, OpenAIParser, TgiParser

ROOT = Path(__file__).resolve().parents[2]
BARE = ROOT / "benchmarks" / "bare_server.py"

# Recorded from lmi-trt (synthetic engine), details on.
LMI_STREAM = (
    b'{"token":{"id":263,"text":"he","log_prob":-0.25}}\n'
    b'{"token":{"id":312,"text":"llo","log_prob":-0.5}}\n'
    b'{"token":{"id":225,"text":" \\"token\\"","log_prob":-0.75}}\n'
    b'{"token":{"id":91,"text":"w","log_prob":-1.0},"generated_text":"hello \\"token\\"w",'
    b'"details":{"finish_reason":"length","generated_tokens":4,"inputs":"hello world the"}}\n'
)
# TGI shape (text-generation-inference 2.x), with multi-byte text.
TGI_STREAM = (
    'data:{"index":1,"token":{"id":100,"text":"Grü","logprob":-0.1,"special":false},"generated_text":null,"details":null}\n\n'
    'data:{"index":2,"token":{"id":101,"text":"ße","logprob":-0.2,"special":false},"generated_text":null,"details":null}\n\n'
    'data:{"index":3,"token":{"id":102,"text":" 東京","logprob":-0.3,"special":false},"generated_text":"Grüße 東京",'
    '"details":{"finish_reason":"length","generated_tokens":3,"seed":null}}\n\n'
).encode()
# OpenAI completions (vLLM shape): tokens, the finishing chunk, usage, [DONE].
OPENAI_COMPLETIONS = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" b","logprobs":null,"finish_reason":null}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" c","logprobs":null,"finish_reason":"length"}]}\n\n'
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
    b"data: [DONE]\n\n"
)
# OpenAI chat: a role-only opening chunk that is not a token, CRLF line ends, no usage.
OPENAI_CHAT = (
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\r\n\r\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\r\n\r\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":null}]}\r\n\r\n'
    b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}]}\r\n\r\n'
    b"data: [DONE]\r\n\r\n"
)


def run_parser(cls, chunks):
    p = cls()
    counts = [p.feed(c) for c in chunks]
    end = p.finish()
    return sum(counts) + end.extra_tokens, counts, end


def splits(data: bytes):
    """Every split into two chunks, plus byte-by-byte and random small chunks."""
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    yield [data[i : i + 1] for i in range(len(data))]
    rng = random.Random(7)
    for _ in range(20):
        out, i = [], 0
        while i < len(data):
            k = rng.randint(1, 40)
            out.append(data[i : i + k])
            i += k
        yield out


@pytest.mark.parametrize(
    "cls,data,tokens,reported",
    [
        (LmiParser, LMI_STREAM, 4, 4),
        (TgiParser, TGI_STREAM, 3, 3),
        (OpenAIParser, OPENAI_COMPLETIONS, 3, 3),
        (OpenAIParser, OPENAI_CHAT, 3, None),
    ],
)
def test_parsers_count_tokens_however_the_stream_is_split(cls, data, tokens, reported):
    for chunks in splits(data):
        n, _, end = run_parser(cls, chunks)
        assert n == tokens, chunks
        assert end.complete and end.error is None
        assert end.reported_tokens == reported


def test_lmi_counts_each_line_when_it_completes():
    lines = LMI_STREAM.splitlines(keepends=True)
    _, counts, _ = run_parser(LmiParser, [lines[0][:10], lines[0][10:] + lines[1], lines[2], lines[3]])
    assert counts == [0, 2, 1, 1]


def test_lmi_final_line_without_newline_counts_at_finish():
    n, counts, end = run_parser(LmiParser, [LMI_STREAM.rstrip(b"\n")])
    assert sum(counts) == 3 and end.extra_tokens == 1 and n == 4 and end.complete


def test_lmi_without_details_is_complete_on_generated_text():
    data = (
        b'{"token":{"id":1,"text":"a","log_prob":-1}}\n'
        b'{"token":{"id":2,"text":"b","log_prob":-1},"generated_text":"ab"}\n'
    )
    n, _, end = run_parser(LmiParser, [data])
    assert n == 2 and end.complete and end.reported_tokens is None


def test_lmi_error_record_ends_the_stream_as_an_error():
    data = LMI_STREAM.splitlines(keepends=True)[0] + b'{"error":"engine died","code":424,"type":"ModelError"}\n'
    n, _, end = run_parser(LmiParser, [data])
    assert n == 1 and not end.complete and end.error == "engine died"


def test_truncated_streams_are_incomplete():
    for cls, data in ((LmiParser, LMI_STREAM), (TgiParser, TGI_STREAM), (OpenAIParser, OPENAI_COMPLETIONS)):
        cut = data[: data.rfind(b"data:") if cls is not LmiParser else data.rfind(b'{"token"')]
        _, _, end = run_parser(cls, [cut])
        assert not end.complete, cls


def test_tgi_and_openai_error_events():
    _, _, end = run_parser(
        TgiParser, [TGI_STREAM.split(b"\n\n")[0] + b'\n\ndata:{"error":"overloaded","error_type":"overloaded"}\n\n']
    )
    assert end.error == "overloaded" and not end.complete
    bad = (
        OPENAI_COMPLETIONS.split(b"\n\n")[0] + b'\n\ndata: {"error":{"message":"boom","code":500}}\n\ndata: [DONE]\n\n'
    )
    n, _, end = run_parser(OpenAIParser, [bad])
    assert n == 1 and end.error == "boom" and not end.complete


def test_openai_usage_wins_over_record_count():
    # A separate finishing chunk (OpenAI's own shape) is one record more than tokens; usage says 2.
    data = (
        b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"text":"b","finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"text":"","finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}\n\n'
        b"data: [DONE]\n\n"
    )
    n, _, end = run_parser(OpenAIParser, [data])
    assert n == 3 and end.reported_tokens == 2 and end.complete


def test_bare_server_bytes_parse(tmp_path):
    sys.path.insert(0, str(BARE.parent))
    try:
        import bare_server
    finally:
        sys.path.remove(str(BARE.parent))
    ev = bare_server.Events()
    for cls, kind, flag, reported in (
        (LmiParser, "lmi", True, 7),
        (TgiParser, "tgi", False, None),
        (OpenAIParser, "completions", True, 7),
        (OpenAIParser, "chat", False, None),
    ):
        n, _, end = run_parser(cls, [b"".join(ev.get(kind, 7, flag))])
        assert (n, end.complete, end.reported_tokens) == (7, True, reported), kind


# --- summary math ---------------------------------------------------------------------------


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    for n in (1, 2, 3, 10, 101):
        vals = sorted(rng.random() for _ in range(n))
        for q in (0, 50, 90, 99, 100):
            assert math.isclose(bench.percentile(vals, q), float(np.percentile(vals, q)), rel_tol=1e-12)
    assert math.isnan(bench.percentile([], 50))


def test_summarize():
    s = bench.summarize([4.0, 1.0, 3.0, 2.0])
    assert s["n"] == 4 and s["mean"] == 2.5 and s["p50"] == 2.5 and math.isclose(s["p90"], 3.7)
    assert bench.summarize([]) == {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None}


def test_weighted_percentiles_equal_expanded_nearest_rank():
    vals, weights = [5.0, 1.0, 3.0], [1, 8, 1]  # ten samples: eight 1s, one 3, one 5
    got = bench.weighted_percentiles(vals, weights)
    assert got == {"p50": 1.0, "p90": 3.0, "p99": 5.0}
    s = bench.weighted_summary(vals, weights)
    assert s["n"] == 10 and math.isclose(s["mean"], (5 + 8 + 3) / 10)
    assert bench.weighted_percentiles([], []) == {"p50": None, "p90": None, "p99": None}
    rng = random.Random(3)
    vals = [rng.random() for _ in range(50)]
    weights = [rng.randint(1, 5) for _ in range(50)]
    expanded = sorted(v for v, w in zip(vals, weights) for _ in range(w))
    for q in (50, 90, 99):
        rank = math.ceil(q / 100 * len(expanded))
        assert bench.weighted_percentiles(vals, weights, (q,))[f"p{q}"] == expanded[rank - 1]


def test_level_result_rates():
    raw = bench.RawLevel(
        t_start=10.0, t_end=12.0, ok=4, output_tokens=400, streamed_records=400, server_cpu0=5.0, server_cpu1=6.0
    )
    raw.ttft.extend([0.01, 0.02, 0.03, 0.04])
    raw.itl.extend([0.001, 0.002])
    raw.itl_w.extend([3, 1])
    spec = bench.LevelSpec("http://x", 2, 4, None)
    r = bench.level_result(spec, raw)
    assert r["requests_per_s"] == 2.0 and r["output_tokens_per_s"] == 200.0 and r["server_cpu_cores"] == 0.5
    assert r["ttft_ms"]["p50"] == 25.0 and r["itl_ms"]["p50"] == 1.0 and r["itl_ms"]["n"] == 4
    assert "200.0" in bench.format_table([r])


def test_raw_levels_merge():
    a = bench.RawLevel(t_start=1.0, t_end=3.0, ok=1, output_tokens=10)
    b = bench.RawLevel(t_start=0.5, t_end=2.0, ok=2, output_tokens=20, errors=1, error_samples={"x": 1})
    b.ttft.append(0.1)
    a.merge(b)
    assert (a.t_start, a.t_end, a.ok, a.output_tokens, a.errors, list(a.ttft)) == (0.5, 3.0, 3, 30, 1, [0.1])


# --- inputs ---------------------------------------------------------------------------------


def test_length_dist():
    assert LengthDist.parse("128") == LengthDist(128, 128)
    d = LengthDist.parse("64:256")
    rng = random.Random(0)
    xs = [d.sample(rng) for _ in range(500)]
    assert min(xs) >= 64 and max(xs) <= 256 and len(set(xs)) > 50 and str(d) == "64:256"
    for bad in ("0", "5:4", "x", "1:y"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_bodies_per_api():
    lmi = json.loads(bench.build_body("lmi", "hi", 7))
    assert lmi == {"inputs": "hi", "parameters": {"max_new_tokens": 7, "do_sample": False}, "stream": True}
    tgi = json.loads(bench.build_body("tgi", "hi", 7, details=True))
    assert tgi == {"inputs": "hi", "parameters": {"max_new_tokens": 7, "do_sample": False, "details": True}}
    oc = json.loads(bench.build_body("openai", "hi", 7, model="m"))
    assert oc["prompt"] == "hi" and oc["max_tokens"] == 7 and oc["stream"] and oc["stream_options"]["include_usage"]
    ch = json.loads(bench.build_body("openai", "hi", 7, openai_endpoint="chat", ignore_eos=True))
    assert ch["messages"] == [{"role": "user", "content": "hi"}] and ch["ignore_eos"] is True
    assert bench.route_for("openai", "chat") == "/v1/chat/completions"


def test_workload_prompts_are_about_n_words():
    wl = bench.build_workload("lmi", LengthDist(20, 20), LengthDist(5, 9), n=16)
    assert len(wl.bodies) == 16 and set(wl.prompt_tokens) == {20}
    assert all(5 <= o <= 9 for o in wl.output_tokens)
    assert len(json.loads(wl.bodies[0])["inputs"].split()) == 20
    assert len({b for b in wl.bodies}) == 16  # distinct prompts


def test_exact_prompts_with_a_tokenizer():
    pytest.importorskip("transformers")
    from tinymodels import tiny_model
    from transformers import AutoTokenizer

    path = tiny_model("llama")
    tok = AutoTokenizer.from_pretrained(str(path))
    f = bench.PromptFactory(path)
    rng = random.Random(0)
    for n in (1, 16, 100):
        text, count = f.make(n, rng)
        assert count == len(tok.encode(text, add_special_tokens=False))
        assert abs(count - n) <= 1
    # never over n where the steering saw a cut at or under it: over many prompts, none is n + 1 (a server whose
    # max_input_len is n refuses those; 14 of 1,024 did at 128 tokens before)
    assert max(f.make(128, rng)[1] for _ in range(300)) <= 128


def test_cli_helpers():
    assert bench.parse_cpus("0,2-4") == [0, 2, 3, 4] and bench.parse_cpus("") is None
    assert bench.parse_concurrency("1,16,64") == [1, 16, 64]
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_concurrency("0")
    argv = bench.serve_argv("--engine synthetic --model-dir /m", 1234)
    assert argv[1:4] == ["-m", "lmi_trt", "serve"] and argv[-2:] == ["--port", "1234"]
    argv = bench.serve_argv("serve --port 99 --engine synthetic", 1234)
    assert bench.port_of(argv, 0) == 99 and argv.count("serve") == 1


def test_add_subcommand_registers_bench():
    parser = argparse.ArgumentParser(prog="lmi-trt")
    sub = parser.add_subparsers(dest="command")
    bench.add_subcommand(sub)
    args = parser.parse_args(
        ["bench", "--url", "http://127.0.0.1:1", "-c", "1,4", "--output-tokens", "8:16", "--api", "tgi"]
    )
    assert args.func is bench.cmd_bench and args.concurrency == [1, 4] and args.output_tokens == LengthDist(8, 16)
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "-c", "4"])  # --url or --serve-args is required


# --- end to end: the bench CLI against the bare server ------------------------------------------


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory):
    port = bench.free_port()
    log = tmp_path_factory.mktemp("bare") / "bare.log"
    srv = bench.ServerProcess([sys.executable, str(BARE), "--port", str(port)], port, name="bare server", log_path=log)
    srv.start()
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()
    assert srv.proc.poll() is not None


@pytest.mark.parametrize(
    "api,extra", [("lmi", ["--details"]), ("tgi", []), ("openai", []), ("openai", ["--openai-endpoint", "chat"])]
)
def test_bench_end_to_end_against_the_bare_server(bare_server, tmp_path, api, extra):
    out = tmp_path / "r.json"
    cmd = [
        sys.executable,
        "-m",
        "lmi_trt.bench",
        "--url",
        bare_server.url,
        "--api",
        api,
        "-c",
        "1,3",
        "-n",
        "6",
        "--prompt-tokens",
        "8:16",
        "--output-tokens",
        "5",
        "--server-pid",
        str(bare_server.pid),
        "--json",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert [r["concurrency"] for r in doc["levels"]] == [1, 3]
    for r in doc["levels"]:
        assert (r["requests"], r["ok"], r["errors"]) == (6, 6, 0), r
        assert r["output_tokens"] == 30 and r["streamed_records"] == 30 and r["token_count_mismatches"] == 0
        assert r["ttft_ms"]["n"] == 6 and r["itl_ms"]["n"] == 24 and r["tpot_ms"]["n"] == 6
        assert r["output_tokens_per_s"] > 0 and r["server_cpu_cores"] is not None
    assert "out tok/s" in proc.stdout


def test_bench_duration_mode_plot_and_client_procs(bare_server, tmp_path):
    pytest.importorskip("matplotlib")
    png, out = tmp_path / "t.png", tmp_path / "r.json"
    rc = bench.main(
        [
            "--url",
            bare_server.url,
            "-c",
            "2,4",
            "--duration",
            "0.3",
            "--output-tokens",
            "3:6",
            "--client-procs",
            "2",
            "--loop",
            "asyncio",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    levels = json.loads(out.read_text())["levels"]
    assert all(r["ok"] > 0 and r["errors"] == 0 and r["client_procs"] == 2 for r in levels)
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_bench_reports_http_errors_and_stops_after_a_first_level_that_failed_whole(bare_server, tmp_path, capsys):
    """Every request of the first level failed: the others would too, so one line says why and the run ends
    (it ran every level, printed the table and ended in the plot)."""
    out = tmp_path / "r.json"
    rc = bench.main(
        ["--url", bare_server.url + "/nope", "-c", "1,2,4", "-n", "2", "--output-tokens", "2", "--json", str(out)]
    )
    assert rc == 1
    levels = json.loads(out.read_text())["levels"]
    assert len(levels) == 1, levels
    r = levels[0]
    assert r["ok"] == 0 and r["errors"] == 2 and any("HTTP 404" in k for k in r["error_samples"])
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("error: every request of the first level (concurrency 1, 2 requests) failed")
    assert "HTTP 404" in captured.err


def test_bench_plot_without_matplotlib_is_refused_before_the_run(bare_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what importlib sees where it is not installed
    rc = bench.main(["--url", bare_server.url, "-c", "1", "-n", "2", "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and 'pip install "matplotlib>=3.8"' in err, err
    assert not (tmp_path / "p.png").exists()


def test_a_note_says_when_streamed_records_and_the_servers_count_differ():
    level = {
        "concurrency": 16,
        "ok": 128,
        "errors": 0,
        "client_cpu_cores": 0.1,
        "client_procs": 1,
        "token_count_mismatches": 123,
        "streamed_records": 7000,
        "output_tokens": 8000,
    }
    (note,) = bench.client_warnings([level])
    assert note.startswith("concurrency 16: in 123 of 128 streams the records counted differ")
    assert "fewer records than tokens" in note and "UTF-8" in note
