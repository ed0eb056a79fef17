"""Issue 14, item 4: one error hierarchy that the CLI handles: a startup error is one line naming the key
and exit code 2, never a traceback (``-o option.rolling_batch=disable`` included)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmi_trt.errors import LmiError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lmi_trt"
_BUILTIN_ROOTS = {"Exception", "BaseException", "ValueError", "RuntimeError", "TypeError", "KeyError", "OSError"}
# Private signals caught inside their own module, never raised to a caller.
_INTERNAL = {("keys.py", "_BadValue"), ("selftest.py", "_StepFailed")}


def test_every_error_class_is_an_lmi_error():
    roots = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef) or node.name == "LmiError":
                continue
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if bases & _BUILTIN_ROOTS and "LmiError" not in bases and (path.name, node.name) not in _INTERNAL:
                roots.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not roots, f"error classes outside the LmiError hierarchy: {roots}"


def test_the_stage_errors_are_lmi_errors():
    from lmi_trt.compile.errors import BuildError, CacheError, PlanError
    from lmi_trt.config import ConfigError, StartupError
    from lmi_trt.engines.base import EngineError
    from lmi_trt.launch import LaunchError
    from lmi_trt.properties import PropertiesSyntaxError
    from lmi_trt.serving.errors import LmiHttpError
    from lmi_trt.sources import SourceError

    for cls in (
        ConfigError,
        StartupError,
        LaunchError,
        PropertiesSyntaxError,
        SourceError,
        PlanError,
        CacheError,
        EngineError,
        LmiHttpError,
    ):
        assert issubclass(cls, LmiError) and cls.exit_code == 2, cls
    assert issubclass(BuildError, LmiError) and BuildError.exit_code == 1


def _serve(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    args = [sys.executable, "-m", "lmi_trt.cli", "serve", "--model-id", str(model), "--port", "0"]
    for option in options:
        args += ["-o", option]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


@pytest.mark.parametrize(
    "option,key",
    [
        ("option.rolling_batch=disable", "option.rolling_batch='disable'"),
        ("option.max_input_len=many", "option.max_input_len='many'"),
        ("option.tensor_parallel_degree=4", "option.tensor_parallel_degree=4"),  # the torch engine: a launch error
    ],
)
def test_a_startup_error_is_one_line_naming_the_key_and_exit_2(tmp_path, option, key):
    done = _serve(tmp_path, "option.rolling_batch=torch" if "rolling_batch" not in option else option, option)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and key in errors[0], output
