"""Fake ``tensorrt_llm.quantization.mode``: ``QuantAlgo`` (a str enum, value == name) and ``QuantMode``."""

from __future__ import annotations

import enum


class QuantAlgo(str, enum.Enum):
    W8A16 = "W8A16"
    W4A16 = "W4A16"
    W4A16_AWQ = "W4A16_AWQ"
    W4A8_AWQ = "W4A8_AWQ"
    W8A16_GPTQ = "W8A16_GPTQ"
    W4A16_GPTQ = "W4A16_GPTQ"
    W8A8_SQ_PER_CHANNEL = "W8A8_SQ_PER_CHANNEL"
    W8A8_SQ_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN"
    W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN = "W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN"
    W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN = "W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN"
    W4A8_QSERVE_PER_GROUP = "W4A8_QSERVE_PER_GROUP"
    W4A8_QSERVE_PER_CHANNEL = "W4A8_QSERVE_PER_CHANNEL"
    FP8 = "FP8"
    FP8_PER_CHANNEL_PER_TOKEN = "FP8_PER_CHANNEL_PER_TOKEN"
    FP8_BLOCK_SCALES = "FP8_BLOCK_SCALES"
    INT8 = "INT8"
    MIXED_PRECISION = "MIXED_PRECISION"
    NVFP4 = "NVFP4"
    W4A8_NVFP4_FP8 = "W4A8_NVFP4_FP8"
    W4A8_MXFP4_FP8 = "W4A8_MXFP4_FP8"
    W4A8_MXFP4_MXFP8 = "W4A8_MXFP4_MXFP8"
    W4A16_MXFP4 = "W4A16_MXFP4"
    NO_QUANT = "NO_QUANT"

    def __str__(self):
        return self.value


class QuantMode(enum.IntFlag):
    INT4_WEIGHTS = enum.auto()
    INT8_WEIGHTS = enum.auto()
    ACTIVATIONS = enum.auto()
    PER_CHANNEL = enum.auto()
    PER_TOKEN = enum.auto()
    PER_GROUP = enum.auto()
    INT8_KV_CACHE = enum.auto()
    FP8_KV_CACHE = enum.auto()
    FP8_QDQ = enum.auto()
    FP8_ROWWISE = enum.auto()
    FP8_1x128_128x128 = enum.auto()
    W4A8_QSERVE = enum.auto()
    NVFP4 = enum.auto()
    NVFP4_KV_CACHE = enum.auto()
    W4A8_NVFP4_FP8 = enum.auto()
    W4A8_MXFP4_FP8 = enum.auto()
    W4A8_MXFP4_MXFP8 = enum.auto()
    W4A16_MXFP4 = enum.auto()

    @staticmethod
    def use_weight_only(use_int4_weights=False, per_group=False):
        mode = QuantMode.INT4_WEIGHTS if use_int4_weights else QuantMode.INT8_WEIGHTS
        return mode | QuantMode.PER_GROUP if per_group else mode

    @staticmethod
    def use_smooth_quant(per_token=False, per_channel=False):
        mode = QuantMode.INT8_WEIGHTS | QuantMode.ACTIVATIONS
        if per_token:
            mode |= QuantMode.PER_TOKEN
        if per_channel:
            mode |= QuantMode.PER_CHANNEL
        return mode

    @staticmethod
    def from_quant_algo(quant_algo=None, kv_cache_quant_algo=None):
        mode = QuantMode(0)
        if quant_algo is not None:
            mode |= _ALGO_MODES[QuantAlgo(quant_algo)]
        if kv_cache_quant_algo is not None:
            mode |= _KV_MODES[QuantAlgo(kv_cache_quant_algo)]
        return mode

    def is_int8_weight_only(self):
        return self.is_weight_only() and bool(self & QuantMode.INT8_WEIGHTS)

    def is_int4_weight_only(self):
        return self.is_weight_only() and bool(self & QuantMode.INT4_WEIGHTS)

    def is_weight_only(self):
        return bool(self & (QuantMode.INT4_WEIGHTS | QuantMode.INT8_WEIGHTS)) and not self & QuantMode.ACTIVATIONS

    def is_int4_weight_only_per_group(self):
        return self.is_int4_weight_only() and bool(self & QuantMode.PER_GROUP)

    def has_act_and_weight_quant(self):
        return bool(self & QuantMode.ACTIVATIONS) and bool(self & (QuantMode.INT4_WEIGHTS | QuantMode.INT8_WEIGHTS))

    def has_int8_kv_cache(self):
        return bool(self & QuantMode.INT8_KV_CACHE)

    def has_fp8_kv_cache(self):
        return bool(self & QuantMode.FP8_KV_CACHE)

    def has_kv_cache_quant(self):
        return bool(self & (QuantMode.INT8_KV_CACHE | QuantMode.FP8_KV_CACHE | QuantMode.NVFP4_KV_CACHE))

    def has_fp8_qdq(self):
        return bool(self & QuantMode.FP8_QDQ)

    def has_nvfp4(self):
        return bool(self & QuantMode.NVFP4)

    def has_any_quant(self):
        return self != 0

    def to_dict(self):
        return {f"has_{m.name.lower()}": bool(self & m) for m in QuantMode}


