"""The OpenAI schema: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``.

Chat messages are rendered with the chat template (``serving.chat``). A body with ``messages``
at ``/invocations`` is a chat request too (DJL): its answer is a ``chat.completion`` object, or
when streaming ``chat.completion.chunk`` JSON lines (DJL's ``jsonlines_chat``; with
``option.output_formatter=sse`` SSE ending in ``data: [DONE]``). Errors under ``/v1`` have
OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``; at ``/invocations`` the LMI
shape, as every other ``/invocations`` error.

Supported: max_tokens / max_completion_tokens, temperature, top_p, seed, presence/frequency
penalties, stop (str | list), n (several choices, streamed too: each chunk names its choice's index), stream +
stream_options.include_usage, logprobs (chat
``logprobs`` with ``top_logprobs`` alternatives up to 20; completions ``logprobs=k``, up to 5),
echo (completions; with logprobs the prompt's tokens and their log-probs come first, as OpenAI answers), and
the common extensions top_k, min_tokens, repetition_penalty, ignore_eos,
skip_special_tokens, stop_token_ids, bad_words, ``logit_bias``, and chat ``response_format``
json_object / json_schema (constrained decoding), and tools / tool_choice / parallel_tool_calls (``tool_calls``);
vLLM's beam search: use_beam_search with length_penalty / early_stopping, n beams returned as the n choices.
Refused with a 400 naming the field: chat best_of > 1, n > 1 with several prompts, suffix, the deprecated
functions / function_call, non-text content, include_stop_str_in_output true, spaces_between_special_tokens
false, and what an engine cannot do (alternatives, grammars, biases, beams, min_p).
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import cached_property
from typing import Any, Literal

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmi_trt import reasoning_parsers
from lmi_trt.engines.base import SAMPLING_FEATURES, FinishReason, GuidedDecoding
from lmi_trt.reasoning_parsers import ReasoningParser
from lmi_trt.reasoning_parsers.base import END as REASONING_END
from lmi_trt.serving import chat, tool_calls
from lmi_trt.serving.access import current_request_id
from lmi_trt.serving.chat_answer import Answer, AnswerReader, Part, Reasoning
from lmi_trt.serving.core import (
    Alternative,
    Completion,
    Delta,
    GenerateParams,
    GenerationService,
    GenerationStream,
    TokenOut,
    refuse_streamed_beams,
    schema_guide_text,
)
from lmi_trt.serving.errors import UNNAMED_MODEL, LmiHttpError, check_model
from lmi_trt.serving.http import (
    CONTEXT,
    Body,
    ServingContext,
    add_post,
    error_response,
    json_response,
    register_feature_fields,
    register_invocation,
)
from lmi_trt.serving.protocols._common import (
    SSE_HEADERS,
    FieldError,
    best_n,
    collect_n,
    errors_as,
    json_object,
    neutral_params,
    open_stream,
    open_streams,
    param_of,
    pump,
    pump_all,
    refuse_typos,
    sse,
    start_n,
    validate_body,
)
from lmi_trt.serving.tool_calls import ToolCall, ToolPlan
from lmi_trt.tool_parsers.base import CallStart, Content

log = logging.getLogger(__name__)

FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "abort",
}
DONE = b"data: [DONE]\n\n"
_TOKEN_ID = re.compile(r"[0-9]{1,10}")


def _json_or_none(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _ebnf_string(text: str) -> str:
    """A literal of xgrammar's EBNF (its strings take JSON's escapes)."""
    return orjson.dumps(text).decode()


# Accepted and without effect on the output.
_IGNORED = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "modalities",
        "prediction",
        "audio",
        "web_search_options",
    }
)
# vLLM's fields this server does not implement, refused where they would change the answer (never ignored):
# field → (whether the value asks for something, why not).
_REFUSED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "include_stop_str_in_output": (
        lambda v: v not in (None, False),
        "the stop string is never included in the output here; leave it out or false",
    ),
    "spaces_between_special_tokens": (
        lambda v: v not in (None, True),
        "special tokens are always decoded with spaces between them here; leave it out or true",
    ),
}
# Fields OpenAI's API (openai-python 3.57 types: chat/completion_create_params.py, completion_create_params.py) or
# vLLM's OpenAI server (vllm/entrypoints/openai/protocol.py: ChatCompletionRequest, CompletionRequest) accept: never
# taken for a typo of a field here, however close (``store`` / ``stop``). Those not served here are warned about.
# fmt: off
PEER_FIELDS = frozenset(
    {
        # OpenAI
        "audio", "best_of", "echo", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
        "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model", "moderation", "n",
        "parallel_tool_calls", "prediction", "presence_penalty", "prompt", "prompt_cache_key",
        "prompt_cache_options", "prompt_cache_retention", "reasoning_effort", "response_format",
        "safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "suffix",
        "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
        # vLLM
        "include_reasoning", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty",
        "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
        "bad_words", "add_generation_prompt", "continue_final_message", "add_special_tokens", "documents",
        "chat_template", "chat_template_kwargs", "mm_processor_kwargs", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "structural_tag", "guided_decoding_backend", "guided_whitespace_pattern",
        "priority", "request_id", "logits_processors", "return_tokens_as_token_ids", "cache_salt",
        "kv_transfer_params", "vllm_xargs", "prompt_embeds",
    }
)
# fmt: on
_warned: set[str] = set()
_MAX_WARNED = 256  # names are client-chosen: bound the set (and the log lines) they can grow


# --- errors ---
_ERROR_TYPES = {404: "not_found_error", 424: "model_error", 429: "rate_limit_error", 503: "service_unavailable_error"}


def _error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def openai_error_body(err: LmiHttpError) -> dict[str, Any]:
    return {
        "error": {"message": err.message, "type": _error_type(err.status), "param": param_of(err), "code": err.status}
    }


def openai_error(err: LmiHttpError) -> web.Response:
    return json_response(openai_error_body(err), status=err.status, headers=err.headers or None)


# --- request schemas ---
class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Base(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**64)
    logit_bias: dict[str, float] | None = None
    # Common extensions (vLLM / TGI names), usually sent through the client's extra_body.
    top_k: int | None = Field(None, ge=-1)
    min_tokens: int | None = Field(None, ge=0)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # vLLM's constrained decoding: ``structured_outputs`` (its StructuredOutputsParams: json, regex, choice,
    # grammar, json_object; vllm/sampling_params.py) and the top-level guided_json, guided_regex, guided_choice,
    # guided_grammar of its releases before 0.12.
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's beam search (vllm/entrypoints/openai/protocol.py): n beams come back as the choices (completions:
    # best_of of them searched, as vLLM's SamplingParams took best_of for the width before 0.6.3).
    use_beam_search: bool = False
    length_penalty: float | None = None
    early_stopping: bool | Literal["never"] | None = None
    min_p: float | None = None

    @cached_property
    def structured(self) -> tuple[GuidedDecoding, str] | None:
        """The vLLM constraint this request sent, and the field it used; a 400 for two, or for an option of
        ``structured_outputs`` not served here."""
        given = [(f, getattr(self, f)) for f in ("guided_json", "guided_regex", "guided_choice", "guided_grammar")]
        for key, value in (self.structured_outputs or {}).items():
            if key == "disable_any_whitespace" and value is True:
                continue  # what every JSON constraint here does
            if key not in ("json", "regex", "choice", "grammar", "json_object"):
                raise FieldError(
                    f"structured_outputs.{key}",
                    f"structured_outputs.{ascii(key)[1:-1][:64]} is not served here; send one of json, regex, "
                    "choice, grammar or json_object",
                )
            given.append((f"structured_outputs.{key}", value if key != "json_object" or value else None))
        sent = [(f, v) for f, v in given if v is not None]
        if len(sent) > 1:
            raise FieldError(sent[1][0], f"{sent[0][0]} and {sent[1][0]} exclude each other; send one")
        if not sent:
            return None
        field, value = sent[0]
        kind = field.rsplit("_", 1)[-1].rsplit(".", 1)[-1]
        if kind == "object":
            return GuidedDecoding("json_object"), field
        if kind == "json":
            schema = _json_or_none(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise FieldError(field, f"{field} must be a JSON schema: an object, or its JSON text")
            return GuidedDecoding("json_schema", schema_guide_text(schema, field)), field
        if kind == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
                raise FieldError(field, f"{field} must be a non-empty list of strings")
            return GuidedDecoding("grammar", "root ::= " + " | ".join(map(_ebnf_string, value))), field
        if not isinstance(value, str):
            raise FieldError(field, f"{field} must be a string")
        return GuidedDecoding(kind, value), field  # type: ignore[arg-type]

    def _check_common(self) -> None:
        best_of = (self.model_extra or {}).get("best_of")  # a completions field; chat has none
        if best_of not in (None, 1):
            raise FieldError("best_of", f"best_of={best_of!r} is a completions field; use n for several chat choices")
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "stream_options is only allowed with stream=true")
        for name, (asks, why) in _REFUSED.items():
            value = (self.model_extra or {}).get(name)
            if asks(value):
                raise FieldError(name, f"{name}={value!r}: {why}")
        refuse_typos(self.model_extra or {}, [*type(self).model_fields, *_IGNORED, *_REFUSED], PEER_FIELDS)
        for name in self.model_extra or {}:
            if name not in _IGNORED and name not in _REFUSED and name not in _warned and len(_warned) < _MAX_WARNED:
                _warned.add(name)
                close = difflib.get_close_matches(name, sorted(type(self).model_fields), n=1)
                log.warning(
                    "ignoring unknown OpenAI field %r%s", name, f" (did you mean {close[0]!r}?)" if close else ""
                )

    def _params(
        self, max_new_tokens: int | None, logprobs: bool, top_logprobs: int = 0, guided: GuidedDecoding | None = None
    ) -> GenerateParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stop):
            raise FieldError("stop", "stop strings must be non-empty")
        if any(not w for w in self.bad_words or []):
            raise FieldError("bad_words", "bad_words: bad words must be non-empty")
        return neutral_params(
            {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"},
            max_new_tokens=max_new_tokens,
            min_new_tokens=self.min_tokens or 0,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k if self.top_k and self.top_k > 0 else None,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            bad_words=list(self.bad_words or []),
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            guided=guided,
            logit_bias=self._logit_bias(),
            beam_width=self._beam_width(),
            num_return_sequences=(self.n or 1) if self.use_beam_search else 1,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            min_p=self.min_p,
        )

    def _beam_width(self) -> int:
        """use_beam_search: the beams searched, n (or completions' best_of when larger); 1 without it."""
        if not self.use_beam_search:
            return 1
        n = self.n or 1
        if self.stream:
            raise FieldError(
                "use_beam_search",
                "use_beam_search cannot be streamed: beams rewrite their earlier tokens; set stream to false",
            )
        return max(getattr(self, "best_of", None) or n, n)

    def _logit_bias(self) -> dict[int, float]:
        """OpenAI's ``{"token id": bias}``, bias in [-100, 100]; a key is ASCII digits (``str.isdigit`` also
        takes "²", which ``int`` refuses), at most 10 of them (``int`` refuses past 4300)."""
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not _TOKEN_ID.fullmatch(key) or not -100 <= value <= 100:
                raise FieldError(
                    "logit_bias",
                    f"logit_bias must map token ids (as strings) to numbers in [-100, 100]; got "
                    f"{ascii(key[:20])}: {value!r}",
                )
            out[int(key)] = float(value)
        return out

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Base):
    messages: Any  # checked by chat.normalize_messages, which names the message and field
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Any] | None = None  # checked by tool_calls.plan_tools, which names the field
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None  # OpenAI's deprecated function calling
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    # OpenAI's reasoning effort, for the chat templates that take it (gpt-oss's); vLLM's switch that leaves the
    # reasoning out of the answer.
    reasoning_effort: str | None = None
    include_reasoning: bool = True

    def generate_params(self, tools: ToolPlan | None = None) -> tuple[GenerateParams, str]:
        """The generation settings and the field the request's constraint (if any) came in."""
        self._check_common()
        if self.top_logprobs and not self.logprobs:  # as OpenAI
            raise FieldError("top_logprobs", "top_logprobs needs logprobs=true")
        for old in ("functions", "function_call"):
            if getattr(self, old) is not None:
                raise FieldError(old, f"{old} is OpenAI's deprecated function calling; send tools and tool_choice")
        guides = [
            (guide, field)
            for guide, field in (
                (tools.guided() if tools is not None else None, "tool_choice"),
                (self._guided(), "response_format"),
                self.structured or (None, ""),
            )
            if guide is not None
        ]
        if len(guides) > 1:
            (_, first), (_, second) = guides[:2]
            why = ", which constrains the output to the tool's arguments" if first == "tool_choice" else ""
            raise FieldError(second, f"{second} cannot be combined with {first}{why}; leave one out")
        guided, field = guides[0] if guides else (None, "response_format")
        max_new = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._params(max_new, bool(self.logprobs), self.top_logprobs or 0, guided), field

    def template_kwargs(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The chat template's keyword arguments, OpenAI's ``reasoning_effort`` among them, and the field each
        came from where it is not ``chat_template_kwargs``."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.reasoning_effort is None:
            return kwargs, {}
        if kwargs.get("reasoning_effort", self.reasoning_effort) != self.reasoning_effort:
            raise FieldError(
                "reasoning_effort", "reasoning_effort and chat_template_kwargs.reasoning_effort differ; send one"
            )
        return {**kwargs, "reasoning_effort": self.reasoning_effort}, {"reasoning_effort": "reasoning_effort"}

    def _guided(self) -> GuidedDecoding | None:
        fmt = self.response_format or {}
        kind = fmt.get("type", "text")
        if kind == "text":
            return None
        if kind == "json_object":
            return GuidedDecoding("json_object")
        if kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema") if isinstance(fmt.get("json_schema"), dict) else None
            if not isinstance(schema, dict):
                raise FieldError("response_format", "response_format.json_schema.schema must be a JSON schema object")
            return GuidedDecoding("json_schema", schema_guide_text(schema, "response_format"))
        raise FieldError(
            "response_format", f"response_format type {kind!r} is not one of text, json_object, json_schema"
        )


class CompletionRequest(_Base):
    prompt: Any
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        def is_ids(x: Any) -> bool:
            return isinstance(x, list) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)

        if isinstance(v, str) or is_ids(v):
            return v
        if isinstance(v, list) and v and all(isinstance(x, str) or is_ids(x) for x in v):
            return v
        raise ValueError("must be a string, a list of token ids, or a non-empty list of those")

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)

    def generate_params(self) -> GenerateParams:
        self._check_common()
        if self.suffix:
            raise FieldError("suffix", "suffix (insertion) is not supported by this server; leave it out")
        if self.best_of is not None and self.best_of < (self.n or 1):
            raise FieldError(
                "best_of",
                f"best_of={self.best_of} must be at least n={self.n}: it is how many are "
                "generated, n how many are returned",
            )
        if (self.best_of or 1) > 1 and self.stream:
            raise FieldError(
                "best_of",
                f"best_of={self.best_of} cannot be streamed (as OpenAI's API says): the best "
                "are known only at the end; leave stream out or best_of at n",
            )
        guided = self.structured[0] if self.structured is not None else None
        params = self._params(self.max_tokens, self.logprobs is not None, self.logprobs or 0, guided)
        # echo with logprobs: OpenAI's answer carries the prompt tokens' log-probs too (the first one null)
        return (
            params.model_copy(update={"prompt_logprobs": True}) if self.echo and self.logprobs is not None else params
        )


