"""The aiohttp application: background model load, /ping, /metrics, errors, protocol adapters.

The server listens at once and loads the model in the background (/ping says PENDING until
the engine is up). Protocol adapters are ``install(app, ctx)`` functions that add routes;
their handlers get the ``ServingContext`` from ``request.app[CONTEXT]`` and the request
core from ``ctx.require_service()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import Engine
from lmi_trt.serving.core import GenerationService, format_validation_error
from lmi_trt.serving.errors import (
    BadRequest,
    LmiHttpError,
    PayloadTooLarge,
    ServiceUnavailable,
    error_body,
)
from lmi_trt.serving.health_responder import HealthResponder
from lmi_trt.serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from lmi_trt.serving.metrics import Metrics

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"


@dataclass(frozen=True)
class LoadedModel:
    engine: Engine  # started: submit() works
    tokenizer: Any  # a transformers tokenizer (see serving.tokenizer.load_tokenizer)


class ModelStatus(str, enum.Enum):
    """The /ping wire names (DJL's)."""

    PENDING = "PENDING"
    HEALTHY = "Healthy"
    FAILED = "FAILED"


# An adapter for a body at /invocations that is not LMI-shaped (e.g. OpenAI chat "messages").
InvocationHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]
# A protocol adapter: adds its routes (and may register invocation handlers).
ProtocolAdapter = Callable[[web.Application, "ServingContext"], None]


@dataclass
class ServingContext:
    config: LmiConfig
    model_name: str
    metrics: Metrics
    service: GenerationService | None = None
    load_error: str | None = None
    # Top-level body key → handler, consulted by the LMI /invocations route when "inputs" is absent.
    invocation_handlers: dict[str, InvocationHandler] = field(default_factory=dict)
    _unhealthy_logged: bool = field(default=False, init=False, repr=False)

    @property
    def status(self) -> ModelStatus:
        if self.load_error is not None:
            return ModelStatus.FAILED
        if self.service is None:
            return ModelStatus.PENDING
        if not self.service.engine.healthy:
            if not self._unhealthy_logged:
                self._unhealthy_logged = True
                log.error("engine %s reports unhealthy; /ping answers 503 FAILED", self.service.engine.name)
            return ModelStatus.FAILED
        return ModelStatus.HEALTHY

    def require_service(self) -> GenerationService:
        """The request core, or 503 while the model is loading or after it failed."""
        if self.service is not None:
            return self.service
        if self.load_error is not None:
            raise ServiceUnavailable(f"model {self.model_name!r} failed to load: {self.load_error}", retry_after=30)
        raise ServiceUnavailable(f"model {self.model_name!r} is still loading; retry when /ping answers 200", retry_after=5)


CONTEXT: web.AppKey[ServingContext] = web.AppKey("lmi_serving_context", ServingContext)
_LOAD_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("lmi_load_task", asyncio.Task)


# --- helpers for adapters ---
def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json", headers=headers)


def error_response(err: LmiHttpError) -> web.Response:
    """The LMI/DJL error shape; adapters with their own shape render ``err`` themselves."""
    return json_response(error_body(err), status=err.status, headers=err.headers or None)


async def read_body(request: web.Request) -> bytes:
    """The raw body, with option.max_request_size enforced as a JSON 413; refused with 503
    before it is read when the server is already full."""
    ctx = request.app[CONTEXT]
    if ctx.service is not None:
        ctx.service.check_admission()
    limit = ctx.config.max_request_size
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body is {request.content_length} bytes, more than option.max_request_size={limit}"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge(f"request body is more than option.max_request_size={limit} bytes") from e


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
            raise BadRequest(f"request body is not valid UTF-8: byte {u.start} is {u.object[u.start:u.start + 1]!r}") from None
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


# --- middleware & built-in routes ---
def _route_label(request: web.Request) -> str:
    route = request.match_info.route
    resource = route.resource
    if resource is None:
        return "unmatched"
    return resource.canonical


