"""``CompileOptions``: the compile-time settings the planner reads, a view of the keys' declarations.

Names follow the DJL keys without ``option.``; each field's type, bounds and default are its key's
(``lmi_trt.keys.reads``), and the serving path fills them in one place, ``lmi_trt.stages.compile_options``.
``None`` means "let the planner decide from the model, the GPU and the TensorRT-LLM version",
and the plan then says what it chose.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from lmi_trt.keys import reads
from lmi_trt.vocabulary import QUANTIZE_NAMES, Quantization

from .errors import PlanError
from .medusa import MedusaPlan


def normalize_quantize(value: Any) -> Quantization | None:
    """Any accepted spelling (or a ``Quantization``) → ``Quantization``; None = not quantized."""
    if value is None or isinstance(value, Quantization):
        return value
    text = str(getattr(value, "value", value)).strip().lower()
    if text not in QUANTIZE_NAMES:
        raise PlanError("option.quantize", value, "unknown quantization", "Use one of: " + ", ".join(QUANTIZE_NAMES))
    return QUANTIZE_NAMES[text]


class CompileOptions(
    reads(
        "max_input_len",
        # Max NEW tokens per request (DJL ≤0.29 meaning). The engine's max_seq_len is
        # max_input_len + max_output_len; the plan states it (DJL 0.30+ silently clipped, djl#3489).
        "max_output_len",
        # Total length; None → max_input_len + max_output_len. Set lower, a long prompt gets fewer new tokens.
        "max_seq_len",
        "max_num_tokens",
        "max_beam_width",
        "dtype",
        "tensor_parallel_degree",
        "pipeline_parallel_degree",
        "quantize",
        "smoothquant_alpha",
        "smoothquant_per_token",
        "smoothquant_per_channel",
        "multi_query_mode",
        "q_format",
        "calib_size",
        "calib_batch_size",
        "calib_max_seq_length",
        "awq_block_size",
        "calib_dataset",
        "use_fused_mlp",
        "rotary_base",
        "rotary_dim",
        "rotary_scaling_type",
        "rotary_scaling_factor",
        "baichuan_model_version",
        "chatglm_model_version",
        "gpt_model_version",
        "tokens_per_block",
        "use_paged_context_fmha",
        "logits_dtype",
        "enable_kv_cache_reuse",
        "use_custom_all_reduce",
        "multi_block_mode",
        "use_fp8_context_fmha",
        "trust_remote_code",
        # LoRA: the LoRA plugin and its max rank are built in; max_loras sizes the PEFT cache the plan counts
        "enable_lora",
        "max_lora_rank",
        "max_loras",
        # option.max_rolling_batch_size as the wiring settled it; None (tests) → DEFAULT_MAX_BATCH_SIZE.
        max_batch_size="max_rolling_batch_size",
    )
):
    """Every compile-time input the planner uses, and nothing else."""

    # Speculative decoding as the configuration settled it (lmi_trt.stages.compile_options, from
    # lmi_trt.speculative.resolve): trtllm-build's --speculative_decoding_mode name, the draft tokens per step the
    # engine is built for (--max_draft_len), and the key that asked for it (for messages).
    speculative_decoding_mode: str | None = None
    max_draft_len: int = Field(0, ge=0)
    speculative_key: str = "option.speculative_decoding_mode"
    speculative_method: str | None = None  # lmi_trt.speculative's method name (ngram, draft_model, lookahead, ...)
    # Medusa: the heads folder as fetched and read (None until it is on local disk: ``lmi-trt plan`` does not fetch)
    medusa: MedusaPlan | None = None

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
