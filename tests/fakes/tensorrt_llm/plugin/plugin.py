"""Fake ``tensorrt_llm.plugin.PluginConfig``, per release (NVIDIA/TensorRT-LLM ``tensorrt_llm/plugin/plugin.py``):

* 0.12, 1.0, 1.1: a ``@dataclass(slots=True)`` whose fields are all ``init=False``. ``PluginConfig()``
  takes no keywords (keywords raise ``TypeError``); values are set attribute by attribute or through
  ``from_dict`` / ``update_from_dict`` ("enable"/"disable" accepted there); ``to_dict`` serialises it
  into the engine's config.json. Slots: setting a name that is not a field raises ``AttributeError``.
* 0.12 differs again: ``use_fused_mlp`` is a ``BuildConfig`` field there, not a plugin field
  (``tensorrt_llm/builder.py`` at v0.12.0).
* 1.2: a pydantic model (NVIDIA/TensorRT-LLM PR 8277), keyword construction, ``validate_assignment``,
  extra keys ignored; PR 8277 removed ``from_dict`` / ``update_from_dict`` / ``to_dict``.

``PluginConfig`` is rebound whenever the impersonated release changes (``_state.on_change``).
Field names and defaults are the 1.x listing in ``trtllm_api_surface.py``; the fields lmi_trt never
sets are not told apart per release.
"""

from __future__ import annotations

import dataclasses
import enum
import sys

from pydantic import BaseModel, ConfigDict, field_validator

from tensorrt_llm import _state

_DTYPES = {"auto", "float16", "bfloat16", "float32", "int8", "fp8", "nvfp4", "int32"}


class ContextFMHAType(enum.IntEnum):
    disabled = 0
    enabled = 1
    enabled_with_fp32_acc = 2


# (name, annotation, default) in the real declaration order (1.x).
_FIELDS: tuple[tuple[str, object, object], ...] = (
    ("dtype", str, "float16"),
    ("bert_attention_plugin", str | None, "auto"),
    ("gpt_attention_plugin", str | None, "auto"),
    ("gemm_plugin", str | None, None),
    ("gemm_swiglu_plugin", str | None, None),
    ("fp8_rowwise_gemm_plugin", str | None, None),
    ("qserve_gemm_plugin", str | None, None),
    ("identity_plugin", str | None, None),
    ("nccl_plugin", str | None, "auto"),
    ("lora_plugin", str | None, None),
    ("dora_plugin", bool, False),
    ("weight_only_groupwise_quant_matmul_plugin", str | None, None),
    ("weight_only_quant_matmul_plugin", str | None, None),
    ("smooth_quant_plugins", bool, True),
    ("smooth_quant_gemm_plugin", str | None, None),
    ("layernorm_quantization_plugin", str | None, None),
    ("rmsnorm_quantization_plugin", str | None, None),
    ("quantize_per_token_plugin", bool, False),
    ("quantize_tensor_plugin", bool, False),
    ("moe_plugin", str | None, "auto"),
    ("mamba_conv1d_plugin", str | None, "auto"),
    ("low_latency_gemm_plugin", str | None, None),
    ("low_latency_gemm_swiglu_plugin", str | None, None),
    ("gemm_allreduce_plugin", str | None, None),
    ("context_fmha", bool, True),
    ("bert_context_fmha_fp32_acc", bool, False),
    ("paged_kv_cache", bool | None, None),
    ("remove_input_padding", bool, True),
    ("norm_quant_fusion", bool, False),
    ("reduce_fusion", bool, False),
    ("user_buffer", bool, False),
    ("tokens_per_block", int, 32),
    ("use_paged_context_fmha", bool, True),
    ("use_fp8_context_fmha", bool, True),
    ("fuse_fp4_quant", bool, False),
    ("multiple_profiles", bool, False),
    ("paged_state", bool, True),
    ("streamingllm", bool, False),
    ("manage_weights", bool, False),
    ("use_fused_mlp", bool, True),
    ("pp_reduce_scatter", bool, False),
)
_PLUGIN_TYPE = str | None


def _coerce(name: str, annotation, value):
    """trtllm-build style strings: plugins take a dtype or "disable", features "enable"/"disable"."""
    if value == "disable":
        return None if annotation == _PLUGIN_TYPE else False
    if value == "enable" and annotation != _PLUGIN_TYPE:
        return True
    if annotation == _PLUGIN_TYPE and value is not None and value not in _DTYPES:
        raise ValueError(f"{name}={value!r}: expected one of {sorted(_DTYPES)} or 'disable'")
    return value


class _Helpers:
    """Methods both shapes have (``plugin.py``: context FMHA, paged KV cache, NCCL, LoRA setters)."""

    __slots__ = ()

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


def _dataclass_plugin_config(fields: tuple[tuple[str, object, object], ...]):
    """The ≤ 1.1 shape: ``@dataclass(slots=True)``, every field ``init=False``."""
    namespace = {
        "__annotations__": {name: annotation for name, annotation, _ in fields},
        **{name: dataclasses.field(default=default, init=False) for name, _, default in fields},
    }

    def update_from_dict(self, config: dict):
        for name, value in config.items():
            if name in self._FIELD_TYPES:  # unknown keys are skipped, as the real loop does (hasattr check)
                setattr(self, name, _coerce(name, self._FIELD_TYPES[name], value))

    def from_dict(cls, config: dict):
        plugin_config = cls()
        plugin_config.update_from_dict(config)
        return plugin_config

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    namespace.update(update_from_dict=update_from_dict, from_dict=classmethod(from_dict), to_dict=to_dict)
    cls = type("PluginConfig", (_Helpers,), namespace)
    cls.__module__ = __name__
    cls = dataclasses.dataclass(slots=True)(cls)
    cls._FIELD_TYPES = {name: annotation for name, annotation, _ in fields}
    return cls


# 0.12: use_fused_mlp lives on BuildConfig (tensorrt_llm/builder.py, v0.12.0), not here.
_PluginConfig012 = _dataclass_plugin_config(tuple(f for f in _FIELDS if f[0] != "use_fused_mlp"))
# 1.0 and 1.1: tensorrt_llm/plugin/plugin.py at v1.0.0 / v1.1.0.
_PluginConfig10 = _dataclass_plugin_config(_FIELDS)


class _PluginConfig12(_Helpers, BaseModel):
    """1.2: pydantic (PR 8277); no from_dict/update_from_dict/to_dict any more."""

    model_config = ConfigDict(validate_assignment=True, extra="ignore")
    __annotations__ = {name: annotation for name, annotation, _ in _FIELDS}
    locals().update({name: default for name, _, default in _FIELDS})

    @field_validator("*", mode="before")
    @classmethod
    def _enable_disable(cls, value, info):
        return _coerce(info.field_name, cls.model_fields[info.field_name].annotation, value)


_PluginConfig12.__name__ = _PluginConfig12.__qualname__ = "PluginConfig"

PluginConfig = _PluginConfig10


def _for_release(version: str):
    """The ``PluginConfig`` class of a release."""
    series = _state.series(version)
    if series[0] == 0:
        return _PluginConfig012
    return _PluginConfig12 if series >= (1, 2) else _PluginConfig10


def _select(version: str) -> None:
    cls = _for_release(version)
    sys.modules[__name__].PluginConfig = cls
    package = sys.modules.get("tensorrt_llm.plugin")
    if package is not None:
        package.PluginConfig = cls


_state.on_change(_select)
