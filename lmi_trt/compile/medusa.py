"""Medusa heads for the TensorRT engine path: FasterDecoding-format heads → TensorRT-LLM checkpoint tensors and config.

Pure functions, plus ``read_heads`` at the edge (it reads the heads file). What was read (NVIDIA/TensorRT-LLM; the
index keeps crawl copies, not tags, dated here by content):

* tensorrt_llm/models/medusa/weight.py ``load_medusa_hf`` (the copy taking ``num_medusa_heads`` and
  ``use_weight_only``, a late-0.x/1.x copy): it reads ``medusa_lm_head.pt`` and, when that file is absent,
  ``medusa_lm_head.safetensors`` (FasterDecoding/Medusa's training scripts save the latter); head ``h``'s residual
  layer ``l`` is ``{h}.{l}.linear.weight``/``.bias`` and its vocabulary projection ``{h}.{num_medusa_layers}.weight``;
  they become ``medusa_heads.{h}.medusa_layers.{l}.linear.weight``/``.bias`` and ``medusa_heads.{h}.lm_head.weight``.
  An older copy (``load_medusa_hf(medusa_path, trt_llm_medusa, ...)``) reads the ``.pt`` file only.
* examples/medusa/convert_checkpoint.py (every copy read, e.g. id 6395194053): flags ``--num_medusa_heads`` (default
  4) and ``--num_medusa_layers`` (default 1); its fallback to the heads' config.json ``medusa_num_heads`` runs only
  when the flag is None, which its default 4 never is, so the example takes the flag; ``medusa_num_layers`` it reads
  from config.json. The checkpoint config is the base model's with ``architecture: MedusaForCausalLM``,
  ``max_draft_len`` (``--max_medusa_token_len``, default 63), ``num_medusa_heads`` and ``num_medusa_layers``.
* tensorrt_llm/models/medusa/model.py (a 1.x copy, id 906315928): ``MedusaForCausalLm`` wraps ``QWenForCausalLM`` when
  the config's ``model_type`` holds "qwen" and ``LLaMAForCausalLM`` otherwise; its ``from_hugging_face`` converts
  the base with ``convert_hf_llama`` and takes ``num_medusa_heads`` from the LLM API's ``speculative_config`` when
  given, else the heads' config.json ``medusa_num_heads`` (llm_args.py ``MedusaDecodingConfig.num_medusa_heads``,
  1.0 id 1520735490 / 1.1 id 1090804222: "defaults to the 'medusa_num_heads' value from the Medusa model's
  config.json"): lmi-trt's head count follows this LLM API path, not convert_checkpoint.py's flag.
  ``MedusaLayer.forward`` is ``x + ACT2FN[hidden_act](linear(x))`` with the base model's ``hidden_act``
  (``MedusaHead(..., hidden_act=config.hidden_act)``; convert_checkpoint.py, id 719502612, parses
  ``--medusa_hidden_act`` but writes no such key into the checkpoint config, so it is never read), silu for the
  LLaMA-family models lmi-trt builds; ``MedusaHead`` applies its layers then its own ``lm_head`` to the base model's
  last hidden state.
  Its ``ColumnLinear`` layers split over tensor-parallel ranks, which lmi-trt does not shard here (``plan_errors``).
* tensorrt_llm/builder.py ``build``: the 1.x copy (id 205252225: NVFP4, norm_quant_fusion, ReDrafter) copies the
  model config's ``max_draft_len`` into the build config only when the build's is 0 and leaves the mode to
  ``--speculative_decoding_mode`` (``BuildConfig.speculative_decoding_mode``); an older 0.x copy (id 3063623504)
  forced ``SpeculativeDecodingMode.MEDUSA`` and the model's draft length. lmi-trt sets both explicitly (the plan's
  ``speculative_decoding_mode`` and ``max_draft_len``), as the 1.x builder needs.
* tensorrt_llm/models/modeling_utils.py ``PretrainedModel.load`` (1.x id 1189552800): a missing tensor raises
  "Required but not provided tensors", an extra one is only a warning, and a tensor of another shape fails its
  parameter ("Encounter error ... for parameter"); ``convert_heads`` checks the heads' shapes against the base
  model's hidden and vocabulary sizes (model.py: each layer ``ColumnLinear(hidden, hidden, bias=True)``, the
  ``lm_head`` ``ColumnLinear(hidden, vocab, bias=False)``) so a mismatch names the heads folder instead.

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


def convert_heads(
    state: Mapping[str, Any], heads: MedusaHeads, key: str, sizes: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Pure: FasterDecoding's tensor names → TensorRT-LLM's (``load_medusa_hf``), refusing a missing tensor and, given
    the base model's ``sizes`` (hidden, vocabulary), one of another shape (model.py's parameters; module docstring)."""
    out: dict[str, Any] = {}

    def take(name: str, shape: tuple[int, ...] | None) -> Any:
        if name not in state:
            raise PlanError(
                key,
                name,
                f"the Medusa heads file lacks tensor {name!r} for {heads.num_heads} heads of {heads.num_layers} "
                f"layers (config.json medusa_num_heads/medusa_num_layers); it has "
                f"{', '.join(sorted(state)[:6])}{', ...' if len(state) > 6 else ''}",
                "set medusa_num_heads and medusa_num_layers in the heads' config.json to what the file holds",
            )
        got = tuple(state[name].shape)
        if shape is not None and got != shape:
            raise PlanError(
                key,
                name,
                f"the Medusa heads' tensor {name!r} is {list(got)} and the base model needs {list(shape)} (hidden "
                f"size {hidden}, vocabulary {vocab}; TensorRT-LLM's MedusaForCausalLm would fail loading it)",
                "use Medusa heads trained for this base model",
            )
        return state[name]

    hidden, vocab = sizes if sizes is not None else (None, None)
    square = (hidden, hidden) if hidden is not None else None
    for h in range(heads.num_heads):
        for layer in range(heads.num_layers):
            prefix = f"medusa_heads.{h}.medusa_layers.{layer}.linear."
            out[prefix + "weight"] = take(f"{h}.{layer}.linear.weight", square)
            out[prefix + "bias"] = take(f"{h}.{layer}.linear.bias", (hidden,) if hidden is not None else None)
        lm_head = (vocab, hidden) if sizes is not None else None
        out[f"medusa_heads.{h}.lm_head.weight"] = take(f"{h}.{heads.num_layers}.weight", lm_head)
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


