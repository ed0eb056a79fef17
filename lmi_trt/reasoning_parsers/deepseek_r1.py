"""``deepseek_r1``: DeepSeek-R1 and its distills, QwQ-like models that always reason (trtllm-serve: ``deepseek-r1``).

R1's chat template opens ``<think>`` at the end of the prompt, so the output holds only the closing tag; older
versions of the template did not, and the model then writes the opening tag itself or, sometimes, leaves it
out: everything before ``</think>`` is reasoning either way, and an output without it is all reasoning
(vllm-project/vllm ``vllm/reasoning/deepseek_r1_reasoning_parser.py`` and ``basic_parsers.py``).
"""

from __future__ import annotations

from .base import END, ReasoningParser, register

ASSISTANT = "<｜Assistant｜>"  # DeepSeek's chat templates' turn marker

PARSER = register(
    ReasoningParser(
        "deepseek_r1",
        unprompted="reasoning",
        recognise=lambda template: END in template and ASSISTANT in template and "thinking" not in template,
        aliases=("deepseek-r1",),
    )
)
