"""`lmi-trt` command line: serve | plan | compile | selftest | bench, one module per command (``bench``'s is
``lmi_trt/bench.py``, which also runs on its own); ``flags`` holds the configuration flags they share."""

from __future__ import annotations

import argparse
import logging
import sys

from lmi_trt import __version__
from lmi_trt.errors import LmiError

from . import compile as compile_command
from . import plan, selftest, serve

log = logging.getLogger("lmi_trt")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmi-trt",
        description=(
            "serving.properties-driven LLM inference: TensorRT-LLM on GPUs, an embedded torch engine elsewhere."
        ),
    )
    parser.add_argument("--version", action="version", version=f"lmi-trt {__version__}")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    plan.add_parser(sub)
    compile_command.add_parser(sub)

    from lmi_trt.bench import add_subcommand as add_bench

    add_bench(sub)
    selftest.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `serve` re-executes it under mpirun for TP×PP
    from lmi_trt.log_context import install_request_tag, log_format

    logging.basicConfig(level=args.log_level.upper(), format=log_format())
    install_request_tag()  # a line logged while serving a request names it: [its X-Request-Id]
    from lmi_trt.config import process_environment
    from lmi_trt.log_redaction import install_log_redaction

    install_log_redaction(env=process_environment())  # HF_TOKEN, AWS_SECRET_ACCESS_KEY, ... never reach the log
    try:
        return int(args.func(args) or 0)
    except LmiError as e:  # every command: a message naming the key and the exit code, never a traceback
        log.error("%s", e)
        return e.exit_code
