"""A skipped test fails the run unless tests/conftest.py allows its reason (issue 12, item 9)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text("import pytest\n\n" + body)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_case.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skipped_test_fails_the_session(tmp_path):
    out = _run(tmp_path, "def test_needs_it():\n    pytest.importorskip('no_such_module_here')\n")
    assert out.returncode == 1, out.stdout
    assert "skipped tests that should have run" in out.stdout and "no_such_module_here" in out.stdout


def test_a_module_level_skip_fails_the_session(tmp_path):
    out = _run(tmp_path, "pytest.importorskip('no_such_module_here')\n\ndef test_x():\n    pass\n")
    assert out.returncode == 1 and "no_such_module_here" in out.stdout, out.stdout


def test_passing_tests_pass(tmp_path):
    out = _run(tmp_path, "def test_x():\n    assert True\n")
    assert out.returncode == 0, out.stdout
