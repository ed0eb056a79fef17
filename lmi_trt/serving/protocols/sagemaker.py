"""A local SageMaker runtime: unmodified boto3 ``sagemaker-runtime`` clients and the SageMaker
Python SDK's ``Predictor`` work against this server through ``endpoint_url``.

``POST /endpoints/{name}/invocations`` (InvokeEndpoint) and
``POST /endpoints/{name}/invocations-response-stream`` (InvokeEndpointWithResponseStream) do
what the SageMaker runtime does in front of a container: forward the body and the SageMaker
headers to the container's ``/invocations`` (this same server, over loopback), then

* InvokeEndpoint: return the container's answer (``Content-Type``, custom attributes and
  ``x-Amzn-Invoked-Production-Variant``); a container error (4xx/5xx) becomes the ``ModelError``
  the runtime answers (HTTP 424, ``x-amzn-ErrorType: ModelError``, ``OriginalStatusCode`` and
  ``OriginalMessage`` = the container's status and body), so botocore raises
  ``client.exceptions.ModelError`` with the container's message in it;
* the stream: the container's bytes as they come, each chunk a ``PayloadPart`` event in AWS
  event-stream framing (``application/vnd.amazon.eventstream``); an error before the first byte
  is the same ``ModelError``; a container connection that breaks mid-stream ends the stream with
  a ``ModelStreamError`` exception event (ErrorCode ``StreamBroken``).

Problems the runtime itself would reject (an endpoint name SageMaker would not accept, a body
over ``max_request_size``) are ``ValidationError`` (HTTP 400). The endpoint name is otherwise not
checked: one server is one endpoint. No authentication is done (a local emulation).
"""

from __future__ import annotations

import binascii
import logging
import re
import struct
import uuid
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from lmi_trt.log_redaction import loggable
from lmi_trt.serving.errors import PayloadTooLarge
from lmi_trt.serving.http import (
    CUSTOM_ATTRIBUTES_HEADER,
    ServingContext,
    add_post,
    read_body,
)
from lmi_trt.serving.protocols.lmi import INVOCATIONS_BODY

log = logging.getLogger(__name__)

EVENTSTREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
VARIANT = "AllTraffic"
MAX_PART = 256 * 1024  # bytes per PayloadPart; a bigger container chunk is split
_ENDPOINT_NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")  # fullmatch: "$" would let a final newline in
_FORWARDED = (
    "Content-Type",
    CUSTOM_ATTRIBUTES_HEADER,
    "X-Amzn-SageMaker-Inference-Id",
    "X-Amzn-SageMaker-Target-Model",
    "X-Amzn-SageMaker-Target-Variant",
    "X-Amzn-SageMaker-Session-Id",
    "X-Amzn-SageMaker-Inference-Component",
    "X-Amzn-SageMaker-Enable-Explanations",
)
_SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("sagemaker_loopback_session", aiohttp.ClientSession)


