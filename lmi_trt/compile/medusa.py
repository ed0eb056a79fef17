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
* tensorrt_llm/models/medusa/model.py (a 1.x copy, id 906315928): ``MedusaForCausalLm`` wraps ``QWenForCausalLM`` when
  the config's ``model_type`` holds "qwen" and ``LLaMAForCausalLM`` otherwise; its ``from_hugging_face`` converts
  the base with ``convert_hf_llama`` and takes ``num_medusa_heads`` from the LLM API's ``speculative_config`` when
  given, else the heads' config.json ``medusa_num_heads``; ``MedusaLayer.forward`` is ``x + act(linear(x))``
  (``medusa_hidden_act``,
  default silu) and ``MedusaHead`` applies its layers then its own ``lm_head`` to the base model's last hidden state.
  Its ``ColumnLinear`` layers split over tensor-parallel ranks, which lmi-trt does not shard here (``plan_errors``).
* tensorrt_llm/builder.py ``build`` (a 1.x copy, id 3063623504): a model whose config has ``max_draft_len`` is built
  with that draft length and ``SpeculativeDecodingMode.MEDUSA`` (a warning where another mode was asked).

lmi-trt follows convert_checkpoint.py's route inside its own build: the base model is converted as for any engine
and saved as a checkpoint, the heads' tensors are added to each rank's ``rank{N}.safetensors`` and its config.json
becomes the Medusa one (``write_checkpoint``), and ``MODEL_MAP["MedusaForCausalLM"].from_checkpoint`` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

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


def _heads_config(folder: Path, key: str) -> MedusaHeads:
    config_path = folder / "config.json"
    return MedusaHeads.from_config(json.loads(config_path.read_text()) if config_path.is_file() else {}, key)


def read_heads(folder: Path, key: str, num_heads: int | None = None) -> tuple[MedusaHeads, dict[str, Any]]:
    """Reads the heads folder: its config.json's shape (``num_heads`` of them where given) and its tensors, under
    TensorRT-LLM's names."""
    heads = _heads_config(folder, key)
    if num_heads is not None:
        heads = MedusaHeads(num_heads, heads.num_layers)
    path = heads_file(folder, key)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        import torch

        # weights_only: a pickled heads file runs no code when loaded.
        state = torch.load(path, map_location="cpu", weights_only=True)
    return heads, convert_heads(state, heads, key)


class MedusaPlan(BaseModel):
    """The heads a Medusa engine is built with: where they are (not part of the cache key), what they are (their
    folder's fingerprint) and how many heads and layers the checkpoint takes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heads_dir: str
    fingerprint: str
    num_heads: int
    num_layers: int


def plan_heads(folder: Path, fingerprint: str, num_heads: int | None, key: str) -> MedusaPlan:
    """The heads in ``folder`` (config.json read): ``num_heads`` where the configuration names it (llm_args.py's
    num_medusa_heads, which model.py prefers to config.json's), else the folder's own; the file must be there."""
    heads = _heads_config(folder, key)
    heads_file(folder, key)
    return MedusaPlan(
        heads_dir=str(folder),
        fingerprint=fingerprint,
        num_heads=num_heads or heads.num_heads,
        num_layers=heads.num_layers,
    )


def plan_errors(
    medusa: MedusaPlan, key: str, trtllm_class: str, tp: int, pp: int, quantized: bool, lora: bool
) -> PlanError | None:
    """Pure: why the compile stage cannot build this Medusa engine (model.py wraps LLaMA and QWen bases; lmi-trt
    converts LLaMA-family ones, unsplit, unquantized and without the LoRA plugin, none of which was read beside
    the heads)."""
    if trtllm_class != "LLaMAForCausalLM":
        return PlanError(
            key,
            "medusa",
            f"the compile stage builds Medusa engines on LLaMA-family models (TensorRT-LLM's LLaMAForCausalLM), and "
            f"this model converts with {trtllm_class}",
            "serve it without speculative decoding, or with lookahead decoding",
        )
    if tp * pp != 1:
        return PlanError(
            "option.tensor_parallel_degree",
            tp,
            f"a Medusa engine is built here on one GPU (tp={tp} pp={pp} asked): lmi-trt does not split the heads "
            "over ranks",
            "set option.tensor_parallel_degree=1 and option.pipeline_parallel_degree=1, or leave Medusa out",
        )
    if lora:
        return PlanError(
            "option.enable_lora",
            True,
            "LoRA adapters beside Medusa heads were not read in TensorRT-LLM, so the compile stage does not build both",
            "leave option.enable_lora out with Medusa, or leave Medusa out",
        )
    if quantized:
        return PlanError(
            "option.quantize",
            "set",
            "the compile stage does not quantize Medusa heads",
            "leave option.quantize out with Medusa, or leave Medusa out",
        )
    return None


def write_checkpoint(checkpoint: Path, rank: int, medusa: MedusaPlan, max_draft_len: int, dtype: str, key: str) -> None:
    """Turns the base model's saved TensorRT-LLM checkpoint into the Medusa one, as convert_checkpoint.py writes it:
    the heads' tensors (in the checkpoint's dtype) join rank ``rank``'s weights, and config.json becomes
    ``checkpoint_config``'s."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(medusa.heads_dir)
    _, state = read_heads(folder, key, medusa.num_heads)
    shard = checkpoint / f"rank{rank}.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 -- safe_open is not a Mapping
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
    tensors.update({name: t.to(dtypes[dtype]).contiguous() for name, t in state.items()})
    save_file(tensors, str(shard), metadata=metadata)
    config_path = checkpoint / "config.json"
    if rank == 0:
        base = json.loads(config_path.read_text())
        heads = MedusaHeads(medusa.num_heads, medusa.num_layers)
        config_path.write_text(json.dumps(checkpoint_config(base, heads, max_draft_len), indent=4))
