"""End to end: `lmi-trt serve` as a real process with the embedded torch engine.

Configured the three ways users do it (serving.properties in a model dir, environment
variables, CLI flags); greedy output over HTTP equals `model.generate` token for token.
"""

from __future__ import annotations

import json
import shutil

import pytest
import requests
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow


def _reference_greedy(model_dir, prompt: str, n: int) -> tuple[list[int], str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, min_new_tokens=n)
    new = out[0, ids.shape[1] :].tolist()
    return new, tok.decode(new, skip_special_tokens=True)


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _jsonlines(resp: requests.Response) -> list[dict]:
    return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def test_model_dir_with_serving_properties_greedy_matches_generate(llama, tmp_path):
    model_dir = tmp_path / "opt_ml_model"
    shutil.copytree(llama, model_dir)
    # No option.model_id: the model dir itself is the model (DJL's /opt/ml/model semantics).
    (model_dir / "serving.properties").write_text(
        "option.rolling_batch=torch\noption.max_rolling_batch_size=4\noption.max_input_len=64\noption.max_output_len=32\n"
    )
    prompt = "The quick brown fox"
    ids, text = _reference_greedy(llama, prompt, 12)
    with serve(["--model-dir", str(model_dir)], tmp_path) as srv:
        r = srv.post(
            "/invocations",
            {"inputs": prompt, "parameters": {"max_new_tokens": 12, "details": True, "ignore_eos": True}},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert [t["id"] for t in body["details"]["tokens"]] == ids
        assert body["generated_text"] == text
        # The stream reassembles to the same text, and its last line carries the whole text.
        r = srv.post(
            "/invocations",
            {"inputs": prompt, "parameters": {"max_new_tokens": 12, "ignore_eos": True}, "stream": True},
            stream=True,
        )
        assert r.headers["content-type"].startswith("application/jsonlines")
        lines = _jsonlines(r)
        assert "".join(line["token"]["text"] for line in lines) == text
        assert lines[-1]["generated_text"] == text
        # /predictions/{model} is the same route under DJL's name.
        r = srv.post(
            "/predictions/opt_ml_model", {"inputs": prompt, "parameters": {"max_new_tokens": 12, "ignore_eos": True}}
        )
        assert r.status_code == 200 and r.json()["generated_text"] == text


def test_environment_variables_configure_the_server(llama, tmp_path):
    env = {
        "HF_MODEL_ID": str(llama),
        "OPTION_ROLLING_BATCH": "torch",
        "OPTION_MAX_INPUT_LEN": "8",
        "OPTION_MAX_OUTPUT_LEN": "16",
    }
    with serve([], tmp_path, env=env) as srv:
        r = srv.post("/invocations", {"inputs": "word " * 40, "parameters": {"max_new_tokens": 4}})
        assert r.status_code == 400
        assert "option.max_input_len" in r.text
        r = srv.post("/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 17}})
        assert r.status_code == 400 and "max_output_len" in r.text
        assert srv.post("/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 4}}).status_code == 200


def test_cli_flag_wins_over_properties_and_env(llama, tmp_path):
    props = tmp_path / "serving.properties"
    props.write_text(f"option.model_id={llama}\noption.rolling_batch=torch\noption.max_input_len=8\n")
    env = {"OPTION_MAX_INPUT_LEN": "4"}
    with serve(
        ["--properties", str(props), "-o", "option.max_input_len=256", "-o", "max_output_len=64"], tmp_path, env=env
    ) as srv:
        r = srv.post("/invocations", {"inputs": "word " * 40, "parameters": {"max_new_tokens": 2}})
        assert r.status_code == 200, r.text


def test_invalid_option_fails_startup_naming_the_key(llama, tmp_path):
    with serve(["--model-id", str(llama), "-o", "option.max_input_len=abc"], tmp_path, ready=False) as srv:
        assert srv.proc.wait(timeout=60) != 0
        assert "option.max_input_len" in srv.log() and "abc" in srv.log()


def test_missing_model_fails_fast_naming_it(tmp_path):
    # A model that cannot load ends the process non-zero (so the platform restarts or reports it),
    # with the model id in the log rather than a bare stack trace.
    missing = tmp_path / "no-such-model"
    with serve(["--model-id", str(missing) + "/", "--engine", "torch"], tmp_path, ready=False) as srv:
        assert srv.proc.wait(timeout=90) != 0
        assert "no-such-model" in srv.log()


def test_readme_quick_start_serves_serving_properties_example(llama, tmp_path):
    # README: `python tests/tinymodels.py ./models/tiny-llama` then
    # `lmi-trt serve --properties serving.properties.example`, run from the repository root.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny-llama").symlink_to(llama)
    shutil.copy(root / "serving.properties.example", tmp_path / "serving.properties.example")
    with serve(["--properties", "serving.properties.example"], tmp_path, cwd=tmp_path) as srv:
        r = srv.post(
            "/invocations", {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 16, "details": True}}
        )
        assert r.status_code == 200, r.text
        assert r.json()["details"]["generated_tokens"] >= 1