# --- response pieces ---
def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# The sampling features an engine may refuse (engines.base.Capabilities), as both OpenAI schemas spell them.
OPENAI_SAMPLING_NAMES = {name: name for name in SAMPLING_FEATURES} | {
    "min_new_tokens": "min_tokens",
    "beam_search": "use_beam_search",
    "min_p": "min_p",
    "num_return_sequences": "n",
    "do_sample": "temperature",
}
CHAT_NAMES = {
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "guided": "response_format",  # or the field the request's constraint came in (_chat)
    "logit_bias": "logit_bias",
    **OPENAI_SAMPLING_NAMES,
}
COMPLETION_NAMES = {
    "logprobs": "logprobs",
    "top_logprobs": "logprobs",
    "logit_bias": "logit_bias",
    "prompt_logprobs": "echo",
    **OPENAI_SAMPLING_NAMES,
}


def _chat_logprobs(tokens: list[TokenOut]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": t.text,
                "logprob": t.logprob,
                "bytes": list(t.text.encode()),
                "top_logprobs": [
                    {"token": a.text, "logprob": a.logprob, "bytes": list(a.text.encode())} for a in t.top or ()
                ],
            }
            for t in tokens
        ]
    }


class _CompletionLogprobs:
    """Completions-style logprobs, accumulated over deltas (text_offset counts from the choice text start, which
    is the prompt's first token with echo: echo with logprobs renders the prompt's tokens too)."""

    def __init__(self) -> None:
        self.offset = 0

    def render(self, tokens: list[TokenOut], prompt: list[Alternative] | None = None) -> dict[str, Any]:
        """``prompt`` (echo): the prompt's tokens first, each with its own log-prob only (the first's null)."""
        steps: list[TokenOut | Alternative] = [*(prompt or []), *tokens]
        offsets = []
        for t in steps:
            offsets.append(self.offset)
            self.offset += len(t.text)
        return {
            "tokens": [t.text for t in steps],
            "token_logprobs": [t.logprob for t in steps],
            # The chosen token alone with logprobs=0 (and for prompt tokens); else the alternatives (tokens of the
            # same text merge).
            "top_logprobs": [
                {a.text: a.logprob for a in t.top}
                if getattr(t, "top", None) is not None
                else ({t.text: t.logprob} if t.logprob is not None else None)
                for t in steps
            ],
            "text_offset": offsets,
        }


