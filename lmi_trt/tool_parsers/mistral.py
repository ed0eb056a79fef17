"""``mistral``: Mistral's tool calls after its ``[TOOL_CALLS]`` token.

Two spellings (vllm-project/vllm ``vllm/tool_parsers/mistral_tool_parser.py``): a JSON list of calls, as
tokenizers before v11 write them, and name-then-arguments, repeated per call, as v11 and later write them::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}

Text before the token is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from .base import CallList, JsonValue, Reader, Schemas, ToolParser, register, scalar_arguments

CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


class MistralReader(Reader):
    def __init__(self, schemas: Schemas) -> None:
        super().__init__()
        self.calls_list: CallList | None = None
        self.value: JsonValue | None = None
        self.args_raw: list[str] = []

    def _content(self) -> bool:
        return self.content_until(CALLS, then="calls")

    def _calls(self) -> bool:
        self.hold(self.skip_space())
        if not self.pending:
            if self.final:
                self.release()
            return False
        if self.pending[0] == "[":
            self.calls_list, self.state = CallList(self, ("arguments", "parameters")), "list"
        else:
            self.state = "name"
        return True

    def _list(self) -> bool:
        assert self.calls_list is not None
        progressed = self.calls_list.feed()
        if self.calls_list.state != "reading":
            self.state = "content"
        return progressed

    def _name(self) -> bool:
        name = _NAME.match(self.pending).group(0)  # type: ignore[union-attr]
        rest = self.pending[len(name) :]
        if rest.startswith(ARGS) and name:
            self.consume(len(name) + len(ARGS))
            self.start(name)
            self.value, self.args_raw, self.state = JsonValue(), [], "args"
            return True
        if not self.final and ARGS.startswith(rest):
            return False
        self.release()
        self.state = "content"
        return True

    def _args(self) -> bool:
        assert self.value is not None
        if not self.value.kind:
            self.skip_space()
            if not self.pending:
                if self.final:
                    self.args("{}")
                    self.state = "content"
                return False
        text = self.consume(self.value.feed(self.pending))
        if self.value.kind in "{[":
            self.args(text)
        else:
            self.args_raw.append(text)
        if self.value.done or self.final:
            if self.value.kind not in "{[":
                self.args(scalar_arguments("".join(self.args_raw)))
            self.state = "next"
        return bool(text) or self.state == "next"

    def _next(self) -> bool:
        self.skip_space()
        more = self.opens(CALLS)
        if more is None:
            return False
        self.state = "name" if more else "content"
        return True


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return CALLS + json.dumps([{"name": n, "arguments": dict(a)} for n, a in calls], ensure_ascii=False)


PARSER = register(
    ToolParser(
        "mistral",
        MistralReader,
        markers=(CALLS,),
        recognise=lambda template: CALLS in template,
        write=write,
    )
)
