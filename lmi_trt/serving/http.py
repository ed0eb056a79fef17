"""The protocol adapters' toolkit: the serving context, JSON bodies read within their bounds, responses,
and route registration with the request models /openapi.json documents.

Adapters (``lmi_trt.serving.protocols``) import from here and from the request core, never from
``lmi_trt.serving.app``, which assembles the application out of them.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from lmi_trt.child_process import die_with_parent
from lmi_trt.config import LmiConfig
from lmi_trt.log_redaction import loggable
from lmi_trt.serving.core import GenerationService, format_validation_error
from lmi_trt.serving.errors import (
    BadRequest,
    LmiHttpError,
    PayloadTooLarge,
    ServiceUnavailable,
    error_body,
)
from lmi_trt.serving.metrics import Metrics

log = logging.getLogger(__name__)


class RateLimitedLog:
    """One WARNING line per kind and interval, with how many were left out: a client must not be
    able to fill the log (malformed requests, limits that bite)."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self._log = logger
        self._interval = interval
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def warning(self, kind: str, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(kind, -self._interval) < self._interval:
            self._skipped[kind] = self._skipped.get(kind, 0) + 1
            return
        self._last[kind] = now
        skipped = self._skipped.pop(kind, 0)
        if skipped:
            msg += f" (and {skipped} more like it in the last {self._interval:.0f} s)"
        self._log.warning(msg, *args)


limits_log = RateLimitedLog(log)

M = TypeVar("M", bound=BaseModel)
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"


class ModelStatus(str, enum.Enum):
    """The /ping wire names (DJL's)."""

    PENDING = "PENDING"
    HEALTHY = "Healthy"
    FAILED = "FAILED"


# An adapter for a body at /invocations that is not LMI-shaped (e.g. OpenAI chat "messages").
InvocationHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]
# A protocol adapter: adds its routes (and may register invocation handlers).
ProtocolAdapter = Callable[[web.Application, "ServingContext"], None]


class FrontendReadiness(Protocol):
    """Readiness shared by the front ends of one server (serving/frontends.py ``SharedReadiness``)."""

    async def loaded(self) -> None:
        """Mark this front end loaded; return once every front end is."""

    def serving(self) -> None:
        """Mark this front end as the only one answering on its socket (its health responder has stopped)."""

    def all_serving(self) -> bool:
        """Every front end marked serving: a connection any of them accepts is served by a loaded model."""


