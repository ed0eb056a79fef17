"""Medusa heads for the TensorRT engine path: FasterDecoding-format heads → TensorRT-LLM checkpoint tensors and config.

Pure functions, plus ``read_heads`` at the edge (it reads the heads file). What was read (NVIDIA/TensorRT-LLM; the
index keeps crawl copies, not tags, dated here by content):

* tensorrt_llm/models/medusa/weight.py ``load_medusa_hf`` (the copy taking ``num_medusa_heads`` and
  ``use_weight_only``, a late-0.x/1.x copy): it reads ``medusa_lm_head.pt`` and, when that file is absent,
  ``medusa_lm_head.safetensors`` (FasterDecoding/Medusa's training scripts save the latter); head ``h``'s residual
  layer ``l`` is ``{h}.{l}.linear.weight``/``.bias`` and its vocabulary projection ``{h}.{num_medusa_layers}.weight``;
  they become ``medusa_heads.{h}.medusa_layers.{l}.linear.weight``/``.bias`` and ``medusa_heads.{h}.lm_head.weight``.
  An older copy (``load_medusa_hf(medusa_path, trt_llm_medusa, ...)``) reads the ``.pt`` file only.
* examples/medusa/convert_checkpoint.py: the heads folder's config.json gives ``medusa_num_heads`` and
  ``medusa_num_layers`` (flags ``--num_medusa_heads`` default 4, ``--num_medusa_layers`` default 1); the checkpoint
  config is the base model's with ``architecture: MedusaForCausalLM``, ``max_draft_len`` (``--max_medusa_token_len``,
  default 63), ``num_medusa_heads`` and ``num_medusa_layers``.
* tensorrt_llm/models/medusa/model.py: ``MedusaLayer.forward`` is ``x + act(linear(x))`` (``medusa_hidden_act``,
  default silu) and ``MedusaHead`` applies its layers then its own ``lm_head`` to the base model's last hidden state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlanError

HEADS_FILES = ("medusa_lm_head.pt", "medusa_lm_head.safetensors")  # load_medusa_hf's order
MEDUSA_ARCHITECTURE = "MedusaForCausalLM"
DEFAULT_HEADS = 4  # convert_checkpoint.py --num_medusa_heads
DEFAULT_LAYERS = 1  # convert_checkpoint.py --num_medusa_layers


@dataclass(frozen=True)
class MedusaHeads:
    """The heads' shape, from their config.json (FasterDecoding's ``MedusaConfig`` names)."""

    num_heads: int
    num_layers: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any], key: str) -> MedusaHeads:
        heads = config.get("medusa_num_heads", DEFAULT_HEADS)
        layers = config.get("medusa_num_layers", DEFAULT_LAYERS)
        for name, value in (("medusa_num_heads", heads), ("medusa_num_layers", layers)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PlanError(
                    key, value, f"the Medusa heads' config.json has {name}={value!r}", "it must be an integer >= 1"
                )
        return cls(heads, layers)


def checkpoint_config(base: Mapping[str, Any], heads: MedusaHeads, max_draft_len: int) -> dict[str, Any]:
    """Pure: the base model's TensorRT-LLM checkpoint config turned into convert_checkpoint.py's Medusa one."""
    return {
        **base,
        "architecture": MEDUSA_ARCHITECTURE,
        "max_draft_len": max_draft_len,
        "num_medusa_heads": heads.num_heads,
        "num_medusa_layers": heads.num_layers,
    }


def convert_heads(state: Mapping[str, Any], heads: MedusaHeads, key: str) -> dict[str, Any]:
    """Pure: FasterDecoding's tensor names → TensorRT-LLM's (``load_medusa_hf``), refusing a missing tensor."""
    out: dict[str, Any] = {}

    def take(name: str) -> Any:
        if name not in state:
            raise PlanError(
                key,
                name,
                f"the Medusa heads file lacks tensor {name!r} for {heads.num_heads} heads of {heads.num_layers} "
                f"layers (config.json medusa_num_heads/medusa_num_layers); it has "
                f"{', '.join(sorted(state)[:6])}{', ...' if len(state) > 6 else ''}",
                "set medusa_num_heads and medusa_num_layers in the heads' config.json to what the file holds",
            )
        return state[name]

    for h in range(heads.num_heads):
        for layer in range(heads.num_layers):
            prefix = f"medusa_heads.{h}.medusa_layers.{layer}.linear."
            out[prefix + "weight"] = take(f"{h}.{layer}.linear.weight")
            out[prefix + "bias"] = take(f"{h}.{layer}.linear.bias")
        out[f"medusa_heads.{h}.lm_head.weight"] = take(f"{h}.{heads.num_layers}.weight")
    return out


def heads_file(folder: Path, key: str) -> Path:
    """The heads file ``load_medusa_hf`` would read in ``folder``: ``.pt`` first, then ``.safetensors``."""
    for name in HEADS_FILES:
        if (folder / name).is_file():
            return folder / name
    raise PlanError(
        key,
        str(folder),
        f"has neither {' nor '.join(HEADS_FILES)}",
        "point it at a folder of Medusa heads in FasterDecoding/Medusa's format",
    )


def read_heads(folder: Path, key: str) -> tuple[MedusaHeads, dict[str, Any]]:
    """Reads the heads folder: its config.json's shape and its tensors, under TensorRT-LLM's names."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    heads = MedusaHeads.from_config(config, key)
    path = heads_file(folder, key)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        import torch

        # weights_only: a pickled heads file runs no code when loaded.
        state = torch.load(path, map_location="cpu", weights_only=True)
    return heads, convert_heads(state, heads, key)
