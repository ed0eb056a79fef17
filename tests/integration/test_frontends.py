"""option.api_server_count=2 against `lmi-trt serve` as a real process: the engine in a process of its own and two
HTTP front-end processes on the one port.

* A front end killed (SIGKILL) mid-stream: the streams the other front end serves finish with exactly the text
  they have without the kill, the killed one's are cut, the engine frees their slots, and a new front end takes its
  place.
* job_queue_size holds across the front ends: with the queue full, a request is refused whichever front end
  takes it; a client that hangs up frees its place and its engine slot.
* SIGTERM: both front ends drain their streams to the end, then the server exits 0.
* The engine dies: its requests end with an error record, every front end's /ping turns FAILED, and the server
  exits non-zero on its own (test_reliability_lifecycle.py's check, with two front ends).

Which front end serves a stream is read from the process that holds the server's end of its connection (psutil).
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time

import psutil
import pytest
from cliserver import Server, serve
from test_reliability_lifecycle import _dies_cleanly, launched, synthetic
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

RATE = 25  # tokens per second per stream: a 50-token stream lasts 2 s
TOKENS = 50


def _args(*options: str) -> list[str]:
    args = ["--engine", "synthetic", "--model-id", str(tiny_model("llama")), "--model-name", "tiny"]
    for option in ("option.api_server_count=2", f"option.synthetic_tokens_per_second={RATE}", *options):
        args += ["-o", option]
    return args


def _frontends(server: Server) -> dict[int, int]:
    """Front-end index → pid of the one running now (the log names each as it starts)."""
    found: dict[int, int] = {}
    for index, pid in re.findall(r"front end (\d+) started \(pid (\d+)\)", server.log()):
        found[int(index)] = int(pid)
    return found


class Stream:
    """One OpenAI completions stream on a connection of its own; ``holder`` is the pid of the front end on the other
    end; ``run`` reads it to its end in a thread."""

    def __init__(self, server: Server, prompt: str, tokens: int = TOKENS) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"prompt": prompt, "max_tokens": tokens, "stream": True}
        self.conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.read()
        self.text = ""
        self.finish: str | None = None
        self.done = False  # saw [DONE]
        self.cut = False
        self._next()  # the first token has come: the stream is under way
        port = self.conn.sock.getsockname()[1]
        self.holder = next(
            p.pid
            for p in psutil.Process(server.proc.pid).children(recursive=True)
            if any(c.raddr and c.raddr.port == port for c in _tcp(p))
        )
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _next(self) -> bool:
        line = self.response.readline()
        if not line:
            return False
        line = line.strip()
        if line == b"data: [DONE]":
            self.done = True
        elif line.startswith(b"data: "):
            choice = json.loads(line[6:])["choices"][0]
            self.text += choice["text"]
            self.finish = choice["finish_reason"] or self.finish
        return True

    def _read(self) -> None:
        try:
            while self._next():
                pass
        except (http.client.HTTPException, OSError):
            self.cut = True
        if not self.done:
            self.cut = True

    def join(self) -> None:
        self.thread.join(60)
        self.conn.close()


def _tcp(p: psutil.Process) -> list:
    try:
        return p.net_connections(kind="tcp")
    except psutil.Error:
        return []


def _streams_on_both(server: Server, prompt: str, pids: set[int]) -> list[Stream]:
    """Streams until each front end serves at least one (the kernel hands connections to either)."""
    streams: list[Stream] = []
    while {s.holder for s in streams} != pids:
        assert len(streams) < 40, f"40 streams and the front ends {pids} did not both get one"
        streams.append(Stream(server, prompt))
    return streams


def _metric(server: Server, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", server.get("/metrics").text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


PROMPT = "The quick brown fox jumps over the lazy dog"


def test_a_front_end_killed_mid_stream_leaves_the_others_streams_exact(tmp_path):
    with serve(_args(), tmp_path) as server:
        reference = Stream(server, PROMPT)
        reference.join()
        assert reference.done and reference.finish == "length" and reference.text

        pids = set(_frontends(server).values())
        assert len(pids) == 2
        streams = _streams_on_both(server, PROMPT, pids)
        victim = streams[0].holder
        psutil.Process(victim).kill()
        for s in streams:
            s.join()

        survivors = [s for s in streams if s.holder != victim]
        killed = [s for s in streams if s.holder == victim]
        assert survivors and killed
        for s in survivors:
            assert s.done and s.finish == "length"
            assert s.text == reference.text
        for s in killed:
            assert s.cut and not s.done

        # A new front end in the victim's place; the engine freed the killed streams' slots.
        _wait(lambda: len(set(_frontends(server).values()) - pids) == 1, "no front end replaced the killed one")
        _wait(lambda: _metric(server, "lmi_engine_active_requests") == 0, "the killed streams still hold the engine")
        _wait(lambda: _metric(server, "lmi_requests_in_system") == 0, "the killed streams still count as admitted")
        assert "starting another in its place" in server.log()
        # ... which serves, once loaded (it accepts nothing before): every new stream, on either front end, is exact.
        _wait(lambda: server.log().count("INFO lmi_trt.serving.app: model 'tiny' ready") == 3, "no replacement", 120)
        assert server.get("/ping").status_code == 200
        new = _streams_on_both(server, PROMPT, set(_frontends(server).values()))
        for s in new:
            s.join()
            assert s.done and s.text == reference.text


def test_job_queue_size_holds_across_front_ends(tmp_path):
    with serve(_args("job_queue_size=2"), tmp_path) as server:
        held = [Stream(server, PROMPT, 8 * RATE), Stream(server, PROMPT, 8 * RATE)]  # 8 s each
        refused = 0
        # Whichever front end takes it (6 connections: both get some), the third request is refused.
        for _ in range(6):
            r = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
            assert r.status_code == 503, r.text
            assert "job_queue_size=2" in r.json()["error"]["message"]
            refused += 1
        # A client that hangs up frees its place and its engine slot, whichever front end served it.
        held[0].conn.sock.shutdown(socket.SHUT_RDWR)
        held[0].join()
        assert held[0].cut
        _wait(lambda: _metric(server, "lmi_requests_in_system") == 1, "the cut stream still counts as admitted")
        _wait(lambda: _metric(server, "lmi_engine_active_requests") <= 1, "the cut stream still holds the engine")
        assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2}).status_code == 200
        held[1].join()
        assert held[1].done
        assert _metric(server, 'lmi_requests_rejected_total{status="503"}') == refused


def test_sigterm_drains_every_front_end_then_exits_0(tmp_path):
    with serve(_args(), tmp_path) as server:
        pids = set(_frontends(server).values())
        streams = _streams_on_both(server, PROMPT, pids)
        server.proc.send_signal(signal.SIGTERM)
        for s in streams:
            s.join()
            assert s.done and s.finish == "length", s.text
        assert server.proc.wait(timeout=60) == 0
        assert all(not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE for pid in pids)


def test_an_engine_that_dies_fails_every_front_end_and_the_server_exits(tmp_path):
    args = synthetic("option.synthetic_tokens_per_second=50", "option.api_server_count=2")
    with launched(args, tmp_path, {"LMI_TEST_KILL": "synthetic", "LMI_TEST_EXIT_AFTER": "1"}) as (proc, url, log):
        body = {"inputs": "abc", "parameters": {"max_new_tokens": 400}}
        _dies_cleanly(proc, url, "llama", log, "/invocations", {**body, "stream": True}, "/invocations", body)
