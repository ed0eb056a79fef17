"""The engine in a process of its own and N front-end processes on the one port (``option.api_server_count``).

This process (under MPI, rank 0) opens the listening socket, starts the front ends, which inherit it (the kernel
hands each connection to one of the processes accepting on it; TLS is each front end's, from the same files),
then loads the model and serves the engine to them over ``engine_link``. A front end is the whole HTTP server
(``app.serve``) with a ``RemoteEngine``: routes, validation, chat templates, tokenization, detokenization, stop
strings, rendering, its own /ping (and health responder) and drain. What must hold across them is shared:
``job_queue_size`` (``admission.SharedAdmission``), /metrics (prometheus_client's multiprocess folder, plus the
engine's statistics every front end hears), the engine's batch (one engine), readiness (``SharedReadiness``: /ping
is 200 once every front end serves alone on the socket, no health responder left). A front end that dies is
replaced and only its own requests end (the engine cancels them). SIGTERM: the front ends drain, then the engine
closes.

vLLM does the same with ``--api-server-count`` API-server processes around its engine core
(vllm-project/vllm vllm/entrypoints/cli/serve.py, ``run_multi_api_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableSequence
from dataclasses import dataclass
from typing import Any

from lmi_trt.config import LmiConfig
from lmi_trt.errors import LmiError
from lmi_trt.serving.core import LoadedModel
from lmi_trt.serving.engine_link import EngineServer

log = logging.getLogger(__name__)

# Front ends started within this long of each other's death count as a crash loop (then no more are started).
_RESTART_WINDOW_S = 60.0
_MAX_RESTARTS = 5
# A front end gets its drain and this long to exit (the rest of its shutdown) before it is killed.
_STOP_MARGIN_S = 5.0


def frontend_count(configured: int | None, cores: int) -> int:
    """option.api_server_count, or from the cores this process may use: 1 below 8 cores (on 2 cores a second
    front end only takes time from the engine: benchmarks/README.md), else a quarter of them, at most 8."""
    if configured is not None:
        return configured
    return 1 if cores < 8 else min(cores // 4, 8)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


@dataclass(frozen=True)
class FrontendSpec:
    """What a front-end process is started with (pickled into it)."""

    index: int
    count: int
    config: LmiConfig
    model_name: str
    host: str
    port: int
    sock: socket.socket
    address: str  # the engine's Unix socket (serving/engine_link.py)
    parent_pid: int
    slots: MutableSequence[int]  # SharedAdmission's
    loaded: MutableSequence[int]  # 1 for each front end that has loaded once
    serving: MutableSequence[int]  # 1 for each front end that has served alone on the socket once
    metrics_dir: str
    log_level: int
    replacement: bool  # started in place of one that died: accepts nothing until loaded


def frontend_config(config: LmiConfig, count: int) -> LmiConfig:
    """A front end's share of the per-server bounds it enforces alone (connections, bytes being received)."""
    return config.model_copy(
        update={
            "max_connections": max(1, config.max_connections // count),
            "max_upload_bytes": max(1, config.max_upload_bytes // count),
        }
    )


def frontend_main(spec: FrontendSpec) -> None:
    """A front-end process: the HTTP server over the engine of ``spec.parent_pid``."""
    from lmi_trt.log_context import install_request_tag, log_format

    logging.basicConfig(level=spec.log_level, format=log_format(f"frontend{spec.index} "))
    install_request_tag()
    from lmi_trt.serving.admission import SharedAdmission
    from lmi_trt.serving.app import build_app, run_app
    from lmi_trt.serving.engine_link import RemoteEngine
    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS
    from lmi_trt.serving.tokenizer import load_tokenizer
    from lmi_trt.sources import resolve_adapter

    config = spec.config
    engine = RemoteEngine(spec.address, f"fe-{os.getpid()}", spec.parent_pid)

    async def load() -> LoadedModel:
        # transformers' import (seconds) overlaps the engine's load
        warm = asyncio.ensure_future(asyncio.to_thread(importlib.import_module, "transformers"))
        state = await engine.connect()
        await warm
        if state.phase != "ready":
            raise LmiError(state.error or "the engine failed")
        assert state.tokenizer_dir is not None
        tokenizer = await asyncio.to_thread(
            load_tokenizer, state.tokenizer_dir, config.trust_remote_code, slow=config.tokenizer_mode == "slow"
        )
        # LoRA sources resolve here, as in one process (the engine's process reads the same folder)
        source = functools.partial(resolve_adapter, config) if config.enable_lora else None
        return LoadedModel(engine, tokenizer, adapter_source=source, model_config=state.model_config)

    app = build_app(
        load,
        config,
        model_name=spec.model_name,
        adapters=DEFAULT_ADAPTERS,
        admission=SharedAdmission(spec.slots, spec.index),
        metrics_dir=spec.metrics_dir,
        readiness=SharedReadiness(spec.loaded, spec.serving, spec.index),
    )
    rc = run_app(app, host=spec.host, port=spec.port, sock=spec.sock, answer_while_loading=not spec.replacement)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as `lmi-trt serve` leaves (cli/serve.py _exit_stopped): no teardown collection


class SharedReadiness:
    """``FrontendReadiness`` over arrays the front ends share. A flag, once set, stays set: a replacement
    (which accepts nothing until loaded, and has no health responder) does not turn the others' /ping 503."""

    def __init__(self, loaded: MutableSequence[int], serving: MutableSequence[int], index: int) -> None:
        self._loaded = loaded
        self._serving = serving
        self._index = index

    async def loaded(self) -> None:
        self._loaded[self._index] = 1
        while not all(self._loaded):
            await asyncio.sleep(0.02)

    def serving(self) -> None:
        self._serving[self._index] = 1

    def all_serving(self) -> bool:
        return all(self._serving)


class Frontends:
    """Starts the front ends, replaces one that dies, and stops them (each drains) on ``stop``."""

    def __init__(
        self,
        make_spec: Callable[[int, bool], FrontendSpec],
        count: int,
        server: EngineServer,
        slots: MutableSequence[int],
    ) -> None:
        self._make_spec = make_spec
        self._count = count
        self._slots = slots
        self._server = server
        self._context = multiprocessing.get_context("spawn")  # no fork of a process that holds CUDA or threads
        self.procs: dict[int, Any] = {}
        self._deaths: list[float] = []
        self.stopping = False
        self.failed = False  # a front end exited FAILED (engine dead) or they crash-looped
        self.all_gone = asyncio.Event()

    def start(self) -> None:
        for index in range(self._count):
            self._spawn(index, replacement=False)

    def _spawn(self, index: int, replacement: bool) -> None:
        spec = self._make_spec(index, replacement)
        proc = self._context.Process(target=frontend_main, args=(spec,), name=f"lmi-frontend-{index}", daemon=False)
        proc.start()
        self.procs[index] = proc
        log.info("front end %d started (pid %d)", index, proc.pid)
        asyncio.get_running_loop().add_reader(proc.sentinel, self._exited, index, proc)

    def _exited(self, index: int, proc: Any) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(proc.sentinel)
        proc.join()
        rc = proc.exitcode
        self.procs.pop(index, None)
        self._server.frontend_gone(f"fe-{proc.pid}")
        self._slots[index] = 0  # its requests are over: they no longer count against job_queue_size
        if self.stopping:
            log.info("front end %d (pid %d) stopped (exit %s)", index, proc.pid, rc)
        elif not self._server.state.healthy:  # it saw the engine FAILED (exit 1 after the grace): the server ends
            log.error("front end %d (pid %d) exited %s: the model FAILED", index, proc.pid, rc)
            self.failed = True
        else:
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < _RESTART_WINDOW_S] + [now]
            if len(self._deaths) > _MAX_RESTARTS:
                log.error(
                    "front end %d (pid %d) exited %s; %d front ends died within %.0f s: not starting another",
                    index,
                    proc.pid,
                    rc,
                    len(self._deaths),
                    _RESTART_WINDOW_S,
                )
                self.failed = True
            else:
                log.error("front end %d (pid %d) exited %s: starting another in its place", index, proc.pid, rc)
                self._spawn(index, replacement=True)
        if not self.procs:
            self.all_gone.set()

    async def stop(self, timeout: float) -> None:
        """SIGTERM to each (each drains its requests), SIGKILL to what is left after ``timeout``."""
        self.stopping = True
        for proc in list(self.procs.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        if self.procs:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.all_gone.wait(), timeout)
        for proc in list(self.procs.values()):
            log.warning("front end pid %d did not stop within %.0f s: killing it", proc.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        if self.procs:
            await self.all_gone.wait()


async def serve_engine(
    load: Callable[[], Awaitable[LoadedModel]],
    config: LmiConfig,
    *,
    model_name: str,
    host: str,
    port: int,
    count: int,
    shutdown_timeout: float = 30.0,
) -> int:
    """The engine's process with ``count`` front ends; returns the exit code (0 stopped, 1 the model FAILED)."""
    from lmi_trt.serving.app import freeze_heap, listen

    sock = listen(host, port)
    workdir = tempfile.mkdtemp(prefix="lmi-trt-frontends-")
    metrics_dir = os.path.join(workdir, "metrics")
    os.mkdir(metrics_dir)
    # Read by prometheus_client when a front end imports it (its multiprocess mode); this process exports nothing.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    server = EngineServer(os.path.join(workdir, "engine"))
    await server.start()
    slots = multiprocessing.get_context("spawn").Array("q", count, lock=False)
    loaded = multiprocessing.get_context("spawn").Array("b", count, lock=False)
    serving = multiprocessing.get_context("spawn").Array("b", count, lock=False)
    shared = frontend_config(config, count)

    def spec(index: int, replacement: bool) -> FrontendSpec:
        return FrontendSpec(
            index,
            count,
            shared,
            model_name,
            host,
            port,
            sock,
            server.address,
            os.getpid(),
            slots,
            loaded,
            serving,
            metrics_dir,
            logging.getLogger().getEffectiveLevel(),
            replacement,
        )

    frontends = Frontends(spec, count, server, slots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("engine process (pid %d) with %d front-end processes on %s:%d", os.getpid(), count, host, port)
    model: list[LoadedModel] = []

    async def load_and_tell() -> None:
        t0 = time.perf_counter()
        try:
            model.append(await load())
        except LmiError as e:
            server.failed(str(e))
            log.error("loading model %r failed: %s; /ping answers 503 FAILED", model_name, e)
            return
        except Exception as e:
            server.failed(f"{type(e).__name__}: {e}")
            log.exception("loading model %r failed; /ping answers 503 FAILED", model_name)
            return
        freeze_heap()  # this process serves the engine alone (serving/app.py); before the front ends may submit
        server.ready(model[0].engine, model[0].tokenizer_dir, model[0].model_config)
        log.info("model %r ready (engine %s) after %.1f s", model_name, model[0].engine.name, time.perf_counter() - t0)

    loading = loop.create_task(load_and_tell(), name="lmi-model-load")
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(frontends.all_gone.wait())]
    try:
        frontends.start()  # they answer /ping while the load holds this process (for minutes, maybe)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            log.info("shutting down: the front ends drain their requests for up to %.0f s", shutdown_timeout)
        await frontends.stop(shutdown_timeout + _STOP_MARGIN_S)
    finally:
        for wait in waits:
            wait.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if not loading.done():
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
        await server.close()
        if model:
            await model[0].engine.close()
        sock.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if stop.is_set() else 1
