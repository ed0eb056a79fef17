"""``llama3_json``: Llama 3.1-3.3 (JSON tool calls).

The output is the calls, JSON objects with ``name`` and ``parameters``, after an optional ``<|python_tag|>``,
several separated by ``;`` (vllm-project/vllm ``vllm/tool_parsers/llama_tool_parser.py``; Meta's Llama 3.1
prompt format for JSON tool calling)::

    {"name": "get_weather", "parameters": {"city": "Paris"}}

An output that does not open with a call is content; text after the calls is content too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import CallObject, Reader, Schemas, ToolParser, register

TAG = "<|python_tag|>"


class Llama3JsonReader(Reader):
    def __init__(self, schemas: Schemas) -> None:
        super().__init__("start")
        self.call: CallObject | None = None

    def _start(self) -> bool:
        return self.optional(TAG, "next")

    def _next(self) -> bool:
        self.hold(self.skip_space())
        if not self.pending:
            if self.final:
                self.release()
            return False
        if self.pending[0] != "{":
            self.release()
            self.state = "content"
            return True
        self.call, self.state = CallObject(self, ("parameters", "arguments")), "call"
        return True

    def _call(self) -> bool:
        assert self.call is not None
        return self.follow_to(self.call, "after")

    def _after(self) -> bool:
        space = self.skip_space()  # after a call: ";" and the next, or the end
        if not self.pending:
            return bool(space)
        if self.pending[0] == ";":
            self.consume(1)
            self.state = "next"
        else:
            self.content(space)
            self.state = "content"
        return True

    def _content(self) -> bool:
        text = self.consume(len(self.pending))
        self.content(text)
        return bool(text)


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return "; ".join(json.dumps({"name": name, "parameters": dict(args)}, ensure_ascii=False) for name, args in calls)


PARSER = register(
    ToolParser(
        "llama3_json",
        Llama3JsonReader,
        markers=(TAG,),
        recognise=lambda template: (TAG in template or "ipython" in template) and "[func_name1(" not in template,
        write=write,
    )
)
