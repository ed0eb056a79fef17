"""Fake ``tensorrt_llm.lora_helper`` (real file: tensorrt_llm/lora_helper.py, read_file id 53470212518, one undated
copy; the docs' examples, docs/source/features/lora.md, build the same fields): ``LoraConfig`` and the default
mapping of TensorRT-LLM LoRA modules to Hugging Face ones. The PyTorch backend reads ``lora_dir``,
``lora_target_modules``, ``trtllm_modules_to_hf_modules``, ``max_lora_rank``, ``max_loras`` and ``max_cpu_loras``
(_torch/pyexecutor/_util.py of the 1.1 line, read_file id 843526953; py_executor_creator.py copies ids 90899134 and
18543847370).

The real class changed shape across copies that could not be dated to releases: a dataclass with
``swap_gate_up_proj`` (id 53470212518), a dataclass with ``lora_weights_converters`` and no swap field (id
2545972156), a pydantic ``BaseModel`` with ``swap_gate_up_proj_lora_b_weight`` (id 388674781), a ``StrictBaseModel``
(id 56112947133). The fake keeps only the fields every one of them has, so a keyword some release lacks is a
TypeError here (as the dataclasses' and the StrictBaseModel's refusal), never accepted."""

from __future__ import annotations

from dataclasses import dataclass, field


def get_missing_qkv_modules_from_lora_modules(lora_target_modules: list[str]) -> list[str]:
    """q, k and v go together: the ones a target list lacks, filled with zeros by the loader."""
    missing = []
    for group in (("attn_q", "attn_k", "attn_v"), ("cross_attn_q", "cross_attn_k", "cross_attn_v")):
        if any(m in lora_target_modules for m in group):
            missing += [m for m in group if m not in lora_target_modules]
    return missing


def get_default_trtllm_modules_to_hf_modules() -> dict[str, str]:
    return {
        "attn_q": "q_proj",
        "attn_k": "k_proj",
        "attn_v": "v_proj",
        "attn_dense": "o_proj",
        "mlp_h_to_4h": "gate_proj",
        "mlp_4h_to_h": "down_proj",
        "mlp_gate": "up_proj",
        "mlp_gate_up": "gate_up_proj",
        "moe_h_to_4h": "w1",
        "moe_4h_to_h": "w2",
        "moe_gate": "w3",
        "moe_router": "gate",
    }


@dataclass
class LoraConfig:
    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    trtllm_modules_to_hf_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int | None = None
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        assert self.lora_ckpt_source in ["hf", "nemo"], (
            f"lora_ckpt_source must be one of 'hf' or 'nemo', got {self.lora_ckpt_source}"
        )

    @property
    def missing_qkv_modules(self) -> list[str]:
        return get_missing_qkv_modules_from_lora_modules(self.lora_target_modules)
