"""Answers health checks from a separate process while the model loads.

TensorRT-LLM's ``Executor`` constructor binding holds the GIL for the whole engine load (minutes for
a large engine; cpp/tensorrt_llm/pybind/executor/executor.cpp releases it for none of it), so no
thread of the serving process runs meanwhile: not the event loop, not a ``to_thread`` worker.
An orchestrator whose liveness probe gets no answer kills the container.

So while the model is PENDING, ``HealthResponder`` runs this file as a small child process (the
standard library only, no lmi_trt import, so it starts in a fraction of a second) that alone accepts
on the server's listening socket, over TLS when the server serves HTTPS (``TlsFiles``, whose context
the server uses too): ``GET /ping`` gets ``503 {"<model>": {"status": "PENDING"}}``,
anything else ``503`` "still loading" with ``Retry-After``, the same answers the server gives while
loading. The server does not watch the socket meanwhile (an event loop frozen by the GIL could still
accept in C, uvloop's does, and leave the connection unanswered). Once the model is ready (or failed),
the server starts accepting, then closes the control pipe; the child finishes the connection in hand
and exits. A connection queued at the handover is accepted by one of the two, and both answer it.
The child also exits when the server dies (the pipe's other end closes with it).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

HEAD_LIMIT = 16 * 1024  # request line + headers read before answering
BODY_DRAIN_LIMIT = 1 << 20  # a body up to this is read (and dropped) so closing does not reset the answer
IO_TIMEOUT_S = 2.0  # per connection: a slow client cannot hold the responder
RETRY_AFTER_S = 5


_CLIENT_CERTS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True)
class TlsFiles:
    """The server side of HTTPS: PEM certificate chain and key; CA certificates and whether clients must
    show a certificate they signed (``client_certs``: none, optional, required)."""

    certfile: str
    keyfile: str
    cafile: str | None = None
    client_certs: str = "none"

    def context(self) -> ssl.SSLContext:
        """The server's context, for the server and this responder alike (TLS 1.2+, the default ciphers:
        ``create_default_context``). Raises OSError / ssl.SSLError for files that do not load."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # No password: without this callback OpenSSL would prompt on the terminal for an encrypted key.
        context.load_cert_chain(self.certfile, self.keyfile, password=_no_password)
        if self.cafile is not None:
            context.load_verify_locations(self.cafile)
        context.verify_mode = _CLIENT_CERTS[self.client_certs]
        return context


def _no_password() -> str:
    raise ValueError("the private key is encrypted; give it unencrypted (openssl pkey -in KEY -out PLAIN_KEY)")


class HealthResponder:
    """The child process, started and stopped by the serving process (see the module docstring)."""

    def __init__(self, listener: socket.socket, model_name: str, tls: TlsFiles | None = None) -> None:
        read_end, control = os.pipe()
        self._control: int | None = control
        self._proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                str(listener.fileno()),
                str(read_end),
                model_name,
                json.dumps(asdict(tls) if tls is not None else None),
            ],
            pass_fds=(listener.fileno(), read_end),
            stdin=subprocess.DEVNULL,
        )
        os.close(read_end)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self, timeout: float = 10.0) -> None:
        """Hand the socket back: the child exits after the connection it is answering, if any. Idempotent."""
        if self._control is not None:
            os.close(self._control)
            self._control = None
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _response(status: str, body: dict, extra_headers: str = "") -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"Connection: close\r\n{extra_headers}\r\n"
    )
    return head.encode("ascii") + payload


def answer(head: bytes, model_name: str) -> bytes:
    """The response to one request head (pure)."""
    line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
    if path == "/ping":
        return _response("503 Service Unavailable", {model_name: {"status": "PENDING"}})
    message = f"model {model_name!r} is still loading; retry when /ping answers 200"
    return _response(
        "503 Service Unavailable",
        {"error": message, "code": 503, "type": "ServiceUnavailableError"},
        f"Retry-After: {RETRY_AFTER_S}\r\n",
    )


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                return max(int(value.strip()), 0)
            except ValueError:
                return 0
    return 0


def _serve_one(conn: socket.socket, model_name: str, tls: ssl.SSLContext | None) -> None:
    deadline = time.monotonic() + IO_TIMEOUT_S
    conn.settimeout(IO_TIMEOUT_S)
    data = b""
    try:
        if tls is not None:  # the handshake within the same bound (ssl.SSLError is an OSError)
            conn = tls.wrap_socket(conn, server_side=True)
        while b"\r\n\r\n" not in data and len(data) < HEAD_LIMIT and time.monotonic() < deadline:
            chunk = conn.recv(4096)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        remaining = min(_content_length(head), BODY_DRAIN_LIMIT) - len(body)
        while remaining > 0 and time.monotonic() < deadline:
            chunk = conn.recv(min(remaining, 65536))
            if not chunk:
                break
            remaining -= len(chunk)
        conn.sendall(answer(head, model_name))
    except OSError:
        pass
    finally:
        conn.close()


def run(listener_fd: int, control_fd: int, model_name: str, tls: TlsFiles | None = None) -> None:
    context = tls.context() if tls is not None else None
    listener = socket.socket(fileno=listener_fd)
    listener.setblocking(False)  # shared with the server, which takes queued connections at the handover
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(control_fd, selectors.EVENT_READ)
    while True:
        ready = [key.fileobj for key, _ in selector.select()]
        if control_fd in ready:  # closed by the server: the model left PENDING, or it died
            return
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            continue  # the server took it (at the handover) or the client gave up
        _serve_one(conn, model_name, context)


if __name__ == "__main__":
    files = json.loads(sys.argv[4])
    run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], TlsFiles(**files) if files is not None else None)
