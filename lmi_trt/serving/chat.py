"""Chat template rendering: OpenAI ``messages`` → one prompt string.

The template is ``option.chat_template`` when set (a Jinja template, or the path of a file
holding one), else the tokenizer's own. Neither → a 400 that says what to set. Content given
as a list of parts is reduced to its text parts joined with newlines (DJL's behaviour), so
text-only templates work with clients that always send parts; other part types are refused.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmi_trt.serving.errors import BadRequest

log = logging.getLogger(__name__)

NO_TEMPLATE = (
    "this model has no chat template: its tokenizer defines none and option.chat_template is not set; "
    "set option.chat_template (a Jinja template or a file holding one), or send a plain prompt instead "
    "(/v1/completions, or {\"inputs\": ...} at /invocations)"
)


class ChatError(BadRequest):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@lru_cache(maxsize=8)
def resolve_template(option: str | None) -> str | None:
    """``option.chat_template`` as template text: a readable file's content, else the value itself."""
    if not option:
        return None
    if "{" not in option and "\n" not in option:
        path = Path(option).expanduser()
        if path.is_file():
            return path.read_text(encoding="utf-8")
        raise ValueError(f"option.chat_template={option!r} is neither a Jinja template nor a readable file")
    return option


def has_template(tokenizer: Any, option: str | None) -> bool:
    return bool(option) or bool(getattr(tokenizer, "chat_template", None))


def _text_of(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or "type" not in part:
                raise ChatError(f"{where}[{i}] must be an object with a 'type', such as {{\"type\": \"text\", \"text\": \"Hi\"}}",
                                f"{where}[{i}]")
            if part["type"] != "text":
                raise ChatError(f"{where}[{i}] has type {part['type']!r}: only text content is supported by this server",
                                f"{where}[{i}].type")
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatError(f"{where}[{i}].text must be a string", f"{where}[{i}].text")
            texts.append(text)
        return "\n".join(texts)
    raise ChatError(f"{where} must be a string, a list of content parts or null, got {type(content).__name__}", where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the shape of ``messages`` and flatten list content into text."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {\"role\": ..., \"content\": ...} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatError(f"messages[{i}] must be an object with 'role' and 'content'", f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatError(f"messages[{i}].role must be a non-empty string such as 'user'", f"messages[{i}].role")
        if "content" not in m and not m.get("tool_calls"):
            raise ChatError(f"messages[{i}] has no content", f"messages[{i}].content")
        msg = dict(m)
        msg["content"] = _text_of(m.get("content"), f"messages[{i}].content")
        out.append(msg)
    return out


def render(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    template_option: str | None = None,
    add_generation_prompt: bool = True,
    template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The prompt text; a template that fails on these messages is the request's 400."""
    try:
        template = resolve_template(template_option)
    except ValueError as e:
        raise ChatError(str(e)) from None
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ChatError(NO_TEMPLATE, "messages")
    try:
        out = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **(template_kwargs or {}),
        )
    except Exception as e:  # jinja2 TemplateError / raise_exception("roles must alternate") / TypeError
        raise ChatError(f"the chat template could not render these messages: {type(e).__name__}: {e}", "messages") from None
    if not isinstance(out, str):  # some transformers versions return a list for batched input
        out = out[0]
    return out
