"""LoRA in a TensorRT engine: what the JIT build asks trtllm-build's way for, and the PEFT cache it sizes (pure).

Sources (NVIDIA/TensorRT-LLM; one stored copy per path, dated by content):
* ``tensorrt_llm/commands/build.py`` ``build_model`` (0.12-era copy: ``use_fused_mlp`` still a BuildConfig field;
  the same block in 1.x): with ``plugin_config.lora_plugin`` set, ``build_config.lora_config = LoraConfig(lora_dir=,
  lora_ckpt_source=, max_lora_rank=)`` and ``lora_config.lora_target_modules`` from ``--lora_target_modules``
  ("command line options is preferred over the modules in the lora dir"); ``--max_lora_rank`` defaults to 64, as
  ``LoraConfig.max_lora_rank`` does (tensorrt_llm/lora_manager.py).
* ``tensorrt_llm/builder.py`` ``build``: ``if build_config.plugin_config.lora_plugin is not None:
  model.use_lora(build_config.lora_config)`` (0.12-era and 1.x copies), which (lora_manager.py ``load_hf_lora``)
  takes the target modules from ``lora_dir`` when none are given, raises "lora_target_modules is empty" when there
  are neither, and adds the missing ones of q/k/v (``get_missing_qkv_modules``); ``BuildConfig.to_dict`` writes
  ``lora_config.to_dict()`` into the engine's config.json.
* The module names of a Llama-shaped decoder (``get_default_trtllm_modules_to_hf_modules``): attn_q/k/v (q/k/v_proj),
  attn_dense (o_proj), mlp_h_to_4h (gate_proj), mlp_gate (up_proj), mlp_4h_to_h (down_proj). The JIT build targets
  all seven: an adapter may use any subset (a module it lacks has no rows and adds nothing).
* The PEFT cache: executor.h ``PeftCacheConfig`` counts "max sized 1-layer 1-module adapterSize=1 sets of weights";
  the LLM API sizes it for a LoRA-plugin engine as max_lora_rank × layers × len(lora_target_modules +
  missing_qkv_modules) × max_loras on the device, × max_cpu_loras in host memory (``tensorrt_llm/llmapi/llm.py``
  ``_TrtLLM._build_model``), with the engine's built rank. lmi-trt sizes with option.max_lora_rank, which may be
  below it, so it also passes ``max_adapter_size`` = that rank: ``PeftCacheManager``'s constructor clamps
  ``maxAdapterSize`` to min(it, the engine's max_lora_rank) (default 64) and refuses to start ("Not enough space
  allocated to device LoRA cache to hold 1 max sized LoRA") when the cache holds less than one adapter of that
  size (``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` ``getPageManagerConfig``, a 1.x copy; the
  ``PeftCacheConfig`` keywords are in every release's binding). ``optimal_adapter_size`` (default 8) is clamped
  the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The families whose decoder layers have the seven Llama projections (the torch engine's read_adapter reads the same).
LORA_FAMILIES = frozenset({"llama", "mistral", "qwen2"})
TARGET_MODULES = ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h")
QKV = ("attn_q", "attn_k", "attn_v")


def with_missing_qkv(targets: Iterable[str]) -> list[str]:
    """``lora_target_modules + LoraManager.get_missing_qkv_modules(...)``: q, k and v are all on or all off."""
    targets = list(targets)
    if any(m in targets for m in QKV):
        targets += [m for m in QKV if m not in targets]
    return targets


def peft_cache_sizes(rank: int, num_layers: int, targets: Sequence[str], max_loras: int, max_cpu_loras: int) -> dict:
    """``PeftCacheConfig`` keywords, as the LLM API sizes them, for adapters of rank ≤ ``rank`` (module docstring)."""
    module_layers = rank * num_layers * len(with_missing_qkv(targets))
    return {
        "max_adapter_size": rank,
        "optimal_adapter_size": min(8, rank),
        "num_device_module_layer": module_layers * max_loras,
        "num_host_module_layer": module_layers * max_cpu_loras,
    }


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def host_module_layers(sizes: Sequence[int], num_layers: int, rank: int, adapters: int) -> int:
    """``num_host_module_layer`` for a host cache that holds ``adapters`` adapters of rank ``rank`` on every module
    (``sizes``: each enabled module's in + out) in whole pages. The Executor counts pages, not module-layers
    (``cpp/tensorrt_llm/batch_manager/peftCacheManager.cpp`` ``getPageManagerConfig``/``getMaxNumSlots``, a 1.x copy):
    a slot is the smallest module's in + out values; a page holds max(optimalAdapterSize × Σ ceilDiv(size, slot) ×
    layers, ceilDiv(maxAdapterSize × largest size, slot)) slots; N module-layers are N × ceilDiv(largest, slot)
    slots; a task takes ceilDiv(rank × size, slot) slots a row in whole pages (``cpp/tensorrt_llm/runtime/
    loraCache.cpp`` ``determineNumPages``). The LLM API's count can round to fewer pages than adapters."""
    width, widest = min(sizes), max(sizes)
    per_page = max(min(8, rank) * sum(_ceil(s, width) for s in sizes) * num_layers, _ceil(rank * widest, width))
    task_pages = _ceil(num_layers * sum(_ceil(rank * s, width) for s in sizes), per_page)
    return _ceil(adapters * task_pages * per_page, _ceil(widest, width))


def peft_device_bytes(sizes: dict, widest_in_out: int, itemsize: int) -> int:
    """The device cache's bytes: a unit is one rank of one module in one layer, ``in + out`` weights of the widest
    module (executor.h's "max sized" set)."""
    return sizes["num_device_module_layer"] * widest_in_out * itemsize
