"""``qwen3_coder``: Qwen3-Coder's XML tool calls (trtllm-serve: ``qwen3_coder``).

Each call names its function and gives each parameter's value as text (vllm-project/vllm
``vllm/tool_parsers/qwen3coder_tool_parser.py``; the format Qwen3-Coder's chat template teaches,
``examples/tool_chat_template_qwen3coder.jinja``)::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

A value loses one newline at each end and is typed by the parameter's schema in the request's tools, as vLLM
types it: strings as written; ``integer``, ``number`` and ``boolean`` parsed (kept as text when they do not
parse); ``null`` as null; objects, arrays and other types as JSON (kept as text when not JSON); a parameter
the schema does not name stays text. The arguments are built as JSON from these, one parameter at a time as
each is complete. Text before a call is content; a call may also start at ``<function=`` without its
``<tool_call>``, as vLLM accepts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Reader, Schemas, ToolParser, register

CALL, CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"


def typed(value: str, schema: Any) -> Any:
    """A parameter's text as the value its schema types (see the module doc)."""
    if value.lower() == "null":
        return None
    kind = schema.get("type", "string") if isinstance(schema, Mapping) else "string"
    if isinstance(kind, list):  # ["integer", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "string":
        return value
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            number = float(value)
            return int(number) if number.is_integer() else number
    except ValueError:
        return value
    if kind == "boolean":
        return {"true": True, "false": False}.get(value.strip().lower(), value)
    try:
        return json.loads(value)
    except ValueError:
        return value


class Qwen3CoderReader(Reader):
    def __init__(self, schemas: Schemas) -> None:
        super().__init__()
        self.schemas = schemas
        self.text: list[str] = []  # the name or value being read
        self.key = ""
        self.function = ""  # the call being read
        self.params = 0

    def _content(self) -> bool:
        self.text = []
        return self.content_until(CALL, FUNCTION, then={CALL: "opened", FUNCTION: "name"})

    def _opened(self) -> bool:
        self.hold(self.skip_space())
        opened = self.opens(FUNCTION)
        if opened is None:
            return False
        if opened:
            self.hold(FUNCTION)
            self.state = "name"
        else:
            self.release()
            self.state = "content"
        return True

    def _name(self) -> bool:
        text, marker = self.take_until(">")
        self.hold(text)
        self.text.append(text)
        name = "".join(self.text).strip()
        if marker is None and not self.final:
            return bool(text)
        if marker is None or not name or "<" in name or "\n" in name:
            self.release()
            self.state = "content"
            return True
        self.start(name)
        self.function, self.params, self.state = name, 0, "params"
        return True

    def _params(self) -> bool:
        self.skip_space()
        opened = self.opens_one(PARAM, FUNCTION_END)
        if opened is None:
            return False
        if opened == PARAM:
            self.text, self.state = [], "key"
            return True
        self._close_args()
        self.state = "close" if opened == FUNCTION_END else "content"
        return True

    def _key(self) -> bool:
        text, marker = self.take_until(">")
        self.text.append(text)
        if marker is not None or self.final:
            self.key, self.text, self.state = "".join(self.text).strip(), [], "value"
        return bool(text) or marker is not None or self.final

    def _value(self) -> bool:
        text, marker = self.take_until(PARAM_END, PARAM, FUNCTION_END)
        self.text.append(text)
        if marker is None and not self.final:
            return bool(text)
        if marker in (PARAM, FUNCTION_END):  # a value closed by the next tag: that tag is the next step's
            self.pending = marker + self.pending
        value = "".join(self.text).removeprefix("\n").removesuffix("\n")
        properties = (self.schemas.get(self.function) or {}).get("properties")
        schema = properties.get(self.key) if isinstance(properties, Mapping) else None
        piece = json.dumps({self.key: typed(value, schema)}, ensure_ascii=False)[1:-1]
        self.args(("{" if not self.params else ", ") + piece)
        self.params += 1
        self.state = "params"
        return True

    def _close(self) -> bool:
        self.skip_space()
        if self.opens(CALL_END) is None:
            return False
        self.state = "content"
        return True

    def _close_args(self) -> None:
        self.args("}" if self.params else "{}")


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    def value(v: Any) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    return "\n".join(
        f"{CALL}\n{FUNCTION}{name}>\n"
        + "".join(f"{PARAM}{k}>\n{value(v)}\n{PARAM_END}\n" for k, v in args.items())
        + f"{FUNCTION_END}\n{CALL_END}"
        for name, args in calls
    )


PARSER = register(
    ToolParser(
        "qwen3_coder",
        Qwen3CoderReader,
        markers=(CALL, FUNCTION),
        recognise=lambda template: CALL in template and FUNCTION in template,
        write=write,
    )
)
