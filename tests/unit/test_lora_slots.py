"""LoRA adapters: the stacked slots' arithmetic, what an adapter folder may hold, and the memory figures."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from lmi_trt.engines.adapters import read_adapter
from lmi_trt.engines.base import EngineError
from lmi_trt.engines.lora_sizes import buffer_bytes, group_sizes
from lmi_trt.engines.torch.lora import LoraSlots, spare_rows

LLAMA3_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
}
TINY = SimpleNamespace(
    hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4, intermediate_size=12, num_hidden_layers=2
)


def test_the_slots_of_a_llama_3_8b_take_what_their_shapes_say():
    # per layer and rank, each part's A column (its input) and B row (the fused projection's whole output, zero
    # outside the part's own columns): q, k, v (4096 → 4096 + 1024 + 1024), o (4096 → 4096), gate and up
    # (4096 → 2 × 14336), down (14336 → 4096)
    per_rank = 3 * (4096 + 6144) + (4096 + 4096) + 2 * (4096 + 2 * 14336) + (14336 + 4096)
    assert buffer_bytes(LLAMA3_8B, 4, 16, 2) == 32 * 4 * 16 * per_rank * 2 == 480 * 2**20


def _adapter(folder, rank=2, alpha=4, modules=("q_proj", "down_proj"), **config):
    folder.mkdir(parents=True, exist_ok=True)
    sizes = {"q_proj": (8, 8), "k_proj": (8, 4), "down_proj": (12, 8)}
    tensors = {}
    torch.manual_seed(0)
    for layer in range(2):
        for m in modules:
            fan_in, fan_out = sizes[m]
            where = "mlp" if m == "down_proj" else "self_attn"
            stem = f"base_model.model.model.layers.{layer}.{where}.{m}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, fan_in)
            tensors[f"{stem}.lora_B.weight"] = torch.randn(fan_out, rank)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(modules), **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    return tensors


def _base_weights(fold: bool, slots: int, rank: int) -> list[dict]:
    """TINY's fused projections per layer (random, no biases but qkv's), with the folded slots' spare rows."""
    out = []
    for _ in range(TINY.num_hidden_layers):
        layer = {}
        for group, (fan_in, parts, outs) in group_sizes(TINY).items():
            weight = torch.randn(sum(outs) + spare_rows(parts, slots, rank, fold), fan_in)
            weight[sum(outs) :] = 0
            layer[group] = (weight, torch.randn(sum(outs)) if group == "qkv" else None)
        out.append(layer)
    return out


@pytest.mark.parametrize("fold", [True, False])
def test_each_row_gets_its_own_slot_and_a_base_row_exactly_nothing(tmp_path, fold):
    tensors = _adapter(tmp_path / "a")
    adapter = read_adapter("a", tmp_path / "a", max_rank=4, num_layers=2, dtype=torch.float32)
    weights = _base_weights(fold, 3, 4)
    slots = LoraSlots(TINY, weights, slots=3, rank=4, fold=fold)
    slots.write(2, adapter)
    x = torch.randn(3, 8)
    mask = slots.mask(torch.tensor([2, -1, 0]))  # adapter a, the base model, an empty slot
    weight, bias = weights[1]["qkv"]
    base = x @ weight[:16].t() + bias  # [3, q 8 + k 4 + v 4]
    got = slots.project(1, "qkv", x, mask) - base
    stem = "base_model.model.model.layers.1.self_attn.q_proj"
    a, b = tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"]
    want = x[0] @ a.t() @ b.t() * (4 / 2)  # scaling = lora_alpha / r (peft LoraLayer.update_layer)
    torch.testing.assert_close(got[0, :8], want)
    assert not got[0, 8:].any()  # k and v: not in the adapter
    assert not got[1:].any()  # the base row and the empty slot's row add exactly zero
    hidden, residual = torch.randn(3, 12), torch.randn(3, 8)  # down, one part: the mask's leading S·R columns
    stream = residual.clone()
    assert slots.project(1, "down", hidden, mask, residual=stream) is stream  # into the residual stream, in place
    delta = stream - residual - hidden @ weights[1]["down"][0][:8].t()
    torch.testing.assert_close(delta[1:], torch.zeros(2, 8), rtol=0, atol=1e-5)
    assert delta[0].abs().max() > 1e-2
    rslora = _adapter(tmp_path / "r", use_rslora=True)
    scaled = read_adapter("r", tmp_path / "r", max_rank=4, num_layers=2, dtype=torch.float32)
    b_r = rslora[f"{stem}.lora_B.weight"]
    torch.testing.assert_close(scaled.weights[1, "q_proj"][1], b_r * (4 / math.sqrt(2)))


@pytest.mark.parametrize(
    ("config", "rank", "says"),
    [
        ({"use_dora": True}, 2, "use_dora"),
        ({"bias": "all"}, 2, "bias"),
        ({"modules_to_save": ["lm_head"]}, 2, "modules_to_save"),
        ({"peft_type": "IA3"}, 2, "peft_type"),
        ({}, 8, "option.max_lora_rank=4"),
    ],
)
def test_what_the_decode_loop_cannot_apply_is_refused_naming_it(tmp_path, config, rank, says):
    _adapter(tmp_path / "x", rank=rank, **config)
    with pytest.raises(EngineError, match=says) as err:
        read_adapter("x", tmp_path / "x", max_rank=4, num_layers=2, dtype=torch.float32)
    assert err.value.code == 400


def test_tensors_of_other_modules_or_layers_are_refused(tmp_path):
    _adapter(tmp_path / "x")
    with pytest.raises(EngineError, match="the model has 1 layers"):
        read_adapter("x", tmp_path / "x", max_rank=4, num_layers=1, dtype=torch.float32)
    save_file(
        {"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 8)}, str(tmp_path / "x" / "adapter_model.safetensors")
    )
    with pytest.raises(EngineError, match="lm_head"):
        read_adapter("x", tmp_path / "x", max_rank=4, num_layers=2, dtype=torch.float32)
    with pytest.raises(EngineError, match="adapter_config.json"):
        read_adapter("y", tmp_path / "missing", max_rank=4, num_layers=2, dtype=torch.float32)
