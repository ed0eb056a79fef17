"""The LMI/DJL schema on ``POST /invocations`` and ``POST /predictions/{model}``.

Request ``{"inputs": str | [str], "parameters": {...}, "stream": bool}`` (or a text/plain
body). Output formats follow DJL's ``output_formatter``: ``json`` (non-streaming default),
``jsonlines`` (streaming default, application/jsonlines), ``sse`` (text/event-stream, the
streaming default with ``option.tgi_compat``). An explicit ``option.output_formatter``
applies to every request, as in DJL; ``stream`` only picks the default.

Streamed tokens always carry their ``log_prob``, as DJL's ``jsonlines`` and ``sse`` formatters
write the backend's per-token log-prob whatever ``details`` says (deepjavalibrary/djl-serving,
engines/python/setup/djl_python/output_formatter.py). ``top_n_tokens`` adds each token's most
likely alternatives to the details as ``top_tokens``; ``decoder_input_details`` the prompt tokens
as ``prefill`` (DJL's key); an engine that cannot report them answers a 400 naming it.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from typing import Any, Literal

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmi_trt.engines.base import MAX_TOP_LOGPROBS, GuidedDecoding
from lmi_trt.serving.core import (
    MAX_BEAM_WIDTH,
    MAX_STOP_STRINGS,
    MAX_TOP_K,
    Alternative,
    Completion,
    Delta,
    GenerateParams,
    GenerationStream,
    TokenOut,
    bounded_words,
    refuse_streamed_beams,
    schema_guide_text,
)
from lmi_trt.serving.errors import BadRequest, FieldError, check_model
from lmi_trt.serving.http import (
    CONTEXT,
    Body,
    ServingContext,
    add_post,
    error_response,
    json_response,
    load_json,
    read_body,
    register_feature_fields,
    request_properties,
    validate,
)
from lmi_trt.serving.protocols._common import PARAMETERS_NAMES, refuse_typos

log = logging.getLogger(__name__)

Format = Literal["json", "jsonlines", "sse"]
CONTENT_TYPES: dict[str, str] = {
    "json": "application/json",
    "jsonlines": "application/jsonlines",
    "sse": "text/event-stream",
}
# Parameters of peers this server does not implement, refused when they would change the output (a 400 naming
# them), never accepted and ignored: value → whether it asks for something.
_REFUSED_PARAMETERS: dict[str, tuple[Any, str]] = {
    "typical_p": (lambda v: v not in (None, 1.0), "typical sampling is not implemented here; leave it out or use 1.0"),
    "watermark": (lambda v: v not in (None, False), "watermarking is not implemented here; leave it out"),
    "n": (lambda v: v not in (None, 1), "this schema returns one sequence; use 1 or leave it out"),
    "best_of": (lambda v: v not in (None, 1), "this schema returns one sequence; use 1 or leave it out"),
}
# Parameters DJL's LMI schema documents for its backends (djl-serving serving/docs/lmi/user_guides/
# lmi_input_output_schema.md: GenerationParameters, vLLM's and TensorRT-LLM's additional ones) and TGI's
# (router/src/lib.rs GenerateParameters): never taken for a typo of a parameter here, however close.
PEER_PARAMETERS = frozenset(
    {
        "do_sample", "seed", "temperature", "repetition_penalty", "top_k", "top_p", "max_new_tokens", "details",
        "return_full_text", "stop_sequences", "decoder_input_details", "min_p", "presence_penalty",
        "frequency_penalty", "n", "best_of", "num_beams", "length_penalty", "early_stopping", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos_token", "logprobs", "prompt_logprobs", "skip_special_tokens",
        "spaces_between_special_tokens", "min_length", "bad_sequences", "stop", "truncate", "typical_p",
        "watermark", "top_n_tokens", "grammar", "adapter_id",
    }
)  # fmt: skip
_warned_unknown: set[str] = set()
_MAX_WARNED = 256  # names are client-chosen: bound the set (and the log lines) they can grow
_NEWLINE = orjson.OPT_APPEND_NEWLINE


class LmiParameters(GenerateParams):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    details: bool = False
    return_full_text: bool = False
    stop_sequences: list[str] = Field(default_factory=list)
    ignore_eos_token: bool = False  # DJL's name for ignore_eos
    # -1 is "no top-k" in DJL's vLLM parameters (lmi_input_output_schema.md: top_k default -1), as in vLLM.
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K)
    top_n_tokens: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)
    # Constrained decoding under vLLM's parameter names (DJL's LMI schema has none of its own).
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    decoder_input_details: bool = False
    # DJL's name for beam search (HF generate's num_beams): the best beam is the answer.
    num_beams: int = Field(1, ge=1, le=MAX_BEAM_WIDTH)
    adapter_id: str | None = None  # TGI's name for the LoRA adapter (DJL's own is the top-level "adapters")

    @field_validator("stop_sequences", mode="before")
    @classmethod
    def _stop_sequences_as_list(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    def to_generate(self) -> GenerateParams:
        """The neutral parameters; refuses what this server does not implement and warns once per unknown key."""
        extras = self.model_extra or {}
        for name, (asks, why) in _REFUSED_PARAMETERS.items():
            if asks(extras.get(name)):
                raise FieldError(f"parameters.{name}", f"parameters.{name}={extras[name]!r}: {why}")
        if self.num_return_sequences != 1:
            raise FieldError(
                "parameters.num_return_sequences",
                f"parameters.num_return_sequences={self.num_return_sequences}: this schema returns the best beam "
                "only; use the OpenAI schema (use_beam_search with n) or Triton's for several",
            )
        refuse_typos(extras, [*_KNOWN_PARAMETERS, *_REFUSED_PARAMETERS], PEER_PARAMETERS, "parameters.")
        for name in extras:
            if name not in _REFUSED_PARAMETERS and name not in _warned_unknown and len(_warned_unknown) < _MAX_WARNED:
                _warned_unknown.add(name)
                close = difflib.get_close_matches(name, _KNOWN_PARAMETERS, n=1)
                log.warning(
                    "ignoring unknown parameters.%s%s",
                    ascii(name)[1:-1][:200],
                    f" (did you mean {close[0]!r}?)" if close else "",
                )
        stops = self.stop + [s for s in self.stop_sequences if s not in self.stop]
        try:
            bounded_words(stops, "stop strings")
        except ValueError as e:
            raise BadRequest(f"parameters.stop_sequences: {e} (stop and stop_sequences together)") from None
        if len(stops) > MAX_STOP_STRINGS:
            raise BadRequest(
                f"parameters.stop_sequences: {len(stops)} stop strings (stop and stop_sequences together); "
                f"send at most {MAX_STOP_STRINGS} items"
            )
        fields = {name: getattr(self, name) for name in GenerateParams.model_fields}
        fields.update(
            stop=stops,
            ignore_eos=self.ignore_eos or self.ignore_eos_token,
            top_k=None if self.top_k == -1 else self.top_k,
            logprobs=self.logprobs or self.details or bool(self.top_n_tokens or self.top_logprobs),
            top_logprobs=self.top_n_tokens or self.top_logprobs,
            prompt_logprobs=self.decoder_input_details or self.prompt_logprobs,
            guided=self._guided() or self.guided,
            beam_width=self.num_beams if self.num_beams > 1 else self.beam_width,
            adapter=self.adapter_id or None,
        )
        return GenerateParams.model_construct(**fields)

    def field_names(self) -> dict[str, str]:
        """``NAMES``, the constraint by the field this request sent it in."""
        sent = next((f for f in _GUIDED_FIELDS if getattr(self, f) is not None), None)
        return {**NAMES, "guided": f"parameters.{sent}"} if sent is not None else NAMES

    def _guided(self) -> GuidedDecoding | None:
        given = {
            k: v
            for k, v in (
                ("json_schema", self.guided_json),
                ("regex", self.guided_regex),
                ("grammar", self.guided_grammar),
            )
            if v is not None
        }
        if len(given) > 1:
            raise BadRequest("parameters.guided_json, guided_regex and guided_grammar exclude each other; send one")
        if not given:
            return None
        kind, value = given.popitem()
        text = value if isinstance(value, str) else schema_guide_text(value, "parameters.guided_json")
        return GuidedDecoding(kind, text)  # type: ignore[arg-type]


_KNOWN_PARAMETERS = sorted(LmiParameters.model_fields)


class LmiRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    # Checked by hand: a plain union would report one error per member ("inputs.str", "inputs.list[str]").
    inputs: Any
    parameters: LmiParameters = Field(default_factory=LmiParameters)
    stream: bool = False
    # DJL's LoRA adapter per input: a name, or a list with one per input ("" for the base model); djl-serving
    # engines/python/setup/djl_python/input_parser.py (_fetch_adapters_from_input) also reads it from the request
    # property "adapter" (a query parameter, or X-Amzn-SageMaker-Custom-Attributes: adapter=...).
    adapters: str | list[str] | None = None

    @field_validator("parameters", mode="before")
    @classmethod
    def _null_parameters(cls, v: Any) -> Any:
        return {} if v is None else v

    @field_validator("inputs")
    @classmethod
    def _text_or_texts(cls, v: Any) -> str | list[str]:
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            return v
        raise ValueError("must be a string or a non-empty list of strings")


def choose_format(output_formatter: str | None, stream: bool, tgi_compat: bool) -> Format:
    if output_formatter in CONTENT_TYPES:
        return output_formatter  # type: ignore[return-value]
    if stream:
        return "sse" if tgi_compat else "jsonlines"
    return "json"


# --- encoding ---
NAMES = {
    **PARAMETERS_NAMES,
    "logprobs": "parameters.details",
    "top_logprobs": "parameters.top_n_tokens",
    "prompt_logprobs": "parameters.decoder_input_details",
    "guided": "parameters.guided_json/guided_regex/guided_grammar",
    "bad_words": "parameters.bad_words",
    "beam_search": "parameters.num_beams",
    **{name: f"parameters.{name}" for name in ("min_p", "length_penalty", "early_stopping", "num_return_sequences")},
    **{name: f"parameters.{name}" for name in ("do_sample", "stop", "logprobs", "min_new_tokens")},
    "lora": "adapters",
}
_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_grammar")


def token_dict(t: TokenOut | Alternative, tgi: bool) -> dict[str, Any]:
    if tgi:
        d: dict[str, Any] = {"id": t.id, "text": t.text, "logprob": t.logprob}
        if t.special:
            d["special"] = True
        return d
    d = {"id": t.id, "text": t.text, "log_prob": t.logprob}
    if t.special:
        d["special_token"] = True
    return d


class _Shape:
    """Per-request output settings, so the per-token path does no lookups."""

    __slots__ = ("details", "full_text_prefix", "inputs", "sse", "tgi")

    def __init__(self, ctx: ServingContext, params: LmiParameters, inputs: str, fmt: Format) -> None:
        self.tgi = ctx.config.tgi_compat
        self.details = params.details or self.tgi  # DJL: tgi_compat turns details on by default
        self.full_text_prefix = inputs if params.return_full_text else ""
        self.inputs = inputs
        self.sse = fmt == "sse"

    def record(self, obj: dict[str, Any]) -> bytes:
        if self.sse:
            return b"data: " + orjson.dumps(obj) + b"\n\n"
        return orjson.dumps(obj, option=_NEWLINE)

    def token_records(self, tokens: list[TokenOut]) -> bytes:
        """``record({"token": token_dict(t)})`` for each token, joined: the per-token path."""
        if self.tgi or self.sse:
            return b"".join([self.record({"token": token_dict(t, self.tgi)}) for t in tokens])
        dumps = orjson.dumps
        out = []
        for t in tokens:
            if t.special:
                d = {"id": t.id, "text": t.text, "log_prob": t.logprob, "special_token": True}
            else:
                d = {"id": t.id, "text": t.text, "log_prob": t.logprob}
            out.append(dumps({"token": d}, option=_NEWLINE))
        return out[0] if len(out) == 1 else b"".join(out)

    def json_result(self, c: Completion) -> dict[str, Any]:
        out: dict[str, Any] = {"generated_text": self.full_text_prefix + c.text}
        if self.details:
            out["details"] = {
                "finish_reason": c.finish_reason.value,
                "generated_tokens": c.generated_tokens,
                "inputs": self.inputs,
                "tokens": [token_dict(t, self.tgi) for t in c.tokens],
            }
            if c.tokens and c.tokens[0].top is not None:
                out["details"]["top_tokens"] = [[token_dict(a, self.tgi) for a in t.top or ()] for t in c.tokens]
            if c.prompt is not None:
                out["details"]["prefill"] = [token_dict(a, self.tgi) for a in c.prompt]
        return out

    def stream_chunk(self, delta: Delta, texts: list[str], prompt: list[Alternative] | None = None) -> bytes:
        """Lines for one delta: one per token; the final one adds generated_text (and details)."""
        tokens = delta.tokens
        if not delta.finished:
            return self.token_records(tokens) if tokens else b""
        parts = [self.token_records(tokens[:-1])] if len(tokens) > 1 else []
        if delta.error is not None:
            last: dict[str, Any] = {"token": {"id": -1, "text": "", "log_prob": -1, "special_token": True}}
        elif tokens:
            last = {"token": token_dict(tokens[-1], self.tgi)}
        else:  # the engine's final output carried no token; the flushed text still needs a line
            last = {"token": {"id": None, "text": delta.text, "log_prob": None, "special_token": True}}
        last["generated_text"] = self.full_text_prefix + "".join(texts)
        if self.details or delta.error is not None:
            last["details"] = {
                "finish_reason": delta.finish_reason.value,  # type: ignore[union-attr]
                "generated_tokens": delta.generated_tokens,
                "inputs": self.inputs,
            }
            if prompt is not None:
                last["details"]["prefill"] = [token_dict(a, self.tgi) for a in prompt]
        if delta.error is not None:
            last["error"] = delta.error.message
            last["code"] = delta.error.status
        parts.append(self.record(last))
        return b"".join(parts)


# --- handlers ---
async def _parse(request: web.Request) -> dict[str, Any] | str:
    raw = await read_body(request)
    if request.content_type.startswith("text/plain"):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadRequest(f"text/plain body is not valid UTF-8: {e}") from None
    body = await load_json(request, raw)
    if not isinstance(body, dict):
        raise BadRequest(
            f'request body must be a JSON object such as {{"inputs": "Hello"}}, got a JSON {type(body).__name__}'
        )
    return body


async def invocations(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    body = await _parse(request)
    if isinstance(body, str):
        req = LmiRequest(inputs=body)
    else:
        if "inputs" not in body:
            for key, handler in ctx.invocation_handlers.items():
                if key in body:
                    return await handler(request, body)
            accepted = ", ".join(repr(k) for k in ("inputs", *ctx.invocation_handlers))
            raise BadRequest(f"invalid payload: the JSON object must contain {accepted}; got keys {sorted(body)!r}")
        req = validate(LmiRequest, body)
        refuse_typos(req.model_extra or {}, LmiRequest.model_fields)
    params = req.parameters.to_generate()
    service = ctx.require_service()
    fmt = choose_format(ctx.config.output_formatter, req.stream, ctx.config.tgi_compat)
    adapters = _adapters(request, req, params.adapter)
    if isinstance(req.inputs, list):
        if fmt != "json":
            raise BadRequest(
                f"inputs is a list of {len(req.inputs)} prompts, which needs the json output; "
                "send one string to stream "
                f"(stream={req.stream}, output format {fmt})"
            )
        return await _batch(ctx, req, params, adapters)
    refuse_streamed_beams(params, fmt != "json", req.parameters.field_names())
    params = params.model_copy(update={"adapter": adapters[0]})
    shape = _Shape(ctx, req.parameters, req.inputs, fmt)
    if fmt != "json" and service.engine.capabilities.logprobs.honoured:
        params = params.model_copy(update={"logprobs": True})  # DJL's streams carry every token's log_prob
    async with await service.start(req.inputs, params, names=req.parameters.field_names()) as stream:
        if fmt == "json":
            completion = await stream.collect(keep_tokens=shape.details)
            if completion.error is not None:
                return error_response(completion.error)
            result = shape.json_result(completion)
            return json_response([result] if shape.tgi else result)
        return await _stream(request, stream, shape, fmt)


async def _stream(request: web.Request, stream: GenerationStream, shape: _Shape, fmt: Format) -> web.StreamResponse:
    # Headers wait for the first delta, as DJL's front end does, so an error that comes
    # before any token still gets its HTTP status instead of a 200 stream.
    first = await stream.__anext__()
    if first.error is not None:
        return error_response(first.error)
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPES[fmt], "Cache-Control": "no-cache"})
    await response.prepare(request)
    texts: list[str] = []
    delta = first
    prompt = first.prompt
    write, records, next_delta = response.write, shape.token_records, stream.__anext__
    try:
        # One write per engine delta (all its records, as stream_chunk makes them); the last
        # one goes out with the end of the chunked body in the same write.
        while not delta.finished:
            if delta.text:
                texts.append(delta.text)
            if delta.tokens:
                await write(records(delta.tokens))
            delta = await next_delta()
        if delta.text:
            texts.append(delta.text)
        await response.write_eof(shape.stream_chunk(delta, texts, prompt))
    except ConnectionResetError:
        # The client went away (seen here when handlers are not cancelled on disconnect);
        # leaving the caller's `async with` cancels the generation. aiohttp finishes quietly.
        pass
    return response


def _adapters(request: web.Request, req: LmiRequest, adapter_id: str | None) -> list[str | None]:
    """The LoRA adapter of each input (None: the base model), from DJL's "adapters" (a list: one per input),
    else its "adapter" request property, else parameters.adapter_id."""
    count = len(req.inputs) if isinstance(req.inputs, list) else 1
    given = req.adapters
    if given is None:
        given = request.query.get("adapter") or request_properties(request).get("adapter") or adapter_id
    if isinstance(given, list):
        if len(given) != count:
            raise FieldError("adapters", f"adapters has {len(given)} names for {count} input(s); give one per input")
        return [name or None for name in given]
    return [given or None] * count


async def _batch(
    ctx: ServingContext, req: LmiRequest, params: GenerateParams, adapters: list[str | None]
) -> web.Response:
    service = ctx.require_service()
    streams: list[GenerationStream] = []
    try:
        with service.admit_batch(len(req.inputs), "inputs") as reservation:
            for text, adapter in zip(req.inputs, adapters, strict=True):
                streams.append(
                    await service.start(
                        text,
                        params.model_copy(update={"adapter": adapter}),
                        field_name=f"inputs[{len(streams)}]",
                        admitted=reservation,
                        names=req.parameters.field_names(),
                    )
                )
        shapes = [_Shape(ctx, req.parameters, text, "json") for text in req.inputs]
        collecting = (s.collect(keep_tokens=shape.details) for s, shape in zip(streams, shapes, strict=True))
        completions = await asyncio.gather(*collecting)
    finally:
        for s in streams:
            await s.aclose()
    for c in completions:
        if c.error is not None:
            return error_response(c.error)
    return json_response([shape.json_result(c) for shape, c in zip(shapes, completions, strict=True)])


async def predictions(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    check_model(request.match_info["model"], ctx.model_name, also=[ctx.config.model_id] if ctx.config.model_id else [])
    return await invocations(request)


# An LMI body, a raw text prompt, or (dispatched on its top-level key) another adapter's body.
INVOCATIONS_BODY = Body((LmiRequest,), text=True, invocations=True)


def install(app: web.Application, ctx: ServingContext) -> None:
    fmt = ctx.config.output_formatter
    if fmt is not None and fmt not in CONTENT_TYPES:
        log.warning(
            "option.output_formatter=%r does not apply to LMI requests (they use %s); "
            "the chat formats belong to chat requests",
            fmt,
            "/".join(CONTENT_TYPES),
        )
    add_post(app, "/invocations", invocations, INVOCATIONS_BODY)
    add_post(app, "/predictions/{model}", predictions, INVOCATIONS_BODY)
    add_post(app, "/predictions/{model}/{version}", predictions, INVOCATIONS_BODY)
    register_feature_fields(ctx, "lmi", NAMES)
