"""OpenAI tool calls on chat: what a request's ``tools``/``tool_choice`` ask for, and the model's calls.

``tool_choice`` (OpenAI: https://platform.openai.com/docs/api-reference/chat/create):
- ``none``: the tools are rendered by the chat template, the output is plain content.
- a named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to
  that function's ``parameters`` schema and is the call's ``arguments`` (vLLM does the same).
- ``required``: the output is constrained to a JSON list of ``{"name", "parameters"}`` objects, one of
  the tools each (vLLM's shape), at most one when ``parallel_tool_calls`` is false.
- ``auto`` (OpenAI's default when tools are given): free output, in which the model's own call format
  is recognised by the parser of its template family. As in DJL LMI and vLLM, this needs
  ``option.enable_auto_tool_choice=true``; ``option.tool_call_parser`` names the family, else it is
  recognised from the chat template's text. The families, with vLLM's parser names:
  ``hermes`` (Hermes 2 Pro, Qwen 2.5/3: ``<tool_call>{"name", "arguments"}</tool_call>``, several allowed),
  ``llama3_json`` (Llama 3.1-3.3: ``{"name", "parameters"}``, optionally after ``<|python_tag|>``,
  several joined by ``;``), ``mistral`` (``[TOOL_CALLS][{"name", "arguments"}, ...]``, and the
  ``[TOOL_CALLS]name[ARGS]{...}`` form of newer Mistral tokenizers).

Streaming: content streams until a call starts; a named call streams its ``arguments`` as they come;
other calls are sent whole when the output ends (OpenAI's delta shape either way), so a stream
reassembles to the answer the same request gets unstreamed.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmi_trt.engines.base import GuidedDecoding
from lmi_trt.engines.guided import schema_problem
from lmi_trt.serving.core import schema_guide_text
from lmi_trt.serving.errors import FieldError
from lmi_trt.vocabulary import TOOL_CALL_PARSERS

log = logging.getLogger(__name__)

Mode = Literal["none", "auto", "required", "named"]
# Tools in one request: OpenAI's bound ("A max of 128 functions are supported", the chat API reference's tools).
MAX_TOOLS = 128


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    # OpenAI's rule for function names
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: FunctionSpec


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _args_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value if value is not None else {}).decode()


def _call(obj: Any, args_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters")))
    return ToolCall(obj["name"], _args_text(args))


def _json_values(text: str, sep: str) -> list[Any] | None:
    """The JSON values of ``text``, separated by ``sep`` and whitespace; None unless all of it is JSON."""
    decoder, values, pos = json.JSONDecoder(), [], 0
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] == sep):
            pos += 1
        if pos == len(text):
            return values
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):  # output nested past Python's recursion limit is no call either
            return None
        values.append(value)


# --- the families' parsers: text → (content outside the calls, calls) or None when no call parses ---
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def _parse_hermes(text: str) -> tuple[str, list[ToolCall]] | None:
    calls = []
    for match in _HERMES.finditer(text):
        values = _json_values(match.group(1), ",")
        call = _call(values[0], "arguments") if values and len(values) == 1 else None
        if call is None:
            return None
        calls.append(call)
    return (_HERMES.sub("", text), calls) if calls else None


def _parse_llama3_json(text: str) -> tuple[str, list[ToolCall]] | None:
    body = text.lstrip().removeprefix("<|python_tag|>")
    values = _json_values(body, ";")
    calls = [_call(v, "parameters") for v in values or []]
    if not calls or any(c is None for c in calls):
        return None
    return "", calls  # type: ignore[return-value]


_MISTRAL_ARGS = re.compile(r"\s*([A-Za-z0-9_-]{1,64})\[ARGS\]")


def _parse_mistral(text: str) -> tuple[str, list[ToolCall]] | None:
    content, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return None
    values = _json_values(rest, ",")
    if values and len(values) == 1 and isinstance(values[0], list):
        calls = [_call(v, "arguments") for v in values[0]]
    else:  # [TOOL_CALLS]name[ARGS]{...} (repeated)
        calls = []
        for chunk in rest.split("[TOOL_CALLS]"):
            head = _MISTRAL_ARGS.match(chunk)
            args = _json_values(chunk[head.end() :], ",") if head else None
            calls.append(ToolCall(head.group(1), _args_text(args[0])) if head and args and len(args) == 1 else None)
    if not calls or any(c is None for c in calls):
        return None
    return content, calls  # type: ignore[return-value]


@dataclass(frozen=True)
class Parser:
    name: str
    parse: Callable[[str], tuple[str, list[ToolCall]] | None]
    # Where a call begins: a marker (held back from the stream as soon as it may be starting), or for
    # llama3_json the output's first character.
    marker: str
    at_start_only: bool = False
    # The marker is a special token in the family's tokenizers, so the output keeps special tokens.
    special_marker: bool = False

    def call_starts(self, text: str) -> int | None:
        """Where in ``text`` a call starts (or may start, the text being cut mid-marker); None: not yet."""
        if self.at_start_only:
            stripped = text.lstrip()
            if not stripped:
                return 0  # undecided: hold the leading whitespace
            tag = "<|python_tag|>"
            opens = stripped[0] == "{" or stripped.startswith(tag) or tag.startswith(stripped)
            return len(text) - len(stripped) if opens else -1
        at = text.find(self.marker)
        if at >= 0:
            return at
        for cut in range(min(len(self.marker) - 1, len(text)), 0, -1):
            if self.marker.startswith(text[-cut:]):
                return len(text) - cut
        return None


FAMILIES: dict[str, Parser] = {
    p.name: p
    for p in (
        Parser("hermes", _parse_hermes, "<tool_call>"),
        Parser("llama3_json", _parse_llama3_json, "{", at_start_only=True),
        Parser("mistral", _parse_mistral, "[TOOL_CALLS]", special_marker=True),
    )
}


@lru_cache(maxsize=8)
def family_of(template: str) -> str | None:
    """The tool-call family a chat template writes, from the markers in its text (logged once per template)."""
    if "<tool_call>" in template:
        found: str | None = "hermes"
    elif "[TOOL_CALLS]" in template:
        found = "mistral"
    elif "<|python_tag|>" in template or "ipython" in template:
        found = "llama3_json"
    else:
        found = None
    log.info("tool calls: the chat template writes %s", f"the {found} format" if found else "no format known here")
    return found


def _required_schema(tools: list[ToolSpec], parallel: bool) -> dict[str, Any]:
    one = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": t.function.parameters or {"type": "object"},
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}), "items": {"anyOf": one}}


@dataclass(frozen=True)
class ToolPlan:
    """What one chat request's tools ask of the server."""

    tools: list[ToolSpec]
    mode: Mode
    name: str | None = None  # the named function
    parser: Parser | None = None  # auto
    parallel: bool = True

    def template_tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def guided(self) -> GuidedDecoding | None:
        if self.mode == "named":
            tool = next(t for t in self.tools if t.function.name == self.name)
            schema = tool.function.parameters or {"type": "object"}
        elif self.mode == "required":
            schema = _required_schema(self.tools, self.parallel)
        else:
            return None
        return GuidedDecoding("json_schema", schema_guide_text(schema, "tools"))

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The answer's content (None when the calls are all there is) and calls."""
        content, calls = self.split(text)
        return (content if content.strip() or not calls else None), calls

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """The text outside the calls, and the calls; an output that holds no well-formed call is content."""
        if self.mode == "named":
            return "", [ToolCall(self.name, text)]  # type: ignore[arg-type]
        if self.mode == "required":
            values = _json_values(text, ",")
            calls = [_call(v, "parameters") for v in values[0]] if values and isinstance(values[0], list) else []
            return ("", calls) if calls and all(c is not None for c in calls) else (text, [])  # type: ignore[misc]
        if self.mode == "auto" and self.parser is not None:
            parsed = self.parser.parse(text)
            if parsed is not None:
                return parsed
        return text, []

    def stream(self) -> ToolStream:
        return ToolStream(self)


