"""``CompileOptions``: the compile-time settings the planner reads, decoupled from ``LmiConfig``.

Names follow the DJL keys without ``option.`` (``reference/djl_lmi.md`` §1.3); ``from_config``
reads them from any object by ``getattr`` so the config stage can change shape without touching
the planner. Defaults are DJL's where DJL documents one; ``None`` means "let the planner decide
from the model, the GPU and the TensorRT-LLM version", and the plan then says what it chose.
"""

from __future__ import annotations

from enum import Enum
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .errors import PlanError


class Quantize(str, Enum):
    """The quantization choices, one name each (DJL's and Truss' spellings map onto these)."""

    NONE = "none"
    WEIGHTS_INT8 = "weights_int8"        # W8A16, no calibration
    WEIGHTS_INT4 = "weights_int4"        # W4A16, no calibration
    WEIGHTS_KV_INT8 = "weights_kv_int8"  # W8A16 + INT8 KV cache (calibrated KV scales)
    WEIGHTS_KV_INT4 = "weights_kv_int4"  # W4A16 + INT8 KV cache: TRT-LLM has no INT4 KV cache
    SMOOTHQUANT = "smoothquant"          # W8A8 SmoothQuant
    AWQ = "awq"                          # W4A16 AWQ (or W4A8 AWQ with q_format=w4a8_awq)
    FP8 = "fp8"                          # FP8 weights and activations
    FP8_KV = "fp8_kv"                    # FP8 weights, activations and KV cache


# DJL (smoothquant|awq|fp8) and Truss (no_quant|weights_int8|...|smooth_quant|fp8|fp8_kv) spellings.
_QUANTIZE_ALIASES: dict[str, Quantize] = {
    "": Quantize.NONE,
    "none": Quantize.NONE,
    "no_quant": Quantize.NONE,
    "smooth_quant": Quantize.SMOOTHQUANT,
    "weights_only_int8": Quantize.WEIGHTS_INT8,
    "weights_only_int4": Quantize.WEIGHTS_INT4,
    "weights_int4_kv_int8": Quantize.WEIGHTS_KV_INT4,
    "weights_int8_kv_int8": Quantize.WEIGHTS_KV_INT8,
    **{q.value: q for q in Quantize},
}


def normalize_quantize(value: Any) -> Quantize:
    """Any accepted spelling (a string or another module's enum member) → ``Quantize``."""
    if value is None:
        return Quantize.NONE
    if isinstance(value, Quantize):
        return value
    raw = getattr(value, "value", value)
    text = str(raw).strip().lower()
    found = _QUANTIZE_ALIASES.get(text)
    if found is None:
        raise PlanError("option.quantize", raw, "unknown quantization",
                        "Use one of: " + ", ".join(sorted(k for k in _QUANTIZE_ALIASES if k)))
    return found


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
    max_batch_size: int | None = Field(None, ge=1)   # option.max_rolling_batch_size
    max_beam_width: int = Field(1, ge=1)
    max_draft_len: int = Field(0, ge=0)
    dtype: Literal["auto", "fp16", "bf16", "fp32"] = "auto"
    tensor_parallel_degree: int | Literal["max"] = 1
    pipeline_parallel_degree: int = Field(1, ge=1)
    quantize: Quantize = Quantize.NONE
    smoothquant_alpha: float = Field(0.8, ge=0.0, le=1.0)
    smoothquant_per_token: bool = False
    smoothquant_per_channel: bool = False
    multi_query_mode: bool = False
    q_format: Literal["int4_awq", "w4a8_awq"] = "int4_awq"
    calib_size: int = Field(512, ge=1)
    calib_batch_size: int = Field(32, ge=1)
    calib_max_seq_length: int = Field(512, ge=1)
    awq_block_size: int = Field(128, ge=1)
    calib_dataset: str | None = None
    use_fused_mlp: bool | None = None
    rotary_base: float | None = Field(None, gt=0)
    rotary_dim: int | None = Field(None, ge=1)
    rotary_scaling_type: Literal["linear", "dynamic"] | None = None
    rotary_scaling_factor: float | None = None
    baichuan_model_version: str | None = None
    chatglm_model_version: str | None = None
    gpt_model_version: str | None = None
    tokens_per_block: int | None = Field(None, ge=1)
    use_paged_context_fmha: bool | None = None
    logits_dtype: Literal["fp32", "fp16"] = "fp32"
    enable_kv_cache_reuse: bool = False
    use_custom_all_reduce: bool | None = None
    multi_block_mode: bool | None = None
    use_fp8_context_fmha: bool = False
    trust_remote_code: bool = False

    @field_validator("quantize", mode="before")
    @classmethod
    def _quantize(cls, v: Any) -> Quantize:
        return normalize_quantize(v)

    @field_validator("tensor_parallel_degree")
    @classmethod
    def _tp(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("tensor_parallel_degree must be >= 1 or 'max'")
        return v

    @classmethod
    def from_config(cls, config: Any) -> CompileOptions:
        """Read the same-named attributes from an ``LmiConfig`` (or any object).

        An attribute that is missing or ``None`` keeps the default here, so a config stage that
        does not know a key yet still yields a valid plan.
        """
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            source = "max_rolling_batch_size" if name == "max_batch_size" else name
            value = getattr(config, source, None)
            if value is None:
                continue
            if name == "quantize":
                value = normalize_quantize(value)  # a PlanError here, not a pydantic wrapper
            elif isinstance(value, Enum):
                value = value.value
            elif isinstance(value, PurePath):
                value = str(value)
            values[name] = value
        return cls(**values)
