"""trust_remote_code is off unless set: a model folder (or tokenizer) that ships its own Python code
fails to load without it, with a message that names the option, and its code never runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tinymodels import tiny_model

from lmi_trt.config import LmiConfig, load_config_from_environment
from lmi_trt.engines.base import EngineError
from lmi_trt.loader import load_model
from lmi_trt.sources.hf import select_hub_files

pytestmark = pytest.mark.slow  # loads transformers

CODE = """
from pathlib import Path
Path({marker!r}).write_text("the remote code ran")
raise RuntimeError("remote code ran")
"""


def _remote_code_model(tmp_path: Path, *, tokenizer_code: bool) -> tuple[Path, Path]:
    folder = tmp_path / "remote-code-model"
    shutil.copytree(tiny_model("llama"), folder)
    marker = tmp_path / "ran.txt"
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="evil",
        architectures=["EvilForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_evil.EvilConfig",
            "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("configuration_evil.py", "modeling_evil.py", "tokenization_evil.py"):
        (folder / name).write_text(CODE.format(marker=str(marker)))
    if tokenizer_code:
        tok = json.loads((folder / "tokenizer_config.json").read_text())
        tok.update(
            tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        )
        (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder, marker


def test_default_is_off(monkeypatch):
    for var in ("HF_MODEL_TRUST_REMOTE_CODE", "OPTION_TRUST_REMOTE_CODE"):
        monkeypatch.delenv(var, raising=False)
    assert LmiConfig().trust_remote_code is False
    assert load_config_from_environment(overrides={"option.model_id": "x"}).trust_remote_code is False
    # and the hub download does not even fetch the code
    assert "modeling_evil.py" not in select_hub_files(
        ["config.json", "model.safetensors", "modeling_evil.py"], trust_remote_code=False
    )


async def test_a_remote_code_model_does_not_load_without_the_option(tmp_path):
    folder, marker = _remote_code_model(tmp_path, tokenizer_code=False)
    with pytest.raises(EngineError, match=r"option\.trust_remote_code=true") as err:
        await load_model(LmiConfig(model_id=str(folder), max_input_len=32, max_output_len=8), "torch")
    assert err.value.code == 400 and str(folder) in str(err.value)
    assert not marker.exists(), "remote code ran without trust_remote_code"
    # with the option, the model's code is what runs (here it refuses to go on)
    with pytest.raises(Exception, match="remote code ran"):
        await load_model(LmiConfig(model_id=str(folder), trust_remote_code=True), "torch")
    assert marker.exists()


async def test_a_remote_code_tokenizer_does_not_load_without_the_option(tmp_path):
    folder, marker = _remote_code_model(tmp_path, tokenizer_code=True)
    with pytest.raises(Exception, match=r"option\.trust_remote_code=true"):
        await load_model(LmiConfig(model_id=str(folder)), "synthetic")
    assert not marker.exists(), "remote code ran without trust_remote_code"