# --- chat ---
ChatFormat = Literal["json", "sse", "jsonlines"]


def _chat_format(ctx: ServingContext, stream: bool, at_invocations: bool) -> ChatFormat:
    if not at_invocations:
        return "sse" if stream else "json"
    fmt = ctx.config.output_formatter
    if fmt == "json_chat":
        return "json"
    if fmt in ("jsonlines_chat", "jsonlines"):
        return "jsonlines"
    if fmt == "sse":
        return "sse"
    return "jsonlines" if stream else "json"


async def _chat(request: web.Request, body: dict[str, Any], *, at_invocations: bool) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    req: ChatRequest = validate_body(ChatRequest, body)
    service = ctx.require_service()
    template = chat.template_text(service.tokenizer, ctx.config.chat_template)
    tools = tool_calls.plan_tools(
        req.tools,
        req.tool_choice,
        req.parallel_tool_calls,
        auto_enabled=ctx.config.enable_auto_tool_choice,
        parser_option=ctx.config.tool_call_parser,
        template=template,
        takes_tools=template is None or chat.takes(template, "tools"),
    )
    params, guided_field = req.generate_params(tools)
    kwargs, kwarg_fields = req.template_kwargs()
    rendered = await chat.prompt_for(
        service,
        req.messages,
        template_option=ctx.config.chat_template,
        add_generation_prompt=req.add_generation_prompt,
        template_kwargs=kwargs,
        kwarg_fields=kwarg_fields,
        tools=tools.template_tools() if tools is not None else None,
        describe=tools.describe if tools is not None and tools.mode != "none" else None,
    )
    reasoning = reasoning_parsers.chosen(ctx.config.reasoning_parser, ctx.config.enable_reasoning, template)
    params = _for_parsers(service, params, rendered.text, reasoning, tools)
    params, model = _with_adapter(ctx, body, params)

    def answer_reader() -> AnswerReader:
        return AnswerReader(
            reasoning.reader(rendered.text) if reasoning is not None else None,
            tools.reader() if tools is not None else None,
            req.include_reasoning,
        )

    prompt = rendered.prompt
    fmt = _chat_format(ctx, bool(req.stream), at_invocations)
    refuse_streamed_beams(params, fmt != "json", CHAT_NAMES)  # option.output_formatter may stream it
    render_error = error_response if at_invocations else openai_error
    cid = f"chatcmpl-{current_request_id()}"  # the X-Request-Id, as vLLM names it
    created = int(time.time())
    max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    start_kw = {
        "add_special_tokens": False,
        "field_name": "messages",
        "max_tokens_field": max_field,
        "user_text": False,
        "names": {**CHAT_NAMES, "guided": guided_field},
    }
    if fmt == "json":
        cs = await collect_n(service, prompt, params, req.n or 1, **start_kw)
        err = next((c.error for c in cs if c.error is not None), None)
        if err is not None:
            return render_error(err)
        return json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": i,
                        **_chat_choice(Answer.of(answer_reader(), c.text), c.finish_reason),
                        "logprobs": _chat_logprobs(c.tokens) if params.logprobs else None,
                    }
                    for i, c in enumerate(cs)
                ],
                "usage": _usage(cs[0].prompt_tokens, sum(c.generated_tokens for c in cs)),
            }
        )
    headers = SSE_HEADERS if fmt == "sse" else {"Content-Type": "application/jsonlines", "Cache-Control": "no-cache"}
    record = sse if fmt == "sse" else (lambda obj: orjson.dumps(obj) + b"\n")
    trailer = DONE if fmt == "sse" else b""
    if (req.n or 1) > 1:
        streams: list[GenerationStream] = []
        try:
            await start_n(service, prompt, params, req.n or 1, streams, **start_kw)
            response, firsts = await open_streams(request, streams, headers, render_error)
            if response is None:
                return firsts  # type: ignore[return-value]
            encoders = [
                _ChatChunks(
                    cid,
                    created,
                    ctx.model_name,
                    record,
                    params.logprobs,
                    req.include_usage,
                    at_invocations,
                    answer_reader(),
                    index=i,
                    own_usage=False,
                )
                for i in range(len(streams))
            ]
            return await pump_all(
                response,
                streams,
                firsts,
                [e.encode for e in encoders],  # type: ignore[arg-type]
                closing=encoders[0].usage_of,
                trailer=trailer,
            )
        finally:
            for s in streams:
                await s.aclose()
    async with await service.start(prompt, params, **start_kw) as stream:
        response, first = await open_stream(request, stream, headers, render_error)
        if response is None:
            return first  # type: ignore[return-value]
        enc = _ChatChunks(
            cid, created, model, record, params.logprobs, req.include_usage, at_invocations, answer_reader()
        )
        return await pump(response, stream, first, enc.encode, trailer=trailer)  # type: ignore[arg-type]


