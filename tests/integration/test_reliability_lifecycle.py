"""Engines that die and SIGTERM, against `lmi-trt serve` as a real process.

* The synthetic engine's ``fail()`` and the fake TensorRT-LLM Executor failing (its response
  loop raising a CUDA error): in-flight requests end with an error record (streamed) or a 424
  (not streamed), /ping turns 503 FAILED, new requests get 503, and the process exits non-zero on
  its own — no hang.
* A stalled synthetic engine (no token for option.watchdog_timeout with a request waiting): /ping 503
  FAILED with a log line saying why, and 200 again once tokens flow; the process stays up.
* SIGTERM: the listener closes at once, in-flight streams run to their end, and the process exits 0;
  a stream longer than the shutdown timeout is cut at the timeout and the process still exits 0.

The server runs through ``LAUNCHER``: the real CLI (``lmi_trt.cli.main``) with test hooks that
kill the engine on SIGUSR1 or stop and restart its steps on SIGUSR2, and shorter waits than the
CLI defaults (10 s before exiting once FAILED, 30 s of draining) so the tests do not sit through
them; the code paths are the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from cliserver import free_port
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
# --- engines that die under a real server process --------------------------------------------------
LAUNCHER = r"""
import asyncio, functools, os, signal, sys, threading
sys.path.insert(0, os.environ["LMI_TEST_DIR"])
import lmi_trt.serving.app as app_module

# Shorter than the CLI's defaults so a test does not wait for them; the code paths are the same.
app_module.run_app = functools.partial(
    app_module.run_app,
    exit_on_failure_after=float(os.environ["LMI_TEST_EXIT_AFTER"]),
    shutdown_timeout=float(os.environ.get("LMI_TEST_SHUTDOWN_TIMEOUT", "30")),
)
if os.environ.get("LMI_TEST_STALL") == "synthetic":
    # SIGUSR2 stops and restarts the synthetic engine's steps: requests stay in flight, no token comes.
    from lmi_trt.engines.synthetic import SyntheticEngine
    start = SyntheticEngine.start
    def toggle(engine):
        if "_step" in vars(engine):
            del engine._step
        else:
            engine._step = lambda active: None
    async def started(self):
        await start(self)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, toggle, self)
    SyntheticEngine.start = started
kind = os.environ.get("LMI_TEST_KILL")
if kind == "synthetic":
    from lmi_trt.engines.synthetic import SyntheticEngine
    start = SyntheticEngine.start
    async def started(self):
        await start(self)
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.fail, "injected: GPU fell off the bus")
    SyntheticEngine.start = started
elif kind == "trtllm":
    sys.path.insert(0, os.path.join(os.environ["LMI_TEST_DIR"], "fakes"))
    import lmi_trt.engines.trtllm as trt
    trt.cuda_available = lambda: True  # the fake Executor needs no GPU
    from tensorrt_llm.bindings import executor as ex
    broken = threading.Event()
    await_responses = ex.Executor.await_responses
    def maybe_broken(self, *args, **kwargs):
        if broken.is_set():
            raise RuntimeError("[TensorRT-LLM][ERROR] CUDA error: an illegal memory access was encountered")
        return await_responses(self, *args, **kwargs)
    ex.Executor.await_responses = maybe_broken
    signal.signal(signal.SIGUSR1, lambda *_: broken.set())
from lmi_trt.cli import main
sys.exit(main(sys.argv[1:]))
"""


@contextlib.contextmanager
def launched(args: list[str], tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_"))}
    full_env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "LMI_TEST_DIR": str(REPO_ROOT / "tests"),
            **env,
        }
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, "serve", *args, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO_ROOT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/ping", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield proc, url, log_path
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def synthetic(*options: str) -> list[str]:
    """`serve` arguments for the synthetic engine with the tiny Llama's tokenizer, and ``-o`` ``options``."""
    return ["--model-id", str(tiny_model("llama")), "--engine", "synthetic", *(a for o in options for a in ("-o", o))]


