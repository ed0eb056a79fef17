"""Fake ``tensorrt_llm.lora_manager``: ``LoraConfig`` and what ``use_lora`` does to it at build time.

Read from NVIDIA/TensorRT-LLM tensorrt_llm/lora_manager.py (one stored 1.x copy: ``load_torch_hf_lora``, DoRA rows):
``LoraConfig`` is a dataclass (``DictConversion``: ``to_dict``/``from_dict``) with these fields and defaults; the
0.12-era ``commands/build.py`` constructs it with ``lora_dir``, ``lora_ckpt_source`` and ``max_lora_rank`` and
assigns ``lora_target_modules``, which is all lmi-trt uses. ``load_hf_lora`` (``model.use_lora`` in ``build``):
target modules from ``lora_dir`` when none are given (not modelled here: a ``lora_dir`` is refused),
"lora_target_modules is empty" when there are neither, then the missing ones of q/k/v added
(``get_missing_qkv_modules``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

_QKV = ("attn_q", "attn_k", "attn_v")


@dataclass
class LoraConfig:
    lora_dir: list = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list = field(default_factory=list)
    trtllm_modules_to_hf_modules: dict = field(default_factory=dict)
    max_loras: int = 4
    max_cpu_loras: int = 4

    def __post_init__(self):
        assert self.lora_ckpt_source in ["hf", "nemo"], (
            f"lora_ckpt_source must be one of 'hf' or 'nemo', got {self.lora_ckpt_source}"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict) -> LoraConfig:
        return cls(**config)

    @property
    def missing_qkv_modules(self) -> list:
        targets = self.lora_target_modules
        return [m for m in _QKV if m not in targets] if any(m in targets for m in _QKV) else []


def _use_lora(lora_config: LoraConfig) -> None:
    """``load_hf_lora``'s effect on the config (the weights of a ``lora_dir`` are not modelled)."""
    if lora_config.lora_dir:
        raise NotImplementedError("fake tensorrt_llm: building with lora_dir is not modelled")
    if not lora_config.lora_target_modules:
        raise ValueError(
            "lora_target_modules is empty. "
            "Please specify lora_target_modules or provide lora_dir to infer lora_target_modules."
        )
    lora_config.lora_target_modules.extend(lora_config.missing_qkv_modules)
