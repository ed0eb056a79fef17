"""A real S3-compatible server on loopback (moto's server, in-process) for tests.

    from s3server import s3_server, s3_env   # pytest fixtures; import them into a test module

    def test_x(s3_env):                      # env applied to os.environ for the test
        s3_env.upload_folder(folder, "s3://models/llama")
        ... boto3 code that finds the endpoint through AWS_ENDPOINT_URL ...

``s3_server`` (session scope) is the running server; ``s3_env`` (function scope) also puts its
``env`` into ``os.environ`` (endpoint, fake keys, region, no IMDS lookups) and restores it afterwards.
For a subprocess, pass ``{**os.environ, **server.env}``. Buckets persist for the session: use a
fresh bucket name per test (``server.new_bucket()``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# One count for the process: each test module that imports the fixtures gets its own server, but moto keeps
# every server's buckets in one in-process backend, so names must not repeat across servers.
_BUCKETS = itertools.count()


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=self.env["AWS_DEFAULT_REGION"],
        )

    def new_bucket(self, stem: str = "models") -> str:
        """Create and return a bucket name unused in this session."""
        name = f"{stem}-{next(_BUCKETS)}"
        self.client().create_bucket(Bucket=name)
        return name

    def upload_folder(self, folder: Path, uri: str) -> list[str]:
        """Upload every file under ``folder`` to ``s3://bucket/prefix``; return the keys, sorted."""
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        prefix = prefix.strip("/")
        client = self.client()
        keys = []
        for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            key = f"{prefix}/{rel}" if prefix else rel
            client.upload_file(str(path), bucket, key)
            keys.append(key)
        return keys


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 on a free port; stop it on exit."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            # No instance-metadata probing (seconds of timeouts) and no user config leaking in.
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
            "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        }
        yield S3Server(endpoint, env)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    return s3_server
