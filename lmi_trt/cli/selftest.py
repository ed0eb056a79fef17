"""``lmi-trt selftest``: on a GPU host with TensorRT-LLM, build a tiny engine, serve it, check it."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parser(subparsers: Any) -> None:
    selftest = subparsers.add_parser(
        "selftest", help="on a GPU host with TensorRT-LLM: build a tiny engine, serve it, check it"
    )
    selftest.add_argument(
        "--backend",
        choices=("auto", "pytorch", "tensorrt"),
        default="auto",
        help="TensorRT-LLM backend (option.backend); auto: the one serve picks for a checkpoint",
    )
    selftest.set_defaults(func=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    from lmi_trt import selftest

    unmet = selftest.unmet_needs()
    if unmet is not None:  # one line, not a FAIL step after imports and a model written for nothing
        print(f"error: {unmet}", file=sys.stderr)
        return 2
    return 0 if selftest.run_selftest(backend=args.backend) else 1
