"""``llama4_pythonic``: Llama 4's (and Llama 3.2's) Python-style calls (vLLM also calls it ``pythonic``).

The whole output is a Python list of calls with keyword arguments of literal values, optionally between
``<|python_start|>`` and ``<|python_end|>`` (vllm-project/vllm ``vllm/tool_parsers/llama4_pythonic_tool_parser.py``;
the format Meta's template teaches, ``examples/tool_chat_template_llama4_pythonic.jinja``: "Use exact format:
[func_name1(param1=value1, param2=value2), func_name2(...)]")::

    [get_weather(city="Paris", days=3), get_time()]

Arguments become JSON (``True`` → ``true``, ``None`` → ``null``), so each call is sent whole once its closing
parenthesis is read. An output that does not open with a call is content; so is anything after the list, or
from a call that is not one (a positional argument, a value that is not a literal).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .base import Reader, Schemas, ToolParser, arguments_json, register

START, END = "<|python_start|>", "<|python_end|>"


def call_of(text: str) -> tuple[str, str] | None:
    """``name(key=literal, ...)`` as (name, arguments JSON), or None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            return None
        values = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # **mapping
                return None
            values[keyword.arg] = ast.literal_eval(keyword.value)
        return node.func.id, arguments_json(values)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
        return None


class PythonicReader(Reader):
    def __init__(self, schemas: Schemas) -> None:
        super().__init__("start")
        self.text: list[str] = []  # the call being read
        self.depth = 0
        self.quote = ""
        self.escaped = False

    def _start(self) -> bool:
        return self.optional(START, "list")

    def _list(self) -> bool:
        self.hold(self.skip_space())
        if not self.pending:
            return self._give_up() if self.final else False
        if self.pending[0] != "[":
            return self._give_up()
        self.hold(self.consume(1))
        self.state = "item"
        return True

    def _item(self) -> bool:
        if not self.text:
            self.hold(self.skip_space())
            if not self.pending:
                return self._give_up() if self.final else False
            if not (self.pending[0].isalpha() or self.pending[0] == "_"):
                return self._give_up()
        used, ended = self._lex(self.pending)
        text = self.consume(used)
        self.hold(text)
        self.text.append(text)
        if not ended:
            return self._give_up() if self.final else bool(text)
        call = call_of("".join(self.text))
        if call is None:
            return self._give_up()
        self.text = []
        self.start(call[0])
        self.args(call[1])
        self.state = "after"
        return True

    def _lex(self, text: str) -> tuple[int, bool]:
        """How much of ``text`` belongs to the call being read, and whether that ends it: at its closing
        parenthesis, or at a character no call has there."""
        for i, ch in enumerate(text):
            if self.quote:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == self.quote:
                    self.quote = ""
            elif ch in "'\"":
                self.quote = ch
            elif ch in "([{":
                self.depth += 1
            elif ch in ")]}":
                self.depth -= 1
                if self.depth <= 0:
                    return i + 1, True
            elif not self.depth and not (ch.isalnum() or ch in "_ "):
                return i + 1, True  # a name followed by something else than "(": not a call
        return len(text), False

    def _after(self) -> bool:
        space = self.skip_space()
        if not self.pending:
            return bool(space)
        ch = self.pending[0]
        if ch in ",]":
            self.consume(1)
            self.state = "item" if ch == "," else "end"
        else:
            self.state = "rest"
        return True

    def _end(self) -> bool:
        self.skip_space()
        if self.opens(END) is None:
            return False
        self.state = "rest"
        return True

    def _rest(self) -> bool:
        text = self.consume(len(self.pending))
        self.content(text)
        return bool(text)

    def _give_up(self) -> bool:
        """Not a call (or the output ended in one): what was held, and all that follows, is content."""
        self.release()
        self.text, self.state = [], "rest"
        return True


def _python(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_python(k)}: {_python(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_python, value)) + "]"
    return repr(value)


def write(calls: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={_python(v)}' for k, v in a.items())})" for n, a in calls) + "]"


PARSER = register(
    ToolParser(
        "llama4_pythonic",
        PythonicReader,
        markers=(START,),
        recognise=lambda template: "[func_name1(" in template,
        write=write,
        aliases=("pythonic",),
    )
)
