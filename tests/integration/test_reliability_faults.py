"""Faults: S3 errors and connection resets injected between the loader and a real S3 server.

S3: a fault-injecting TCP proxy (``FaultProxy``) sits between boto3 and the local S3 server and,
per request, answers 503 SlowDown / 500, resets the connection before or in the middle of the
body, or sends a body cut short. Transient faults are retried (by the SDK with backoff, or by
s3transfer for broken bodies) and the copy is byte-identical; persistent ones fail with the
object's name and leave no folder that looks complete. (A killed download and a killed compile
are covered by test_sources.py and test_compile_cache.py; engines that die by
test_reliability_lifecycle.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tinymodels import tiny_model

from lmi_trt.config import LmiConfig
from lmi_trt.sources import SourceError, parse_s3_uri, resolve_model
from lmi_trt.sources.s3 import MANIFEST, cache_dir_for

if TYPE_CHECKING:
    from s3server import S3Server

pytest_plugins = ["s3server"]
pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- the fault-injecting proxy --------------------------------------------------------------------
@dataclass
class Seen:
    method: str
    path: str
    attempt: str  # botocore's amz-sdk-request header: "attempt=N; max=M"
    action: str
    at: float


Policy = Callable[[str, str, int], str]  # (method, path, n-th request for this method+path) -> action
ACTIONS = ("pass", "503", "500", "reset_before", "reset_mid", "close_mid", "short")


@dataclass
class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in a thread of its own, in front of ``upstream``."""

    upstream: tuple[str, int]
    policy: Policy
    seen: list[Seen] = field(default_factory=list)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    port: int = 0

    def __enter__(self) -> FaultProxy:
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:  # idle keep-alive connections
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def faults(self) -> list[Seen]:
        return [s for s in self.seen if s.action != "pass"]

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = [tuple(x.split(":", 1)) for x in lines[1:] if x]
                hmap = {k.strip().lower(): v.strip() for k, v in headers}
                body = await reader.readexactly(int(hmap.get("content-length", "0")))
                path = target.split("?", 1)[0]
                key = (method, target)
                self.counts[key] = self.counts.get(key, 0) + 1
                action = self.policy(method, target, self.counts[key])
                self.seen.append(Seen(method, path, hmap.get("amz-sdk-request", ""), action, time.monotonic()))
                if action == "reset_before":
                    return _reset(writer)
                if action in ("503", "500"):
                    code, reason, err = (
                        ("503", "Slow Down", "SlowDown")
                        if action == "503"
                        else ("500", "Internal Server Error", "InternalError")
                    )
                    xml = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{err}</Code>"
                        f"<Message>injected</Message></Error>"
                    ).encode()
                    writer.write(
                        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\n"
                        f"Content-Length: {len(xml)}\r\n\r\n".encode()
                        + xml
                    )
                    await writer.drain()
                    continue
                status_line, resp_headers, resp_body = await self._forward(method, target, headers, body)
                keep = [
                    (k, v)
                    for k, v in resp_headers
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "keep-alive")
                ]
                length = (
                    int(dict((k.lower(), v) for k, v in resp_headers).get("content-length", "0"))
                    if method == "HEAD"
                    else len(resp_body)
                )
                if action == "short" and method == "GET" and len(resp_body) > 16:
                    resp_body = resp_body[: len(resp_body) // 2]
                    length = len(resp_body)
                out = (
                    status_line
                    + "\r\n"
                    + "".join(f"{k}:{v}\r\n" for k, v in keep)
                    + f"Content-Length: {length}\r\n\r\n"
                ).encode("latin-1")
                if action in ("reset_mid", "close_mid") and method == "GET":
                    writer.write(out + resp_body[: len(resp_body) // 2])
                    await writer.drain()
                    await asyncio.sleep(0.01)
                    if action == "reset_mid":
                        return _reset(writer)
                    writer.close()
                    return
                writer.write(out + (b"" if method == "HEAD" else resp_body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a client gone, or the proxy stopping
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _forward(self, method: str, target: str, headers: list, body: bytes) -> tuple[str, list, bytes]:
        """One request upstream over HTTP/1.0: the answer is delimited by the connection closing."""
        r, w = await asyncio.open_connection(*self.upstream)
        keep = [(k, v) for k, v in headers if k.strip().lower() not in ("connection", "keep-alive", "expect")]
        w.write(
            (
                f"{method} {target} HTTP/1.0\r\n"
                + "".join(f"{k}:{v}\r\n" for k, v in keep)
                + "Connection: close\r\n\r\n"
            ).encode("latin-1")
            + body
        )
        await w.drain()
        raw = await r.read()
        w.close()
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].replace("HTTP/1.0", "HTTP/1.1", 1)
        return status, [tuple(x.split(":", 1)) for x in lines[1:] if x], rest


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --- S3 -----------------------------------------------------------------------------------------------
def _is_object_get(method: str, target: str, bucket: str) -> bool:
    path, _, query = target.partition("?")
    return (
        method == "GET" and path.startswith(f"/{bucket}/") and len(path) > len(bucket) + 2 and "list-type" not in query
    )


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def _leftovers(dest: Path) -> list[Path]:
    return sorted(dest.parent.glob(f".{dest.name}.*"))


@pytest.fixture
def s3_model(s3_env: S3Server, monkeypatch) -> Iterator[tuple[S3Server, str, str]]:
    bucket = s3_env.new_bucket("faults")
    uri = f"s3://{bucket}/llama"
    s3_env.upload_folder(tiny_model("llama"), uri)
    yield s3_env, bucket, uri


def _through(proxy: FaultProxy, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)


def _upstream(s3: S3Server) -> tuple[str, int]:
    host, port = s3.endpoint.removeprefix("http://").split(":")
    return host, int(port)


def test_transient_s3_faults_are_retried_and_the_copy_is_exact(s3_model, tmp_path, monkeypatch):
    s3, bucket, uri = s3_model
    kinds = ["503", "500", "reset_before", "reset_mid", "close_mid", "503"]
    first_fault: dict[str, str] = {}

    def policy(method: str, target: str, n: int) -> str:
        if method == "GET" and "list-type" in target and n == 1:
            return "503"  # the listing too
        if _is_object_get(method, target, bucket) and n == 1:
            kind = kinds[len(first_fault) % len(kinds)]
            first_fault[target] = kind
            return kind
        return "pass"

    with FaultProxy(_upstream(s3), policy) as proxy:
        _through(proxy, monkeypatch)
        artifact = resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path))
    dest = cache_dir_for(tmp_path, parse_s3_uri(uri))
    assert artifact.path == dest and artifact.kind == "hf_checkpoint"
    assert _files(dest) == _files(tiny_model("llama"))  # byte for byte
    assert _leftovers(dest) == []
    faults = proxy.faults()
    objects = len(_files(tiny_model("llama")))
    assert len(first_fault) == objects and len(faults) == objects + 1, [(f.path, f.action) for f in faults]
    # Every faulted request was asked again; error answers and resets before a response are retried
    # by the SDK itself (its retry header counts the attempt, with backoff between), broken bodies by
    # s3transfer with a fresh GET.
    for f in faults:
        again = [s for s in proxy.seen if s.path == f.path and s.at > f.at and s.action == "pass"]
        assert again, f"{f.path} was not retried after {f.action}"
        if f.action in ("503", "500", "reset_before"):
            assert "attempt=2" in again[0].attempt, (f, again[0])
    print(
        f"s3 faults: {len(faults)} injected ({', '.join(sorted({f.action for f in faults}))}), "
        f"{len(proxy.seen)} requests, all recovered"
    )


@pytest.mark.parametrize("action", ["reset_mid", "short"])
def test_persistent_s3_fault_fails_naming_the_object_and_leaves_nothing_complete(
    s3_model, tmp_path, monkeypatch, action
):
    s3, bucket, uri = s3_model

    def policy(method: str, target: str, n: int) -> str:
        return action if _is_object_get(method, target, bucket) and target.endswith("/model.safetensors") else "pass"

    with FaultProxy(_upstream(s3), policy) as proxy:
        _through(proxy, monkeypatch)
        with pytest.raises(SourceError) as err:
            resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path))
    assert "model.safetensors" in str(err.value), err.value
    dest = cache_dir_for(tmp_path, parse_s3_uri(uri))
    assert not dest.exists() and _leftovers(dest) == [], "a failed download must leave nothing behind"
    tries = [s for s in proxy.seen if s.path.endswith("/model.safetensors")]
    assert len(tries) >= 2 or action == "short", tries  # broken bodies are retried before giving up
    # Once S3 behaves, the same call completes the copy.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    assert _files(resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path)).path) == _files(tiny_model("llama"))


def test_an_object_replaced_after_the_listing_is_refused_by_etag(s3_model, tmp_path, monkeypatch):
    """Same size, other bytes: only the listing's ETag (sent as If-Match) can tell."""
    s3, bucket, uri = s3_model
    original = (tiny_model("llama") / "config.json").read_bytes()
    replaced = original.replace(b'": ', b'":\t')  # still valid JSON: without the check it would be used
    assert len(replaced) == len(original) and replaced != original
    swapped = threading.Event()

    def policy(method: str, target: str, n: int) -> str:
        if _is_object_get(method, target, bucket) and not swapped.is_set():
            swapped.set()  # after the listing, before the first object is fetched
            s3.client().put_object(Bucket=bucket, Key="llama/config.json", Body=replaced)
        return "pass"

    with FaultProxy(_upstream(s3), policy) as proxy:
        _through(proxy, monkeypatch)
        with pytest.raises(SourceError, match=r"s3://faults-\d+/llama/config.json: .*ETag"):
            resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path))
    dest = cache_dir_for(tmp_path, parse_s3_uri(uri))
    assert not dest.exists() and _leftovers(dest) == []
    assert proxy.seen
