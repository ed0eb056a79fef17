"""``lmi-trt selftest``: on a GPU host with TensorRT-LLM, build a tiny engine, serve it, check it."""

from __future__ import annotations

import argparse
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
    from lmi_trt.selftest import run_selftest

    return 0 if run_selftest(backend=args.backend) else 1
