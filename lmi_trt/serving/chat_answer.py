"""A chat answer's parts, read out of the model's output as it comes: reasoning (``reasoning_parsers``), then
content and tool calls (``tool_calls``, ``tool_parsers``).

``AnswerReader.feed`` takes each piece of one choice's output and gives its parts; a stream sends them as
deltas, an answer folds all of them (``Answer.of``), so a stream reassembles to the answer the same request
gets unstreamed. The reasoning is read first: a tool call after the model's thinking is read from the content
that follows it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lmi_trt.reasoning_parsers.base import ReasoningReader
from lmi_trt.serving.tool_calls import ToolCall
from lmi_trt.tool_parsers.base import CallArgs, CallStart, Content, Reader


@dataclass(frozen=True)
class Reasoning:
    text: str


Part = Reasoning | Content | CallStart | CallArgs


class AnswerReader:
    """One choice's output split into parts. ``reasoning``: the reasoning parser's reader (None: no reasoning
    parsed); ``include_reasoning`` false (vLLM's request field) drops the reasoning from the answer.
    ``tools``: the calls' reader (None: the output is all content)."""

    def __init__(self, reasoning: ReasoningReader | None, tools: Reader | None, include_reasoning: bool = True):
        self.reasoning = reasoning
        self.tools = tools
        self.include_reasoning = include_reasoning

    def feed(self, text: str) -> list[Part]:
        return self._parts(*(self.reasoning.feed(text) if self.reasoning is not None else ("", text)), final=False)

    def finish(self) -> list[Part]:
        return self._parts(*(self.reasoning.finish() if self.reasoning is not None else ("", "")), final=True)

    def _parts(self, reasoning: str, content: str, *, final: bool) -> list[Part]:
        parts: list[Part] = [Reasoning(reasoning)] if reasoning and self.include_reasoning else []
        if self.tools is None:
            return [*parts, Content(content)] if content else parts
        parts += self.tools.feed(content) if content else []
        return parts + self.tools.finish() if final else parts


@dataclass
class Answer:
    """An unstreamed choice's parts: ``content`` is None when calls are all there is (OpenAI's shape),
    ``reasoning`` None when there is none."""

    content: str | None
    reasoning: str | None = None
    calls: list[ToolCall] = field(default_factory=list)

    @classmethod
    def of(cls, reader: AnswerReader, text: str) -> Answer:
        content, reasoning, calls = [], [], []
        for part in [*reader.feed(text), *reader.finish()]:
            if isinstance(part, Reasoning):
                reasoning.append(part.text)
            elif isinstance(part, Content):
                content.append(part.text)
            elif isinstance(part, CallStart):
                calls.append([part.name, ""])
            else:
                calls[part.index][1] += part.text
        text_content = "".join(content)
        return cls(
            text_content if text_content.strip() or not calls else None,
            "".join(reasoning) or None,
            [ToolCall(name, arguments) for name, arguments in calls],
        )
