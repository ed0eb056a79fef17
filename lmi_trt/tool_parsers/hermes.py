"""``hermes``: Hermes 2 Pro, Qwen 2.5 and Qwen3 (trtllm-serve calls it ``qwen3``).

Each call is a JSON object in its own tags, text around them is content (vllm-project/vllm
``vllm/tool_parsers/hermes_tool_parser.py``; the format Qwen 2.5's and Qwen3's chat templates teach and render)::

    Let me look.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import CallObject, Reader, Schemas, ToolParser, register

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesReader(Reader):
    def __init__(self, schemas: Schemas) -> None:
        super().__init__()
        self.call: CallObject | None = None

    def _content(self) -> bool:
        self.call = CallObject(self, ("arguments", "parameters"))
        return self.content_until(OPEN, then="call")

    def _call(self) -> bool:
        assert self.call is not None
        return self.follow_to(self.call, "close")

    def _close(self) -> bool:
        self.skip_space()  # after a call: its closing tag, if written
        if self.opens(CLOSE) is None:
            return False
        self.state = "content"
        return True


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return "\n".join(
        f"{OPEN}\n{json.dumps({'name': name, 'arguments': dict(args)}, ensure_ascii=False)}\n{CLOSE}"
        for name, args in calls
    )


PARSER = register(
    ToolParser(
        "hermes",
        HermesReader,
        markers=(OPEN,),
        recognise=lambda template: OPEN in template and "<function=" not in template,
        write=write,
        aliases=("qwen3",),
    )
)
