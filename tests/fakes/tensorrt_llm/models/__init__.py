"""Fake ``tensorrt_llm.models``: ``MODEL_MAP`` (the project's subset of NVIDIA/TensorRT-LLM
tensorrt_llm/models/__init__.py) and its classes."""

from tensorrt_llm.models.modeling_utils import PretrainedConfig, PretrainedModel, QuantConfig


class LLaMAForCausalLM(PretrainedModel):
    pass


class FalconForCausalLM(PretrainedModel):
    pass


class QWenForCausalLM(PretrainedModel):
    pass


class ChatGLMForCausalLM(PretrainedModel):
    pass


class GPTJForCausalLM(PretrainedModel):
    pass


class GPTForCausalLM(PretrainedModel):
    pass


class BaichuanForCausalLM(PretrainedModel):
    pass


class DeepseekForCausalLM(PretrainedModel):
    pass


class DeepseekV2ForCausalLM(PretrainedModel):
    pass


MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
    "MistralForCausalLM": LLaMAForCausalLM,
    "MixtralForCausalLM": LLaMAForCausalLM,
    "InternLMForCausalLM": LLaMAForCausalLM,
    "InternLM2ForCausalLM": LLaMAForCausalLM,
    "FalconForCausalLM": FalconForCausalLM,
    "RWForCausalLM": FalconForCausalLM,
    "QWenLMHeadModel": QWenForCausalLM,
    "QWenForCausalLM": QWenForCausalLM,
    "Qwen2ForCausalLM": QWenForCausalLM,
    "Qwen2MoeForCausalLM": QWenForCausalLM,
    "Qwen3ForCausalLM": QWenForCausalLM,
    "ChatGLMModel": ChatGLMForCausalLM,
    "ChatGLMForCausalLM": ChatGLMForCausalLM,
    "ChatGLMForConditionalGeneration": ChatGLMForCausalLM,
    "GLMModel": ChatGLMForCausalLM,
    "GPTJForCausalLM": GPTJForCausalLM,
    "GPT2LMHeadModel": GPTForCausalLM,
    "GPT2LMHeadCustomModel": GPTForCausalLM,
    "GPTBigCodeForCausalLM": GPTForCausalLM,
    "Starcoder2ForCausalLM": GPTForCausalLM,
    "BaichuanForCausalLM": BaichuanForCausalLM,
    "BaiChuanForCausalLM": BaichuanForCausalLM,
    "DeepseekForCausalLM": DeepseekForCausalLM,
    "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
}

__all__ = [
    "MODEL_MAP",
    "PretrainedConfig",
    "PretrainedModel",
    "QuantConfig",
    *sorted({cls.__name__ for cls in MODEL_MAP.values()}),
]
