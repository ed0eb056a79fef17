"""OpenAI tool calls on chat: what a request's ``tools``/``tool_choice`` ask for, and how its calls are read.

``tool_choice`` (OpenAI: https://platform.openai.com/docs/api-reference/chat/create):
- ``none``: the output is plain content.
- a named function (``{"type": "function", "function": {"name": ...}}``): the output is constrained to that
  function's ``parameters`` schema and is the call's ``arguments``, whatever the chat template (vLLM does the
  same: vllm-project/vllm ``entrypoints/openai/chat_completion/protocol.py``, the named choice's JSON guide).
- ``required``: the output is constrained to a JSON list of ``{"name", "parameters"}`` objects, one of the tools
  each (vLLM's shape), at most one when ``parallel_tool_calls`` is false.
- ``auto`` (OpenAI's default when tools are given): free output, in which the model's own call format is read
  by a tool-call parser (``tool_parsers``). As in DJL LMI and vLLM, this needs
  ``option.enable_auto_tool_choice=true``; ``option.tool_call_parser`` names the parser, else the chat
  template's text is recognised.

The chat template renders the tools where it can. Where it cannot (it leaves every tool's name out of the
prompt), the tools are described to the model in a system message (``describe``): their JSON definitions and
what to answer, for ``auto`` the parser's own call format. TGI does the like for every template that does not
take ``tools`` (huggingface/text-generation-inference ``router/src/infer/chat_template.rs``: the tools' JSON and
its ``tool_prompt``, "You will be presented with a JSON schema representing a set of tools...", appended to the
last message); a system message keeps the user's turn as written, and a template that refuses a system
message gets the description at the end of the last message, TGI's place.

A call is read as the output comes (see ``tool_parsers.base``): a named call's arguments stream as they are
generated, ``required`` calls and the parsers' calls as far as each format allows.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmi_trt import tool_parsers
from lmi_trt.engines.base import GuidedDecoding
from lmi_trt.engines.guided import schema_problem
from lmi_trt.serving.core import schema_guide_text
from lmi_trt.serving.errors import FieldError
from lmi_trt.tool_parsers.base import CallList, Reader, Schemas, ToolParser

log = logging.getLogger(__name__)

Mode = Literal["none", "auto", "required", "named"]
# Tools in one request: OpenAI's bound ("A max of 128 functions are supported", the chat API reference's tools).
MAX_TOOLS = 128
# The format a template that cannot render tools is told to write calls in, for ``auto``, when
# option.tool_call_parser does not name one.
DESCRIBED_FORMAT = "hermes"


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


class NamedReader(Reader):
    """``tool_choice`` naming a function: the whole output is that call's arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def _step(self) -> bool:
        if not self.calls and (self.pending or self.final):
            self.start(self.name)  # a call with empty output still is the call
        text = self.consume(len(self.pending))
        self.args(text)
        return False


class RequiredReader(Reader):
    """``tool_choice: required``: the output is a JSON list of ``{"name", "parameters"}`` (its guide)."""

    def __init__(self) -> None:
        super().__init__()
        self.list = CallList(self, ("parameters",))

    def _step(self) -> bool:
        if self.list.state == "reading":
            return self.list.feed()
        self.content(self.consume(len(self.pending)))  # what follows the list: none, under the guide
        return False


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
    parser: ToolParser | None = None  # auto
    parallel: bool = True

    def template_tools(self) -> list[dict[str, Any]]:
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def schemas(self) -> Schemas:
        return {t.function.name: t.function.parameters or {} for t in self.tools}

    def guided(self) -> GuidedDecoding | None:
        if self.mode == "named":
            tool = next(t for t in self.tools if t.function.name == self.name)
            schema = tool.function.parameters or {"type": "object"}
        elif self.mode == "required":
            schema = _required_schema(self.tools, self.parallel)
        else:
            return None
        return GuidedDecoding("json_schema", schema_guide_text(schema, "tools"))

    def reader(self) -> Reader | None:
        """A reader of one output's calls; None where the output is all content."""
        if self.mode == "named":
            return NamedReader(self.name)  # type: ignore[arg-type]
        if self.mode == "required":
            return RequiredReader()
        if self.mode == "auto" and self.parser is not None:
            return self.parser.reader(self.schemas())
        return None

    def describe(self, tools: list[dict[str, Any]]) -> str:
        """The tools told to a model whose chat template cannot render them (``tools``: their definitions as the
        template would get them), and what to answer."""
        functions = json.dumps([t["function"] for t in tools], ensure_ascii=False)
        text = f"You can call these functions (each with a JSON schema of its parameters):\n{functions}\n"
        if self.mode == "named":
            return text + f"Call {self.name}: answer with its arguments alone, as one JSON object."
        if self.mode == "required":
            return text + (
                'Call one or more of them: answer with a JSON list of calls alone, each {"name": <function name>, '
                '"parameters": {<its arguments>}}.'
            )
        if self.mode == "auto" and self.parser is not None:
            example = self.parser.write([("function_name", {"parameter": "value"})])
            return (
                text + f"To call a function, answer with the call alone, written as:\n{example}\nElse answer in text."
            )
        return text


def plan_tools(
    tools: Any,
    tool_choice: Any,
    parallel_tool_calls: Any,
    *,
    auto_enabled: bool,
    parser_option: str | None,
    template: str | None,
    takes_tools: bool = True,
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
    parser = _auto_parser(parser_option, template, takes_tools)
    if parser is None:
        raise FieldError(
            "tool_choice",
            "tool_choice 'auto': this model's chat template writes no tool-call format known here; "
            f"set option.tool_call_parser to one of {', '.join(tool_parsers.names())}",
        )
    return ToolPlan(specs, "auto", parser=parser, parallel=parallel)


def _auto_parser(option: str | None, template: str | None, takes_tools: bool) -> ToolParser | None:
    """``auto``'s parser: option.tool_call_parser, else the one the template's text shows, else (a template that
    does not take ``tools``, to which the tools are described) ``DESCRIBED_FORMAT``."""
    if option:
        return tool_parsers.REGISTRY[option]
    found = recognised(template) if template is not None else None
    if found is None and not takes_tools:
        return tool_parsers.REGISTRY[DESCRIBED_FORMAT]
    return found


@lru_cache(maxsize=8)
def recognised(template: str) -> ToolParser | None:
    """The tool-call parser a chat template's text shows (logged once per template)."""
    found = tool_parsers.recognise(template)
    log.info("tool calls: the chat template writes %s", f"the {found.name} format" if found else "no format known here")
    return found


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


def with_description(
    messages: list[dict[str, Any]], text: str, place: Literal["system", "last"]
) -> list[dict[str, Any]]:
    """``messages`` with ``text`` in a system message (the first one's, appended, or a new first one), or at the
    end of the last message."""
    if place == "last":
        last = messages[-1]
        return [*messages[:-1], {**last, "content": f"{last.get('content') or ''}\n\n{text}"}]
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        return [{**first, "content": f"{first.get('content') or ''}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