@web.middleware
async def _errors_and_metrics(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    metrics = request.app[CONTEXT].metrics
    t0 = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except LmiHttpError as e:
        status = e.status
        return error_response(e)
    except web.HTTPException as e:  # the router's 404/405, aiohttp's own 413
        status = e.status
        if e.status == 404:
            msg = f"no route for {request.method} {request.path}; see /ping, /invocations, /predictions/{{model}}"
        elif e.status == 405:
            allowed = sorted(getattr(e, "allowed_methods", ()) or ())
            msg = f"{request.method} is not allowed on {request.path}; use {', '.join(allowed) or 'another method'}"
        else:
            msg = e.text or e.reason
        return json_response({"error": msg, "code": e.status, "type": e.reason}, status=e.status)
    except asyncio.CancelledError:
        status = 499  # the client went away (nginx's convention); generation was cancelled
        raise
    except ConnectionResetError:
        status = 499
        raise
    except Exception as e:
        log.exception("unhandled error on %s %s", request.method, request.path)
        body = {"error": f"internal error: {type(e).__name__}: {e}", "code": 500, "type": "InternalServerError"}
        return json_response(body, status=500)
    finally:
        route = _route_label(request)
        metrics.requests.labels(route, str(status)).inc()
        metrics.request_latency.labels(route).observe(time.perf_counter() - t0)


async def _ping(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    status = ctx.status
    return json_response({ctx.model_name: {"status": status.value}}, status=200 if status is ModelStatus.HEALTHY else 503)


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[CONTEXT].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


def build_app(
    load: Callable[[], Awaitable[LoadedModel]],
    config: LmiConfig,
    *,
    model_name: str,
    adapters: Sequence[ProtocolAdapter] | None = None,
) -> web.Application:
    """The application; ``load`` runs in the background once the server is listening.

    ``adapters`` defaults to the LMI protocol (/invocations, /predictions/{model}).
    """
    if adapters is None:
        from lmi_trt.serving.protocols import lmi

        adapters = (lmi.install,)
    metrics = Metrics()
    ctx = ServingContext(config=config, model_name=model_name, metrics=metrics)
    metrics.attach_live(
        lambda: ctx.service.in_system if ctx.service else 0,
        lambda: ctx.service.engine.stats() if ctx.service else None,
    )
    app = web.Application(client_max_size=config.max_request_size, middlewares=[_errors_and_metrics])
    app[CONTEXT] = ctx
    app.router.add_get("/ping", _ping)
    app.router.add_get("/metrics", _metrics)
    for install in adapters:
        install(app, ctx)

    async def load_in_background() -> None:
        t0 = time.perf_counter()
        try:
            loaded = await load()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            ctx.load_error = f"{type(e).__name__}: {e}"
            log.exception("loading model %r failed; /ping answers 503 FAILED", model_name)
            return
        ctx.service = GenerationService(loaded.engine, loaded.tokenizer, config, metrics=metrics)
        log.info("model %r ready (engine %s) after %.1f s", model_name, loaded.engine.name, time.perf_counter() - t0)

    async def on_startup(app: web.Application) -> None:
        app[_LOAD_TASK] = asyncio.get_running_loop().create_task(load_in_background(), name="lmi-model-load")

    async def on_cleanup(app: web.Application) -> None:
        task = app[_LOAD_TASK]
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if ctx.service is not None:
            await ctx.service.drain()
            await ctx.service.engine.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def _exit_when_failed(ctx: ServingContext, stop: asyncio.Event, grace: float) -> bool:
    """Once the model is FAILED (load error, engine died), keep answering 503 FAILED for
    ``grace`` seconds so health checks and logs see why, then stop: a restart is the fix."""
    while ctx.status is not ModelStatus.FAILED:
        await asyncio.sleep(0.5)
    log.error("model %r is FAILED (%s); exiting in %.0f s", ctx.model_name, ctx.load_error or "engine unhealthy", grace)
    await asyncio.sleep(grace)
    stop.set()
    return True


async def serve(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown_timeout: float = 30.0,
    exit_on_failure_after: float | None = 10.0,
    stop: asyncio.Event | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then stop accepting, give in-flight
    requests up to ``shutdown_timeout`` seconds, and close the engine.

    Returns the process exit code: 0 after a requested stop, 1 when the model FAILED and
    ``exit_on_failure_after`` (seconds; None = serve 503 FAILED for ever) ran out.
    """
    # The socket, and the responder answering on it, come before runner.setup() starts the load: a load
    # that holds the GIL from its first steps would keep this coroutine from starting them later.
    listener = _listen(host, port)
    ctx = app[CONTEXT]
    responder = HealthResponder(listener, ctx.model_name) if ctx.status is ModelStatus.PENDING else None
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout, access_log=None)
    try:
        await runner.setup()
    except BaseException:
        if responder is not None:
            responder.stop()
        listener.close()
        raise
    log.info("listening on http://%s:%d", host, port)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher: asyncio.Task[bool] | None = None
    site: web.SockSite | None = None
    try:
        if responder is not None and not await _responder_answers_until_loaded(app, responder, stop):
            return 0
        site = web.SockSite(runner, listener, backlog=1024)
        await site.start()
        if responder is not None:
            # Stopped only once this server accepts too: a connection queued meanwhile is taken by one
            # of the two, both of which answer it.
            await asyncio.to_thread(responder.stop)
            log.info("health responder stopped: the server answers alone (model %s)", ctx.status.value)
        if exit_on_failure_after is not None:
            watcher = loop.create_task(_exit_when_failed(ctx, stop, exit_on_failure_after))
        await stop.wait()
        log.info("shutting down: draining in-flight requests for up to %.0f s", shutdown_timeout)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        failed = watcher is not None and watcher.done() and not watcher.cancelled() and watcher.result()
        if watcher is not None and not watcher.done():
            watcher.cancel()
        if responder is not None:
            responder.stop()
        await runner.cleanup()
        if site is None:  # once started, the site owns (and has closed) the socket
            listener.close()
    return 1 if failed else 0


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, ours rather than aiohttp's, so the health responder can share it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024)


async def _responder_answers_until_loaded(app: web.Application, responder: HealthResponder, stop: asyncio.Event) -> bool:
    """While the model loads, only the health responder accepts on the listening socket; this process
    does not even watch it. An engine load that holds the GIL (TensorRT-LLM's Executor constructor
    does) freezes every Python thread here, yet an event loop can still accept: uvloop's libuv accepts
    in C with the GIL released, then waits for the GIL to run the callback, leaving the connection
    unanswered until the load ends. True once the load ended (ready or failed), False if stopped first."""
    log.info("health responder (pid %d) answers /ping while the model loads", responder.pid)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({app[_LOAD_TASK], stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    return app[_LOAD_TASK].done()


EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def event_loop_factory(choice: EventLoopChoice = "auto") -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """(loop factory, name): uvloop when it is installed (``auto``) or asked for, else asyncio's
    own loop (factory None). uvloop is an optional dependency: it serves the same streams with
    less CPU per token (measured in benchmarks/README.md); without it nothing changes."""
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"event loop must be auto, uvloop or asyncio, got {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise RuntimeError("the uvloop event loop was asked for but uvloop is not installed (pip install uvloop)") from None
        else:
            return uvloop.new_event_loop, "uvloop"
    return None, "asyncio"


def run_app(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown_timeout: float = 30.0,
    exit_on_failure_after: float | None = 10.0,
    event_loop: EventLoopChoice = "auto",
) -> int:
    """Blocking entry point for the CLI; returns the exit code (see ``serve``).

    ``event_loop``: see ``event_loop_factory`` (auto: uvloop when installed, else asyncio)."""
    factory, name = event_loop_factory(event_loop)
    log.info("event loop: %s", name)
    main = serve(app, host, port, shutdown_timeout=shutdown_timeout, exit_on_failure_after=exit_on_failure_after)
    if factory is None:
        return asyncio.run(main)
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    loop = factory()  # Python 3.10: no Runner; the same steps by hand
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
