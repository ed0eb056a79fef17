"""Chat template rendering: OpenAI ``messages`` → one prompt string.

The template is ``option.chat_template`` when set (a Jinja template, or the path of a file
holding one), else the tokenizer's own. Neither → a 400 that says what to set. Content given
as a list of parts is reduced to its text parts joined with newlines (DJL's behaviour), so
text-only templates work with clients that always send parts; other part types are refused.

What a client sends is text: special-token text (``<|im_end|>``, ``</s>``) in message content, roles,
names, tool calls and tool definitions is tokenized as plain characters, never as the control tokens the
template itself writes, unless ``option.parse_special_tokens``. Client ``chat_template_kwargs`` are
limited to ``TEMPLATE_KWARGS``. Big chats are rendered and tokenized off the event loop.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.meta

from lmi_trt.engines.guided import json_extent
from lmi_trt.serving.errors import FieldError
from lmi_trt.serving.tool_calls import template_messages, with_description

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
# Chats this big (characters of text, or messages) are rendered off the event loop.
_THREAD_CHARS = 16_384
_THREAD_MESSAGES = 256
# Levels of arrays and objects in one message, tool or tool call's arguments: the template's JSON writer
# (transformers' tojson, json.dumps) recurses, and deeper values are no one's real request.
MAX_NESTING = 64


class ChatError(FieldError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(param, message)


class ToolsLeftOut(ChatError):
    """The chat template rendered none of the tools it was given (``_prompt`` then describes them)."""


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat: what goes to the engine (the text, or its token ids where special-token text the client
    sent must stay text) and the rendered text itself (whose end says whether the template opened reasoning)."""

    prompt: str | list[int]
    text: str


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
        raise ToolsLeftOut("tools: this model's chat template does not render tools", "tools")
    return out


@lru_cache(maxsize=32)
def takes(template: str, variable: str) -> bool:
    """Whether a chat template reads ``variable`` (jinja2's analysis of the template's undeclared variables; a
    template plain jinja2 cannot parse, written for transformers' extensions, is searched for the word)."""
    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        return variable in jinja2.meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return re.search(rf"\b{re.escape(variable)}\b", template) is not None


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


def check_template_kwargs(
    kwargs: dict[str, Any] | None, template: str | None, fields: dict[str, str] | None = None
) -> dict[str, Any]:
    """``chat_template_kwargs`` limited to ``TEMPLATE_KWARGS`` with their types, and to what the chat template
    reads (one it does not read would be accepted and ignored); a 400 naming the key, or ``fields[key]`` where
    the request spelled it elsewhere (OpenAI's top-level ``reasoning_effort``)."""
    for key, value in (kwargs or {}).items():
        want = TEMPLATE_KWARGS.get(key)
        where = (fields or {}).get(key) or f"chat_template_kwargs.{ascii(key)[1:-1][:64]}"
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
        if template is not None and not takes(template, key):
            raise ChatError(f"{where}: this model's chat template does not read {key}; leave it out", where)
    return dict(kwargs or {})


async def prompt_for(
    service: GenerationService,
    raw_messages: Any,
    *,
    template_option: str | None,
    add_generation_prompt: bool,
    template_kwargs: dict[str, Any] | None,
    kwarg_fields: dict[str, str] | None = None,
    tools: list[dict[str, Any]] | None = None,
    describe: Callable[[list[dict[str, Any]]], str] | None = None,
) -> ChatPrompt:
    """The chat's prompt: the rendered text (its special tokens are the template's), or token ids
    where a client's text holds special-token text that must stay text. Bounded before any work
    that grows with the chat: messages (one token each at least), and the characters of every string
    the client sent in messages and tools (content, roles, names, tool calls and their arguments,
    tool definitions), which also decide whether the chat is rendered off the event loop. ``describe``:
    the text that tells a template that leaves ``tools`` out about them (none: they are left out)."""
    kwargs = check_template_kwargs(template_kwargs, template_text(service.tokenizer, template_option), kwarg_fields)
    max_len = service.engine.limits.max_input_len
    if isinstance(raw_messages, list) and len(raw_messages) > max_len:
        raise ChatError(
            f"messages has {len(raw_messages)} messages, more than option.max_input_len={max_len} tokens "
            "could hold; shorten the chat",
            "messages",
        )
    messages = normalize_messages(raw_messages)
    chars = {"messages": _text_chars(messages, "messages"), "tools": _text_chars(tools or [], "tools")}
    if sum(chars.values()) > service.max_prompt_chars:
        field = max(chars, key=chars.__getitem__)
        raise ChatError(
            f"{field} holds {chars[field]} characters of text (messages and tools together "
            f"{sum(chars.values())}), more than any prompt of option.max_input_len={max_len} tokens can have "
            f"({service.max_prompt_chars}); shorten the chat",
            field,
        )
    protect = None if service.config.parse_special_tokens else service.special_text
    job = functools.partial(
        _prompt, service.tokenizer, messages, template_option, add_generation_prompt, kwargs, protect, tools, describe
    )
    if sum(chars.values()) > _THREAD_CHARS or len(messages) > _THREAD_MESSAGES:
        return await service.off_loop(job)
    return job()