_Q = QuantMode
_ALGO_MODES = {
    QuantAlgo.W8A16: _Q.INT8_WEIGHTS,
    QuantAlgo.W4A16: _Q.INT4_WEIGHTS,
    QuantAlgo.W4A16_AWQ: _Q.INT4_WEIGHTS | _Q.PER_GROUP,
    QuantAlgo.W4A16_GPTQ: _Q.INT4_WEIGHTS | _Q.PER_GROUP,
    QuantAlgo.W8A16_GPTQ: _Q.INT8_WEIGHTS | _Q.PER_GROUP,
    QuantAlgo.W4A8_AWQ: _Q.INT4_WEIGHTS | _Q.ACTIVATIONS | _Q.PER_GROUP,
    QuantAlgo.W8A8_SQ_PER_CHANNEL: _Q.INT8_WEIGHTS | _Q.ACTIVATIONS | _Q.PER_CHANNEL,
    QuantAlgo.W8A8_SQ_PER_TENSOR_PLUGIN: _Q.INT8_WEIGHTS | _Q.ACTIVATIONS,
    QuantAlgo.W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN: _Q.INT8_WEIGHTS | _Q.ACTIVATIONS | _Q.PER_CHANNEL | _Q.PER_TOKEN,
    QuantAlgo.W8A8_SQ_PER_CHANNEL_PER_TENSOR_PLUGIN: _Q.INT8_WEIGHTS | _Q.ACTIVATIONS | _Q.PER_CHANNEL,
    QuantAlgo.W8A8_SQ_PER_TENSOR_PER_TOKEN_PLUGIN: _Q.INT8_WEIGHTS | _Q.ACTIVATIONS | _Q.PER_TOKEN,
    QuantAlgo.W4A8_QSERVE_PER_GROUP: _Q.W4A8_QSERVE | _Q.PER_GROUP,
    QuantAlgo.W4A8_QSERVE_PER_CHANNEL: _Q.W4A8_QSERVE,
    QuantAlgo.FP8: _Q.FP8_QDQ,
    QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN: _Q.FP8_ROWWISE,
    QuantAlgo.FP8_BLOCK_SCALES: _Q.FP8_1x128_128x128,
    QuantAlgo.INT8: _Q(0),
    QuantAlgo.MIXED_PRECISION: _Q(0),
    QuantAlgo.NVFP4: _Q.NVFP4,
    QuantAlgo.W4A8_NVFP4_FP8: _Q.W4A8_NVFP4_FP8,
    QuantAlgo.W4A8_MXFP4_FP8: _Q.W4A8_MXFP4_FP8,
    QuantAlgo.W4A8_MXFP4_MXFP8: _Q.W4A8_MXFP4_MXFP8,
    QuantAlgo.W4A16_MXFP4: _Q.W4A16_MXFP4,
    QuantAlgo.NO_QUANT: _Q(0),
}
_KV_MODES = {QuantAlgo.INT8: _Q.INT8_KV_CACHE, QuantAlgo.FP8: _Q.FP8_KV_CACHE, QuantAlgo.NVFP4: _Q.NVFP4_KV_CACHE}