def _for_parsers(
    service: GenerationService,
    params: GenerateParams,
    prompt: str,
    reasoning: ReasoningParser | None,
    tools: ToolPlan | None,
) -> GenerateParams:
    """The request's settings as its parsers need them: a constraint starts after the reasoning where the prompt
    left it open (``GuidedDecoding.after``), and the output keeps special tokens where a marker the parsers read
    is one in this tokenizer (Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``)."""
    update: dict[str, Any] = {}
    if params.guided is not None and reasoning is not None and reasoning.start(prompt) == "reasoning":
        update["guided"] = replace(params.guided, after=REASONING_END)
    markers = [
        *(reasoning.markers if reasoning is not None else ()),
        *(tools.parser.markers if tools is not None and tools.mode == "auto" and tools.parser is not None else ()),
    ]
    if service.special_text is not None and any(service.special_text.fullmatch(m) for m in markers):
        update["skip_special_tokens"] = False
    return params.model_copy(update=update) if update else params


def _finish_reason(reason: FinishReason, called: bool) -> str:
    if called and reason in (FinishReason.EOS, FinishReason.STOP_SEQUENCE):
        return "tool_calls"
    return FINISH.get(reason, reason.value)


def _reasoning_fields(text: str) -> dict[str, str]:
    """The reasoning under both names clients read: ``reasoning_content`` (DeepSeek's API, trtllm-serve, vLLM
    before 0.16) and ``reasoning`` (vLLM since, vllm-project/vllm PRs 27752 and 33402; OpenRouter)."""
    return {"reasoning_content": text, "reasoning": text}


