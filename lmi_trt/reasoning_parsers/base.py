"""What the reasoning parsers share: the reader that splits an output into reasoning and content, and the
registry (as vLLM's ``ReasoningParserManager``, vllm-project/vllm ``vllm/reasoning/``: one module per parser,
registered by name).

The families here write their reasoning between ``<think>`` and ``</think>``. Whether an output starts inside
the reasoning is read off the end of the rendered prompt, as trtllm-serve reads it
(NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/reasoning_parser.py``, ``resolve_prefilled_thinking``): a prompt that
ends with ``<think>`` (DeepSeek-R1's template, Qwen3.5's, QwQ's, DeepSeek-V3.1's with ``thinking``) leaves it
open, so the output is reasoning up to ``</think>``; one that ends with ``</think>`` (Qwen3 with
``enable_thinking: false``, DeepSeek-V3.1 without ``thinking``) closed it, so all of it is content. A prompt
with neither at its end leaves it to the model, and the parser says what its family does then (``unprompted``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from lmi_trt.tool_parsers.base import held_prefix, register_in

START, END = "<think>", "</think>"
# Enough of the rendered prompt's end to hold a marker and the space a template writes after it.
_TAIL_CHARS = 64
Start = Literal["reasoning", "content", "either"]


@dataclass(frozen=True)
class ReasoningParser:
    """One family's reasoning. ``unprompted``: how an output begins when the prompt neither opened nor closed
    the reasoning: "reasoning" (all of it up to ``</think>``: DeepSeek-R1 always reasons, and some of its
    outputs leave out the opening tag, vLLM's ``deepseek_r1``) or "either" (reasoning only when the output
    opens with ``<think>``). ``recognise``: whether a chat template's text is this family's."""

    name: str
    unprompted: Start
    recognise: Callable[[str], bool]
    aliases: tuple[str, ...] = ()  # other servers' spellings (trtllm-serve's --reasoning_parser names)
    markers: tuple[str, ...] = (START, END)

    def start(self, prompt: str) -> Start:
        """How an output of this prompt begins."""
        tail = prompt[-_TAIL_CHARS:].rstrip()
        if tail.endswith(END):
            return "content"
        if tail.endswith(START):
            return "reasoning"
        return self.unprompted

    def reader(self, prompt: str) -> ReasoningReader:
        return ReasoningReader(self.start(prompt))


class ReasoningReader:
    """One output split as it comes: ``feed`` a piece, get (reasoning, content) of it; ``finish`` at the end.
    Reasoning comes first; an opening ``<think>`` and the closing ``</think>`` belong to neither. Text that may
    still be the start of a marker is held back, so any split of an output gives the same two texts."""

    def __init__(self, start: Start) -> None:
        self.state: Literal["opening", "reasoning", "content"] = "opening"
        self.first: Start = start
        self.pending = ""

    def feed(self, text: str, *, final: bool = False) -> tuple[str, str]:
        self.pending += text
        reasoning = content = ""
        if self.state == "opening":
            stripped = self.pending.lstrip()
            if self.first == "content" or (stripped and not START.startswith(stripped[: len(START)])):
                self.state = "content" if self.first in ("content", "either") else "reasoning"
            elif stripped.startswith(START):
                self.pending, self.state = stripped[len(START) :], "reasoning"
            elif final:
                self.state = "content" if self.first == "either" else "reasoning"
            else:
                return "", ""
        if self.state == "reasoning":
            before, marker, after = self.pending.partition(END)
            if marker:
                reasoning, self.pending, self.state = before, after, "content"
            else:
                keep = 0 if final else held_prefix(self.pending, END)
                reasoning, self.pending = (
                    self.pending[: len(self.pending) - keep],
                    self.pending[len(self.pending) - keep :],
                )
        if self.state == "content":
            content, self.pending = self.pending, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)


REGISTRY: dict[str, ReasoningParser] = {}


def register(parser: ReasoningParser) -> ReasoningParser:
    return register_in(REGISTRY, parser)
