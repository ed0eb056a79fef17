"""Fake ``tensorrt_llm.quantization``."""

from tensorrt_llm.quantization.mode import QuantAlgo, QuantMode
from tensorrt_llm.quantization.quantize_by_modelopt import quantize_and_export

__all__ = ["QuantAlgo", "QuantMode", "quantize_and_export"]
