"""The aiohttp application: background model load, /ping, /metrics, errors, protocol adapters.

The server listens at once and loads the model in the background (/ping says PENDING until
the engine is up). Protocol adapters are ``install(app, ctx)`` functions that add routes;
their handlers get the ``ServingContext`` from ``request.app[CONTEXT]`` and the request
core from ``ctx.require_service()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Literal

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from lmi_trt.config import LmiConfig
from lmi_trt.errors import LmiError
from lmi_trt.log_redaction import loggable
from lmi_trt.serving import access, tls
from lmi_trt.serving.admission import Admission
from lmi_trt.serving.core import GenerationService, LoadedModel
from lmi_trt.serving.errors import LmiHttpError
from lmi_trt.serving.health_responder import HealthResponder
from lmi_trt.serving.http import (
    CONTEXT,
    FrontendReadiness,
    JsonWorker,
    ModelStatus,
    ProtocolAdapter,
    ServingContext,
    error_response,
    json_response,
    limits_log,
)
from lmi_trt.serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from lmi_trt.serving.metrics import Metrics

log = logging.getLogger(__name__)

_LOAD_TASK: web.AppKey[asyncio.Task[None]] = web.AppKey("lmi_load_task", asyncio.Task)


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
        log.exception("unhandled error on %s %s", request.method, loggable(request.path))
        body = {"error": f"internal error: {type(e).__name__}: {e}", "code": 500, "type": "InternalServerError"}
        return json_response(body, status=500)
    finally:
        route = _route_label(request)
        metrics.requests.labels(route, str(status)).inc()
        metrics.request_latency.labels(route).observe(time.perf_counter() - t0)


async def _ping(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    status = ctx.status
    return json_response(
        {ctx.model_name: {"status": status.value}}, status=200 if status is ModelStatus.HEALTHY else 503
    )


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[CONTEXT].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


def build_app(
    load: Callable[[], Awaitable[LoadedModel]],
    config: LmiConfig,
    *,
    model_name: str,
    adapters: Sequence[ProtocolAdapter] | None = None,
    admission: Admission | None = None,
    metrics_dir: str | None = None,
    readiness: FrontendReadiness | None = None,
) -> web.Application:
    """The application; ``load`` runs in the background once the server is listening.

    ``adapters`` defaults to the LMI protocol (/invocations, /predictions/{model}). A front end of several
    (serving/frontends.py) passes the ``admission`` they share, the folder of their metrics, and their
    ``readiness``: loaded, it waits until every front end is, and /ping turns 200 only once every one serves
    alone on the socket (no health responder of any answers "still loading" after a 200).
    """
    if adapters is None:
        from lmi_trt.serving.protocols import lmi

        adapters = (lmi.install,)
    metrics = Metrics(model_name, metrics_dir)
    ctx = ServingContext(config=config, model_name=model_name, metrics=metrics, readiness=readiness)
    metrics.attach_live(
        lambda: ctx.service.admission.total() if ctx.service else 0,
        lambda: ctx.service.engine.stats() if ctx.service else None,
    )
    # request_context outermost: a 401 and an error response carry X-Request-Id too, and the log lines
    # of everything below name the request; the key check inside the error handling (a 401 is counted).
    middlewares: list[Any] = [access.request_context, _errors_and_metrics]
    if config.api_key is not None:
        middlewares.append(access.api_key_guard(config.api_keys()))
    app = web.Application(client_max_size=config.max_request_size, middlewares=middlewares)
    app.on_response_prepare.append(access.echo_request_id)
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
        except LmiError as e:  # a failure lmi-trt explains (the file or key, and what to do): one line
            ctx.load_error = str(e)
            log.error("loading model %r failed: %s; /ping answers 503 FAILED", model_name, e)
            return
        except Exception as e:
            ctx.load_error = f"{type(e).__name__}: {e}"
            log.exception("loading model %r failed; /ping answers 503 FAILED", model_name)
            return
        service = GenerationService(
            loaded.engine,
            loaded.tokenizer,
            config,
            metrics=metrics,
            adapter_source=loaded.adapter_source,
            admission=admission,
            model_config=loaded.model_config,
        )
        if readiness is not None:
            await readiness.loaded()
        ctx.service = service
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


async def _watch_health(ctx: ServingContext, stop: asyncio.Event, grace: float | None) -> bool:
    """Look at the model's status twice a second, so that what changes it is logged when it happens
    (the progress watchdog too, not only when a probe asks). Once the model is dead (load error, engine
    died), keep answering 503 FAILED for ``grace`` seconds so health checks and logs see why, then stop:
    a restart is the fix (``grace`` None: serve 503 FAILED for ever). True when it stopped the server."""
    while not ctx.dead or grace is None:
        await asyncio.sleep(0.5)
        _ = ctx.status
    log.error("model %r is FAILED (%s); exiting in %.0f s", ctx.model_name, ctx.load_error or "engine unhealthy", grace)
    await asyncio.sleep(grace)
    stop.set()
    return True


# Idle keep-alive connections close after this long (nginx's default); aiohttp's is about an hour.
KEEPALIVE_TIMEOUT_S = 75.0
# File descriptors kept for everything but client connections (model files, logs, pipes, threads).
_RESERVED_FDS = 64
# After the drain, aiohttp gets this long to cancel what is left before the engine closes.
_CANCEL_GRACE_S = 1.0


def _timeout_response(message: str) -> bytes:
    body = orjson.dumps({"error": message, "code": 408, "type": "RequestTimeout"})
    return (
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Retry-After: 1\r\nContent-Length: 81\r\n\r\n"
    b'{"error":"too many open connections; retry later","code":503,"type":"ServiceUnav"}'
)


class ConnectionGuard:
    """Bounds open connections (idle keep-alive ones are closed first) and how long a client may
    take to send a request's line and headers. Shared by the handlers of one listening socket."""

    def __init__(self, max_connections: int, header_timeout: float) -> None:
        self.max_connections = max_connections
        self.header_timeout = header_timeout
        self.open: dict[GuardedRequestHandler, None] = {}  # insertion order: oldest first

    def admit(self, handler: GuardedRequestHandler) -> bool:
        if len(self.open) >= self.max_connections:
            idle = next((h for h in self.open if h.idle), None)
            if idle is None:
                limits_log.warning(
                    "max_connections",
                    "max_connections=%d open connections, none idle: new connections get 503",
                    self.max_connections,
                )
                return False
            limits_log.warning(
                "max_connections_idle",
                "max_connections=%d reached: closing idle keep-alive connections for new ones",
                self.max_connections,
            )
            idle.force_close()
            self.open.pop(idle, None)
        self.open[handler] = None
        return True


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's connection handler plus a header read timeout (408), the connection bound, and
    malformed requests logged as one rate-limited WARNING line instead of an ERROR traceback.

    It reads aiohttp's ``_request_count`` / ``_request_in_progress`` / ``_messages`` (aiohttp 3.9
    to 3.14, aiohttp/web_protocol.py); ``data_received`` and ``connection_made`` are its
    asyncio.Protocol methods."""

    def __init__(self, manager: web.Server, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._header_timer: asyncio.TimerHandle | None = None
        self._served = False

    @property
    def idle(self) -> bool:
        """Between requests of a keep-alive connection, with nothing of the next one received."""
        return self._served and self._header_timer is None and not self._request_in_progress and not self._messages

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._guard.admit(self):
            transport.write(_BUSY)  # type: ignore[attr-defined]
            transport.close()
            return
        super().connection_made(transport)
        self._start_header_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        self._guard.open.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and data and not self._request_in_progress and not self._messages:
            self._start_header_timer()  # the first bytes of the next request on a kept-alive connection
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._served = True
            self._stop_header_timer()

    def _start_header_timer(self) -> None:
        self._header_timer = self._loop.call_later(self._guard.header_timeout, self._headers_late)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        t = self._guard.header_timeout
        limits_log.warning(
            "header_read_timeout",
            "a client sent no complete request line and headers within "
            "header_read_timeout=%g s: 408, connection closed",
            t,
        )
        if self.transport is not None:
            self.transport.write(
                _timeout_response(f"the request line and headers did not arrive within header_read_timeout={t:g} s")
            )
        self.force_close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        # The client's malformed request (line, headers, body encoding), not a server fault; a bad
        # body shows up again when aiohttp reads the rest of it after the handler answered 400.
        if isinstance(exc, (HttpProcessingError, web.RequestPayloadError)):
            limits_log.warning(
                "malformed",
                "malformed request from %s refused: %s",
                self.peername[0] if isinstance(self.peername, tuple) else "?",
                ascii(" ".join(str(exc).split()))[:200],
            )
            return
        super().log_exception(*args, **kw)


def connection_limit(configured: int) -> int:
    """max_connections, lowered to fit the process's open-files limit (each connection is one)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft - _RESERVED_FDS >= configured:
        return configured
    fits = max(soft - _RESERVED_FDS, 1)
    log.warning(
        "max_connections=%d does not fit the open-files limit (ulimit -n %d): serving at most %d "
        "connections; raise ulimit -n to allow more",
        configured,
        soft,
        fits,
    )
    return fits


