"""Fake ``tensorrt_llm.plugin.PluginConfig`` (1.x: pydantic, keyword-only, validate_assignment, extra ignored)."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, field_validator

_DTYPES = {"auto", "float16", "bfloat16", "float32", "int8", "fp8", "nvfp4", "int32"}


class ContextFMHAType(enum.IntEnum):
    disabled = 0
    enabled = 1
    enabled_with_fp32_acc = 2


class PluginConfig(BaseModel):
    model_config = ConfigDict(validate_assignment=True, extra="ignore")

    dtype: str = "float16"
    bert_attention_plugin: str | None = "auto"
    gpt_attention_plugin: str | None = "auto"
    gemm_plugin: str | None = None
    gemm_swiglu_plugin: str | None = None
    fp8_rowwise_gemm_plugin: str | None = None
    qserve_gemm_plugin: str | None = None
    identity_plugin: str | None = None
    nccl_plugin: str | None = "auto"
    lora_plugin: str | None = None
    dora_plugin: bool = False
    weight_only_groupwise_quant_matmul_plugin: str | None = None
    weight_only_quant_matmul_plugin: str | None = None
    smooth_quant_plugins: bool = True
    smooth_quant_gemm_plugin: str | None = None
    layernorm_quantization_plugin: str | None = None
    rmsnorm_quantization_plugin: str | None = None
    quantize_per_token_plugin: bool = False
    quantize_tensor_plugin: bool = False
    moe_plugin: str | None = "auto"
    mamba_conv1d_plugin: str | None = "auto"
    low_latency_gemm_plugin: str | None = None
    low_latency_gemm_swiglu_plugin: str | None = None
    gemm_allreduce_plugin: str | None = None
    context_fmha: bool = True
    bert_context_fmha_fp32_acc: bool = False
    paged_kv_cache: bool | None = None
    remove_input_padding: bool = True
    norm_quant_fusion: bool = False
    reduce_fusion: bool = False
    user_buffer: bool = False
    tokens_per_block: int = 32
    use_paged_context_fmha: bool = True
    use_fp8_context_fmha: bool = True
    fuse_fp4_quant: bool = False
    multiple_profiles: bool = False
    paged_state: bool = True
    streamingllm: bool = False
    manage_weights: bool = False
    use_fused_mlp: bool = True
    pp_reduce_scatter: bool = False

    @field_validator("*", mode="before")
    @classmethod
    def _enable_disable(cls, value, info):
        # trtllm-build style strings: plugins take a dtype or "disable", features "enable"/"disable".
        annotation = cls.model_fields[info.field_name].annotation
        if value == "disable":
            return None if annotation == (str | None) else False
        if value == "enable" and annotation != (str | None):
            return True
        if annotation == (str | None) and value is not None and value not in _DTYPES:
            raise ValueError(f"{info.field_name}={value!r}: expected one of {sorted(_DTYPES)} or 'disable'")
        return value

    @property
    def context_fmha_type(self):
        if not self.context_fmha:
            return ContextFMHAType.disabled
        return ContextFMHAType.enabled_with_fp32_acc if self.bert_context_fmha_fp32_acc else ContextFMHAType.enabled

    @context_fmha_type.setter
    def context_fmha_type(self, value):
        self.set_context_fmha(value)

    def is_context_fmha_enabled(self):
        return self.context_fmha

    def set_context_fmha(self, context_fmha_type=ContextFMHAType.enabled):
        self.context_fmha = context_fmha_type != ContextFMHAType.disabled
        self.bert_context_fmha_fp32_acc = context_fmha_type == ContextFMHAType.enabled_with_fp32_acc
        return self

    def enable_paged_kv_cache(self, tokens_per_block=32):
        self.paged_kv_cache = True
        self.tokens_per_block = tokens_per_block
        return self

    def set_nccl_plugin(self, dtype="auto"):
        self.nccl_plugin = dtype
        return self

    def set_lora_plugin(self, dtype=None):
        self.lora_plugin = dtype
        return self
