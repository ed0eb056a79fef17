"""Value vocabularies and DJL defaults that both the configuration and the compile stage use.

A leaf module (it imports nothing of lmi_trt), so ``config`` parses user input into these values and
``compile`` plans with the same ones: one quantization vocabulary, one list of model variants, and
the defaults both sides take by reference instead of repeating a number.
"""

from __future__ import annotations

import enum

# DJL's Java front end sets option.max_rolling_batch_size=256 for the trtllm rolling batch
# (deepjavalibrary/djl-serving, wlm/src/main/java/ai/djl/serving/wlm/LmiConfigRecommender.java,
# setRollingBatchSize; 32 for the other backends). The engine registry's trtllm entry and the compile
# plan's fallback are this value.
TRTLLM_DEFAULT_BATCH = 256
# option.kv_cache_free_gpu_mem_fraction's default: LmiConfig's field and the plan's memory estimate.
KV_CACHE_FREE_GPU_MEM_FRACTION = 0.95
# The KV-cache fractions' exclusive upper bound (option.kv_cache_free_gpu_mem_fraction and
# option.draft_kv_cache_free_gpu_mem_fraction): NVIDIA/TensorRT-LLM cpp/tensorrt_llm/executor/kvCacheConfig.cpp
# setFreeGpuMemoryFraction, which the KvCacheConfig constructor calls (0.x and 1.x copies), checks
# "freeGpuMemoryFraction < 1.F", and kvCacheManager.cpp calculateFreeMemBytes (every copy read, 0.x to 1.x): "Invalid
# freeMemFraction, freeMemFraction (%f) must be smaller than 1.0f".
FREE_FRACTION_BELOW = 1.0
# AWQ group sizes (option.awq_block_size, DJL's 64 and 128): what the configuration accepts and all the
# planner suggests when a model's per-rank dimensions do not divide by the chosen one (NVIDIA/TensorRT-LLM
# examples/quantization/quantize.py --awq_block_size, default 128).
AWQ_BLOCK_SIZES: tuple[int, ...] = (64, 128)

# option.tokens_per_block: the paged KV-cache block sizes (powers of two) the configuration accepts.
TOKENS_PER_BLOCK: tuple[int, ...] = tuple(2**n for n in range(3, 9))


class Quantization(str, enum.Enum):
    """DJL's ``option.quantize`` and Truss's ``quantization_type``, one name each (None = off).

    The values are what the engine-cache key records, so they do not change.
    """

    SMOOTHQUANT = "smoothquant"  # W8A8 SmoothQuant
    AWQ = "awq"  # W4A16 AWQ (or W4A8 with option.q_format=w4a8_awq)
    FP8 = "fp8"  # fp8 weights and activations
    FP8_KV = "fp8_kv"  # fp8 weights/activations and an fp8 KV cache
    WEIGHTS_INT8 = "weights_int8"  # int8 weight-only (W8A16)
    WEIGHTS_INT8_KV_INT8 = "weights_int8_kv_int8"
    WEIGHTS_INT4 = "weights_int4"  # int4 weight-only (W4A16)
    WEIGHTS_INT4_KV_INT8 = "weights_int4_kv_int8"  # TensorRT-LLM has no int4 KV cache

    @property
    def needs_calibration(self) -> bool:
        """Calibration data is read for activation or KV-cache scales; plain weight-only needs none."""
        return self not in (Quantization.WEIGHTS_INT8, Quantization.WEIGHTS_INT4)


# What TensorRT-LLM's PyTorch backend loads of these, as modelopt checkpoints: FP8 per tensor, FP8 KV cache,
# W4A16/W4A8 AWQ (NVIDIA/TensorRT-LLM docs/source/features/quantization.md); the rest are TensorRT-engine formats.
PYTORCH_QUANTIZATIONS = frozenset({Quantization.FP8, Quantization.FP8_KV, Quantization.AWQ})

# Input spellings → Quantization (None = no quantization): DJL's, Truss's legacy names included.
QUANTIZE_NAMES: dict[str, Quantization | None] = {
    "none": None,
    "no_quant": None,
    "smoothquant": Quantization.SMOOTHQUANT,
    "smooth_quant": Quantization.SMOOTHQUANT,
    "awq": Quantization.AWQ,
    "fp8": Quantization.FP8,
    "fp8_kv": Quantization.FP8_KV,
    "weights_int8": Quantization.WEIGHTS_INT8,
    "weights_kv_int8": Quantization.WEIGHTS_INT8_KV_INT8,
    "weights_int8_kv_int8": Quantization.WEIGHTS_INT8_KV_INT8,
    "weights_int4": Quantization.WEIGHTS_INT4,
    # Truss's first config called int4 weights + int8 KV "weights_kv_int4" (there is no int4 KV cache).
    "weights_kv_int4": Quantization.WEIGHTS_INT4_KV_INT8,
    "weights_int4_kv_int8": Quantization.WEIGHTS_INT4_KV_INT8,
}

# Per-family variant keys: accepted value → TensorRT-LLM converter value (from_hugging_face's
# chatglm_version / model_version / gpt_variant keywords).
CHATGLM_VERSIONS: dict[str, str] = {
    # DJL master / TensorRT-LLM spellings
    "glm": "glm",
    "chatglm": "chatglm",
    "chatglm2": "chatglm2",
    "chatglm3": "chatglm3",
    "glm4": "glm4",
    # DJL ≤0.29 spellings
    "chatglm_6b": "chatglm",
    "chatglm2_6b": "chatglm2",
    "chatglm2_6b_32k": "chatglm2",
    "chatglm3_6b": "chatglm3",
    "chatglm3_6b_base": "chatglm3",
    "chatglm3_6b_32k": "chatglm3",
    "glm_10b": "glm",
}
BAICHUAN_VERSIONS: dict[str, str] = {v: v for v in ("v1_7b", "v1_13b", "v2_7b", "v2_13b")}
GPT_VARIANTS: dict[str, str] = {v: v for v in ("gpt2", "santacoder", "starcoder", "starcoder2", "nemotron", "jais")}


def quantization_name(value: Quantization | None) -> str:
    """The name a message shows; ``none`` for no quantization."""
    return "none" if value is None else value.value
