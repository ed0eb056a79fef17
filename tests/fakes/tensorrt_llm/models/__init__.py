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
    ``num_medusa_heads`` heads, each ``num_medusa_layers`` residual layers (``ColumnLinear(hidden, hidden)`` with
    bias) and an ``lm_head`` (``ColumnLinear(hidden, vocab)`` without), whose checkpoint tensors are
    ``medusa_heads.{h}.medusa_layers.{l}.linear.{weight,bias}`` and ``medusa_heads.{h}.lm_head.weight``. Loading
    follows modeling_utils.py ``PretrainedModel.load`` (1.x ids 1189552800, 67284696939): a missing tensor raises
    "Required but not provided tensors", an extra one is a warning ("Provided but not required tensors"), and one of
    another shape fails its parameter ("Encounter error ... for parameter", wrapping parameter.py's "The value updated
    is not the same shape as the original", ids 728909344 and 2877918272). The fake keeps the heads' tensors (the
    base weights stay in the Hugging Face folder) for the engine to carry; it checks only the heads' tensors."""

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        import logging
        from pathlib import Path

        from safetensors.torch import load_file

        model = super().from_checkpoint(ckpt_dir, rank, config, preprocess_weights_hook=preprocess_weights_hook)
        c = model.config
        if c.architecture != "MedusaForCausalLM":
            raise ValueError(f"MedusaForCausalLm cannot load a {c.architecture} checkpoint")
        shard = load_file(str(Path(ckpt_dir) / f"rank{c.mapping.rank}.safetensors"))
        hidden, vocab = c.hidden_size, c.vocab_size  # tp 1: pad_vocab_size leaves the vocabulary as it is
        expected = {}
        for h in range(c.num_medusa_heads):
            expected[f"medusa_heads.{h}.lm_head.weight"] = (vocab, hidden)
            for n in range(c.num_medusa_layers):
                expected[f"medusa_heads.{h}.medusa_layers.{n}.linear.weight"] = (hidden, hidden)
                expected[f"medusa_heads.{h}.medusa_layers.{n}.linear.bias"] = (hidden,)
        heads = {name: t for name, t in shard.items() if name.startswith("medusa_heads.")}
        missing = set(expected) - set(heads)
        if missing:
            raise RuntimeError(f"Required but not provided tensors:{missing}")
        extra = set(heads) - set(expected)
        if extra:
            logging.getLogger("tensorrt_llm").warning(f"Provided but not required tensors: {extra}")
        for name, shape in expected.items():
            if tuple(heads[name].shape) != shape:
                raise RuntimeError(
                    f"Encounter error 'The value updated is not the same shape as the original. Updated: "
                    f"{tuple(heads[name].shape)}, original: {shape}' for parameter '{name}'"
                )
        model._medusa_heads = {name: heads[name] for name in expected}
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
