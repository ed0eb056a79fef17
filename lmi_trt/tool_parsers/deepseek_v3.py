"""``deepseek_v3``: DeepSeek-V3 and DeepSeek-R1 (trtllm-serve: ``deepseekv3``).

The calls sit between DeepSeek's tool-call tokens, each with its type, name and JSON arguments in a fenced
block (vllm-project/vllm ``vllm/tool_parsers/deepseekv3_tool_parser.py``; the format DeepSeek-V3's chat template
teaches, ``examples/tool_chat_template_deepseekv3.jinja``)::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Text before the calls is content, and so is any after them. The arguments stream as written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Reader, Schemas, ToolParser, register

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
FENCE_OPEN, FENCE_CLOSE = "```json", "\n```"


class DeepSeekReader(Reader):
    """DeepSeek's call tokens around calls whose head is ``typed`` (V3: type, separator, name, a fenced JSON
    block) or not (V3.1: name, separator, the arguments up to the call's end token)."""

    def __init__(self, schemas: Schemas, *, typed: bool = True) -> None:
        super().__init__()
        self.typed = typed
        self.name: list[str] = []

    def _content(self) -> bool:
        return self.content_until(CALLS_BEGIN, then="calls")

    def _calls(self) -> bool:
        self.hold(self.skip_space())
        begins = self.opens(CALL_BEGIN)
        if begins:
            self.hold(CALL_BEGIN)
            self.name, self.state = [], "type" if self.typed else "name"
            return True
        ends = self.opens(CALLS_END) if begins is False else None
        if begins is None or ends is None:
            return False
        if ends and self.calls:
            self.drop()  # the space between the last call and the block's end token
        else:
            self.release()  # a block with no call, or one that broke: its text is content
        self.state = "content"
        return True

    def _type(self) -> bool:
        text, marker = self.take_until(SEP)
        self.hold(text)
        if marker is not None:
            self.hold(marker)
            self.state = "name"
        return self._head_end(bool(text) or marker is not None)

    def _name(self) -> bool:
        text, marker = self.take_until("\n" if self.typed else SEP)
        self.hold(text)
        self.name.append(text)
        if marker is not None:
            self.hold(marker)
            self.state = "fence" if self.typed else "begin"
        return self._head_end(bool(text) or marker is not None)

    def _fence(self) -> bool:
        opened = self.opens(FENCE_OPEN)
        if opened is None:
            return self._head_end(False)
        if not opened:
            return self._head_end(True, broken=True)
        self.hold(FENCE_OPEN)
        self.state = "newline"
        return True

    def _newline(self) -> bool:
        if self.opens("\n") is None:
            return self._head_end(False)
        self.state = "begin"
        return True

    def _begin(self) -> bool:
        name = "".join(self.name).strip()
        if not name:
            return self._head_end(True, broken=True)
        self.start(name)
        self.state = "args"
        return True

    def _args(self) -> bool:
        text, marker = self.take_until(FENCE_CLOSE if self.typed else CALL_END)
        self.args(text)
        if marker is not None:
            self.state = "end" if self.typed else "calls"
        return bool(text) or marker is not None

    def _end(self) -> bool:
        self.skip_space()
        if self.opens(CALL_END) is None:
            return False
        self.state = "calls"
        return True

    def _head_end(self, progressed: bool, *, broken: bool = False) -> bool:
        """A call's head that cannot be one (or the output ended in it): what was held is content."""
        if broken or (self.final and not self.pending):
            self.release()
            self.state = "content"
            return True
        return progressed


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return (
        CALLS_BEGIN
        + "\n".join(
            f"{CALL_BEGIN}function{SEP}{name}\n{FENCE_OPEN}\n{json.dumps(dict(args), ensure_ascii=False)}"
            f"{FENCE_CLOSE}{CALL_END}"
            for name, args in calls
        )
        + CALLS_END
    )


PARSER = register(
    ToolParser(
        "deepseek_v3",
        DeepSeekReader,
        markers=(CALLS_BEGIN,),
        recognise=lambda template: CALLS_BEGIN in template and FENCE_OPEN in template,
        write=write,
        aliases=("deepseekv3",),
    )
)
