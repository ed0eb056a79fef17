"""Medusa heads in FasterDecoding's format → TensorRT-LLM checkpoint tensors and config (lmi_trt.compile.medusa),
against load_medusa_hf's names (tensorrt_llm/models/medusa/weight.py) and convert_checkpoint.py's config."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.medusa import MedusaHeads, checkpoint_config, heads_file, read_heads

HIDDEN, VOCAB = 8, 32


def faster_decoding_heads(heads: int, layers: int) -> dict[str, torch.Tensor]:
    """What FasterDecoding/Medusa's ``medusa_head`` state dict holds: per head, ``layers`` ResBlocks then a vocabulary
    projection without bias."""
    g = torch.Generator().manual_seed(0)
    state = {}
    for h in range(heads):
        for layer in range(layers):
            state[f"{h}.{layer}.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g)
            state[f"{h}.{layer}.linear.bias"] = torch.randn(HIDDEN, generator=g)
        state[f"{h}.{layers}.weight"] = torch.randn(VOCAB, HIDDEN, generator=g)
    return state


def write_heads(folder, heads=3, layers=1, fmt="safetensors", config=True):
    folder.mkdir(parents=True, exist_ok=True)
    state = faster_decoding_heads(heads, layers)
    if fmt == "safetensors":
        save_file(state, str(folder / "medusa_lm_head.safetensors"))
    else:
        torch.save(state, folder / "medusa_lm_head.pt")
    if config:
        (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    return state


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_heads_become_tensorrt_llm_names(tmp_path, fmt):
    state = write_heads(tmp_path, heads=3, layers=2, fmt=fmt)
    heads, weights = read_heads(tmp_path, "option.speculative_draft_model")
    assert heads == MedusaHeads(3, 2)
    assert set(weights) == {
        *(
            f"medusa_heads.{h}.medusa_layers.{j}.linear.{p}"
            for h in range(3)
            for j in range(2)
            for p in ("weight", "bias")
        ),
        *(f"medusa_heads.{h}.lm_head.weight" for h in range(3)),
    }
    assert torch.equal(weights["medusa_heads.2.medusa_layers.1.linear.bias"], state["2.1.linear.bias"])
    assert torch.equal(weights["medusa_heads.1.lm_head.weight"], state["1.2.weight"])


def test_the_pt_file_wins_as_load_medusa_hf_reads_it(tmp_path):
    write_heads(tmp_path, fmt="safetensors")
    write_heads(tmp_path, fmt="pt")
    assert heads_file(tmp_path, "k").name == "medusa_lm_head.pt"


def test_without_config_json_the_converter_defaults_apply(tmp_path):
    write_heads(tmp_path, heads=4, layers=1, config=False)
    assert read_heads(tmp_path, "k")[0] == MedusaHeads(4, 1)  # --num_medusa_heads 4, --num_medusa_layers 1


def test_a_missing_tensor_is_named(tmp_path):
    write_heads(tmp_path, heads=2, layers=1, config=False)  # the converter's default asks for 4 heads
    with pytest.raises(PlanError, match=r"option.speculative_draft_model=.*lacks tensor '2.0.linear.weight'"):
        read_heads(tmp_path, "option.speculative_draft_model")


def test_a_folder_without_heads_is_refused(tmp_path):
    with pytest.raises(PlanError, match="neither medusa_lm_head.pt nor medusa_lm_head.safetensors"):
        read_heads(tmp_path, "k")


def test_a_bad_head_count_is_refused(tmp_path):
    write_heads(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 0}))
    with pytest.raises(PlanError, match="medusa_num_heads=0"):
        read_heads(tmp_path, "k")


def test_checkpoint_config_is_the_base_model_s_with_medusa_fields():
    base = {"architecture": "LlamaForCausalLM", "hidden_size": HIDDEN, "vocab_size": VOCAB}
    assert checkpoint_config(base, MedusaHeads(3, 1), 63) == {
        "architecture": "MedusaForCausalLM",
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "max_draft_len": 63,
        "num_medusa_heads": 3,
        "num_medusa_layers": 1,
    }


def test_the_plan_takes_num_medusa_heads_over_the_folder_s_and_refuses_what_it_cannot_build(tmp_path):
    from lmi_trt.compile.medusa import plan_errors, plan_heads

    write_heads(tmp_path, heads=3, layers=2, fmt="safetensors")
    planned = plan_heads(tmp_path, "fp", None, "k")
    assert (planned.num_heads, planned.num_layers, planned.fingerprint) == (3, 2, "fp")
    assert plan_heads(tmp_path, "fp", 2, "k").num_heads == 2  # model.py: speculative_config's count first
    assert planned.sizes == (HIDDEN, VOCAB)  # from the safetensors header
    fits, fp16 = (HIDDEN, VOCAB), ("auto", "float16")
    assert plan_errors(planned, "k", "LLaMAForCausalLM", 1, 1, False, False, fits, fp16) is None
    assert plan_errors(planned, "k", "QWenForCausalLM", 1, 1, False, False, fits, fp16).key == "k"
    split = plan_errors(planned, "k", "LLaMAForCausalLM", 2, 1, False, False, fits, fp16)
    assert split.key == "option.tensor_parallel_degree"
    assert plan_errors(planned, "k", "LLaMAForCausalLM", 1, 1, True, False, fits, fp16).key == "option.quantize"
    assert plan_errors(planned, "k", "LLaMAForCausalLM", 1, 1, False, True, fits, fp16).key == "option.enable_lora"
    # examples/medusa/README.md's Support Matrix: FP16 and BF16 only
    fp32 = plan_errors(planned, "k", "LLaMAForCausalLM", 1, 1, False, False, fits, ("fp32", "float32"))
    assert (fp32.key, fp32.value) == ("option.dtype", "fp32") and "float16 or bfloat16" in str(fp32)
    # heads of another hidden size: model.py's parameters would not take them
    other = plan_errors(planned, "k", "LLaMAForCausalLM", 1, 1, False, False, (16, VOCAB), fp16)
    assert (other.key, other.value) == ("k", str(tmp_path)) and "hidden size 8" in str(other)


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_tensors_of_another_shape_are_named(tmp_path, fmt):
    """modeling_utils.py load: "Encounter error ... for parameter" on a shape mismatch; the conversion says so first."""
    write_heads(tmp_path, heads=2, layers=1, fmt=fmt)
    assert read_heads(tmp_path, "k", sizes=(HIDDEN, VOCAB))[0] == MedusaHeads(2, 1)
    with pytest.raises(PlanError, match=r"k='0.0.linear.weight': .* is \[8, 8\] and the base model needs \[16, 16\]"):
        read_heads(tmp_path, "k", sizes=(16, VOCAB))
    with pytest.raises(PlanError, match=r"'0.1.weight' is \[32, 8\] and the base model needs \[64, 8\]"):
        read_heads(tmp_path, "k", sizes=(HIDDEN, 64))