async def serve(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown_timeout: float = 30.0,
    exit_on_failure_after: float | None = 10.0,
    stop: asyncio.Event | None = None,
    sock: socket.socket | None = None,
    answer_while_loading: bool = True,
    own_process: bool = False,
) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set), then stop accepting, give in-flight
    requests up to ``shutdown_timeout`` seconds, cancel what is left, and close the engine.
    ``sock``: a listening socket to accept on (a front end's, shared with the others), else one on host:port.
    ``answer_while_loading`` False: accept nothing until loaded (a front end replacing one that died, while the
    others serve). ``own_process``: the process serves nothing else (the CLI's, a front end's): once loaded, what
    start-up built leaves the garbage collector's view (``freeze_heap``).

    Returns the process exit code: 0 after a requested stop, 1 when the model FAILED and
    ``exit_on_failure_after`` (seconds; None = serve 503 FAILED for ever) ran out.
    """
    ctx = app[CONTEXT]
    files = tls.tls_files(ctx.config)  # HTTPS when certificate_file is set (checked at startup: cli)
    ssl_context = files.context() if files is not None else None
    # Forked first, while the process has no other thread and no listening socket to inherit.
    ctx.json_worker = JsonWorker()
    # The socket, and the responder answering on it, come before runner.setup() starts the load: a load
    # that holds the GIL from its first steps would keep this coroutine from starting them later.
    sock = sock if sock is not None else listen(host, port)
    loading = ctx.status is ModelStatus.PENDING
    responder = HealthResponder(sock, ctx.model_name, files) if loading and answer_while_loading else None
    ctx.responder_accepting = responder is not None
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=_CANCEL_GRACE_S,
        access_log=None,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
    )
    try:
        await runner.setup()
    except BaseException:
        if responder is not None:
            responder.stop()
        sock.close()
        ctx.json_worker.close()
        raise
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watcher: asyncio.Task[bool] | None = None
    listener: asyncio.base_events.Server | None = None
    try:
        if loading and not await _until_loaded(app, responder, stop):
            return 0
        if own_process and ctx.service is not None:
            freeze_heap()
        guard = ConnectionGuard(connection_limit(ctx.config.max_connections), ctx.config.header_read_timeout)
        server = runner.server
        assert server is not None
        # The same protocol aiohttp's TCPSite serves (web.Server → RequestHandler), built here so
        # each connection gets the guarded handler; arguments as AppRunner passes them.
        listener = await loop.create_server(
            lambda: GuardedRequestHandler(
                server, guard, loop=loop, keepalive_timeout=KEEPALIVE_TIMEOUT_S, access_log=None
            ),
            sock=sock,
            backlog=1024,
            ssl=ssl_context,
            # The TLS handshake comes before the request line: the same bound (asyncio's default is 60 s).
            ssl_handshake_timeout=float(ctx.config.header_read_timeout) if ssl_context is not None else None,
        )
        log.info(
            "listening on %s://%s:%d (at most %d connections%s)",
            "https" if ssl_context is not None else "http",
            host,
            port,
            guard.max_connections,
            "; clients need an API key" if ctx.config.api_key is not None else "",
        )
        watcher = loop.create_task(_watch_health(ctx, stop, exit_on_failure_after))  # from the moment it answers
        if responder is not None:
            # Stopped only once this server accepts too: a connection queued meanwhile is taken by one
            # of the two, both of which answer it.
            await asyncio.to_thread(responder.stop)
            ctx.responder_accepting = False
        if ctx.readiness is not None and ctx.service is not None:
            ctx.readiness.serving()  # no responder of this front end answers "still loading" any more
        if responder is not None:
            log.info("health responder stopped: the server answers alone (model %s)", ctx.status.value)
        await stop.wait()
        log.info("shutting down: draining in-flight requests for up to %.0f s", shutdown_timeout)
    finally:
        t0 = time.monotonic()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        failed = watcher is not None and watcher.done() and not watcher.cancelled() and watcher.result()
        if watcher is not None and not watcher.done():
            watcher.cancel()
        if responder is not None:
            responder.stop()
        if listener is not None:  # once serving, the server owns (and closes) the socket
            listener.close()
            if runner.server is not None:
                runner.server.pre_shutdown()  # idle connections close; busy ones after their request
            # Drain: wait for the requests in flight, up to the timeout (a real bound: what is
            # left then is cancelled, aiohttp gets _CANCEL_GRACE_S for that, then the engine closes).
            while ctx.service is not None and ctx.service.in_system and time.monotonic() - t0 < shutdown_timeout:
                await asyncio.sleep(0.05)
            if ctx.service is not None and ctx.service.in_system:
                log.warning(
                    "drain timeout (%.0f s): cancelling %d requests still in flight",
                    shutdown_timeout,
                    ctx.service.in_system,
                )
        else:
            sock.close()
        await runner.cleanup()
        ctx.json_worker.close()
        log.info("stopped after %.1f s", time.monotonic() - t0)
    return 1 if failed else 0


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, ours rather than aiohttp's, so the health responder can share it."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    return socket.create_server((host, port), family=family, backlog=1024)


async def _until_loaded(app: web.Application, responder: HealthResponder | None, stop: asyncio.Event) -> bool:
    """While the model loads, only the health responder (if any) accepts on the listening socket; this process
    does not even watch it. An engine load that holds the GIL (TensorRT-LLM's Executor constructor
    does) freezes every Python thread here, yet an event loop can still accept: uvloop's libuv accepts
    in C with the GIL released, then waits for the GIL to run the callback, leaving the connection
    unanswered until the load ends. True once the load ended (ready or failed), False if stopped first."""
    if responder is not None:
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
                raise RuntimeError(
                    "the uvloop event loop was asked for but uvloop is not installed (pip install uvloop)"
                ) from None
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
    sock: socket.socket | None = None,
    answer_while_loading: bool = True,
) -> int:
    """Blocking entry point for the CLI; returns the exit code (see ``serve``).

    ``event_loop``: see ``event_loop_factory`` (auto: uvloop when installed, else asyncio)."""
    main = serve(
        app,
        host,
        port,
        shutdown_timeout=shutdown_timeout,
        exit_on_failure_after=exit_on_failure_after,
        sock=sock,
        answer_while_loading=answer_while_loading,
        own_process=True,
    )
    return run_loop(main, event_loop)


def freeze_heap() -> None:
    """Once a serving process has loaded: everything start-up built (with torch and transformers imported, over
    400,000 objects) moves to the collector's permanent generation. Python starts a full collection by itself as
    objects accumulate, and a full walk of that heap stalls every stream of the process (367 ms on a development
    VM); frozen, it walks only what serving made since. vLLM does the same after its warm-up
    (vllm/utils/gc_utils.py ``freeze_gc_heap``: collect, then ``gc.freeze()``)."""
    gc.collect()
    gc.freeze()


def run_loop(main: Coroutine[Any, Any, int], event_loop: EventLoopChoice = "auto") -> int:
    """Run ``main`` to its end on the chosen event loop (see ``event_loop_factory``); its result."""
    factory, name = event_loop_factory(event_loop)
    log.info("event loop: %s", name)
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