def _text_chars(items: list[Any], where: str) -> int:
    """Characters of the strings (keys too) in ``items``; a 400 naming an item nested past ``MAX_NESTING``,
    which the template's JSON writer (``tojson``) could not follow."""
    total = 0
    for i, item in enumerate(items):
        depth, chars = json_extent(item, MAX_NESTING)
        if depth > MAX_NESTING:
            raise ChatError(
                f"{where}[{i}] nests more than {MAX_NESTING} levels of objects and arrays; flatten it", f"{where}[{i}]"
            )
        total += chars
    return total


def _prompt(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template_option: str | None,
    add_generation_prompt: bool,
    kwargs: dict[str, Any],
    protect: re.Pattern[str] | None,
    tools: list[dict[str, Any]] | None,
    describe: Callable[[list[dict[str, Any]]], str] | None,
) -> ChatPrompt:
    """Render (and, where special-token text must stay text, tokenize) the chat: off the event loop when big."""
    messages = template_messages(messages)
    for i, m in enumerate(messages):  # arguments sent as JSON text are parsed here: bound what they nest to
        for j, call in enumerate(m.get("tool_calls") or ()):
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and json_extent(fn.get("arguments"), MAX_NESTING)[0] > MAX_NESTING:
                where = f"messages[{i}].tool_calls[{j}].function.arguments"
                raise ChatError(f"{where} nests more than {MAX_NESTING} levels of objects and arrays", where)
    # Special-token text in anything the client sent (content, roles, names, tool calls, tool definitions:
    # keys and values) is swapped for placeholders the client cannot guess; the template renders those, and
    # each is tokenized back as plain characters, never as the control token the template writes.
    tag = uuid.uuid4().hex
    originals: list[str] = []
    if protect is not None:
        messages = _shielded(messages, protect, tag, originals)
        tools = _shielded(tools, protect, tag, originals) if tools else tools
    template = functools.partial(
        render,
        tokenizer,
        template_option=template_option,
        add_generation_prompt=add_generation_prompt,
        template_kwargs=kwargs,
    )
    try:
        text = template(messages, tools=tools)
    except ToolsLeftOut:
        text = _described(template, messages, describe(tools) if describe is not None and tools else None)
    return ChatPrompt(_ids_with_text(tokenizer, text, tag, originals) if originals else text, text)


def _described(template: Callable[..., str], messages: list[dict[str, Any]], description: str | None) -> str:
    """The chat rendered without the tools its template left out: told about them in a system message, or, where
    the template refuses one, at the end of the last message (TGI's place); ``description`` None: left out."""
    if description is None:
        return template(messages)
    try:
        return template(with_description(messages, description, "system"))
    except ChatError:
        return template(with_description(messages, description, "last"))


def _shielded(value: Any, protect: re.Pattern[str], tag: str, originals: list[str]) -> Any:
    """``value`` with each special-token text in its strings and keys replaced by a placeholder naming its
    place in ``originals`` (recursive: the chat's nesting is bounded by ``MAX_NESTING``)."""
    if isinstance(value, str):

        def placeholder(match: re.Match[str]) -> str:
            originals.append(match.group(0))
            return f"\ue000{tag}{len(originals) - 1:x}\ue001"

        return protect.sub(placeholder, value)
    if isinstance(value, dict):
        return {_shielded(k, protect, tag, originals): _shielded(v, protect, tag, originals) for k, v in value.items()}
    if isinstance(value, list):
        return [_shielded(v, protect, tag, originals) for v in value]
    return value


def _ids_with_text(tokenizer: Any, text: str, tag: str, originals: list[str]) -> list[int]:
    """The rendered chat's token ids: the template's text with its special tokens, each placeholder as the
    client's special-token text split into plain tokens."""
    ids: list[int] = []
    pos, found = 0, 0
    for match in re.finditer(f"\ue000{tag}([0-9a-f]+)\ue001", text):
        if match.start() > pos:
            ids += tokenizer.encode(text[pos : match.start()], add_special_tokens=False)
        ids += tokenizer.encode(originals[int(match.group(1), 16)], add_special_tokens=False, split_special_tokens=True)
        pos, found = match.end(), found + 1
    if text.count(tag) != found:  # the template changed a placeholder (escaped it, cut it)
        raise ChatError(
            "the chat template changed special-token text sent in the messages or tools in a way this server "
            "cannot keep apart from the template's own text; remove special-token text from them",
            "messages",
        )
    if pos < len(text):
        ids += tokenizer.encode(text[pos:], add_special_tokens=False)
    return ids