# --- AWS event-stream framing ---
def _header(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return struct.pack("!B", len(n)) + n + b"\x07" + struct.pack("!H", len(v)) + v  # 7: string


def encode_event(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude (total length, headers length, CRC32 of both), string
    headers, payload, and a CRC32 of everything before it."""
    hdr = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(hdr) + len(payload) + 4
    prelude = struct.pack("!II", total, len(hdr))
    prelude += struct.pack("!I", binascii.crc32(prelude) & 0xFFFFFFFF)
    message = prelude + hdr + payload
    return message + struct.pack("!I", binascii.crc32(message) & 0xFFFFFFFF)


def payload_part(data: bytes) -> bytes:
    return encode_event(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}, data
    )


def exception_event(kind: str, message: str, error_code: str | None = None) -> bytes:
    body: dict[str, Any] = {"Message": message}
    if error_code is not None:
        body["ErrorCode"] = error_code
    return encode_event(
        {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}, orjson.dumps(body)
    )


def utf8_boundary(data: bytes) -> tuple[bytes, bytes]:
    """Split off an incomplete UTF-8 sequence at the end, so that no PayloadPart ends inside a
    character (clients commonly decode each part on its own). Bytes that are not UTF-8 pass."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80 or b >= 0xF8:
            return data, b""  # ASCII (complete), or not UTF-8 at all
        if b >= 0xC0:  # a lead byte: how long is its sequence?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return (data, b"") if back >= need else (data[: n - back], data[n - back :])
    return data, b""


# --- errors in the runtime's shape ---
def _aws_error(kind: str, status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(
        body=orjson.dumps(body),
        status=status,
        content_type="application/json",
        headers={
            "x-amzn-ErrorType": f"{kind}:http://internal.amazon.com/coral/com.amazon.sagemaker.runtime/",
            "x-amzn-RequestId": str(uuid.uuid4()),
        },
    )


def validation_error(message: str) -> web.Response:
    return _aws_error("ValidationError", 400, {"Message": message, "message": message})


def model_error(name: str, status: int, text: str) -> web.Response:
    side = "client" if status < 500 else "server"
    message = (
        f'Received {side} error ({status}) from primary with message "{text}". '
        f"See the lmi-trt server log for endpoint {name} for more information."
    )
    return _aws_error(
        "ModelError",
        424,
        {
            "ErrorCode": f"{side.upper()}_ERROR_FROM_MODEL",
            "Message": message,
            "message": message,
            "OriginalMessage": text,
            "OriginalStatusCode": status,
            "LogStreamArn": f"arn:aws:logs:local:000000000000:log-group:/aws/sagemaker/Endpoints/{name}",
        },
    )


# --- the forwarding ---
def _container_url(request: web.Request) -> str:
    sock = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if not isinstance(sock, tuple):
        raise RuntimeError("the SageMaker emulation needs a TCP listener to reach /invocations")
    host, port = sock[0], sock[1]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/invocations"


async def _forward(request: web.Request, accept_header: str) -> tuple[str, bytes, dict[str, str]] | web.Response:
    name = request.match_info["endpoint"]
    if not _ENDPOINT_NAME.fullmatch(name):
        return validation_error(
            f"1 validation error detected: Value '{name}' at 'endpointName' failed to satisfy constraint: "
            "Member must satisfy regular expression pattern: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}"
        )
    try:
        body = await read_body(request)
    except PayloadTooLarge as e:
        return validation_error(e.message)
    headers = {h: request.headers[h] for h in _FORWARDED if h in request.headers}
    accept = request.headers.get(accept_header)
    if accept:
        headers["Accept"] = accept
    return name, body, headers


async def invoke_endpoint(request: web.Request) -> web.StreamResponse:
    fwd = await _forward(request, "Accept")
    if isinstance(fwd, web.Response):
        return fwd
    name, body, headers = fwd
    session = request.app[_SESSION]
    async with session.post(_container_url(request), data=body, headers=headers) as r:
        data = await r.read()
        if r.status >= 400:
            return model_error(name, r.status, data.decode("utf-8", "replace"))
        out = {
            "x-Amzn-Invoked-Production-Variant": VARIANT,
            "Content-Type": r.headers.get("Content-Type", "application/json"),
        }
        if CUSTOM_ATTRIBUTES_HEADER in r.headers:
            out[CUSTOM_ATTRIBUTES_HEADER] = r.headers[CUSTOM_ATTRIBUTES_HEADER]
        return web.Response(body=data, status=200, headers=out)


async def invoke_endpoint_with_response_stream(request: web.Request) -> web.StreamResponse:
    fwd = await _forward(request, "X-Amzn-SageMaker-Accept")
    if isinstance(fwd, web.Response):
        return fwd
    name, body, headers = fwd
    session = request.app[_SESSION]
    async with session.post(_container_url(request), data=body, headers=headers) as r:
        if r.status >= 400:
            return model_error(name, r.status, (await r.read()).decode("utf-8", "replace"))
        out = {
            "Content-Type": EVENTSTREAM_CONTENT_TYPE,
            "X-Amzn-SageMaker-Content-Type": r.headers.get("Content-Type", "application/octet-stream"),
            "x-Amzn-Invoked-Production-Variant": VARIANT,
        }
        if CUSTOM_ATTRIBUTES_HEADER in r.headers:
            out[CUSTOM_ATTRIBUTES_HEADER] = r.headers[CUSTOM_ATTRIBUTES_HEADER]
        response = web.StreamResponse(status=200, headers=out)
        await response.prepare(request)
        held = b""
        try:
            try:
                async for chunk in r.content.iter_any():
                    whole, held = utf8_boundary(held + chunk)
                    for i in range(0, len(whole), MAX_PART):
                        await response.write(payload_part(whole[i : i + MAX_PART]))
                if held:
                    await response.write(payload_part(held))
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                log.warning("endpoint %s: the container's stream broke: %s", loggable(name), e)
                await response.write(
                    exception_event(
                        "ModelStreamError", f"the model container's response stream broke: {e}", "StreamBroken"
                    )
                )
            await response.write_eof()
        except ConnectionResetError:
            pass  # our client went away; leaving `async with` closes the container request, which cancels it
        return response


def install(app: web.Application, ctx: ServingContext) -> None:
    # The runtime's routes forward the body to /invocations: they take what it takes.
    add_post(app, "/endpoints/{endpoint}/invocations", invoke_endpoint, INVOCATIONS_BODY)
    add_post(
        app, "/endpoints/{endpoint}/invocations-response-stream", invoke_endpoint_with_response_stream, INVOCATIONS_BODY
    )

    async def open_session(app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        app[_SESSION] = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close_session(app: web.Application) -> None:
        await app[_SESSION].close()

    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)


__all__ = ["encode_event", "exception_event", "install", "model_error", "payload_part", "validation_error"]
