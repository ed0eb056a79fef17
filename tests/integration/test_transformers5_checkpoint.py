"""A checkpoint transformers 5 wrote serves under whichever transformers is installed (issue 22, item 5): in the
default run transformers 5 itself, in each release leg of .ci/run the image's 4.42.4 / 4.53.1 / 4.56.0 / 4.57.3.

The folder is tests/fixtures/transformers5-llama as transformers 5 wrote it (``TokenizersBackend``, a list of
``extra_special_tokens``, ``chat_template.jinja``, ``rope_parameters``, pair-form BPE merges) plus random weights made
here. The reference is the model its writer meant (RoPE base 100, linear scaling 4), built by hand, prompted through a
tokenizer and template built by hand from the same files; a transformers 4 that misread the config (default RoPE)
answers otherwise, which the test checks, so it can fail."""

from __future__ import annotations

import json
import os

import jinja2
import pytest
from cliserver import serve
from tinymodels import TRANSFORMERS5_FIXTURE, transformers5_checkpoint
from trtllm_testing import fake_server_env

pytestmark = pytest.mark.slow

RELEASE = os.environ.get("LMI_TRT_FAKE_RELEASE")  # set in the release legs
ENGINES = ["torch"] + ([] if RELEASE == "0.12.0" else ["trtllm"])  # the LLM API's PyTorch backend from 1.0
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]
NEW_TOKENS = 8
EOS = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return transformers5_checkpoint(tmp_path_factory.mktemp("transformers5") / "model")


def _codec(folder):
    """Encode/decode from tokenizer.json's own vocabulary and merges, with the tokenizers library directly."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    spec = json.loads((folder / "tokenizer.json").read_text())
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["model"]["merges"]]
    tok = Tokenizer(models.BPE(spec["model"]["vocab"], merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t["content"], special=True) for t in spec["added_tokens"]])
    return tok


def _greedy(checkpoint, prompt: list[int], **rope) -> list[int]:
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    written = json.loads((checkpoint / "config.json").read_text())
    shape = {k: written[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
    heads = {k: written[k] for k in ("num_attention_heads", "num_key_value_heads", "max_position_embeddings")}
    model = LlamaForCausalLM(LlamaConfig(**shape, **heads, rms_norm_eps=written["rms_norm_eps"], **rope)).eval()
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            if token == EOS:
                break
            ids.append(token)
    return ids[len(prompt) :]


@pytest.fixture(scope="module")
def expected(checkpoint):
    """The chat answer as the checkpoint's writer meant it: its template, its vocabulary, its RoPE."""
    template = (TRANSFORMERS5_FIXTURE / "chat_template.jinja").read_text()
    prompt = jinja2.Template(template).render(messages=MESSAGES, add_generation_prompt=True)
    codec = _codec(TRANSFORMERS5_FIXTURE)
    ids = codec.encode(prompt).ids
    meant = _greedy(checkpoint, ids, rope_theta=100.0, rope_scaling={"type": "linear", "factor": 4.0})
    assert _greedy(checkpoint, ids) != meant  # misread RoPE answers otherwise: this test can fail
    return codec.decode(meant)


def test_the_fixture_is_what_transformers_5_writes():
    config = json.loads((TRANSFORMERS5_FIXTURE / "config.json").read_text())
    tokenizer = json.loads((TRANSFORMERS5_FIXTURE / "tokenizer_config.json").read_text())
    assert config["transformers_version"].startswith("5.") and "rope_parameters" in config
    assert tokenizer["tokenizer_class"] == "TokenizersBackend"
    assert isinstance(tokenizer["extra_special_tokens"], list) and "chat_template" not in tokenizer


@pytest.mark.parametrize("engine", ENGINES)
def test_it_serves_the_answer_its_writer_meant(checkpoint, expected, engine, tmp_path):
    env = fake_server_env(tmp_path, RELEASE or "1.2.1") if engine == "trtllm" else {}
    args = ["--model-id", str(checkpoint), "--engine", engine, "-o", f"download_dir={tmp_path / 'dl'}"]
    limits = [
        "-o",
        "option.max_input_len=64",
        "-o",
        "option.max_output_len=16",
        "-o",
        "option.max_rolling_batch_size=2",
    ]
    with serve([*args, *limits, "-o", "option.dtype=fp32"], tmp_path, env=env) as server:
        body = {"model": checkpoint.name, "messages": MESSAGES, "max_tokens": NEW_TOKENS, "temperature": 0}
        r = server.post("/v1/chat/completions", body)
        assert r.status_code == 200, r.text + server.log()[-3000:]
        assert r.json()["choices"][0]["message"]["content"] == expected
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):  # read through a view, never rewritten
        assert (checkpoint / name).read_bytes() == (TRANSFORMERS5_FIXTURE / name).read_bytes(), name


def test_a_tokenizer_that_cannot_load_fails_with_one_line_naming_the_file(checkpoint, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in checkpoint.iterdir():  # all but the vocabulary: tokenizer_config.json names a class with nothing to load
        if f.name != "tokenizer.json":
            (broken / f.name).symlink_to(f)
    args = ["--model-id", str(broken), "--engine", "torch", "-o", f"download_dir={tmp_path / 'dl'}"]
    with serve(args, tmp_path, ready=False, failed_exit_after=0.5) as server:
        assert server.proc.wait(timeout=120) != 0
        log = server.log()
    failed = [line for line in log.splitlines() if "loading model" in line and "failed" in line]
    assert len(failed) == 1 and "Traceback" not in log, log[-3000:]
    assert "tokenizer_config.json: transformers " in failed[0] and "TokenizersBackend" in failed[0], failed[0]
    assert "option.tokenizer_id" in failed[0], failed[0]
