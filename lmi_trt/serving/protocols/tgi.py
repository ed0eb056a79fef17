"""The TGI schema: ``POST /generate``, ``POST /generate_stream``, ``POST /`` (TGI's compat route,
which huggingface_hub's InferenceClient uses for a URL model), ``GET /info``, ``GET /health``.

Request ``{"inputs": str, "parameters": {...}, "stream": bool}`` with TGI's parameter names
(``null`` means "not given"). ``/generate`` answers ``{"generated_text", "details"?}``; ``/``
answers a one-element list of that (TGI's api-inference shape) or streams when ``stream`` is
true; ``/generate_stream`` sends SSE events ``{"index", "token": {id, text, logprob, special},
"top_tokens", "generated_text" (last event only), "details" (last event only: finish_reason
length|eos_token|stop_sequence, generated_tokens, seed, input_length)}``. Errors: ``{"error",
"error_type"}`` with error_type validation | overloaded | generation, under the same HTTP status
codes as every other schema here (TGI itself answers 422 for validation). Stop sequences end the
text and are not part of it (TGI keeps them), as in every schema of this server.

``top_n_tokens`` (at most 20) gives each token's most likely alternatives as ``top_tokens``;
``decoder_input_details`` the prompt tokens with their log-probs as ``prefill``; an engine that
cannot report them refuses with a 400 naming the field and the engine.

``grammar`` ``{"type": "json", "value": schema}`` or ``{"type": "regex", "value": pattern}``
constrains the output (on engines with constrained decoding; elsewhere a 400 naming the engine).

``adapter_id`` names a registered LoRA adapter (TGI's multi-LoRA field, router/src/lib.rs
GenerateParameters): an unknown one is a 404 naming it.

Refused with a 400: typical_p, watermark — the engine cannot honour them and a silent no-op would
mislead.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from lmi_trt.engines.base import MAX_TOP_LOGPROBS, GuidedDecoding
from lmi_trt.serving.core import (
    Alternative,
    Completion,
    Delta,
    GenerateParams,
    TokenOut,
    output_cap,
    sampling_params,
    schema_guide_text,
)
from lmi_trt.serving.errors import LmiHttpError
from lmi_trt.serving.http import (
    CONTEXT,
    Body,
    ModelStatus,
    ServingContext,
    add_post,
    json_response,
    register_feature_fields,
)
from lmi_trt.serving.protocols._common import (
    PARAMETERS_NAMES,
    SSE_HEADERS,
    FieldError,
    best_n,
    collect_n,
    errors_as,
    json_object,
    open_stream,
    pump,
    refuse_typos,
    sse,
    validate_body,
)

_ERROR_TYPES = {400: "validation", 404: "validation", 413: "validation", 503: "overloaded", 429: "overloaded"}
_UNSUPPORTED = {
    "typical_p": lambda v: v is not None,
    "watermark": lambda v: bool(v),
    # TGI's schema has no beam search (router/src/lib.rs GenerateParameters); the LMI, OpenAI and Triton ones do
    "beam_width": lambda v: v != 1,
    "num_return_sequences": lambda v: v != 1,
}
_WHY = {
    "beam_width": "TGI's schema has no beam search; use /invocations with num_beams",
    "num_return_sequences": "TGI's schema has no beam search; use /invocations with num_beams",
    "typical_p": "typical sampling is not available in the engine",
    "watermark": "watermarking is not available",
}


def tgi_error_body(err: LmiHttpError) -> dict[str, Any]:
    return {"error": err.message, "error_type": _ERROR_TYPES.get(err.status, "generation")}


def tgi_error(err: LmiHttpError) -> web.Response:
    return json_response(tgi_error_body(err), status=err.status, headers=err.headers or None)


class TgiParameters(GenerateParams):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    details: bool = False
    return_full_text: bool = False
    best_of: int | None = Field(None, ge=1)
    top_n_tokens: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    decoder_input_details: bool = False
    typical_p: float | None = None
    watermark: bool = False
    grammar: Any = None
    adapter_id: str | None = None

    def to_generate(self) -> GenerateParams:
        refuse_typos(self.model_extra or {}, type(self).model_fields, prefix="parameters.")
        for name, refused in _UNSUPPORTED.items():
            value = getattr(self, name)
            if refused(value):
                raise FieldError(
                    f"parameters.{name}", f"parameters.{name}={value!r} is not supported: {_WHY[name]}; leave it out"
                )
        if (self.best_of or 1) > 1:  # TGI's rules and words (router/src/validation.rs, ValidationError)
            sampling = self.do_sample or any(v is not None for v in (self.temperature, self.top_k, self.top_p))
            if not sampling:
                raise FieldError(
                    "parameters.best_of",
                    "you must use sampling when `best_of` is > 1 (set do_sample, temperature, top_k or top_p)",
                )
            if self.seed is not None:
                raise FieldError("parameters.seed", "`seed` must not be set when `best_of` > 1")
        fields = {name: getattr(self, name) for name in GenerateParams.model_fields}
        fields["top_logprobs"] = self.top_n_tokens or self.top_logprobs
        fields["prompt_logprobs"] = self.decoder_input_details or self.prompt_logprobs
        fields["logprobs"] = self.logprobs or self.details or bool(fields["top_logprobs"])
        fields["guided"] = self._guided() or self.guided
        fields["adapter"] = self.adapter_id or self.adapter
        return GenerateParams.model_construct(**fields)

    def _guided(self) -> GuidedDecoding | None:
        g = self.grammar
        if g is None:
            return None
        kind = g.get("type") if isinstance(g, dict) else None
        value = g.get("value") if isinstance(g, dict) else None
        if kind in ("json", "json_schema") and isinstance(value, (dict, str)):
            text = value if isinstance(value, str) else schema_guide_text(value, "parameters.grammar")
            return GuidedDecoding("json_schema", text)
        if kind == "regex" and isinstance(value, str):
            return GuidedDecoding("regex", value)
        raise FieldError(
            "parameters.grammar",
            'parameters.grammar must be {"type": "json", "value": <JSON schema>} or '
            '{"type": "regex", "value": <pattern>}',
        )


class TgiRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    inputs: str
    parameters: TgiParameters = Field(default_factory=TgiParameters)
    stream: bool = False

    @field_validator("parameters", mode="before")
    @classmethod
    def _drop_nulls(cls, v: Any) -> Any:
        if v is None:
            return {}
        return {k: x for k, x in v.items() if x is not None} if isinstance(v, dict) else v


NAMES = {
    **PARAMETERS_NAMES,
    "logprobs": "parameters.details",
    "top_logprobs": "parameters.top_n_tokens",
    "prompt_logprobs": "parameters.decoder_input_details",
    "guided": "parameters.grammar",
    "min_p": "parameters.min_p",
    "lora": "parameters.adapter_id",
}


def _token(t: TokenOut | Alternative) -> dict[str, Any]:
    return {"id": t.id, "text": t.text, "logprob": t.logprob, "special": t.special}


def _top(t: TokenOut) -> list[dict[str, Any]] | None:
    return [_token(a) for a in t.top] if t.top is not None else None


def _seed(p: GenerateParams) -> int | None:
    return p.seed if sampling_params(p, max_new_tokens=1, logprobs=False).do_sample else None


async def _parse(request: web.Request) -> TgiRequest:
    body = await json_object(request, '{"inputs": "Hello", "parameters": {"max_new_tokens": 20}}')
    req = validate_body(TgiRequest, body)
    refuse_typos(req.model_extra or {}, TgiRequest.model_fields)
    return req


async def _generate(request: web.Request, req: TgiRequest, *, as_list: bool) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    params = req.parameters.to_generate()
    service = ctx.require_service()
    best_of = req.parameters.best_of or 1
    if best_of > 1:  # the best by log-prob per token, as TGI picks it; the engine must report log-probs
        service.require("logprobs", "parameters.best_of", " picks the best by log-prob")
        params = params.model_copy(update={"logprobs": True})
    cs = await collect_n(service, req.inputs, params, best_of, "parameters.best_of", names=NAMES)
    err = next((c.error for c in cs if c.error is not None), None)
    if err is not None:
        return tgi_error(err)
    best, *others = best_n(cs, best_of) if best_of > 1 else cs
    prefix = req.inputs if req.parameters.return_full_text else ""
    out: dict[str, Any] = {"generated_text": prefix + best.text}
    if req.parameters.details:
        out["details"] = {
            **_details(best, params),
            "best_of_sequences": [{"generated_text": prefix + c.text, **_details(c, params)} for c in others]
            if best_of > 1
            else None,
        }
    return json_response([out] if as_list else out)


def _details(c: Completion, params: GenerateParams) -> dict[str, Any]:
    return {
        "finish_reason": c.finish_reason.value,
        "generated_tokens": c.generated_tokens,
        "seed": _seed(params),
        "prefill": [_token(a) for a in c.prompt] if c.prompt is not None else [],
        "tokens": [_token(t) for t in c.tokens],
        "top_tokens": [_top(t) for t in c.tokens] if params.top_logprobs else None,
    }


async def _generate_stream(request: web.Request, req: TgiRequest) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    params = req.parameters.to_generate()
    if params.prompt_logprobs:  # as TGI: its stream events have no place for them
        raise FieldError(
            "parameters.decoder_input_details",
            "parameters.decoder_input_details=true is not supported when streaming tokens; leave it out "
            "or use /generate",
        )
    if (req.parameters.best_of or 1) > 1:  # as TGI (ValidationError::BestOfStream)
        raise FieldError("parameters.best_of", "`best_of` != 1 is not supported when streaming tokens; use /generate")
    service = ctx.require_service()
    prefix = req.inputs if req.parameters.return_full_text else ""
    seed = _seed(params)
    async with await service.start(req.inputs, params, names=NAMES) as stream:
        response, first = await open_stream(request, stream, SSE_HEADERS, tgi_error)
        if response is None:
            return first  # type: ignore[return-value]
        texts: list[str] = []
        index = 0

        def event(t: TokenOut | None, last: Delta | None = None) -> bytes:
            nonlocal index
            index += 1
            # No token on the last output: the flushed text still needs an event.
            token = _token(t) if t is not None else {"id": -1, "text": last.text, "logprob": None, "special": True}  # type: ignore[union-attr]
            obj: dict[str, Any] = {
                "index": index,
                "token": token,
                "top_tokens": _top(t) if t is not None else None,
                "generated_text": None,
                "details": None,
            }
            if last is not None:
                obj["generated_text"] = prefix + "".join(texts)
                obj["details"] = {
                    "finish_reason": last.finish_reason.value,  # type: ignore[union-attr]
                    "generated_tokens": last.generated_tokens,
                    "seed": seed,
                    "input_length": last.prompt_tokens,
                }
            return sse(obj)

        def encode(d: Delta) -> list[bytes]:
            if d.text:
                texts.append(d.text)
            if not d.finished:
                return [event(t) for t in d.tokens]
            if d.error is not None:
                return [*(event(t) for t in d.tokens), sse(tgi_error_body(d.error))]
            out = [event(t) for t in d.tokens[:-1]]
            out.append(event(d.tokens[-1] if d.tokens else None, d))
            return out

        return await pump(response, stream, first, encode)


@errors_as(tgi_error)
async def generate(request: web.Request) -> web.StreamResponse:
    req = await _parse(request)
    # "stream": true is honoured here as at "/" (TGI's compat_generate, router/src/server.rs): huggingface_hub's
    # InferenceClient(base_url=".../generate").text_generation(stream=True) posts it to this URL and reads SSE.
    if req.stream:
        return await _generate_stream(request, req)
    return await _generate(request, req, as_list=False)


@errors_as(tgi_error)
async def generate_stream(request: web.Request) -> web.StreamResponse:
    return await _generate_stream(request, await _parse(request))


@errors_as(tgi_error)
async def compat_generate(request: web.Request) -> web.StreamResponse:
    req = await _parse(request)
    if req.stream:
        return await _generate_stream(request, req)
    return await _generate(request, req, as_list=True)


def _info(ctx: ServingContext) -> dict[str, Any]:
    from lmi_trt import __version__

    cfg = ctx.config
    limits = ctx.service.engine.limits if ctx.service is not None else None
    max_input = limits.max_input_len if limits else cfg.max_input_len
    max_new = output_cap(limits, cfg)
    max_total = limits.max_seq_len if limits and limits.max_seq_len is not None else max_input + max_new
    return {
        "model_id": cfg.model_id or ctx.model_name,
        "model_sha": None,
        "model_dtype": cfg.dtype,
        "model_device_type": ctx.service.engine.name if ctx.service is not None else "loading",
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": cfg.job_queue_size,
        "max_best_of": cfg.max_prompts_per_request,  # best_of sequences count as prompts of one request
        "max_stop_sequences": 64,
        "max_input_tokens": max_input,
        "max_input_length": max_input,
        "max_total_tokens": max_total,
        "max_batch_size": limits.max_batch_size if limits else None,
        "validation_workers": 1,
        "max_client_batch_size": 1,
        "router": "lmi-trt",
        "version": __version__,
        "sha": None,
        "docker_label": None,
    }


async def info(request: web.Request) -> web.Response:
    return json_response(_info(request.app[CONTEXT]))


async def health(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    status = ctx.status
    if status is ModelStatus.HEALTHY:
        return web.Response(status=200)
    msg = ctx.load_error or (
        "the model is still loading" if status is ModelStatus.PENDING else "the engine is unhealthy"
    )
    return json_response({"error": msg, "error_type": "healthcheck"}, status=503)


def install(app: web.Application, ctx: ServingContext) -> None:
    add_post(app, "/generate", generate, Body((TgiRequest,)))
    add_post(app, "/generate_stream", generate_stream, Body((TgiRequest,)))
    add_post(app, "/", compat_generate, Body((TgiRequest,)))
    app.router.add_get("/info", info)
    app.router.add_get("/health", health)
    register_feature_fields(ctx, "tgi", NAMES)
