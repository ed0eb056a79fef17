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


class MedusaForCausalLm(PretrainedModel):
    """tensorrt_llm/models/medusa/model.py (a 1.x copy, id 906315928): a LLaMA (or QWen) model plus
    ``num_medusa_heads`` heads, each ``num_medusa_layers`` residual layers and an ``lm_head``, whose checkpoint tensors
    are ``medusa_heads.{h}.medusa_layers.{l}.linear.{weight,bias}`` and ``medusa_heads.{h}.lm_head.weight``. The fake
    keeps the heads' tensors (the base weights stay in the Hugging Face folder) for the engine to carry."""

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        from pathlib import Path

        from safetensors.torch import load_file

        model = super().from_checkpoint(ckpt_dir, rank, config, preprocess_weights_hook=preprocess_weights_hook)
        c = model.config
        if c.architecture != "MedusaForCausalLM":
            raise ValueError(f"MedusaForCausalLm cannot load a {c.architecture} checkpoint")
        shard = load_file(str(Path(ckpt_dir) / f"rank{c.mapping.rank}.safetensors"))
        expected = {
            f"medusa_heads.{h}.{name}"
            for h in range(c.num_medusa_heads)
            for name in (
                "lm_head.weight",
                *(f"medusa_layers.{n}.linear.{w}" for n in range(c.num_medusa_layers) for w in ("weight", "bias")),
            )
        }
        heads = {name: t for name, t in shard.items() if name.startswith("medusa_heads.")}
        if set(heads) != expected:  # model.load's check of the weights against the module's parameters
            raise RuntimeError(
                f"Required but not provided tensors: {sorted(expected - set(heads))[:4]}; "
                f"provided but not required: {sorted(set(heads) - expected)[:4]}"
            )
        model._medusa_heads = heads
        return model


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
    "MedusaForCausalLM": MedusaForCausalLm,
}

__all__ = [
    "MODEL_MAP",
    "PretrainedConfig",
    "PretrainedModel",
    "QuantConfig",
    *sorted({cls.__name__ for cls in MODEL_MAP.values()}),
]
