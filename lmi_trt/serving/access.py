"""Who may call, and which request a response and a log line belong to: the API key and X-Request-Id.

* ``request_context`` (the outermost middleware) gives every request an id: the client's ``X-Request-Id``
  when it sends a usable one, as vLLM takes it (vllm/entrypoints/openai/serving_engine.py
  ``_base_request_id``), else SageMaker's ``X-Amzn-SageMaker-Inference-Id`` (the InvokeEndpoint
  ``InferenceId``, which the runtime forwards to the container: aws/sagemaker-python-sdk
  src/sagemaker/local/local_session.py ``invoke_endpoint``), else a new one. It is echoed in the
  response's ``X-Request-Id`` header (streams too: ``echo_request_id`` runs as headers are sent) and
  set as ``lmi_trt.log_context.REQUEST_ID`` while the request is handled, so every log line about it
  names it. A client's id is used only when it is short and plain (``_USABLE_ID``): it goes into log
  lines and headers, where newlines or megabytes would do harm.
* ``api_key_guard`` (``option.api_key``) answers 401 to a request without ``Authorization: Bearer KEY``
  for one of the keys, as vLLM's AuthenticationMiddleware does (vllm/entrypoints/serve/middleware/
  authenticate.py: the scheme case-insensitive, SHA-256 digests compared with ``compare_digest`` against
  every key, so neither the time taken nor an early exit tells which key or how much matched). Only
  Bearer is accepted, as by vLLM and TGI (router/src/server.rs). Routes that probes and scrapers call
  stay open (``PUBLIC_ROUTES``): SageMaker's and Kubernetes' health checks send no key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import uuid
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from lmi_trt.log_context import REQUEST_ID
from lmi_trt.serving.errors import LmiHttpError
from lmi_trt.serving.http import limits_log

REQUEST_ID_HEADER = "X-Request-Id"
SAGEMAKER_INFERENCE_ID_HEADER = "X-Amzn-SageMaker-Inference-Id"
# UUIDs, AWS request ids, W3C trace ids, base64 ids: up to 128 characters a header and a log line carry safely.
_USABLE_ID = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

# Health probes (LMI/SageMaker /ping, TGI /health, Triton's live/ready), Prometheus' scrape and the API
# description: open with or without option.api_key (vLLM leaves /health, /ping, /metrics, /openapi.json open).
PUBLIC_ROUTES = frozenset(
    {
        "/ping",
        "/health",
        "/metrics",
        "/openapi.json",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/{model}/ready",
        "/v2/models/{model}/versions/{version}/ready",
    }
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def choose_request_id(client_ids: Sequence[str | None]) -> str:
    """Pure: the first usable id the client sent (in order of preference), else a new one."""
    return next((i for i in client_ids if i is not None and _USABLE_ID.fullmatch(i)), None) or uuid.uuid4().hex


def current_request_id() -> str:
    """The id ``request_context`` gave the request being handled (a new one outside of any)."""
    return REQUEST_ID.get() or uuid.uuid4().hex


@web.middleware
async def request_context(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = choose_request_id(
        [request.headers.get(REQUEST_ID_HEADER), request.headers.get(SAGEMAKER_INFERENCE_ID_HEADER)]
    )
    token = REQUEST_ID.set(rid)
    try:
        response = await handler(request)
        if not response.prepared:  # a stream's headers went out already, with the id (echo_request_id)
            response.headers[REQUEST_ID_HEADER] = rid
        return response
    finally:
        REQUEST_ID.reset(token)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` hook: a stream's headers go out while its handler runs, in the
    request's context."""
    rid = REQUEST_ID.get()
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


class Unauthorized(LmiHttpError):
    status = 401
    type = "Unauthorized"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})  # RFC 6750 section 3


def key_digests(keys: Sequence[str]) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(k.encode()).digest() for k in keys)


def authorized(header: str | None, digests: Sequence[bytes]) -> bool:
    """Pure: whether an ``Authorization`` value is ``Bearer`` and one of the keys; every key is compared."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
    match = False
    for digest in digests:
        match |= hmac.compare_digest(given, digest)
    return match


def api_key_guard(keys: Sequence[str]) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The middleware for ``option.api_key``: 401 unless the request is to a public route or carries a key."""
    digests = key_digests(keys)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        if resource is not None and resource.canonical in PUBLIC_ROUTES:
            return await handler(request)
        header = request.headers.get("Authorization")
        if authorized(header, digests):
            return await handler(request)
        limits_log.warning(
            "unauthorized",
            "refused %s %s (401): %s",
            request.method,
            request.path[:200],
            "no API key" if header is None else "not a valid API key",
        )
        raise Unauthorized(
            "this server needs an API key: send Authorization: Bearer <key> with a key of option.api_key"
            if header is None
            else "the Authorization header does not carry a valid API key (Bearer <key>, a key of option.api_key)"
        )

    return guard
