"""``deepseek_v31``: DeepSeek-V3.1 (trtllm-serve: ``deepseekv3.1``).

DeepSeek-V3's call tokens, each call its name and then its JSON arguments up to the call's end token
(vllm-project/vllm ``vllm/tool_parsers/deepseekv31_tool_parser.py``; the format DeepSeek-V3.1's chat template
teaches, ``examples/tool_chat_template_deepseekv31.jinja``)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

(one line, without the break before the closing token).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from .base import ToolParser, register
from .deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, FENCE_OPEN, SEP, DeepSeekReader


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return (
        CALLS_BEGIN
        + "".join(
            f"{CALL_BEGIN}{name}{SEP}{json.dumps(dict(args), ensure_ascii=False)}{CALL_END}" for name, args in calls
        )
        + CALLS_END
    )


PARSER = register(
    ToolParser(
        "deepseek_v31",
        partial(DeepSeekReader, typed=False),
        markers=(CALLS_BEGIN,),
        recognise=lambda template: CALLS_BEGIN in template and FENCE_OPEN not in template,
        write=write,
        aliases=("deepseekv3.1",),
    )
)
