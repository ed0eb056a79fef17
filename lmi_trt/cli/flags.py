"""The configuration flags ``serve``, ``plan`` and ``compile`` share, and what they read into."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmi_trt.engines.registry import ENGINE_NAMES

if TYPE_CHECKING:
    from lmi_trt.compile.jit import CompileJob

DEFAULT_MODEL_DIR = Path("/opt/ml/model")


def add_config_flags(p: argparse.ArgumentParser) -> None:
    src = p.add_argument_group("model and configuration (flags win over serving.properties and the environment)")
    src.add_argument(
        "--model-dir",
        type=Path,
        help="folder holding serving.properties; with no model_id it is the model "
        f"(default: {DEFAULT_MODEL_DIR} when it exists)",
    )
    src.add_argument(
        "--properties", type=Path, help="a serving.properties file (default: MODEL_DIR/serving.properties)"
    )
    src.add_argument("--model-id", help="same as option.model_id: HF id, s3:// URI or local folder")
    src.add_argument("--engine", choices=["auto", *ENGINE_NAMES], help="same as option.rolling_batch")
    src.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any serving.properties key, e.g. -o option.max_input_len=2048 (repeatable)",
    )


def _overrides(args: argparse.Namespace) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--option {item!r}: expected KEY=VALUE, e.g. option.max_input_len=2048")
        out[key.strip()] = value.strip()
    if args.model_id:
        out["option.model_id"] = args.model_id
    if args.engine:
        out["option.rolling_batch"] = args.engine
    return out


def load_cli_config(args: argparse.Namespace):
    """CLI flags → LmiConfig (the config stage reads the environment and the properties file)."""
    from lmi_trt.config import load_config_from_environment

    model_dir = args.model_dir
    if model_dir is None and args.properties is None and DEFAULT_MODEL_DIR.is_dir():
        model_dir = DEFAULT_MODEL_DIR
    return load_config_from_environment(
        properties_file=args.properties, model_dir=model_dir, overrides=_overrides(args)
    )


def load_compile_job(args: argparse.Namespace):
    """CLI flags → (LmiConfig settled for the compiling engine, its CompileJob) for `plan` and `compile`."""
    from lmi_trt import stages
    from lmi_trt.engines.registry import COMPILING_ENGINE

    config = stages.settle(load_cli_config(args), COMPILING_ENGINE)
    return config, stages.compile_job(config)


def fitted_job(config: Any, model_config: Mapping[str, Any] | None) -> tuple[Any, CompileJob]:
    """``config`` with unset max_input_len / max_output_len fitted to the model's config.json as ``serve`` fits
    them (one function for both: ``stages.fit_lengths``), and its CompileJob (option.enable_lora: the LoRA plugin
    built in, the PEFT cache counted, ``compile.plan``)."""
    from lmi_trt import stages
    from lmi_trt.engines.registry import COMPILING_ENGINE

    config = stages.fit_lengths(config, model_config, COMPILING_ENGINE)
    return config, stages.compile_job(config)