def _dies_cleanly(
    proc: subprocess.Popen,
    url: str,
    model: str,
    log_path: Path,
    streaming_path: str,
    stream_body: dict,
    json_path: str,
    json_body: dict,
) -> None:
    """Start a stream and a non-streamed request, kill the engine, check the aftermath."""
    stream = requests.post(url + streaming_path, json=stream_body, stream=True, timeout=30)
    assert stream.status_code == 200
    lines = stream.iter_lines()
    first = next(line for line in lines if line)
    pending: dict[str, requests.Response] = {}

    def blocking() -> None:
        pending["r"] = requests.post(url + json_path, json=json_body, timeout=30)

    t = threading.Thread(target=blocking)
    t.start()
    time.sleep(0.3)  # both in flight
    os.kill(proc.pid, signal.SIGUSR1)
    rest = [line for line in lines if line]
    t.join(30)
    assert first and rest, "the stream must end with a record, not a cut connection"
    last = json.loads(rest[-1].removeprefix(b"data: ") if rest[-1].startswith(b"data: ") else rest[-1])
    # LMI: {"token": ..., "details": {"finish_reason": "error"}, "error", "code"}; TGI: {"error", "error_type"}
    assert "illegal memory access" in last["error"] or "GPU fell off" in last["error"], last
    assert last.get("code", 424) == 424 and last.get("error_type", "generation") == "generation", last
    assert "details" not in last or last["details"]["finish_reason"] == "error", last
    r = pending["r"]
    assert r.status_code == 424 and r.json()["code"] == 424, r.text
    ping = requests.get(url + "/ping", timeout=5)
    assert ping.status_code == 503 and ping.json()[model]["status"] == "FAILED"
    r = requests.post(url + json_path, json=json_body, timeout=10)
    assert r.status_code == 503 and r.headers.get("Retry-After"), r.text
    code = proc.wait(timeout=60)  # exits on its own: no hang (a bound that holds on a loaded machine)
    assert code != 0, code
    log = log_path.read_text()
    assert "is FAILED" in log and "exiting" in log, log[-3000:]


def test_synthetic_engine_failure_ends_requests_turns_ping_503_and_exits_nonzero(tmp_path):
    args = synthetic("option.synthetic_tokens_per_second=50")
    with launched(args, tmp_path, {"LMI_TEST_KILL": "synthetic", "LMI_TEST_EXIT_AFTER": "1"}) as (proc, url, log):
        body = {"inputs": "abc", "parameters": {"max_new_tokens": 400}}
        _dies_cleanly(proc, url, "llama", log, "/invocations", {**body, "stream": True}, "/invocations", body)


