"""What a new user and an operator hit first (issue 12): limits that follow the model, mistakes
found before loading (one line, exit 2), one rule for unknown model names, metrics on the stems
vLLM and TensorRT-LLM dashboards know."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from cliserver import serve
from prometheus_client.parser import text_string_to_metric_families
from tinymodels import make_hub_cache, tiny_model
from trtllm_testing import FAKES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llama() -> Path:
    return tiny_model("llama")  # 512 positions


def _start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`lmi-trt serve ARGS` expected to stop before loading; the bound only guards a hang."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_", "HF_MODEL"))}
    full_env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "lmi_trt", "serve", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _closed_port() -> int:
    """A loopback port nothing listens on (bound and released: connecting to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_exit_2(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if " ERROR " in line]
    assert proc.returncode == 2, out
    assert "Traceback" not in out and len(errors) == 1, out
    # Nothing was loaded or served: the sources stage never ran and the port never opened.
    assert "resolved:" not in out and "listening" not in out.lower(), out
    return errors[0]


@pytest.mark.parametrize(
    "case",
    [
        "dot_path",
        "bare_relative_path",
        "hub_id_offline",
        "trtllm_not_installed",
        "trtllm_no_gpu",
        "lengths_over_positions",
        "input_over_positions",
        "hub_unreachable",
        "device_cuda_without_cuda",
        "key_typo",
    ],
)
def test_what_can_be_checked_before_loading_fails_with_one_line_and_exit_2(case, llama, tmp_path):
    args, env, expect = {
        "dot_path": (["--model-id", "./no-such-model"], {}, ["option.model_id", "no such folder"]),
        "bare_relative_path": (
            ["--model-id", "models/no-such-model"],
            {},
            ["option.model_id", "no such local folder exists", "hub cache", "HF_HUB_OFFLINE"],
        ),
        "hub_id_offline": (
            ["--model-id", "acme/not-downloaded"],
            {"HF_HOME": str(tmp_path / "hf")},
            ["option.model_id", "hub cache", "hf download acme/not-downloaded"],
        ),
        "trtllm_not_installed": (
            ["--model-id", str(llama), "--engine", "trtllm"],
            {},
            ["option.rolling_batch='trtllm'", "not installed", "option.rolling_batch=torch"],
        ),
        # The fake TensorRT-LLM imports; this machine has no GPU.
        "trtllm_no_gpu": (
            ["--model-id", str(llama), "--engine", "trtllm"],
            {"PYTHONPATH": os.pathsep.join([str(FAKES), os.environ.get("PYTHONPATH", "")])},
            ["option.rolling_batch='trtllm'", "no CUDA GPU"],
        ),
        "lengths_over_positions": (
            ["--model-id", str(llama), "-o", "max_input_len=500", "-o", "max_output_len=100"],
            {},
            ["option.max_input_len + option.max_output_len", "512 positions"],
        ),
        "input_over_positions": (
            ["--model-id", str(llama), "-o", "option.max_input_len=512"],
            {},
            ["option.max_input_len=512", "512 positions"],
        ),
        # Online, a hub that cannot be reached: one request decides (it took 35 s of retries and 224 lines).
        "hub_unreachable": (
            ["--model-id", "models/no-such-model"],
            {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "", "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"},
            [
                "option.model_id='models/no-such-model'",
                "no such local folder exists",
                "cannot be reached",
                "HF_ENDPOINT",
            ],
        ),
        # This machine's torch is a CPU build (it ended in torch's own AssertionError after the load).
        "device_cuda_without_cuda": (
            ["--model-id", str(llama), "-o", "option.device=cuda"],
            {},
            ["option.device='cuda'", "set option.device=cpu"],
        ),
        "key_typo": (
            ["--model-id", str(llama), "-o", "option.max_imput_len=100"],
            {},
            ["option.max_imput_len", "within a typo of option.max_input_len"],
        ),
    }[case]
    line = _one_line_exit_2(_start(args, tmp_path, env))
    for text in expect:
        assert text in line, line


def test_without_xgrammar_structured_output_is_a_400_naming_the_install_and_start_up_says_so(llama, tmp_path):
    """A Python where xgrammar cannot be imported (sys.modules["xgrammar"] = None, as importlib reads a module that
    is not there): the torch engine logs that constrained decoding is off, and response_format is a 400 with the pip
    command, not "serve with option.rolling_batch=torch" (the engine already running)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["xgrammar"] = None\n')
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    args = ["--model-id", str(llama), "--engine", "torch", "-o", "max_input_len=64", "-o", "max_output_len=16"]
    with serve(args, tmp_path, env=env) as srv:
        body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
        r = srv.post("/v1/chat/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
        message = r.json()["error"]["message"]
        assert 'pip install "xgrammar>=0.1.21"' in message and "rolling_batch" not in message, message
        assert "constrained decoding is off" in srv.log()


def test_port_in_use_is_one_line_naming_port(llama, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        line = _one_line_exit_2(_start(["--model-id", str(llama), "--port", str(port)], tmp_path))
    assert f"--port={port}" in line and "in use" in line, line


def test_unset_limits_follow_the_model_from_the_hub_cache(llama, tmp_path):
    # The README's tiny model has 512 positions, below the 1024 + 512 defaults: HF_MODEL_ID=... serve
    # (a hub id, offline from the cache) starts, with the limits logged once.
    hf_home = tmp_path / "hf"
    make_hub_cache(llama, hf_home)
    env = {"HF_HOME": str(hf_home), "HF_MODEL_ID": "acme/tiny-llama"}
    with serve(["--engine", "torch"], tmp_path, env=env) as srv:
        info = srv.get("/info").json()
        assert (info["max_input_tokens"], info["max_total_tokens"]) == (384, 512), info
        ok = srv.post("/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 128}})
        assert ok.status_code == 200, ok.text
        over = srv.post("/generate", {"inputs": "hello", "parameters": {"max_new_tokens": 129}})
        assert over.status_code == 400 and "max_output_len" in over.text, over.text
        assert srv.log().count("follow the model's 512 positions") == 1, srv.log()[-3000:]


@pytest.fixture(scope="module")
def synthetic(llama, tmp_path_factory):
    with serve(
        [
            "--model-id",
            str(llama),
            "--engine",
            "synthetic",
            "--model-name",
            "tiny",
            "-o",
            "max_input_len=64",
            "-o",
            "max_output_len=32",
        ],
        tmp_path_factory.mktemp("synthetic"),
    ) as srv:
        yield srv, str(llama)


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("post", "/v1/completions", {"model": "other", "prompt": "hi", "max_tokens": 2}),
        ("post", "/v1/chat/completions", {"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
        ("get", "/v1/models/other", None),
        ("post", "/predictions/other", {"inputs": "hi"}),
        ("post", "/v2/models/other/generate", {"text_input": "hi"}),
    ],
)
def test_unknown_model_name_is_404_on_every_route(synthetic, method, path, body):
    srv, _ = synthetic
    r = requests.request(method, srv.url + path, json=body, timeout=30)
    assert r.status_code == 404, r.text
    assert "other" in r.text and "tiny" in r.text


@pytest.mark.parametrize("model", ["tiny", None, "model_id", "dummy"])  # dummy: huggingface_hub's placeholder
def test_served_model_name_or_model_id_or_none_is_accepted(synthetic, model):
    srv, model_id = synthetic
    body = {
        "prompt": "hi",
        "max_tokens": 2,
        **({} if model is None else {"model": model_id if model == "model_id" else model}),
    }
    r = srv.post("/v1/completions", body)
    assert r.status_code == 200, r.text


def test_metrics_on_the_stems_vllm_and_trtllm_share(synthetic):
    srv, _ = synthetic
    for n in (3, 5):
        assert srv.post("/generate", {"inputs": "hello", "parameters": {"max_new_tokens": n}}).status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(srv.get("/metrics").text)}

    def samples(name: str, suffix: str = "") -> list:
        assert name in families, sorted(families)
        got = [s for s in families[name].samples if s.name == name + suffix]
        assert got and all(s.labels.get("model_name") == "tiny" for s in got), got
        return got

    assert sum(s.value for s in samples("lmi_request_success", "_total")) >= 2
    assert {s.labels["finished_reason"] for s in samples("lmi_request_success", "_total")} <= {
        "stop",
        "length",
        "abort",
        "error",
    }
    assert samples("lmi_generation_tokens", "_total")[0].value >= 8
    assert samples("lmi_prompt_tokens", "_total")[0].value >= 2
    for hist in (
        "lmi_time_to_first_token_seconds",
        "lmi_time_per_output_token_seconds",
        "lmi_e2e_request_latency_seconds",
        "lmi_request_queue_time_seconds",
    ):
        assert families[hist].type == "histogram"
        assert samples(hist, "_count")[0].value >= 2, hist
    for gauge in ("lmi_num_requests_running", "lmi_num_requests_waiting"):
        assert families[gauge].type == "gauge" and samples(gauge)[0].value == 0
