"""Fake ``tensorrt_llm.lora_manager`` (real file: tensorrt_llm/lora_manager.py, read_file id 1059464385): it imports
``LoraConfig`` from lora_helper.py, and docs/source/features/lora.md imports it from here
(``from tensorrt_llm.lora_manager import LoraConfig``). The loader's behaviour is the fake runtime's (``_lora``)."""

from tensorrt_llm.lora_helper import LoraConfig

__all__ = ["LoraConfig"]
