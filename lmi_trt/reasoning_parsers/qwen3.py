"""``qwen3``: Qwen3, QwQ and Qwen3.5 (trtllm-serve: ``qwen3``).

Qwen3's first chat template lets the model open ``<think>`` itself (and closes it in the prompt, empty, with
``enable_thinking: false``); Qwen3.5's and the thinking-only releases' open it in the prompt
(vllm-project/vllm ``vllm/reasoning/qwen3_reasoning_parser.py``). An output whose prompt did neither is
reasoning only when it opens with ``<think>``.
"""

from __future__ import annotations

from .base import END, ReasoningParser, register
from .deepseek_r1 import ASSISTANT

PARSER = register(
    ReasoningParser(
        "qwen3", unprompted="either", recognise=lambda template: END in template and ASSISTANT not in template
    )
)
