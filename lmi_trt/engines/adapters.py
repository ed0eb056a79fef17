"""LoRA adapters as the engines serve them: a PEFT adapter folder read and checked (``read_adapter``), and the table of
registered adapters an ``AdapterHost`` keeps (``AdapterTable``: names, ``option.max_cpu_loras``, 404 for an unknown
name, 409 for a name taken or one that requests are using), shared by the torch engine and the LLM API engine.

A PEFT LoRA folder is ``adapter_config.json`` and ``adapter_model.safetensors`` (peft's
``save_pretrained``; huggingface/peft src/peft/utils/save_and_load.py). Its tensors are named
``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight``, A ``[r, in]`` and B ``[out, r]``,
and the layer computes ``W x + scaling · B (A x)`` with ``scaling = lora_alpha / r``, or ``lora_alpha / sqrt(r)``
with ``use_rslora`` (peft src/peft/tuners/lora/layer.py, ``LoraLayer.update_layer``). Only that plain form of the
seven projections of a Llama block is served (the torch engine's decode loop, engines/torch/lora.py; the LLM
API's PyTorch backend, engines/llmapi.py); what would change the math otherwise (DoRA, trained biases,
``modules_to_save``, per-module rank or alpha patterns, fan-in-fan-out weights, other targets such as the
embeddings or lm_head) is refused when the adapter is registered, naming the field, never ignored.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from .base import AdapterInfo, EngineError
from .lora_sizes import GROUPS

if TYPE_CHECKING:
    import torch

MODULES = tuple(m for parts in GROUPS.values() for m in parts)
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
_TENSOR = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(MODULES) + r")\.lora_([AB])\.weight"
)
# adapter_config.json fields that change the math when set, and the value that leaves it plain LoRA.
_PLAIN = {
    "use_dora": False,
    "bias": "none",
    "fan_in_fan_out": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "layer_replication": None,
    "trainable_token_indices": None,
    "lora_bias": False,
    "use_qalora": False,
    "alora_invocation_tokens": None,
    "arrow_config": None,
}


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter read into host memory: per (layer, module) its ``A [r, in]`` and ``scaling · B [out, r]``."""

    name: str
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    # Unique per load: the prefix cache keys an adapter's blocks by it (a name registered again with other
    # weights must not find the old weights' keys and values).
    key: bytes = field(default_factory=lambda: secrets.token_bytes(16))

    @property
    def modules(self) -> frozenset[str]:
        """The PEFT modules it adapts (``MODULES``' names)."""
        return frozenset(module for _, module in self.weights)

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def _refuse(name: str, folder: Path, why: str) -> EngineError:
    return EngineError(f"LoRA adapter {name!r} ({folder}): {why}", code=400, field="adapter")