@dataclass
class ServingContext:
    config: LmiConfig
    model_name: str
    metrics: Metrics
    service: GenerationService | None = None
    load_error: str | None = None
    # Top-level body key → handler, consulted by the LMI /invocations route when "inputs" is absent.
    invocation_handlers: dict[str, InvocationHandler] = field(default_factory=dict)
    invocation_models: list[type[BaseModel]] = field(default_factory=list)  # their request models (register_invocation)
    # Schema → its field for each engine feature it can ask for (register_feature_fields; /v1/capabilities).
    feature_fields: dict[str, Mapping[str, str]] = field(default_factory=dict)
    uploads: UploadBudget = field(init=False)
    json_worker: JsonWorker | None = None
    readiness: FrontendReadiness | None = None  # one of several front ends: healthy only once all serve
    # This process's health responder still accepts on the socket (serving/app.py serve): a connection it takes
    # is answered "still loading", so /ping must not say 200 yet even though the model is loaded.
    responder_accepting: bool = False
    _unhealthy_logged: bool = field(default=False, init=False, repr=False)
    _stalled: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.uploads = UploadBudget(self.config.max_upload_bytes)

    @property
    def status(self) -> ModelStatus:
        if self.dead:
            return ModelStatus.FAILED
        if (
            self.service is None
            or self.responder_accepting
            or (self.readiness is not None and not self.readiness.all_serving())
        ):
            # With front ends, PENDING until none has a health responder left on the shared socket: a 200
            # from one means any connection is served, not answered "still loading" by another's responder.
            return ModelStatus.PENDING
        if self._watchdog_trips(self.service):
            return ModelStatus.FAILED
        return ModelStatus.HEALTHY

    @property
    def dead(self) -> bool:
        """The load failed or the engine died: FAILED for good (the process exits, see app.serve)."""
        if self.load_error is not None:
            return True
        if self.service is None or self.service.engine.healthy:
            return False
        if not self._unhealthy_logged:
            self._unhealthy_logged = True
            log.error("engine %s reports unhealthy; /ping answers 503 FAILED", self.service.engine.name)
        return True

    def _watchdog_trips(self, service: GenerationService) -> bool:
        """option.watchdog_timeout: requests waited that long on the engine and no token came out of it.
        FAILED until tokens flow again, so the platform's health check (SageMaker's /ping, a Kubernetes
        liveness probe) replaces a hung container; unlike a dead engine it may recover, so the server
        does not exit by itself. Each change is logged once."""
        limit = self.config.watchdog_timeout
        waited = service.stalled_for() if limit else 0.0
        stalled = bool(limit) and waited > limit
        if stalled and not self._stalled:
            log.error(
                "watchdog: requests have waited %.0f s on engine %s and no token came out of it "
                "(option.watchdog_timeout=%d; %d waiting now); /ping answers 503 FAILED until tokens flow again",
                waited,
                service.engine.name,
                limit,
                service.waiting_on_engine,
            )
        elif self._stalled and not stalled:
            log.warning("watchdog: engine %s produces tokens again; /ping answers 200", service.engine.name)
        self._stalled = stalled
        return stalled

    def require_service(self) -> GenerationService:
        """The request core, or 503 while the model is loading or after it failed."""
        if self.service is not None:
            return self.service
        if self.load_error is not None:
            raise ServiceUnavailable(f"model {self.model_name!r} failed to load: {self.load_error}", retry_after=30)
        raise ServiceUnavailable(
            f"model {self.model_name!r} is still loading; retry when /ping answers 200", retry_after=5
        )


CONTEXT: web.AppKey[ServingContext] = web.AppKey("lmi_serving_context", ServingContext)


# --- helpers for adapters ---
def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers)


def error_response(err: LmiHttpError) -> web.Response:
    """The LMI/DJL error shape; adapters with their own shape render ``err`` themselves."""
    return json_response(error_body(err), status=err.status, headers=err.headers or None)


async def read_body(request: web.Request) -> bytes:
    """The raw body (decoded from its Content-Encoding), refused with 503 before it is read when
    the server is already full. As it streams in, its decoded bytes count against
    max_request_size (413) and, with every other body being received, against max_upload_bytes
    (503); it must arrive within body_read_timeout seconds (408). A body that does not decode
    (bad gzip/deflate) is a 400."""
    ctx = request.app[CONTEXT]
    if ctx.service is not None:
        ctx.service.check_admission()
    config = ctx.config
    limit = config.max_request_size
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(f"request body is {request.content_length} bytes, more than max_request_size={limit}")
    uploads = ctx.uploads
    uploads.check(request.content_length or 0)
    body = bytearray()
    taken = 0
    try:
        async with asyncio.timeout(config.body_read_timeout):
            while chunk := await request.content.readany():
                body += chunk
                if len(body) > limit:
                    raise PayloadTooLarge(
                        f"request body is more than max_request_size={limit} bytes"
                        + (" once decompressed" if request.headers.get("Content-Encoding") else "")
                    )
                uploads.take(len(chunk))
                taken += len(chunk)
    except TimeoutError:
        limits_log.warning(
            "body_read_timeout",
            "a request body took longer than body_read_timeout=%d s (408): %s %s",
            config.body_read_timeout,
            request.method,
            loggable(request.path),
        )
        raise LmiHttpError(
            f"the request body did not arrive within body_read_timeout={config.body_read_timeout} s",
            status=408,
            type="RequestTimeout",
            headers={"Connection": "close"},
        ) from None
    except web.RequestPayloadError as e:  # aiohttp's wrapper of a ContentEncodingError, bad chunking, ...
        raise BadRequest(
            f"request body could not be read: {' '.join(str(e).split())}"
            + (
                f" (Content-Encoding: {request.headers['Content-Encoding']})"
                if request.headers.get("Content-Encoding")
                else ""
            )
        ) from None
    finally:
        uploads.give(taken)
    return bytes(body)