def _load_state(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    import torch

    # weights_only: a pickled heads file runs no code when loaded.
    return torch.load(path, map_location="cpu", weights_only=True)


def read_heads(
    folder: Path, key: str, num_heads: int | None = None, sizes: tuple[int, int] | None = None
) -> tuple[MedusaHeads, dict[str, Any]]:
    """Reads the heads folder: its config.json's shape (``num_heads`` of them where given) and its tensors, under
    TensorRT-LLM's names (checked against the base model's ``sizes``, hidden and vocabulary, where given)."""
    heads = _heads_config(folder, key)
    if num_heads is not None:
        heads = MedusaHeads(num_heads, heads.num_layers)
    return heads, convert_heads(_load_state(heads_file(folder, key)), heads, key, sizes)


def head_sizes(folder: Path, num_layers: int, key: str) -> tuple[int, int] | None:
    """(hidden, vocabulary) of the first head's vocabulary projection ``0.{num_layers}.weight`` (safetensors: from
    the header alone), for the planner to check against the base model; None where the file lacks it (the build's
    ``convert_heads`` then names what is missing)."""
    path, name = heads_file(folder, key), f"0.{num_layers}.weight"
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            if name not in f.keys():  # noqa: SIM118 -- safe_open is not a Mapping
                return None
            vocab, hidden = f.get_slice(name).get_shape()
    else:
        state = _load_state(path)
        if name not in state:
            return None
        vocab, hidden = state[name].shape
    return int(hidden), int(vocab)


class MedusaPlan(BaseModel):
    """The heads a Medusa engine is built with: where they are (not part of the cache key), what they are (their
    folder's fingerprint) and how many heads and layers the checkpoint takes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    heads_dir: str
    fingerprint: str
    num_heads: int
    num_layers: int
    sizes: tuple[int, int] | None = None  # (hidden, vocabulary) of the heads' projections (``head_sizes``)


def plan_heads(folder: Path, fingerprint: str, num_heads: int | None, key: str) -> MedusaPlan:
    """The heads in ``folder`` (config.json read): ``num_heads`` where the configuration names it (llm_args.py's
    num_medusa_heads, which model.py prefers to config.json's), else the folder's own; the file must be there."""
    heads = _heads_config(folder, key)
    return MedusaPlan(
        heads_dir=str(folder),
        fingerprint=fingerprint,
        num_heads=num_heads or heads.num_heads,
        num_layers=heads.num_layers,
        sizes=head_sizes(folder, heads.num_layers, key),
    )


def plan_errors(
    medusa: MedusaPlan,
    key: str,
    trtllm_class: str,
    tp: int,
    pp: int,
    quantized: bool,
    lora: bool,
    base_sizes: tuple[int, int],
    dtype: tuple[str, str],
) -> PlanError | None:
    """Pure: why the compile stage cannot build this Medusa engine (model.py wraps LLaMA and QWen bases; lmi-trt
    converts LLaMA-family ones, unsplit, unquantized and without the LoRA plugin, none of which was read beside
    the heads), in ``dtype`` (the option as written, the planned one), for heads of the base model's ``base_sizes``
    (hidden, vocabulary)."""
    if trtllm_class != "LLaMAForCausalLM":
        return PlanError(
            key,
            "medusa",
            f"the compile stage builds Medusa engines on LLaMA-family models (TensorRT-LLM's LLaMAForCausalLM), and "
            f"this model converts with {trtllm_class}",
            "serve it without speculative decoding, or with lookahead decoding",
        )
    if dtype[1] == "float32":
        # examples/medusa/README.md's Support Matrix (every copy read, ids 5217130389 and 713996416) lists FP16 and
        # BF16 (and an FP8 base) only
        return PlanError(
            "option.dtype",
            dtype[0],
            "Medusa engines are built in float16 or bfloat16 (examples/medusa/README.md, Support Matrix), not float32",
            "set option.dtype=fp16 or bf16, or leave it out",
        )
    if medusa.sizes is not None and medusa.sizes != base_sizes:
        return PlanError(
            key,
            medusa.heads_dir,
            f"the Medusa heads project hidden size {medusa.sizes[0]} onto a vocabulary of {medusa.sizes[1]}, and the "
            f"base model has hidden size {base_sizes[0]} and {base_sizes[1]} tokens (TensorRT-LLM's MedusaForCausalLm "
            "would fail loading them: module docstring)",
            "use Medusa heads trained for this base model",
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

    config_path = checkpoint / "config.json"
    base = json.loads(config_path.read_text())  # rank 0 wrote it (build.py: save_config on rank 0 only)
    _, state = read_heads(Path(medusa.heads_dir), key, medusa.num_heads, (base["hidden_size"], base["vocab_size"]))
    shard = checkpoint / f"rank{rank}.safetensors"
    with safe_open(str(shard), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 -- safe_open is not a Mapping
    tensors.update({name: t.to(getattr(torch, dtype)).contiguous() for name, t in state.items()})
    save_file(tensors, str(shard), metadata=metadata)
    if rank == 0:
        heads = MedusaHeads(medusa.num_heads, medusa.num_layers)
        config_path.write_text(json.dumps(checkpoint_config(base, heads, max_draft_len), indent=4))
