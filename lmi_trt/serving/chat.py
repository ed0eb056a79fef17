"""Chat template rendering: OpenAI ``messages`` → one prompt string.

The template is ``option.chat_template`` when set (a Jinja template, or the path of a file
holding one), else the tokenizer's own. Neither → a 400 that says what to set. Content given
as a list of parts is reduced to its text parts joined with newlines (DJL's behaviour), so
text-only templates work with clients that always send parts; other part types are refused.

A client's message content is text: special-token text in it (``<|im_end|>``, ``</s>``) is
tokenized as plain characters, never as the control tokens the template itself writes, unless
``option.parse_special_tokens``. Client ``chat_template_kwargs`` are limited to ``TEMPLATE_KWARGS``.
Big chats are rendered and tokenized off the event loop.
"""

from __future__ import annotations

import functools
import logging
import uuid
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmi_trt.serving.errors import FieldError
from lmi_trt.serving.tool_calls import template_messages

if TYPE_CHECKING:
    from lmi_trt.serving.core import GenerationService

log = logging.getLogger(__name__)

NO_TEMPLATE = (
    "this model has no chat template: its tokenizer defines none and option.chat_template is not set; "
    "set option.chat_template (a Jinja template or a file holding one), or send a plain prompt instead "
    '(/v1/completions, or {"inputs": ...} at /invocations)'
)
# The documented switches of common templates (Qwen3 enable_thinking, DeepSeek/Granite thinking,
# gpt-oss reasoning_effort) and their types; anything else could reach apply_chat_template's own
# arguments (tokenize, chat_template, return_*) or a template's internals.
TEMPLATE_KWARGS: dict[str, type] = {"enable_thinking": bool, "thinking": bool, "reasoning_effort": str}
_MAX_KWARG_TEXT = 64
# Chats this big (characters of content, or messages) are rendered off the event loop.
_THREAD_CHARS = 16_384
_THREAD_MESSAGES = 256


class ChatError(FieldError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(param, message)


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
                raise ChatError(
                    f'{where}[{i}] must be an object with a \'type\', such as {{"type": "text", "text": "Hi"}}',
                    f"{where}[{i}]",
                )
            if part["type"] != "text":
                raise ChatError(
                    f"{where}[{i}] has type {part['type']!r}: only text content is supported by this server",
                    f"{where}[{i}].type",
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatError(f"{where}[{i}].text must be a string", f"{where}[{i}].text")
            texts.append(text)
        return "\n".join(texts)
    raise ChatError(f"{where} must be a string, a list of content parts or null, got {type(content).__name__}", where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Check the shape of ``messages`` and flatten list content into text."""
    if not isinstance(messages, list) or not messages:
        raise ChatError('messages must be a non-empty list of {"role": ..., "content": ...} objects', "messages")
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
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The prompt text; a template that fails on these messages, or that leaves out the tools it is
    given, is the request's 400."""
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
            tools=tools,
            **(template_kwargs or {}),
        )
    except Exception as e:  # jinja2 TemplateError / raise_exception("roles must alternate") / TypeError
        raise ChatError(
            f"the chat template could not render these messages: {type(e).__name__}: {e}", "messages"
        ) from None
    if not isinstance(out, str):  # some transformers versions return a list for batched input
        out = out[0]
    if tools and not any(t["function"]["name"] in out for t in tools):
        raise ChatError(
            "tools: this model's chat template does not render tools (no tool's name is in the prompt "
            "it wrote); set option.chat_template to a template that does, or leave tools out",
            "tools",
        )
    return out


def template_text(tokenizer: Any, option: str | None) -> str | None:
    """The chat template in use: ``option.chat_template`` (its text) or the tokenizer's own."""
    try:
        own = resolve_template(option)
    except ValueError:
        own = None
    template = own or getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates (transformers): the tool-use one where there is one
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else None


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``chat_template_kwargs`` limited to ``TEMPLATE_KWARGS`` with their types (400 naming the key)."""
    for key, value in (kwargs or {}).items():
        want = TEMPLATE_KWARGS.get(key)
        where = f"chat_template_kwargs.{ascii(key)[1:-1][:64]}"
        if want is None:
            raise ChatError(
                f"{where} is not accepted; the accepted keys are {', '.join(sorted(TEMPLATE_KWARGS))}", where
            )
        if type(value) is not want or (want is str and len(value) > _MAX_KWARG_TEXT):
            raise ChatError(
                f"{where} must be a {want.__name__}"
                + (f" of at most {_MAX_KWARG_TEXT} characters" if want is str else ""),
                where,
            )
    return dict(kwargs or {})


async def prompt_for(
    service: GenerationService,
    raw_messages: Any,
    *,
    template_option: str | None,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None = None,
) -> str | list[int]:
    """The chat's prompt: the rendered text (its special tokens are the template's), or token ids
    where a client's content holds special-token text that must stay text. Bounded before any
    work that grows with the chat: messages (one token each at least) and content characters."""
    kwargs = check_template_kwargs(template_kwargs)
    max_len = service.engine.limits.max_input_len
    if isinstance(raw_messages, list) and len(raw_messages) > max_len:
        raise ChatError(
            f"messages has {len(raw_messages)} messages, more than option.max_input_len={max_len} tokens "
            "could hold; shorten the chat",
            "messages",
        )
    messages = template_messages(normalize_messages(raw_messages))
    chars = sum(len(m["content"] or "") for m in messages)
    if chars > service.max_prompt_chars:
        raise ChatError(
            f"messages has {chars} characters of content, more than any prompt of option.max_input_len="
            f"{max_len} tokens can have ({service.max_prompt_chars}); shorten the chat",
            "messages",
        )
    protect = None if service.config.parse_special_tokens else service.special_text
    job = functools.partial(
        _prompt, service.tokenizer, messages, template_option, add_generation_prompt, kwargs, protect, tools
    )
    if chars > _THREAD_CHARS or len(messages) > _THREAD_MESSAGES:
        return await service.off_loop(job)
    return job()


def _prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template_option: str | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
    protect: Any,
    tools: list[dict[str, Any]] | None,
) -> str | list[int]:
    if protect is None or not any(protect.search(m["content"] or "") for m in messages):
        return render(
            tokenizer,
            messages,
            template_option=template_option,
            add_generation_prompt=add_generation_prompt,
            template_kwargs=kwargs,
            tools=tools,
        )
    # Mark each content with markers the client cannot guess, render, then tokenize the template's
    # text with its special tokens and the clients' text with special-token text split into plain tokens.
    tag = uuid.uuid4().hex
    start, end = f"\ue000{tag}", f"{tag}\ue001"
    marked = [{**m, "content": start + m["content"] + end} if m["content"] else m for m in messages]
    text = render(
        tokenizer,
        marked,
        template_option=template_option,
        add_generation_prompt=add_generation_prompt,
        template_kwargs=kwargs,
        tools=tools,
    )
    ids: list[int] = []
    rest = text
    while rest:
        head, found, rest = rest.partition(start)
        if head:
            ids += tokenizer.encode(head, add_special_tokens=False)
        if not found:
            break
        content, closed, rest = rest.partition(end)
        if not closed:
            raise ChatError(
                "the chat template changed a message's content in a way this server cannot keep apart "
                "from the template's own text; remove special-token text from the messages",
                "messages",
            )
        ids += tokenizer.encode(content, add_special_tokens=False, split_special_tokens=True)
    return ids
