"""Start `lmi-trt serve` as a real process on a free loopback port, for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import requests

# Set (to N), every server these helpers start runs N HTTP front-end processes (option.api_server_count), unless
# the test sets the option itself: .ci/run runs a subset of the HTTP integration tests so.
FRONTENDS_VAR = "LMI_TEST_API_SERVER_COUNT"
# `lmi-trt serve` (lmi_trt.cli.main) whose server, once its model is FAILED, exits after serve()'s failed_exit_after
# seconds instead of the CLI's 10 (the same code path: lmi_trt.serving.app.run_app's exit_on_failure_after).
_FAILED_EXIT_LAUNCHER = (
    "import functools, sys; import lmi_trt.serving.app as app; "
    "app.run_app = functools.partial(app.run_app, exit_on_failure_after={}); "
    "from lmi_trt.cli import main; sys.exit(main(sys.argv[1:]))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(
        self,
        proc: subprocess.Popen,
        port: int,
        log_path: Path,
        ca: Path | None = None,
        client_cert: tuple[str, str] | None = None,
    ):
        self.proc = proc
        self.port = port
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        self.log_path = log_path
        self.verify: str | bool = str(ca) if ca else True  # HTTPS: the CA that signed the server's certificate
        self.cert = client_cert  # (certificate, key) when the server asks clients for one

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def post(self, path: str, json=None, **kw) -> requests.Response:
        kw.setdefault("verify", self.verify)
        kw.setdefault("cert", self.cert)
        return requests.post(self.url + path, json=json, timeout=kw.pop("timeout", 60), **kw)

    def get(self, path: str, **kw) -> requests.Response:
        kw.setdefault("verify", self.verify)
        kw.setdefault("cert", self.cert)
        return requests.get(self.url + path, timeout=kw.pop("timeout", 30), **kw)


def wait_ready(server: Server, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode}:\n{server.log()[-4000:]}")
        try:
            if server.get("/ping", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"server not ready after {timeout}s:\n{server.log()[-4000:]}")


@contextmanager
def serve(
    args: list[str],
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    ready: bool = True,
    cwd: Path | None = None,
    ca: Path | None = None,
    client_cert: tuple[str, str] | None = None,
    ready_timeout: float = 120.0,
    failed_exit_after: float | None = None,
):
    """Run `python -m lmi_trt serve ARGS --port P`; yields a Server; SIGTERM then SIGKILL at exit. With
    ``ca`` the server serves HTTPS (ARGS set its certificate) and the Server's requests verify it by ``ca``
    (and show ``client_cert`` when the server asks for one). ``failed_exit_after``: seconds a FAILED server
    waits before it exits (one front end: the CLI starts several through lmi_trt.serving.frontends)."""
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_"))}
    full_env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    if os.environ.get(FRONTENDS_VAR):  # .ci/run: these tests again with N front-end processes
        full_env["OPTION_API_SERVER_COUNT"] = os.environ[FRONTENDS_VAR]
    full_env.update(env or {})
    launcher = ["-m", "lmi_trt"]
    if failed_exit_after is not None:
        if full_env.get("OPTION_API_SERVER_COUNT", "1") != "1":
            raise ValueError("failed_exit_after applies to one front end, not OPTION_API_SERVER_COUNT's")
        launcher = ["-c", _FAILED_EXIT_LAUNCHER.format(failed_exit_after)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *launcher, "serve", *args, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
        )
    server = Server(proc, port, log_path, ca, client_cert)
    try:
        if ready:
            wait_ready(server, ready_timeout)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
