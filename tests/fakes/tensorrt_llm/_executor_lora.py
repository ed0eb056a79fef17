"""The fake Executor's LoRA (private): a request's ``LoraConfig`` checked as TensorRT-LLM checks it, its weights
decoded from the real layout back into per-module A and B, kept in a host cache of the ``PeftCacheConfig``'s size,
and applied to the tiny torch model's projections while that request's tokens go through it.

What is real here (NVIDIA/TensorRT-LLM; one stored copy per path, dated by content):
* the layout: ``tensorrt_llm/lora_manager.py`` ``LoraManager.load_from_hf`` (1.x copy): a row per (layer, module),
  ``A`` [r, in] flattened then ``B`` (scaled) [out, r] flattened, zero-padded; config rows ``[module id, layer,
  rank(, is_dora)]``; module ids ``LORA_MODULE_IDS`` and HF names ``get_default_trtllm_modules_to_hf_modules``;
* the checks, in their order: ``cpp/tensorrt_llm/runtime/loraUtils.cpp`` ``loraValidateRequestTensorDims`` /
  ``loraValidateRequestTensors`` (the 2-D tensors of ``executor::LoraConfig`` are unsqueezed to [1, ...] by
  ``LlmRequest``, cpp/tensorrt_llm/batch_manager/llmRequest.h): "Request for LoRA inference must have both
  lora_weights and lora_keys", int32 keys, 3 (3 or 4 from the DoRA release) columns, the model's dtype, the layer
  range, rank > 0, "lora module X not enabled for this model", "lora_weights has to few values for X", rank ≤
  max_lora_rank ("Invalid low_rank");
* the cache: ``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` ``addRequestPeft``: a task id without weights
  that the cache does not hold fails the request with "LoRA task N not found in cache. Please send LoRA weights with
  request" (an error Response: cpp/tests executorTest ``LoRA task 10 not found in cache``); weights sent for a task
  put it in the host cache, which evicts tasks no request uses, and fails the request with "PEFT Cache is full. Could
  not store taskId=N" when none can go (``LoraCache`` claimPagesWithEvict's LoraCacheFullException, rethrown there);
  a task the host cache holds keeps its weights when sent again (``LoraCache::put`` returns for a present task).
* the pages (``PeftCacheManager`` constructor and ``getPageManagerConfig``/``getMaxNumSlots``, a 1.x copy):
  ``_Pages`` below. The constructor refuses to start when either cache holds less than one adapter of
  min(max_adapter_size, the engine's max_lora_rank).
* the device cache: the capacity scheduler claims a running task's PEFT pages once per distinct task and leaves a
  request pending while its new task's pages do not fit (``determineNumPages``, availablePeftPages:
  cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp, every stored copy).
Simplifications: the host cache is filled when the scheduler takes a request, not when the Executor fetches it;
3-column rows only (DoRA's fourth column is refused here, not read).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

# LoraManager.LORA_MODULE_IDS → (TensorRT-LLM module name, HF submodule path in a Llama decoder layer).
MODULE_IDS = {
    1: ("attn_q", "self_attn.q_proj"),
    2: ("attn_k", "self_attn.k_proj"),
    3: ("attn_v", "self_attn.v_proj"),
    4: ("attn_dense", "self_attn.o_proj"),
    5: ("mlp_h_to_4h", "mlp.gate_proj"),
    6: ("mlp_4h_to_h", "mlp.down_proj"),
    7: ("mlp_gate", "mlp.up_proj"),
}


def _error(msg: str) -> RuntimeError:
    return RuntimeError(f"[TensorRT-LLM][ERROR] Assertion failed: {msg}")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _Pages:
    """The page arithmetic of peftCacheManager.cpp ``getPageManagerConfig`` (1.x copy): a slot is ``pageWidth`` =
    the smallest enabled module's in+out values; ``numSlotsPerPage`` = max(optimalAdapterSize × Σ_modules
    ceilDiv(in+out, pageWidth) × layers, ceilDiv(maxAdapterSize × max in+out, pageWidth)); a cache of N module-layers
    has N × ceilDiv(max in+out, pageWidth) slots (``getMaxNumSlots``), rounded up to whole pages; a task's rows take
    ceilDiv(rank × (in+out), pageWidth) slots each, in whole pages (``LoraCache::determineNumPages``)."""

    def __init__(self, sizes: dict[int, int], layers: int, max_rank: int, values: dict) -> None:
        optimal = min(int(values.get("optimal_adapter_size", 8)), max_rank)  # the constructor's clamps
        largest = min(int(values.get("max_adapter_size", 64)), max_rank)
        self.sizes, self.width = sizes, min(sizes.values())
        widest = max(sizes.values())
        per_page = optimal * sum(_ceil(s, self.width) for s in sizes.values()) * layers
        self.per_page = max(per_page, _ceil(largest * widest, self.width))
        least = _ceil(largest * sum(sizes.values()) * layers, self.width)
        self.pages = {}
        for where in ("host", "device"):
            # 0 means a size in bytes or a fraction of free memory instead (getMaxNumSlots): ample for the tiny model
            slots = int(values.get(f"num_{where}_module_layer", 0)) * _ceil(widest, self.width) or 1 << 40
            if slots < least:
                raise _error(
                    f"Not enough space allocated to {where} LoRA cache to hold 1 max sized LoRA {slots} < {least}"
                )
            self.pages[where] = _ceil(slots, self.per_page)

    def of(self, config) -> int:
        slots = sum(_ceil(rank * self.sizes[module], self.width) for module, _, rank in config.tolist())
        return max(1, _ceil(slots, self.per_page))


class LoraRuntime:
    def __init__(self, engine_dir: Path, model, precision: str, peft_cache_config) -> None:
        build = json.loads((engine_dir / "config.json").read_text()).get("build_config", {})
        plugin = (build.get("plugin_config") or {}).get("lora_plugin")
        lora = build.get("lora_config") or {}
        enabled = plugin not in (None, "disable") and lora.get("lora_target_modules")
        self.modules = {i for i, (name, _) in MODULE_IDS.items() if enabled and name in lora["lora_target_modules"]}
        self.max_rank = int(lora.get("max_lora_rank", 64))
        self.model = model
        self.dtype = precision
        self.cache: OrderedDict[int, tuple[dict, int]] = OrderedDict()  # task id → (A/B by (layer, path), pages)
        self._active: dict | None = None
        # an engine built without the LoRA plugin has nothing to hook (benchmarks/pump_bench.py runs no model at all)
        layers = model.model.layers if self.modules else []
        if layers:
            values = getattr(peft_cache_config, "_values", {}) if peft_cache_config is not None else {}
            sizes = {}
            for i in self.modules:
                linear = layers[0].get_submodule(MODULE_IDS[i][1])
                sizes[i] = linear.in_features + linear.out_features
            self.pages = _Pages(sizes, len(layers), self.max_rank, values)
        for index, layer in enumerate(layers):
            for _, path in MODULE_IDS.values():
                module = layer.get_submodule(path)
                module.register_forward_hook(self._hook(index, path))

    def _hook(self, index: int, path: str):
        def add(module, inputs, output):
            pair = self._active.get((index, path)) if self._active else None
            if pair is None:
                return output
            a, b = pair
            return output + (inputs[0].to(a.dtype) @ a.t() @ b.t()).to(output.dtype)

        return add

    def use(self, weights: dict | None) -> None:
        """The adapter the model's next passes apply (None: the base model); set before every pass."""
        self._active = weights

    def fits(self, lora_config, running: list) -> bool:
        """Whether the scheduler takes a request now: its task already runs, or its pages fit beside the running
        tasks' (``running``: the running requests' LoraConfigs)."""
        if lora_config is None:
            return True
        tasks = {c.task_id: self._pages(c) for c in running if c is not None}
        if lora_config.task_id in tasks:
            return True
        return sum(tasks.values()) + self._pages(lora_config) <= self.pages.pages["device"]

    def _pages(self, lora_config) -> int:
        if lora_config.config is not None:
            return self.pages.of(lora_config.config)
        cached = self.cache.get(lora_config.task_id)
        return cached[1] if cached is not None else 0

    def admit(self, lora_config, in_use: set[int]) -> dict | None:
        """The request's adapter weights (None: the base model), its task put into or found in the host cache;
        ``in_use``: task ids of requests running or waiting (not evictable)."""
        if lora_config is None:
            return None
        task, weights, config = lora_config.task_id, lora_config.weights, lora_config.config
        if weights is None and config is None:
            if task not in self.cache:
                raise RuntimeError(f"LoRA task {task} not found in cache. Please send LoRA weights with request")
            self.cache.move_to_end(task)
            return self.cache[task][0]
        decoded = self._decode(weights, config)
        if task in self.cache:  # LoraCache::put: a task present is only bumped; its weights stay
            self.cache.move_to_end(task)
            return self.cache[task][0]
        pages = self.pages.of(config)
        while sum(p for _, p in self.cache.values()) + pages > self.pages.pages["host"]:
            victim = next((t for t in self.cache if t not in in_use), None)
            if victim is None:  # addRequestPeft rethrows LoraCacheFullException with this text
                raise RuntimeError(f"PEFT Cache is full. Could not store taskId={task}")
            del self.cache[victim]
        self.cache[task] = (decoded, pages)
        return decoded

    def _decode(self, weights, config) -> dict:
        import torch

        if weights is None or config is None:
            raise _error("Request for LoRA inference must have both lora_weights and lora_keys")
        if weights.dim() != 2 or config.dim() != 2:  # LlmRequest unsqueezes 2-D to the checked 3-D
            raise _error("Invalid shape for lora_weights tensor")
        if weights.device.type != "cpu" or config.device.type != "cpu":
            raise _error("Expected lora weights to be in CPU memory")
        if config.dtype != torch.int32:
            raise _error(f"Expected  lora keys to have TYPE_INT32 but was {config.dtype}")
        if config.shape[0] != weights.shape[0]:
            raise _error("Expected dim1 lora_weights and lora_keys to have the same size")
        if config.shape[1] != 3:
            raise _error("Expected dim2 of lora_keys to have a size of 3")
        if weights.dtype != getattr(torch, self.dtype):
            raise _error("Expected lora weights to be the same data type as base model")
        layers = self.model.model.layers
        decoded = {}
        for row, (module_id, layer, rank) in enumerate(config.tolist()):
            if not 0 <= layer < len(layers):
                raise _error("Expected layerId to be in the range [0, numModelLayers)")
            if rank <= 0:
                raise _error("Expected adapterSize to be > 0")
            if module_id not in self.modules:
                name = MODULE_IDS.get(module_id, (str(module_id),))[0]
                raise _error(f"lora module {name} not enabled for this model")
            name, path = MODULE_IDS[module_id]
            linear = layers[layer].get_submodule(path)
            fan_in, fan_out = linear.in_features, linear.out_features
            if rank * (fan_in + fan_out) > weights.shape[1]:
                raise _error(f"lora_weights has to few values for {name}")
            if rank > self.max_rank:
                raise _error(f"Invalid low_rank ({rank}). low_rank must be smaller than mMaxLowRank ({self.max_rank})")
            flat = weights[row].float()
            a = flat[: rank * fan_in].reshape(rank, fan_in)
            b = flat[rank * fan_in : rank * (fan_in + fan_out)].reshape(fan_out, rank)
            decoded[layer, path] = (a, b)
        return decoded