def read_adapter(
    name: str,
    folder: Path,
    *,
    max_rank: int,
    num_layers: int,
    dtype: torch.dtype,
    rslora: str | None = None,
) -> LoraAdapter:
    """The adapter in ``folder`` (PEFT's layout), checked against what the engine applies; an ``EngineError``
    (400) names what cannot be served and what would. ``rslora``: why ``use_rslora`` is refused, where the engine
    does not scale by ``lora_alpha / sqrt(r)`` (None: it does)."""
    from safetensors.torch import load_file  # torch: only where an adapter is read

    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise _refuse(name, folder, f"a PEFT LoRA adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise _refuse(name, folder, f"{CONFIG_FILE} is not JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise _refuse(name, folder, f"peft_type={config.get('peft_type')!r}: only LORA adapters are served")
    for key, plain in _PLAIN.items():
        if config.get(key, plain) not in (plain, None, [], {}):
            raise _refuse(name, folder, f"{key}={config[key]!r} is not applied here; adapters with {key}={plain!r}")
    if config.get("use_rslora") and rslora is not None:
        raise _refuse(name, folder, f"use_rslora=true: {rslora}; adapters with use_rslora=false")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise _refuse(name, folder, f"r={rank!r}, lora_alpha={alpha!r}: a positive integer rank and a number alpha")
    if rank > max_rank:
        raise _refuse(name, folder, f"rank {rank} is above option.max_lora_rank={max_rank}; raise it to {rank}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for tensor_name, tensor in load_file(str(weights_path)).items():
        found = _TENSOR.fullmatch(tensor_name)
        if found is None:
            raise _refuse(
                name, folder, f"tensor {tensor_name!r} is not a LoRA A or B of {', '.join(MODULES)} in a decoder layer"
            )
        layer = int(found.group(1))
        if layer >= num_layers:
            raise _refuse(name, folder, f"tensor {tensor_name!r}: the model has {num_layers} layers")
        pairs.setdefault((layer, found.group(2)), {})[found.group(3)] = tensor
    weights = {}
    for (layer, module), pair in pairs.items():
        if set(pair) != {"A", "B"}:
            raise _refuse(name, folder, f"layer {layer} {module} has lora_{''.join(pair)} without its pair")
        a, b = pair["A"], pair["B"]
        if a.shape[0] != rank or b.shape[1] != rank:
            raise _refuse(name, folder, f"layer {layer} {module}: A {tuple(a.shape)}, B {tuple(b.shape)} for r={rank}")
        weights[layer, module] = (a.to(dtype), (b.float() * scaling).to(dtype))
    if not weights:
        raise _refuse(name, folder, f"{WEIGHTS_FILE} holds no LoRA weights")
    return LoraAdapter(name, rank, weights)


def write_adapter(folder: Path, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]) -> int:
    """``read_adapter``'s inverse: per (layer, module) ``A`` and already scaled ``B`` as a PEFT folder (scaling 1:
    ``lora_alpha = r``); returns the rank. PEFT has one ``r`` (a per-module one is its ``rank_pattern``, which
    ``read_adapter`` refuses), so modules of a smaller rank are padded with zeros to the largest."""
    import torch
    from safetensors.torch import save_file

    rank = max(a.shape[0] for a, _ in weights.values())
    part = {m: "mlp" if m in GROUPS["gate_up"] + GROUPS["down"] else "self_attn" for m in MODULES}
    tensors = {}
    for (layer, module), (a, b) in weights.items():
        stem = f"base_model.model.model.layers.{layer}.{part[module]}.{module}"
        pad = rank - a.shape[0]  # zero rows of A and columns of B: the same B·A at the adapter's one rank
        tensors[f"{stem}.lora_A.weight"] = torch.nn.functional.pad(a, (0, 0, 0, pad)).contiguous()
        tensors[f"{stem}.lora_B.weight"] = torch.nn.functional.pad(b, (0, pad)).contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": rank,
        "target_modules": sorted({m for _, m in weights}),
    }
    (folder / CONFIG_FILE).write_text(json.dumps(config))
    save_file(tensors, str(folder / WEIGHTS_FILE))
    return rank


T = TypeVar("T")


class AdapterTable(Generic[T]):
    """The adapters an engine serves by name, each an ``AdapterInfo`` and what the engine keeps for it (``T``).
    ``using(name)``: how many requests in flight name it (an adapter in use is not unregistered)."""

    def __init__(self, *, enabled: bool, max_registered: int | None, using: Callable[[str], int]) -> None:
        self.enabled, self.max_registered, self._using = enabled, max_registered, using
        self._entries: dict[str, tuple[AdapterInfo, T]] = {}

    def infos(self) -> list[AdapterInfo]:
        return [info for info, _ in self._entries.values()]

    def check_room(self, name: str) -> None:
        """Before reading an adapter: 400 when adapters are off, 409 for a name taken or a full table."""
        if not self.enabled:
            raise EngineError("LoRA adapters are off: set option.enable_lora=true", code=400, field="adapter")
        if name in self._entries:
            raise EngineError(f"LoRA adapter {name!r} is registered already; unregister it first", code=409)
        if self.max_registered is not None and len(self._entries) >= self.max_registered:
            raise EngineError(
                f"option.max_cpu_loras={self.max_registered} adapters are registered; unregister one first, or "
                "raise option.max_cpu_loras",
                code=409,
            )

    def add(self, info: AdapterInfo, value: T) -> None:
        """Once read (the name checked again: registered meanwhile is a 409)."""
        self.check_room(info.name)
        self._entries[info.name] = (info, value)

    def remove(self, name: str) -> None:
        """404 for a name not registered; 409 while a request uses it."""
        if name not in self._entries:
            raise EngineError(f"LoRA adapter {name!r} is not registered", code=404, field="adapter")
        using = self._using(name)
        if using:
            raise EngineError(
                f"LoRA adapter {name!r} is in use by {using} request(s); unregister it once they finish", code=409
            )
        del self._entries[name]

    def get(self, name: str) -> T:
        """What the engine keeps for a registered adapter; 404 for an unknown name."""
        found = self._entries.get(name)
        if found is None:
            raise EngineError(f"LoRA adapter {name!r} is not registered", code=404, field="adapter")
        return found[1]
