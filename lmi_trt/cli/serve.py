"""``lmi-trt serve``: the configuration → the engine's launch → the HTTP server."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, NoReturn

from lmi_trt.errors import LmiError

from .flags import add_config_flags, load_cli_config

log = logging.getLogger("lmi_trt")


def add_parser(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve", help="serve a model over HTTP (DJL/SageMaker, TGI, OpenAI and Triton routes)"
    )
    add_config_flags(serve)
    serve.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1; the container entrypoint passes 0.0.0.0)"
    )
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--model-name", help="name reported by /ping and /v1/models (default: last part of model_id)")
    # Added by the MPI relaunch (lmi_trt.launch): this process is one of the ranks lmi-trt started.
    serve.add_argument("--under-mpi", action="store_true", help=argparse.SUPPRESS)
    serve.add_argument("--rank-reports", type=Path, default=None, help=argparse.SUPPRESS)  # launch.RANK_REPORTS_FLAG
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from lmi_trt.config import log_effective_config, process_environment
    from lmi_trt.engines import choose_engine, probe_host
    from lmi_trt.launch import plan_for, run_serve
    from lmi_trt.loader import load_model, preflight
    from lmi_trt.log_redaction import install_log_redaction
    from lmi_trt.serving.app import build_app, run_app, run_loop
    from lmi_trt.serving.core import LoadedModel
    from lmi_trt.serving.frontends import frontend_count, serve_engine, usable_cores
    from lmi_trt.serving.protocols import DEFAULT_ADAPTERS
    from lmi_trt.serving.tls import check_tls

    try:
        config = load_cli_config(args)
        check_tls(config)
        host = probe_host()
        kind, why = choose_engine(config.rolling_batch, host)
        if not args.under_mpi:  # MPI ranks: the launching process checked, and rank 0 binds the port
            _check_port(args.host, args.port)
        config = preflight(config, kind)
        plan = plan_for(config, kind, host.gpu_count)
    except LmiError as e:  # a startup error: one line naming the key, exit 2
        log.error("%s", e)
        return e.exit_code
    except ValueError as e:  # a value a library refused before loading (e.g. a malformed model id)
        log.error("%s", e)
        return 2
    # option.hf_token and option.api_key may come from serving.properties, not the environment
    secrets = [*config.api_keys(), *([config.hf_token.get_secret_value()] if config.hf_token is not None else [])]
    if secrets:
        install_log_redaction(secrets, env=process_environment())
    log_effective_config(config, log)
    log.info("engine: %s (%s)", kind, why)
    log.info("launch: %s", plan.describe())
    for note in plan.notes:
        (log.warning if "idle" in note else log.info)("launch: %s", note)
    model_name = args.model_name or _model_name(config)

    frontends = frontend_count(config.api_server_count, usable_cores())
    log.info(
        "HTTP front ends: %d%s",
        frontends,
        "" if config.api_server_count is not None else f" (option.api_server_count unset: {usable_cores()} cores)",
    )

    def serve_http() -> int:
        def load() -> Awaitable[LoadedModel]:
            return load_model(config, kind, plan)

        if frontends > 1:  # the engine here, the HTTP servers in processes of their own
            engine_here = serve_engine(
                load, config, model_name=model_name, host=args.host, port=args.port, count=frontends
            )
            return run_loop(engine_here)
        app = build_app(load, config, model_name=model_name, adapters=DEFAULT_ADAPTERS)
        return run_app(app, host=args.host, port=args.port)

    try:
        # TP×PP ranks / several TensorRT-LLM copies: re-executes this command under mpirun (lmi_trt.launch).
        rc = run_serve(
            plan,
            argv=getattr(args, "argv", sys.argv[1:]),
            under_mpi=args.under_mpi,
            reports=args.rank_reports,
            serve_http=serve_http,
            load_follower=lambda: load_model(config, kind, plan),
        )
    except LmiError as e:  # LaunchError: no MPI launcher, mpi4py/launcher mismatch
        log.error("%s", e)
        return e.exit_code
    if plan.needs_mpi:  # the ranks and mpirun: MPI_Finalize runs at interpreter exit (mpi4py's atexit)
        return rc
    _exit_stopped(rc)


def _exit_stopped(rc: int) -> NoReturn:
    """Leave a stopped server at once. The engine is closed and the JSON worker joined; what
    interpreter teardown would add is a garbage collection over every object of the process,
    measured (py-spy dump --native: gc_collect_main, no Python frame) at 6-9 s on a loaded
    machine after 100 cut streams. Skipping it makes the drain timeout a bound on the exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _check_port(host: str, port: int) -> None:
    """A port in use is found before the model loads (with the listener's own SO_REUSEADDR, so a
    port in TIME_WAIT still counts as free)."""
    from lmi_trt.config import StartupError

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        socket.create_server((host, port), family=family).close()
    except OSError as e:
        raise StartupError(
            "--port",
            port,
            f"cannot listen on {host}:{port} ({e.strerror or e})",
            "stop what holds it or pass another --port (and --host for another address)",
        ) from None


def _model_name(config) -> str:
    ident = config.model_id or (str(config.model_dir) if config.model_dir else "model")
    return ident.rstrip("/").split("/")[-1] or "model"
