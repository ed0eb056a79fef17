"""The Baseten Truss TRT-LLM payload at ``POST /invocations``, and the ``prompt`` dispatch there.

Truss (the Triton-in-Truss TRT-LLM models) takes ``{"prompt", "max_tokens", "beam_width",
"bad_words_list", "stop_words_list", "repetition_penalty", "ignore_eos", "stream"}``; ``stream``
defaults to true (a ``beam_width`` over 1 needs ``stream: false``: its answer is the best beam's text) and
streams the text as plain ``text/plain`` chunks (each chunk is the text the
engine produced since the last one, never a split UTF-8 character); ``stream: false`` answers
``{"text": ...}``. A mid-stream failure aborts the connection (a text stream has no room for an
error record), so the client sees a truncated transfer rather than a text that merely looks short.

How ``/invocations`` picks a schema (the LMI route asks the registered handlers in this order):
1. ``inputs`` → LMI (lmi.py);
2. ``messages`` → OpenAI chat (openai.py);
3. ``prompt`` → Truss, unless the body is OpenAI-completions shaped: it has an OpenAI-only
   field (model, n, best_of, echo, logprobs, stop, suffix, stream_options, logit_bias, user,
   seed, temperature, top_p, presence_penalty, frequency_penalty) and no Truss-only field
   (beam_width, bad_words_list, stop_words_list). A body mixing both is a 400 naming them.
   A body with only ``prompt`` / ``max_tokens`` / ``stream`` / ``repetition_penalty`` is Truss.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from lmi_trt.log_redaction import loggable
from lmi_trt.serving.core import Delta, GenerateParams, refuse_streamed_beams
from lmi_trt.serving.errors import BadRequest
from lmi_trt.serving.http import CONTEXT, ServingContext, error_response, json_response, register_invocation
from lmi_trt.serving.protocols import openai
from lmi_trt.serving.protocols._common import (
    neutral_params,
    open_stream,
    pump,
    refuse_typos,
    validate_body,
    word_list,
)

log = logging.getLogger(__name__)

TRUSS_ONLY = frozenset({"beam_width", "bad_words_list", "stop_words_list"})
OPENAI_ONLY = frozenset(
    {
        "model",
        "n",
        "best_of",
        "echo",
        "logprobs",
        "stop",
        "suffix",
        "stream_options",
        "logit_bias",
        "user",
        "seed",
        "temperature",
        "top_p",
        "presence_penalty",
        "frequency_penalty",
    }
)


class TrussRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    prompt: str
    max_tokens: int | None = Field(None, ge=1)
    beam_width: int | None = Field(None, ge=1)
    bad_words_list: Any = None
    stop_words_list: Any = None
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    ignore_eos: bool | None = False
    stream: bool | None = True

    def to_generate(self) -> GenerateParams:
        refuse_typos(self.model_extra or {}, type(self).model_fields)
        return neutral_params(
            {"max_new_tokens": "max_tokens", "stop": "stop_words_list", "bad_words": "bad_words_list"},
            max_new_tokens=self.max_tokens,
            repetition_penalty=self.repetition_penalty,
            stop=word_list(self.stop_words_list, "stop_words_list"),
            bad_words=word_list(self.bad_words_list, "bad_words_list"),
            ignore_eos=bool(self.ignore_eos),
            beam_width=self.beam_width or 1,  # beam search: the best beam is the text
        )


def is_openai_completion(body: dict[str, Any]) -> bool:
    truss = sorted(TRUSS_ONLY & body.keys())
    oai = sorted(OPENAI_ONLY & body.keys())
    if truss and oai:
        raise BadRequest(
            f"ambiguous payload: it has Truss fields {truss} and OpenAI completions fields {oai}; "
            "send one schema (or use /v1/completions for OpenAI)"
        )
    return bool(oai)


async def prompt_at_invocations(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    if is_openai_completion(body):
        return await openai.completions_at_invocations(request, body)
    return await _truss(request, body)


async def _truss(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    req: TrussRequest = validate_body(TrussRequest, body)
    params = req.to_generate()
    service = ctx.require_service()
    # a refusal's 400 names the field as Truss spells it
    names = {"bad_words": "bad_words_list", "stop": "stop_words_list", "beam_search": "beam_width"}
    refuse_streamed_beams(params, req.stream is not False, names)
    async with await service.start(
        req.prompt, params, field_name="prompt", max_tokens_field="max_tokens", names=names
    ) as stream:
        if req.stream is False:
            c = await stream.collect()
            if c.error is not None:
                return error_response(c.error)
            return json_response({"text": c.text})
        headers = {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache"}
        response, first = await open_stream(request, stream, headers, error_response)
        if response is None:
            return first  # type: ignore[return-value]

        def encode(d: Delta) -> bytes:
            if d.error is not None:
                log.warning(
                    "truss stream %s failed after it started: %s; aborting the connection",
                    stream.request_id,
                    loggable(d.error.message),
                )
                if request.transport is not None:
                    request.transport.abort()
                raise ConnectionResetError(d.error.message)
            return d.text.encode()

        return await pump(response, stream, first, encode)


def install(app: web.Application, ctx: ServingContext) -> None:
    # a "prompt" body is Truss's, or an OpenAI completion where it has OpenAI-only fields
    register_invocation(ctx, "prompt", prompt_at_invocations, TrussRequest, openai.CompletionRequest)