class UploadBudget:
    """Bytes of request bodies being received right now, all clients together (max_upload_bytes)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def check(self, announced: int) -> None:
        if self.in_flight + announced > self.limit:
            self._refuse()

    def take(self, n: int) -> None:
        self.in_flight += n
        if self.in_flight > self.limit:
            self._refuse()

    def give(self, n: int) -> None:
        self.in_flight -= n

    def _refuse(self) -> None:
        limits_log.warning(
            "max_upload_bytes",
            "request bodies being received reached max_upload_bytes=%d; refusing new bodies with 503",
            self.limit,
        )
        raise ServiceUnavailable(
            f"too many request bytes being received at once (max_upload_bytes={self.limit}); retry later", retry_after=1
        )


# JSON bodies from this size up are parsed in the JSON worker process: a parser holds the GIL for
# its whole run (orjson: 0.4 s for 300k chat turns), so a thread would still stall the event loop.
_WORKER_JSON_BYTES = 256 * 1024


class JsonWorker:
    """One process that parses big request bodies and refuses those with more JSON values than any
    valid request needs (then only a bounded object graph is unpickled on the event loop).
    Forked before the model load starts any thread (serve())."""

    def __init__(self) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self._pool = ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("fork"), initializer=die_with_parent, initargs=(os.getpid(),)
        )
        self._pool.submit(int).result()  # fork now, while the process has no other thread

    async def parse(self, raw: bytes, max_values: int) -> Any:
        from concurrent.futures.process import BrokenProcessPool

        try:
            ok, value = await asyncio.get_running_loop().run_in_executor(self._pool, _parse_bounded, raw, max_values)
        except BrokenProcessPool:  # the worker died (killed for memory?): this body is not parsed
            log.error("the JSON worker process died; big request bodies are refused until a restart")
            raise ServiceUnavailable("the server cannot parse big request bodies right now") from None
        if not ok:
            raise BadRequest(value)
        return value

    def close(self) -> None:
        # Joined (a body being parsed finishes; nobody waits for it): the CLI's exit skips the
        # interpreter's atexit joins (lmi_trt.cli.serve._exit_stopped), so no worker is left behind.
        self._pool.shutdown(wait=True, cancel_futures=True)


def _parse_bounded(raw: bytes, max_values: int) -> tuple[bool, Any]:
    """In the worker: (True, parsed body) or (False, the 400's message)."""
    try:
        data = parse_json(raw)
    except LmiHttpError as e:
        return False, e.message
    n, stack = 0, [data]
    while stack:
        value = stack.pop()
        n += 1
        if n > max_values:
            return False, (
                f"request body holds more than {max_values} JSON values, more than any request within "
                "option.max_input_len and option.max_prompts_per_request needs"
            )
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return True, data


def max_json_values(config: LmiConfig) -> int:
    """JSON values a valid request may hold: each prompt (a batch's) as token ids, or a chat of
    one message per token (a message is an object, a role, a content: 3 values), plus settings. With
    option.enable_lora, Triton's lora_weights may come in the body: as many numbers as max_request_size's bytes
    hold (two bytes each at least, ``0,``)."""
    most = config.max_prompts_per_request * (config.max_input_len + 16) + 3 * config.max_input_len + 1024
    return max(most, config.max_request_size // 2) if config.enable_lora else most


async def load_json(request: web.Request, raw: bytes) -> Any:
    """``parse_json``, in the JSON worker for big bodies (when the server runs one)."""
    ctx = request.app[CONTEXT]
    if len(raw) < _WORKER_JSON_BYTES:
        return parse_json(raw)
    if ctx.json_worker is None:  # an app served without serve() (tests): a thread at least
        return await asyncio.to_thread(parse_json, raw)
    return await ctx.json_worker.parse(raw, max_json_values(ctx.config))


def parse_json(raw: bytes) -> Any:
    if not raw.strip():
        raise BadRequest('request body is empty; send JSON such as {"inputs": "Hello", "parameters": {}}')
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        # orjson is strict JSON; Python's parser also takes NaN/Infinity, which clients'
        # json.dumps emits. Parsing those lets validation name the offending field.
        try:
            data = json.loads(raw)
        except UnicodeDecodeError as u:
            raise BadRequest(
                f"request body is not valid UTF-8: byte {u.start} is {u.object[u.start : u.start + 1]!r}"
            ) from None
        except ValueError:
            raise BadRequest(f"request body is not valid JSON: {e}") from None
        except RecursionError:  # orjson stops at 1024 levels; Python's parser overflows the stack
            raise BadRequest("request body is nested too deeply (more than 1024 levels of arrays/objects)") from None
        _reject_lone_surrogates(data)
        return data


def _reject_lone_surrogates(data: Any) -> None:
    """Python's parser accepts ``"\\ud800"`` escapes that orjson refuses: such a string is not
    text (no tokenizer or encoder takes it), so it is a 400 that names where it is."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise BadRequest(
                    f"{where or 'request body'}: contains a lone UTF-16 surrogate ({ascii(value[e.start])[1:-1]}), "
                    "which is not Unicode text; send valid UTF-8 / paired surrogate escapes"
                ) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                shown = key.encode("utf-8", "backslashreplace").decode()
                stack.append((f"{where}.{shown}" if where else shown, key))
                stack.append((f"{where}.{shown}" if where else shown, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def validate(model: type[M], data: Any, prefix: str = "") -> M:
    """pydantic validation whose failure is a 400 naming each field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BadRequest(f"invalid request: {format_validation_error(e, prefix)}") from None


def request_properties(request: web.Request) -> dict[str, str]:
    """``X-Amzn-SageMaker-Custom-Attributes: k1=v1; k2=v2`` as a dict (DJL: request properties)."""
    header = request.headers.get(CUSTOM_ATTRIBUTES_HEADER)
    return parse_custom_attributes(header) if header else {}


def parse_custom_attributes(header: str) -> dict[str, str]:
    props: dict[str, str] = {}
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key:
            props[key.strip()] = value.strip()
    return props


# --- routes ---
@dataclass(frozen=True)
class Body:
    """What a POST route takes: JSON that is one of ``models`` (validated by them, documented from them by
    /openapi.json), or plain text where ``text``; ``invocations`` adds the bodies of the registered
    invocation handlers (DJL's /invocations dispatches on the body's top-level key)."""

    models: tuple[type[BaseModel], ...]
    text: bool = False
    invocations: bool = False


ROUTE_BODIES: web.AppKey[dict[str, Body]] = web.AppKey("lmi_route_bodies", dict)


def add_post(
    app: web.Application, path: str, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], body: Body
) -> None:
    """A POST route and its request body, registered together so the OpenAPI document cannot miss it."""
    app.router.add_post(path, handler)
    if ROUTE_BODIES not in app:
        app[ROUTE_BODIES] = {}
    app[ROUTE_BODIES][path] = body


def register_feature_fields(ctx: ServingContext, schema: str, names: Mapping[str, str]) -> None:
    """``names`` (engine feature → the schema's field, what the schema passes to ``GenerationService.start``
    for its 400s) as ``GET /v1/capabilities`` shows them."""
    ctx.feature_fields[schema] = names


def register_invocation(ctx: ServingContext, key: str, handler: InvocationHandler, *models: type[BaseModel]) -> None:
    """A body at /invocations with top-level ``key`` (when ``inputs`` is absent) goes to ``handler``; ``models``
    are what it validates against (documented as /invocations' bodies)."""
    if key not in ctx.invocation_handlers:
        ctx.invocation_handlers[key] = handler
        ctx.invocation_models.extend(models)