def test_a_stalled_engine_fails_ping_with_a_log_line_and_recovers_when_tokens_flow(tmp_path):
    """option.watchdog_timeout: a stream waits on an engine that stops producing tokens (SIGUSR2 stops the
    synthetic engine's steps) → /ping 503 FAILED and a log line saying why, the process stays up; the
    steps resume → /ping 200 and the stream ends as asked."""
    args = synthetic("option.synthetic_tokens_per_second=50", "option.watchdog_timeout=1", "option.max_output_len=300")
    with launched(args, tmp_path, {"LMI_TEST_STALL": "synthetic", "LMI_TEST_EXIT_AFTER": "1"}) as (proc, url, log):
        body = {"inputs": "abc", "parameters": {"max_new_tokens": 300, "ignore_eos": True}, "stream": True}
        with requests.post(url + "/invocations", json=body, stream=True, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(line for line in lines if line)
            os.kill(proc.pid, signal.SIGUSR2)
            _wait_for_ping(url, 503, {"llama": {"status": "FAILED"}})
            assert "watchdog: requests have waited" in log.read_text() and proc.poll() is None
            os.kill(proc.pid, signal.SIGUSR2)
            _wait_for_ping(url, 200, {"llama": {"status": "Healthy"}})
            rest = [json.loads(line) for line in lines if line]
        assert rest[-1]["generated_text"] and "error" not in rest[-1], rest[-1]
        assert "produces tokens again" in log.read_text() and proc.poll() is None


def _wait_for_ping(url: str, status: int, body: dict) -> None:
    deadline = time.monotonic() + 60  # a bound that holds on a loaded machine, not a timing assertion
    while True:
        r = requests.get(url + "/ping", timeout=10)
        if (r.status_code, r.json()) == (status, body):
            return
        assert time.monotonic() < deadline, (r.status_code, r.text)
        time.sleep(0.1)


def test_trtllm_executor_failure_ends_requests_turns_ping_503_and_exits_nonzero(tmp_path):
    from trtllm_testing import fake_tensorrt_llm, make_engine_dir

    with fake_tensorrt_llm():
        engine_dir = make_engine_dir(
            tiny_model("llama"), tmp_path / "engine", max_batch_size=4, max_input_len=64, max_seq_len=512
        )
    args = ["--model-id", str(engine_dir), "--engine", "trtllm", "-o", f"option.tokenizer_id={tiny_model('llama')}"]
    with launched(args, tmp_path, {"LMI_TEST_KILL": "trtllm", "LMI_TEST_EXIT_AFTER": "1"}) as (proc, url, log):
        body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 400, "ignore_eos": True}}
        _dies_cleanly(proc, url, "engine", log, "/generate_stream", body, "/invocations", body)


# --- SIGTERM --------------------------------------------------------------------------------------------
def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True


def _stream_in_thread(url: str, body: dict, out: dict) -> threading.Thread:
    def run() -> None:
        lines = []
        try:
            with requests.post(url + "/invocations", json=body, stream=True, timeout=60) as r:
                out["status"] = r.status_code
                for line in r.iter_lines():
                    if line:
                        lines.append(json.loads(line))
                        out.setdefault("first_at", time.monotonic())
        except requests.RequestException as e:
            out["error"] = e
        out["lines"] = lines

    t = threading.Thread(target=run)
    t.start()
    return t


def test_sigterm_stops_accepting_drains_in_flight_streams_up_to_the_timeout_and_exits_0(tmp_path):
    """Three streams that end within the shutdown timeout run to their end; one that would not is
    cut at the timeout; the listener closes at once; the exit code is 0."""
    timeout_s = 2.5
    args = synthetic("option.synthetic_tokens_per_second=100", "option.max_output_len=4000")
    env = {"LMI_TEST_EXIT_AFTER": "10", "LMI_TEST_SHUTDOWN_TIMEOUT": str(timeout_s)}
    with launched(args, tmp_path, env) as (proc, url, log):
        outs = [{} for _ in range(4)]
        lengths = [150, 150, 150, 4000]  # 1.5 s of tokens each, and 40 s
        threads = [
            _stream_in_thread(url, {"inputs": f"s{i} ", "parameters": {"max_new_tokens": n}, "stream": True}, out)
            for i, (n, out) in enumerate(zip(lengths, outs, strict=True))
        ]
        deadline = time.monotonic() + 10
        while not all("first_at" in o for o in outs):
            assert time.monotonic() < deadline, outs
            time.sleep(0.01)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert _refused(url), "the listener must close on SIGTERM"
        assert proc.wait(timeout=30) == 0
        took = time.monotonic() - t_term
        for t in threads:
            t.join(30)
        for o in outs[:3]:  # each short stream ran to its end: 150 tokens and the final record
            assert o["status"] == 200 and "error" not in o, o
            assert len(o["lines"]) == 150 and "generated_text" in o["lines"][-1], o["lines"][-1:]
        long = outs[3]["lines"]  # cut at the timeout: no final record, so the client can tell
        assert 0 < len(long) < 4000 and "generated_text" not in long[-1], long[-1:]
        # The server waits out the shutdown timeout for the long stream (a lower bound that load
        # cannot break); how soon after it the process is gone depends on the machine.
        assert took > timeout_s - 0.5, took
        assert "shutting down" in log.read_text()
