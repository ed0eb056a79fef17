"""Every configuration key a message names is one the configuration reads (issue 12, item 4):
a message naming a key that does not exist sends the user to set something that is ignored."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lmi_trt.config import REGISTRY, StartupError

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_trt"
KNOWN = {name for spec in REGISTRY for name in (spec.key, *spec.aliases)}
OPTION_KEY = re.compile(r"option\.[A-Za-z_][A-Za-z0-9_]*")


def _strings(tree: ast.AST) -> list[str]:
    """String literals and f-string parts, docstrings left out (they may show misspellings)."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_every_option_key_in_a_message_is_a_known_key():
    unknown = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for text in _strings(ast.parse(path.read_text())):
            for key in OPTION_KEY.findall(text):
                if key not in KNOWN:
                    unknown.setdefault(key, []).append(str(path.relative_to(PACKAGE.parent)))
    assert not unknown, unknown


def test_serving_limits_are_named_as_configured():
    # The 413 and 503 name the keys as serving.properties spells them (no "option." prefix).
    assert {"max_request_size", "job_queue_size"} <= KNOWN
    assert not {"option.max_request_size", "option.job_queue_size"} & KNOWN


def test_startup_error_names_key_value_problem_and_fix():
    e = StartupError("option.max_input_len", 600, "the model has 512 positions", "set it below 512")
    assert (e.key, e.value, e.problem, e.fix) == (
        "option.max_input_len",
        600,
        "the model has 512 positions",
        "set it below 512",
    )
    assert str(e) == "option.max_input_len=600: the model has 512 positions; set it below 512"
    assert isinstance(e, ValueError)


def test_a_value_is_shown_as_written_not_as_its_python_enum():
    """option.quantize=fp8 on the torch engine said option.quantize=<Quantization.FP8: 'fp8'>."""
    from lmi_trt import stages
    from lmi_trt.compile.errors import PlanError
    from lmi_trt.config import LmiConfig, Quantization
    from lmi_trt.engines.registry import TORCH

    for error in (
        StartupError("option.quantize", Quantization.FP8, "p", "f"),
        PlanError("option.quantize", Quantization.FP8, "p", "f"),
    ):
        assert str(error).startswith("option.quantize='fp8': p"), str(error)
    config = stages.settle(LmiConfig(quantize="fp8"), "torch")
    with pytest.raises(StartupError, match=r"^option\.quantize='fp8': the torch engine does not use it"):
        stages.refuse_ignored(TORCH, config)
