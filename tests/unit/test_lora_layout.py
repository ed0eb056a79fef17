"""TensorRT-LLM's LoRA rows (lmi_trt.engines.lora_layout) both ways, and a Triton task's decoded adapter written as a
PEFT folder that read_adapter reads back to the same product B·A."""

from __future__ import annotations

import pytest
import torch

from lmi_trt.engines.adapters import read_adapter, write_adapter
from lmi_trt.engines.base import EngineError
from lmi_trt.engines.lora_layout import decode, encode, module_dims

CONFIG = {
    "hidden_size": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
}


def _adapter(ranks: dict[str, int]) -> dict:
    torch.manual_seed(0)
    dims = module_dims(CONFIG)
    return {(1, m): (torch.randn(r, dims[m][0]), torch.randn(dims[m][1], r)) for m, r in ranks.items()}


def test_module_dims_are_the_llama_projections():
    assert module_dims(CONFIG) == {
        "q_proj": (16, 16),
        "k_proj": (16, 8),
        "v_proj": (16, 8),
        "o_proj": (16, 16),
        "gate_proj": (16, 24),
        "up_proj": (16, 24),
        "down_proj": (24, 16),
    }


def test_rows_are_a_then_b_padded_and_decode_back():
    weights = _adapter({"q_proj": 2, "down_proj": 4})
    rows, config = encode(weights)
    # LoraManager.load_from_hf: config [module id, layer, rank]; a row is A [r, in] then B [out, r], zero-padded
    assert config.tolist() == [[6, 1, 4], [1, 1, 2]]
    a, b = weights[1, "q_proj"]
    assert torch.equal(rows[1, : 2 * 16], a.flatten())
    assert torch.equal(rows[1, 2 * 16 : 2 * 32], b.flatten())
    assert not rows[1, 2 * 32 :].any()
    back = decode(rows, config, module_dims(CONFIG), 2)
    assert back.keys() == weights.keys()
    for key, (a, b) in weights.items():
        assert torch.equal(back[key][0], a) and torch.equal(back[key][1], b)


@pytest.mark.parametrize(
    ("config", "width", "field", "words"),
    [
        ([[9, 0, 2]], 64, "lora_config", "module id 9"),
        ([[1, 2, 2]], 64, "lora_config", "layer 2"),
        ([[1, 0, 0]], 64, "lora_config", "adapter size 0"),
        ([[1, 0, 2]], 63, "lora_weights", "needs 64 values"),
        ([[1, 0, 2], [1, 0, 2]], 64, "lora_config", "given twice"),
    ],
)
def test_rows_that_are_not_the_layout_are_a_400_naming_the_input(config, width, field, words):
    rows = torch.zeros(len(config), width)
    with pytest.raises(EngineError) as err:
        decode(rows, torch.tensor(config), module_dims(CONFIG), 2)
    assert err.value.code == 400 and err.value.field == field and words in str(err.value)


def test_modules_of_other_ranks_are_padded_to_one_peft_rank_with_the_same_product(tmp_path):
    weights = _adapter({"q_proj": 2, "v_proj": 4})
    assert write_adapter(tmp_path, weights) == 4
    read = read_adapter("t", tmp_path, max_rank=4, num_layers=2, dtype=torch.float32)
    assert read.rank == 4
    for key, (a, b) in weights.items():
        ra, rb = read.weights[key]
        torch.testing.assert_close(rb @ ra, b @ a)
