"""Secrets and exposure, with `lmi-trt serve` as a real process.

HF_TOKEN and the AWS credentials are unique marker strings; the server loads its model from the
local S3 server with them (DEBUG logging, the most a user can turn on), answers good and bad
requests, /info, /v1/models, /metrics, /openapi.json; a second server fails its load through the
hub path where HF_TOKEN is used. No marker may appear in any log line or any response body.
Both servers were started without ``--host``: they listen on loopback only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import pytest
import requests
from cliserver import Server, free_port, wait_ready
from tinymodels import tiny_model

if TYPE_CHECKING:
    from s3server import S3Server

pytest_plugins = ["s3server"]
pytestmark = pytest.mark.slow


@contextlib.contextmanager
def server(args: list[str], tmp_path: Path, env: dict[str, str], *, ready: bool = True) -> Iterator[Server]:
    port = free_port()
    log_path = tmp_path / f"server-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_", "AWS_", "HF_"))}
    full_env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmi_trt", "--log-level", "DEBUG", "serve", *args, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    srv = Server(proc, port, log_path)
    try:
        if ready:
            wait_ready(srv)
        yield srv
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _listening_on_loopback_only(pid: int) -> list[str]:
    addrs = [c.laddr for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert addrs, "the server listens nowhere"
    return [f"{a.ip}:{a.port}" for a in addrs if a.ip not in ("127.0.0.1", "::1")]


def test_credentials_never_appear_in_logs_bodies_or_info(s3_server: S3Server, tmp_path):
    markers = {
        "HF_TOKEN": f"hf_MARKER{uuid.uuid4().hex}",
        "AWS_SECRET_ACCESS_KEY": f"awsMARKER{uuid.uuid4().hex}",
        "AWS_SESSION_TOKEN": f"sessMARKER{uuid.uuid4().hex}",
    }
    bucket = s3_server.new_bucket("secrets")
    s3_server.upload_folder(tiny_model("llama"), f"s3://{bucket}/llama")
    env = {
        **s3_server.env,
        **markers,
        "SERVING_DOWNLOAD_DIR": str(tmp_path / "dl"),
        "HF_HOME": str(tmp_path / "hf-home"),
    }
    bodies: list[str] = []

    # B: the model comes from S3, the tokenizer from a (private, uncached) hub repo: offline, the start-up
    # check refuses it before loading (exit 2, issue 12), naming the repo, with HF_TOKEN in the environment.
    failing = [
        "--model-id",
        f"s3://{bucket}/llama",
        "--engine",
        "synthetic",
        "-o",
        "option.tokenizer_id=acme/private-tok",
        "--model-name",
        "broken",
    ]
    with (
        server(failing, tmp_path, env, ready=False) as broken,
        server(
            ["--model-id", f"s3://{bucket}/llama", "--engine", "synthetic", "-o", "option.max_input_len=16"],
            tmp_path,
            env,
        ) as srv,
    ):
        assert not _listening_on_loopback_only(srv.proc.pid)
        requests_made = [
            ("POST", "/invocations", {"inputs": "hello", "parameters": {"max_new_tokens": 4}}, 200),
            ("POST", "/invocations", {"inputs": "hello", "parameters": {"max_new_tokens": 4}, "stream": True}, 200),
            ("POST", "/invocations", {"inputs": 5}, 400),
            ("POST", "/invocations", {"inputs": "word " * 40}, 400),
            ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 10**6}, 400),
            ("POST", "/v1/chat/completions", {"messages": "nope"}, 400),
            ("POST", "/generate", {"inputs": "x", "parameters": {"temperature": -1}}, 400),
            ("POST", "/v2/models/other/generate", {"text_input": "x"}, 404),
            ("POST", "/predictions/other", {"inputs": "x"}, 404),
            ("POST", "/endpoints/ep/invocations", {"inputs": "x", "parameters": {"max_new_tokens": 10**6}}, 424),
            ("GET", "/nope", None, 404),
            ("GET", "/info", None, 200),
            ("GET", "/v1/models", None, 200),
            ("GET", "/metrics", None, 200),
            ("GET", "/openapi.json", None, None),
            ("GET", "/ping", None, 200),
            ("GET", "/health", None, 200),
        ]
        for method, path, body, want in requests_made:
            r = requests.request(method, srv.url + path, json=body, timeout=30)
            assert want is None or r.status_code == want, (path, r.status_code, r.text[:300])
            bodies.append(f"{path} {r.status_code} {dict(r.headers)} {r.text}")
        assert broken.proc.wait(timeout=120) == 2, broken.log()[-3000:]
        assert "acme/private-tok" in broken.log()  # the refusal names the repository ...
    logs = srv.log() + broken.log()
    assert "DEBUG" in logs and "s3://" in logs  # the logs are the verbose ones, from the S3 load
    everything = logs + "\n".join(bodies)
    for name, value in markers.items():
        assert value not in everything, (
            f"{name} leaked: " + next(line for line in everything.splitlines() if value in line)[:500]
        )
    # ... and the secrets show up masked where the configuration is echoed
    assert "HF_TOKEN=****" in logs or "option.hf_token = ****" in logs, logs[:3000]


def test_the_cli_binds_loopback_unless_told_otherwise():
    from lmi_trt.cli import build_parser

    args = build_parser().parse_args(["serve"])
    assert args.host == "127.0.0.1"
    entrypoint = (Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh").read_text()
    assert '--host "${LMI_HOST:-0.0.0.0}"' in entrypoint  # inside the container: every interface
