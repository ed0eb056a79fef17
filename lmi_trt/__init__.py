"""lmi-trt: a serving.properties-driven LLM inference server for TensorRT-LLM."""

__version__ = "0.1.0"
