"""The deployment notebooks, executed headless (nbclient) in their local mode: moto for SageMaker and
S3, a local ``lmi-trt serve`` for the endpoint (through its SageMaker runtime routes), the fake
TensorRT-LLM for the ahead-of-time compile. notebooks/run_local.py runs them (README.md's local runs use it too):
its local parameters, then the test's, are injected after the ``parameters`` cell, as papermill does."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tinymodels import tiny_model

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("sagemaker")
pytest.importorskip("moto")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import run_local  # noqa: E402 - notebooks/run_local.py: what README's local runs use, parameters and all


def _processes_under(folder: Path) -> list[int]:
    """Processes whose working directory is inside ``folder`` (the notebooks start servers there)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
                state = next(x for x in (entry / "status").read_text().splitlines() if x.startswith("State:"))
            except (OSError, StopIteration):
                continue
            if cwd.startswith(str(folder)) and "zombie" not in state:
                out.append(int(entry.name))
    return out


def run_notebook(name: str, tmp_path: Path, **params) -> dict:
    workdir = Path(params["workdir"])
    try:
        nb = run_local.execute(name, {**run_local.LOCAL[name], **params}, tmp_path / name, cwd=tmp_path)
    finally:
        leftovers = _processes_under(workdir)
        for pid in leftovers:  # a failed run leaves its server behind; stop only what it started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert leftovers == [], f"the notebook's clean-up left processes running: {leftovers}"
    return nb


def outputs(nb, marker: str) -> str:
    """The text a code cell containing ``marker`` printed."""
    cell = next(c for c in nb.cells if c.cell_type == "code" and marker in c.source)
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """The kernel inherits this environment: no AWS or server settings from elsewhere, no hub."""
    for key in list(os.environ):
        if key.startswith(("OPTION_", "SERVING_", "AWS_", "HF_MODEL", "SAGEMAKER_")) or key in ("HF_TOKEN",):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")


SMALL = {"max_input_len": 64, "max_output_len": 64}  # the cells ask for up to 64 new tokens


def test_sagemaker_deploy(tmp_path):
    t0 = time.monotonic()
    nb = run_notebook(
        "sagemaker_deploy.ipynb",
        tmp_path,
        local_model_dir=str(tiny_model("llama")),
        workdir=str(tmp_path / "work"),
        **SMALL,
    )
    assert "option.model_id=s3://lmi-trt-local/models/local-model" in outputs(nb, "properties = {")
    assert "InService" in outputs(nb, "model.deploy(")
    assert outputs(nb, "response = predictor.predict").strip()
    assert outputs(nb, '"messages"').strip()
    assert outputs(nb, "invoke_endpoint_with_response_stream").strip()
    assert "exit status: 0" in outputs(nb, "predictor.delete_endpoint()")
    assert "resolved: hf_checkpoint from s3" in (tmp_path / "work" / "server.log").read_text()
    print(f"sagemaker_deploy: {time.monotonic() - t0:.1f} s")


def test_local_docker(tmp_path):
    t0 = time.monotonic()
    nb = run_notebook(
        "local_docker.ipynb",
        tmp_path,
        model_id=str(tiny_model("llama")),
        workdir=str(tmp_path / "work"),
        **SMALL,
    )
    command = outputs(nb, "docker_cmd = [")
    assert command.startswith("docker run --rm -d --name lmi-trt --gpus all")
    assert f"-e HF_MODEL_ID={tiny_model('llama')}" in command and "-e TENSOR_PARALLEL_DEGREE=max" in command
    assert outputs(nb, "/invocations").strip()
    assert outputs(nb, "/generate_stream").strip()
    assert "→" in outputs(nb, "OpenAI(")
    assert "lmi_http_requests" in outputs(nb, "/metrics")
    assert "exit status: 0" in outputs(nb, "server.terminate()")
    print(f"local_docker: {time.monotonic() - t0:.1f} s")


def test_aot_compile(tmp_path):
    t0 = time.monotonic()
    nb = run_notebook(
        "aot_compile.ipynb",
        tmp_path,
        local_model_dir=str(tiny_model("llama")),
        workdir=str(tmp_path / "work"),
        **SMALL,
    )
    listing = outputs(nb, "list_objects_v2")
    for name in ("rank0.engine", "config.json", "lmi_trt_manifest.json", "tokenizer.json"):
        assert f"lmi-trt/engines/lmi-trt-tinyllama-aot/{name}" in listing, listing
    assert "compile --model-id" in outputs(nb, "compile_args = [")
    assert outputs(nb, "response = predictor.predict").strip()
    server_log = (tmp_path / "work" / "server.log").read_text()
    assert "trtllm_engine from s3" in server_log  # served the precompiled artifact, nothing compiled
    assert "compile:" not in server_log
    print(f"aot_compile: {time.monotonic() - t0:.1f} s")
