"""LoRA adapters on TensorRT-LLM's Executor (the tensorrt backend): what an engine built with the LoRA plugin takes,
and a PEFT adapter in the layout its ``LoraConfig`` wants.

Sources (NVIDIA/TensorRT-LLM; the index holds one copy of each path, dated by content as noted):
* ``tensorrt_llm/lora_manager.py`` (a 1.x copy: it has ``load_torch_hf_lora`` and DoRA rows):
  ``LoraManager.LORA_MODULE_IDS`` and ``get_default_trtllm_modules_to_hf_modules`` name the modules (q_proj is
  ``attn_q`` = 1, k_proj ``attn_k`` = 2, v_proj ``attn_v`` = 3, o_proj ``attn_dense`` = 4, gate_proj
  ``mlp_h_to_4h`` = 5, down_proj ``mlp_4h_to_h`` = 6, up_proj ``mlp_gate`` = 7); ``load_from_hf`` turns each
  (layer, module) into one row: ``A`` [r, in] flattened, then ``B·scale`` [out, r] flattened (scale =
  ``lora_alpha / r``, ``lora_alpha / sqrt(r)`` with ``use_rslora``, folded into B), cast to the model's dtype, rows
  zero-padded to the longest and stacked [rows, longest]; the config is int32 [rows, 3 or 4]: module id, layer,
  rank (and is_dora from the DoRA release on). It keeps full (not tensor-parallel split) weights for the Executor
  ("For Executor, only rank 0 can enqueue requests, and should hold all lora weights", its runner).
* ``cpp/tensorrt_llm/batch_manager/llmRequest.h`` (every copy from 0.11's ``externalDraftTokensConfig`` on): the
  request's 2-D weights and config are unsqueezed to [1, rows, ...]; ``cpp/tensorrt_llm/runtime/loraUtils.cpp``
  then checks: both or neither given, config int32 with 3 columns (3 or 4 once DoRA came), weights of the model's
  dtype in host memory, each row's layer in range, rank > 0 and ≤ the engine's max_lora_rank, its module one the
  engine was built for ("lora module X not enabled for this model"), and enough values for its in+out size.
  Three columns are accepted by every release, so that is what is sent (no DoRA here: read_adapter refuses it).
* ``cpp/tensorrt_llm/runtime/loraModule.cpp`` ``createLoraModules`` (commit 2a9abd95): each module's in and out
  sizes from the model config: attn_q hidden → heads × head size, attn_k/attn_v hidden → kv heads × head size,
  attn_dense hidden → hidden, mlp_h_to_4h/mlp_gate hidden → mlp hidden, mlp_4h_to_h mlp hidden → hidden. loraUtils
  only checks a row against the padded width, so the Executor would read a wrongly shaped adapter at these sizes
  without a word: lmi-trt compares the shapes at registration.
* The PEFT cache's sizing and the module names the JIT build targets: ``lmi_trt.compile.lora``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmi_trt.compile.lora import TARGET_MODULES

from .base import EngineError

# HF (PEFT) module → (TensorRT-LLM lora module, LoraManager.LORA_MODULE_IDS id), lora_manager.py.
MODULES = {
    "q_proj": ("attn_q", 1),
    "k_proj": ("attn_k", 2),
    "v_proj": ("attn_v", 3),
    "o_proj": ("attn_dense", 4),
    "gate_proj": ("mlp_h_to_4h", 5),
    "down_proj": ("mlp_4h_to_h", 6),
    "up_proj": ("mlp_gate", 7),
}


@dataclass(frozen=True)
class LoraBuild:
    """What an engine's config.json says of its LoRA plugin (build_config.plugin_config.lora_plugin and
    build_config.lora_config, as ``Engine.save`` writes BuildConfig.to_dict)."""

    plugin: bool
    max_lora_rank: int | None
    target_modules: tuple[str, ...]

    @classmethod
    def of(cls, build: dict) -> LoraBuild:
        plugin = (build.get("plugin_config") or {}).get("lora_plugin")
        lora = build.get("lora_config") or {}
        on = plugin is not None and str(plugin).lower() not in ("disable", "none", "false", "")
        rank = lora.get("max_lora_rank")
        return cls(on, int(rank) if rank is not None else None, tuple(lora.get("lora_target_modules") or ()))


def module_dims(pretrained: dict) -> dict[str, tuple[int, int]]:
    """(in, out) of each HF projection as the engine's LoRA modules take them (loraModule.cpp, module docstring), from
    config.json's pretrained_config; empty where it lacks the sizes."""
    try:
        hidden, heads = int(pretrained["hidden_size"]), int(pretrained["num_attention_heads"])
        kv_heads = int(pretrained.get("num_key_value_heads") or heads)
        head = int(pretrained.get("head_size") or hidden // heads)
        mlp = int(pretrained["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return {}
    q, kv = (hidden, heads * head), (hidden, kv_heads * head)
    return {
        "q_proj": q,
        "k_proj": kv,
        "v_proj": kv,
        "o_proj": (hidden, hidden),
        "gate_proj": (hidden, mlp),
        "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }


def shape_error(name: str, adapter: Any, dims: dict[str, tuple[int, int]]) -> EngineError | None:
    """A 400 naming the first (layer, module) whose A [r, in] / B [out, r] do not match the engine's sizes."""
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        want = dims.get(module)
        if want is not None and (a.shape[1], b.shape[0]) != want:
            return EngineError(
                f"LoRA adapter {name!r}: {module} of layer {layer} maps {a.shape[1]} → {b.shape[0]} values, but the "
                f"engine's {module} maps {want[0]} → {want[1]} (its config.json pretrained_config); the adapter was "
                "trained for another model",
                code=400,
                field="adapter",
            )
    return None


def executor_tensors(name: str, adapter: Any, built: LoraBuild, dims: dict[str, tuple[int, int]]) -> tuple[Any, Any]:
    """An adapter read by ``engines.torch.lora.read_adapter`` (A [r, in] and scaling·B [out, r] per (layer, HF
    module), the model's dtype) as ``LoraConfig``'s (weights [rows, longest], config int32 [rows, 3]); 400 naming
    the modules the engine was not built for or whose shapes differ from the engine's (``dims``: module_dims)."""
    import torch

    missing = sorted({m for _, m in adapter.weights if MODULES[m][0] not in built.target_modules})
    if missing:
        raise EngineError(
            f"LoRA adapter {name!r} targets {', '.join(missing)}, which the engine was not built for (its "
            f"lora_target_modules: {', '.join(built.target_modules) or 'none'}); rebuild it with trtllm-build "
            f"--lora_target_modules {' '.join(TARGET_MODULES)}",
            code=400,
            field="adapter",
        )
    wrong = shape_error(name, adapter, dims)
    if wrong is not None:
        raise wrong
    rows, keys = [], []
    for (layer, module), (a, b) in sorted(adapter.weights.items()):
        rows.append(torch.cat([a.contiguous().flatten(), b.contiguous().flatten()]))
        keys.append([MODULES[module][1], layer, a.shape[0]])
    longest = max(r.numel() for r in rows)
    weights = torch.stack([torch.nn.functional.pad(r, (0, longest - r.numel())) for r in rows])
    return weights, torch.tensor(keys, dtype=torch.int32)