def _chat_choice(answer: Answer, reason: FinishReason) -> dict[str, Any]:
    """A non-streamed choice's message and finish reason."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning is not None:
        message.update(_reasoning_fields(answer.reasoning))
    if answer.calls:
        message["tool_calls"] = [c.as_openai() for c in answer.calls]
    return {"message": message, "finish_reason": _finish_reason(reason, bool(answer.calls))}


class _ChatChunks:
    """One choice's chunks. ``own_usage``: its last chunk is followed by the request's usage record (one
    choice); with several, ``usage_of`` writes one record for all of them once every choice has ended.
    ``answer`` splits the output into reasoning, content and tool-call deltas (``chat_answer``)."""

    def __init__(
        self,
        cid: str,
        created: int,
        model: str,
        record,
        logprobs: bool,
        usage: bool,
        lmi_errors: bool,
        answer: AnswerReader,
        *,
        index: int = 0,
        own_usage: bool = True,
    ) -> None:
        self.answer = answer
        self.call_ids: list[str] = []
        self.base = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
        self.record = record
        self.logprobs = logprobs
        self.usage = usage
        self.lmi_errors = lmi_errors
        self.index = index
        self.own_usage = own_usage
        self.started = False

    def _delta(self, parts: list[Part]) -> dict[str, Any]:
        """One delta of these parts: reasoning, content, and each call's fragment (its id, type and name on its
        first, as OpenAI streams a call)."""
        delta: dict[str, Any] = {}
        calls: dict[int, dict[str, Any]] = {}
        for part in parts:
            if isinstance(part, Reasoning):
                delta.update(_reasoning_fields(delta.get("reasoning_content", "") + part.text))
            elif isinstance(part, Content):
                delta["content"] = delta.get("content", "") + part.text
            elif isinstance(part, CallStart):
                self.call_ids.append(ToolCall(part.name, "").id)
                calls[part.index] = {
                    "index": part.index,
                    "id": self.call_ids[part.index],
                    "type": "function",
                    "function": {"name": part.name, "arguments": ""},
                }
            else:
                fragment = calls.setdefault(part.index, {"index": part.index, "function": {"arguments": ""}})
                fragment["function"]["arguments"] += part.text
        if calls:
            delta["tool_calls"] = list(calls.values())
        return delta

    def usage_of(self, finals: list[Delta]) -> list[bytes]:
        if not self.usage:
            return []
        used = _usage(finals[0].prompt_tokens, sum(d.generated_tokens for d in finals))
        return [self.record({**self.base, "choices": [], "usage": used})]

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        obj = {
            **self.base,
            "choices": [{"index": self.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }
        if self.usage:
            obj["usage"] = None
        return self.record(obj)

    def encode(self, d: Delta) -> list[bytes]:
        out = []
        if not self.started:
            self.started = True
            out.append(self._chunk({"role": "assistant", "content": ""}))
        delta = self._delta(self.answer.feed(d.text)) if d.text else {}
        if delta or (self.logprobs and d.tokens):
            out.append(
                self._chunk(delta or {"content": ""}, logprobs=_chat_logprobs(d.tokens) if self.logprobs else None)
            )
        if d.finished:
            if d.error is not None:
                body = (
                    {"error": d.error.message, "code": d.error.status, "type": d.error.type}
                    if self.lmi_errors
                    else openai_error_body(d.error)
                )
                out.append(self.record(body))
                return out
            rest = self._delta(self.answer.finish())
            if rest:
                out.append(self._chunk(rest))
            out.append(self._chunk({}, _finish_reason(d.finish_reason, bool(self.call_ids))))  # type: ignore[arg-type]
            if self.own_usage:
                out += self.usage_of([d])
        return out


# --- completions ---
async def _completions(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    req: CompletionRequest = validate_body(CompletionRequest, body)
    params, model = _with_adapter(ctx, body, req.generate_params())
    names = {**COMPLETION_NAMES, "guided": req.structured[1]} if req.structured is not None else COMPLETION_NAMES
    prompts = req.prompts()
    service = ctx.require_service()
    cid = f"cmpl-{current_request_id()}"
    created = int(time.time())
    base = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
    }

    def echo_text(p: str | list[int]) -> str:
        if not req.echo:
            return ""
        return p if isinstance(p, str) else service.tokenizer.decode(p, skip_special_tokens=params.skip_special_tokens)

    if len(prompts) > 1:
        if (req.n or 1) > 1:
            raise FieldError("n", f"n={req.n} with a list of {len(prompts)} prompts is not supported; send one prompt")
        if req.stream:
            raise FieldError(
                "prompt",
                f"prompt is a list of {len(prompts)} prompts, which cannot be streamed; "
                "send one prompt per streamed request",
            )
        return await _completions_batch(ctx, prompts, params, base, echo_text, names)
    prompt = prompts[0]
    if not req.stream:
        # with beams, best_of is the beams searched, of which n come back best first (_Base._beam_width)
        best_of = (req.n or 1) if params.beam_width > 1 else max(req.best_of or 1, req.n or 1)
        if best_of > (req.n or 1):  # ranked by the sequences' log-probs: the engine must report them
            service.require("logprobs", "best_of", " ranks the sequences by log-prob")
        ranked = params if best_of == (req.n or 1) else params.model_copy(update={"logprobs": True})
        cs = await collect_n(
            service, prompt, ranked, best_of, field_name="prompt", max_tokens_field="max_tokens", names=names
        )
        err = next((c.error for c in cs if c.error is not None), None)
        if err is not None:
            return openai_error(err)
        kept = best_n(cs, req.n or 1) if best_of > (req.n or 1) else cs
        return json_response(
            {
                **base,
                "choices": [_completion_choice(i, c, echo_text(prompt), params.logprobs) for i, c in enumerate(kept)],
                # every sequence generated counts, the ones best_of left out too (OpenAI's rule)
                "usage": _usage(cs[0].prompt_tokens, sum(c.generated_tokens for c in cs)),
            }
        )
    start_kw = {"field_name": "prompt", "max_tokens_field": "max_tokens", "names": names}
    n = req.n or 1
    streams: list[GenerationStream] = []
    try:
        await start_n(service, prompt, params, n, streams, **start_kw)
        response, firsts = await open_streams(request, streams, SSE_HEADERS, openai_error)
        if response is None:
            return firsts  # type: ignore[return-value]
        encoders = [
            _CompletionChunks(base, i, echo_text(prompt), params.logprobs, req.include_usage, own_usage=n == 1)
            for i in range(n)
        ]
        if n == 1:
            return await pump(response, streams[0], firsts[0], encoders[0].encode, trailer=DONE)
        return await pump_all(
            response, streams, firsts, [e.encode for e in encoders], closing=encoders[0].usage_of, trailer=DONE
        )
    finally:
        for s in streams:
            await s.aclose()


class _CompletionChunks:
    """One choice's ``text_completion`` chunks (``_ChatChunks``' counterpart: ``own_usage`` and ``usage_of``)."""

    def __init__(
        self, base: dict[str, Any], index: int, prefix: str, logprobs: bool, usage: bool, *, own_usage: bool
    ) -> None:
        self.base, self.index, self.prefix, self.usage, self.own_usage = base, index, prefix, usage, own_usage
        self.lps = _CompletionLogprobs() if logprobs else None
        self.extra = {"usage": None} if usage else {}

    def usage_of(self, finals: list[Delta]) -> list[bytes]:
        if not self.usage:
            return []
        return [
            sse(
                {
                    **self.base,
                    "choices": [],
                    "usage": _usage(finals[0].prompt_tokens, sum(d.generated_tokens for d in finals)),
                }
            )
        ]

    def _choice(self, text: str, logprobs: Any, finish: str | None) -> bytes:
        return sse(
            {
                **self.base,
                "choices": [{"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": finish}],
                **self.extra,
            }
        )

    def encode(self, d: Delta) -> list[bytes]:
        out = []
        text, self.prefix = self.prefix + d.text, ""
        lps = self.lps
        if text or (lps and (d.tokens or d.prompt)):
            out.append(self._choice(text, lps.render(d.tokens, d.prompt) if lps else None, None))
        if d.finished:
            if d.error is not None:
                out.append(sse(openai_error_body(d.error)))
                return out
            out.append(self._choice("", None, FINISH.get(d.finish_reason, d.finish_reason.value)))  # type: ignore[arg-type]
            if self.own_usage:
                out += self.usage_of([d])
        return out


def _completion_choice(index: int, c: Completion, prefix: str, logprobs: bool) -> dict[str, Any]:
    return {
        "index": index,
        "text": prefix + c.text,
        "logprobs": _CompletionLogprobs().render(c.tokens, c.prompt) if logprobs else None,
        "finish_reason": FINISH.get(c.finish_reason, c.finish_reason.value),
    }


async def _completions_batch(
    ctx: ServingContext, prompts, params: GenerateParams, base: dict[str, Any], echo_text, names: dict[str, str]
) -> web.Response:
    service = ctx.require_service()
    streams: list[GenerationStream] = []
    try:
        with service.admit_batch(len(prompts), "prompt") as reservation:
            for i, p in enumerate(prompts):
                streams.append(
                    await service.start(
                        p,
                        params,
                        field_name=f"prompt[{i}]",
                        max_tokens_field="max_tokens",
                        admitted=reservation,
                        names=names,
                    )
                )
        completions = await asyncio.gather(*(s.collect(keep_tokens=params.logprobs) for s in streams))
    finally:
        for s in streams:
            await s.aclose()
    for c in completions:
        if c.error is not None:
            return openai_error(c.error)
    choices = [
        _completion_choice(i, c, echo_text(p), params.logprobs)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    usage = _usage(sum(c.prompt_tokens for c in completions), sum(c.generated_tokens for c in completions))
    return json_response({**base, "choices": choices, "usage": usage})


# --- handlers ---
@errors_as(openai_error)
async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await json_object(request, '{"messages": [{"role": "user", "content": "Hi"}]}')
    _check_model(request.app[CONTEXT], body.get("model"), also=UNNAMED_MODEL)
    return await _chat(request, body, at_invocations=False)


@errors_as(openai_error)
async def completions(request: web.Request) -> web.StreamResponse:
    body = await json_object(request, '{"prompt": "Hello"}')
    _check_model(request.app[CONTEXT], body.get("model"), also=UNNAMED_MODEL)
    return await _completions(request, body)


async def completions_at_invocations(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """An OpenAI completions body at /invocations (dispatched by the Truss adapter); LMI error shape."""
    try:
        return await _completions(request, body)
    except LmiHttpError as e:
        return error_response(e)


async def chat_at_invocations(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return await _chat(request, body, at_invocations=True)


def _model_card(ctx: ServingContext) -> dict[str, Any]:
    return {
        "id": ctx.model_name,
        "object": "model",
        "created": _STARTED,
        "owned_by": "lmi-trt",
        "root": ctx.config.model_id or ctx.model_name,
    }


def _adapter_cards(ctx: ServingContext) -> list[dict[str, Any]]:
    """The registered LoRA adapters, as vLLM lists them (vllm/entrypoints/openai/serving_models.py, show_available_
    models: the adapter's name as id, its path as root, the base model as parent)."""
    service = ctx.service
    adapters = service.adapters() if service is not None else []
    return [
        {
            "id": a.name,
            "object": "model",
            "created": _STARTED,
            "owned_by": "lmi-trt",
            "root": a.src,
            "parent": ctx.model_name,
        }
        for a in adapters
    ]


def _with_adapter(ctx: ServingContext, body: dict[str, Any], params: GenerateParams) -> tuple[GenerateParams, str]:
    """A ``model`` naming a registered LoRA adapter generates with it (vLLM's rule); the name answers as the
    response's model."""
    name = body.get("model")
    if ctx.service is not None and isinstance(name, str) and name in ctx.service.adapter_names():
        return params.model_copy(update={"adapter": name}), name
    return params, ctx.model_name


_STARTED = int(time.time())


async def list_models(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return json_response({"object": "list", "data": [_model_card(ctx), *_adapter_cards(ctx)]})


async def get_model(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    card = next((c for c in _adapter_cards(ctx) if c["id"] == request.match_info["model"]), None)
    if card is not None:
        return json_response(card)
    try:
        _check_model(ctx, request.match_info["model"])
    except LmiHttpError as e:
        return openai_error(e)
    return json_response(_model_card(ctx))


def _check_model(ctx: ServingContext, name: object, also: Iterable[str] = ()) -> None:
    # /invocations bodies are not checked: SageMaker routes by endpoint, and its clients send any name.
    adapters = ctx.service.adapter_names() if ctx.service is not None else set()
    check_model(name, ctx.model_name, also={*also, *adapters, *([ctx.config.model_id] if ctx.config.model_id else [])})


def install(app: web.Application, ctx: ServingContext) -> None:
    add_post(app, "/v1/chat/completions", chat_completions, Body((ChatRequest,)))
    add_post(app, "/v1/completions", completions, Body((CompletionRequest,)))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", get_model)
    register_invocation(ctx, "messages", chat_at_invocations, ChatRequest)
    register_feature_fields(ctx, "openai.chat", CHAT_NAMES)
    register_feature_fields(ctx, "openai.completions", COMPLETION_NAMES)
