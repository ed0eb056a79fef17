"""``CompileOptions``: the compile-time settings the planner reads, decoupled from ``LmiConfig``.

Names follow the DJL keys without ``option.``. The serving path builds them in one place,
``lmi_trt.engines.registry.compile_options``, from the configuration; a field here has the type
and default of the ``LmiConfig`` field of the same name (tests/unit/test_arch_registry.py checks
it). ``None`` means "let the planner decide from the model, the GPU and the TensorRT-LLM version",
and the plan then says what it chose.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmi_trt.vocabulary import AWQ_BLOCK_SIZES, QUANTIZE_NAMES, TOKENS_PER_BLOCK, Quantization

from .errors import PlanError


def normalize_quantize(value: Any) -> Quantization | None:
    """Any accepted spelling (or a ``Quantization``) → ``Quantization``; None = not quantized."""
    if value is None or isinstance(value, Quantization):
        return value
    text = str(getattr(value, "value", value)).strip().lower()
    if text not in QUANTIZE_NAMES:
        raise PlanError("option.quantize", value, "unknown quantization", "Use one of: " + ", ".join(QUANTIZE_NAMES))
    return QUANTIZE_NAMES[text]


class CompileOptions(BaseModel):
    """Every compile-time input the planner uses, and nothing else."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_input_len: int = Field(1024, ge=1)
    # Max NEW tokens per request (DJL ≤0.29 meaning). The engine's max_seq_len is
    # max_input_len + max_output_len; the plan states it (DJL 0.30+ silently clipped, djl#3489).
    max_output_len: int = Field(512, ge=1)
    # Total length; None → max_input_len + max_output_len. Set lower, a long prompt gets fewer new tokens.
    max_seq_len: int | None = Field(None, ge=2)
    max_num_tokens: int | None = Field(None, ge=1)
    # option.max_rolling_batch_size as the engine registry settled it; None (tests) → DEFAULT_MAX_BATCH_SIZE.
    max_batch_size: int | None = Field(None, ge=1)
    max_beam_width: int = Field(1, ge=1)
    max_draft_len: int = Field(0, ge=0)
    dtype: Literal["auto", "fp16", "bf16", "fp32"] = "auto"
    tensor_parallel_degree: int | Literal["max"] = 1
    pipeline_parallel_degree: int = Field(1, ge=1)
    quantize: Quantization | None = None
    smoothquant_alpha: float = Field(0.8, gt=0.0, le=1.0)
    smoothquant_per_token: bool = False
    smoothquant_per_channel: bool = False
    multi_query_mode: bool = False
    q_format: Literal["int4_awq", "w4a8_awq"] = "int4_awq"
    calib_size: int = Field(512, ge=1)
    calib_batch_size: int = Field(32, ge=1)
    calib_max_seq_length: int = Field(512, ge=1)
    awq_block_size: Literal[AWQ_BLOCK_SIZES] = 128
    calib_dataset: str | None = None
    use_fused_mlp: bool = False
    rotary_base: float | None = Field(None, gt=0)
    rotary_dim: int | None = Field(None, ge=1)
    rotary_scaling_type: Literal["linear", "dynamic"] | None = None
    rotary_scaling_factor: float | None = Field(None, gt=1)
    baichuan_model_version: str | None = None
    chatglm_model_version: str | None = None
    gpt_model_version: str | None = None
    tokens_per_block: Literal[TOKENS_PER_BLOCK] | None = None
    use_paged_context_fmha: bool | None = None
    logits_dtype: Literal["fp32", "fp16"] = "fp32"
    enable_kv_cache_reuse: bool = False
    use_custom_all_reduce: bool = False
    multi_block_mode: bool | None = None
    use_fp8_context_fmha: bool = False
    trust_remote_code: bool = False

    @field_validator("quantize", mode="before")
    @classmethod
    def _quantize(cls, v: Any) -> Quantization | None:
        return normalize_quantize(v)

    @field_validator("tensor_parallel_degree")
    @classmethod
    def _tp(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("tensor_parallel_degree must be >= 1 or 'max'")
        return v
