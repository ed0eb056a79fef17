"""``deepseek_v3``: DeepSeek-V3.1 and later hybrids, which reason when the request's ``chat_template_kwargs``
say ``thinking: true``.

Their template then opens ``<think>`` at the end of the prompt, and otherwise closes it there (vllm-project/vllm
``vllm/reasoning/deepseek_v3_reasoning_parser.py``: R1's parser with ``thinking``, none without;
``examples/tool_chat_template_deepseekv31.jinja``). An output whose prompt did neither is reasoning only when
it opens with ``<think>``.
"""

from __future__ import annotations

from .base import END, ReasoningParser, register
from .deepseek_r1 import ASSISTANT

PARSER = register(
    ReasoningParser(
        "deepseek_v3",
        unprompted="either",
        recognise=lambda template: END in template and ASSISTANT in template and "thinking" in template,
    )
)
