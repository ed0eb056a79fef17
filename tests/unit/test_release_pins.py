"""The TensorRT-LLM release images' Python pins (ci/pins/) against pyproject's requirements and the installed
packages, and the Dockerfile's import check.

The release legs of .ci/run install lmi-trt under each image's pins (pip fails if it cannot stay inside
them) and set LMI_CI_PINS, so that the versions actually installed are checked against that release's pins:
a pin that pip replaced, or that drifted, fails CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PINS = sorted((ROOT / "ci" / "pins").glob("trtllm-*.txt"))
RELEASES = [p.stem.removeprefix("trtllm-") for p in PINS]


def read_pins(path: Path) -> dict[str, SpecifierSet]:
    """name → specifier, from a constraints file (one requirement a line, # comments)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req.specifier
    return pins


def project_requirements() -> list[Requirement]:
    """What `pip install .[mpi,quant,torch,test-core]` asks for: the dependencies and those extras."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    return [
        Requirement(r)
        for r in project["dependencies"] + extras["mpi"] + extras["quant"] + extras["torch"] + extras["test-core"]
    ]


def oldest_admitted(spec: SpecifierSet) -> Version | None:
    """The lowest version a pin admits: its == version, else its >= / ~= bound (None when unbounded)."""
    for s in spec:
        if s.operator in ("==", "==="):
            return Version(s.version)
    floors = [Version(s.version) for s in spec if s.operator in (">=", "~=")]
    return max(floors) if floors else None


def test_every_supported_release_has_pins():
    assert RELEASES == ["0.12.0", "1.0.0", "1.1.0", "1.2.1"]
    for path in PINS:
        pins = read_pins(path)
        assert {"torch", "transformers", "huggingface-hub", "tokenizers", "mpi4py", "nvidia-modelopt"} <= set(pins)
        assert re.search(r"^# ci: python=3\.\d+$", path.read_text(), re.M), path.name
        for line in path.read_text().splitlines():  # every pin says where it comes from
            if line.strip() and not line.startswith("#"):
                assert "#" in line, f"{path.name}: {line!r} has no source comment"


@pytest.mark.parametrize("release", RELEASES)
def test_pyproject_admits_the_release_image_packages(release):
    """pip keeps every package the image has: each of our requirements admits the image's version (an exact
    pin) or the oldest version the image's range allows. (On 4dccd9d: transformers>=4.46 refused 0.12's and
    1.0's transformers, mpi4py>=4.0 every image's 3.1.5, huggingface_hub>=0.24 0.12's floor.)"""
    pins = read_pins(ROOT / "ci" / "pins" / f"trtllm-{release}.txt")
    refused = []
    for req in project_requirements():
        name = canonicalize_name(req.name)
        if name not in pins or (oldest := oldest_admitted(pins[name])) is None:
            continue
        if not req.specifier.contains(oldest, prereleases=True):
            refused.append(f"{req} refuses the image's {name} {oldest}")
    assert not refused, "; ".join(refused)


def test_installed_packages_match_the_release_pins():
    """In a release leg of .ci/run: pip replaced none of the pinned packages (LMI_CI_PINS names the file)."""
    pins_file = os.environ.get("LMI_CI_PINS")
    if not pins_file:
        pytest.skip("not a release leg of .ci/run (LMI_CI_PINS is unset)")
    not_installed = {canonicalize_name(n) for n in os.environ.get("LMI_CI_PINS_NOT_INSTALLED", "").split(",") if n}
    drift = []
    for name, spec in read_pins(ROOT / pins_file).items():
        if name in not_installed:
            continue
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            drift.append(f"{name} is not installed (pinned {spec})")
            continue
        if not spec.contains(version, prereleases=True):
            drift.append(f"{name} {version} is installed, the pin is {spec}")
    assert not drift, f"{pins_file}: " + "; ".join(drift)


def test_dockerfile_check_imports_the_serving_path():
    """The image build's check imports what `serve` imports (not only `lmi-trt --version`), and those imports
    succeed with the packages installed here — in a release leg, that image's packages. (On 4dccd9d the check
    was the version alone, and lmi_trt.sources.hf failed to import with any huggingface_hub < 1.0.)"""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    checks = re.findall(r'python3 -c "(import lmi_trt[^"]*)"', dockerfile)
    assert len(checks) == 1, "the Dockerfile's RUN that installs lmi-trt ends with one python3 -c import check"
    modules = {m.strip() for m in checks[0].removeprefix("import ").split(",")}
    assert {"lmi_trt.cli", "lmi_trt.loader", "lmi_trt.sources.hf", "lmi_trt.serving.app"} <= modules
    # A fresh interpreter without tests/fakes on the path: the image has the real tensorrt_llm, and the check
    # must not need it to be imported by these modules either.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", checks[0]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