class ToolStream:
    """One choice's streamed output split into the content to send now and, at the end, the calls; a
    named call's ``arguments`` are the output itself and stream as they come (see the module doc)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.held = ""  # output not sent yet: a call, or what may be the start of one
        self.content_only = plan.mode == "none"

    def feed(self, text: str) -> str:
        """The content to send now for this piece of output ("" while a call may be under way)."""
        if self.content_only:
            return text
        self.held += text
        if self.plan.mode != "auto":
            return ""
        start = self.plan.parser.call_starts(self.held)  # type: ignore[union-attr]
        if start == -1:  # llama3_json: the output does not open with a call
            self.content_only = True
            start = len(self.held)
        elif start is None:
            start = len(self.held)
        out, self.held = self.held[:start], self.held[start:]
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end of the output: the content still to send, and the calls."""
        held, self.held = self.held, ""
        return self.plan.split(held) if held else ("", [])


def plan_tools(
    tools: Any,
    tool_choice: Any,
    parallel_tool_calls: Any,
    *,
    auto_enabled: bool,
    parser_option: str | None,
    template: str | None,
) -> ToolPlan | None:
    """The request's ToolPlan (None without tools); a 400 naming ``tools`` or ``tool_choice`` for what cannot be."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise FieldError(
                "tool_choice", f"tool_choice={tool_choice!r} needs tools; send tools or leave tool_choice out"
            )
        return None
    if len(tools) > MAX_TOOLS:
        raise FieldError("tools", f"tools has {len(tools)} tools; send at most {MAX_TOOLS} (OpenAI's bound)")
    try:
        specs = [ToolSpec.model_validate(t) for t in tools]
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise FieldError(
            "tools",
            f'tools: each tool must be {{"type": "function", "function": {{"name": ..., '
            f'"parameters": {{...}}}}}}; {where}: {first["msg"]}',
        ) from None
    for i, spec in enumerate(specs):
        problem = schema_problem(spec.function.parameters)
        if problem is not None:
            raise FieldError(f"tools[{i}].function.parameters", f"tools[{i}].function.parameters: {problem}")
    names = [t.function.name for t in specs]
    if len(set(names)) != len(names):
        raise FieldError("tools", f"tools: function names must be unique, got {names}")
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise FieldError("parallel_tool_calls", "parallel_tool_calls must be true or false")
    parallel = parallel_tool_calls is not False
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan(specs, "none", parallel=parallel)
    if choice == "required":
        return ToolPlan(specs, "required", parallel=parallel)
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise FieldError(
                "tool_choice",
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}',
            )
        if name not in names:
            raise FieldError("tool_choice", f"tool_choice names function {name!r}, which is not among tools: {names}")
        return ToolPlan(specs, "named", name=name, parallel=parallel)
    if choice != "auto":
        raise FieldError(
            "tool_choice", f"tool_choice={choice!r} is not one of 'none', 'auto', 'required' or a named function"
        )
    if not auto_enabled:
        raise FieldError(
            "tool_choice",
            "tool_choice 'auto' (the default with tools) needs the server started with "
            "option.enable_auto_tool_choice=true (as DJL LMI and vLLM); or send "
            "tool_choice 'required' or a named function",
        )
    family = parser_option or (family_of(template) if template else None)
    if family is None:
        raise FieldError(
            "tool_choice",
            "tool_choice 'auto': this model's chat template writes no tool-call format "
            f"known here; set option.tool_call_parser to one of {', '.join(TOOL_CALL_PARSERS)}",
        )
    return ToolPlan(specs, "auto", parser=FAMILIES[family], parallel=parallel)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` as chat templates read them: ``arguments`` a mapping, not JSON text
    (Hugging Face's chat-template tool-use guide; the templates write ``arguments | tojson``)."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if isinstance(calls, list):
            fixed = []
            for c in calls:
                fn = c.get("function") if isinstance(c, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    try:
                        c = {**c, "function": {**fn, "arguments": orjson.loads(fn["arguments"])}}
                    except orjson.JSONDecodeError:  # orjson: nested past 1024 levels too, not a RecursionError
                        pass  # not JSON: the template gets the text as sent
                fixed.append(c)
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out
