"""Triton's generate extension, as the tensorrtllm_backend ensemble answers it.

``POST /v2/models/{name}[/versions/{v}]/generate`` → ``{"model_name", "model_version",
"text_output"}`` (+ ``output_log_probs``, ``cum_log_probs`` with ``return_log_probs``);
``/generate_stream`` → SSE ``data: {...}`` events whose ``text_output`` is the new text. Fields
come at the top level (the ensemble's inputs) or under ``"parameters"``; a one-element list is
taken as its element (a shape-[1] tensor). ``{name}`` is the served model or the ensemble
names Triton users call (``ensemble``, ``tensorrt_llm_bls``). Errors: ``{"error": msg}``; after a
stream started, an ``{"error": msg}`` event under the 200 (as Triton does).

Inputs: text_input, max_tokens, bad_words, stop_words (a comma-separated string or a list),
end_id, pad_id, top_k, top_p, temperature, length_penalty, repetition_penalty, min_tokens
(min_length), presence_penalty, frequency_penalty, seed (random_seed), return_log_probs,
beam_width, num_return_sequences, exclude_input_in_output (default true), stream. Beam search
(beam_width > 1, with length_penalty) answers the best num_return_sequences beams (default: all of them, as
TensorRT-LLM's SamplingConfig returns beamWidth beams unless numReturnSequences is set: executor.h) as a
list in text_output, best first; not streamed. Refused with a 400 (the engine cannot honour them):
num_return_sequences > 1 without beams, return_context_logits, return_generation_logits,
prompt_embedding_table, embedding_bias_*, guided_decoding_*.
LoRA, as the backend's tensorrt_llm model takes it (triton-inference-server/tensorrtllm_backend docs/lora.md and
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt): ``lora_task_id`` [1] uint64, ``lora_weights``
[1, rows, D×Hi + Ho×D] and ``lora_config`` [1, rows, 3] int32 (module id, layer, adapter size) in TensorRT-LLM's
layout (engines/lora_layout.py); a task's first request carries the weights and config, later ones the id alone.
The task is registered as the adapter ``lora-task-<id>`` (core.GenerationService.task_adapter) on every engine.
``stop_words`` end the text and are not part of it (server-side stop strings, multi-byte safe).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from lmi_trt.serving.core import Delta, GenerateParams, refuse_streamed_beams
from lmi_trt.serving.errors import BadRequest, LmiHttpError, NotFound
from lmi_trt.serving.http import CONTEXT, Body, ModelStatus, ServingContext, add_post, json_response
from lmi_trt.serving.protocols._common import (
    SSE_HEADERS,
    FieldError,
    errors_as,
    json_object,
    neutral_params,
    open_stream,
    pump,
    refuse_typos,
    sse,
    validate_body,
    word_list,
)

TRITON_MODEL_NAMES = ("ensemble", "tensorrt_llm_bls")
# Neutral feature names (lmi_trt.engines.base.features_used) as this schema spells them, for a refusal's 400.
NAMES = {
    "min_new_tokens": "min_tokens",
    "beam_search": "beam_width",
    "stop": "stop_words",
    "logprobs": "return_log_probs",
}
_LISTS = ("bad_words", "stop_words", "text_input", "lora_weights", "lora_config")
_REFUSED_PREFIXES = ("embedding_bias", "guided_decoding", "prompt_embedding_table", "prompt_vocab_size")
# Inputs of the TensorRT-LLM backend's older ensemble and of its tensorrt_llm model (triton-inference-server/
# tensorrtllm_backend all_models/inflight_batcher_llm/ensemble/config.pbtxt at 039e5b4, tensorrt_llm/config.pbtxt):
# taken under the ensemble's names (never ignored); input_lengths is the prompt's, which the server counts itself.
_ALIASES = {
    "runtime_top_k": "top_k",
    "runtime_top_p": "top_p",
    "len_penalty": "length_penalty",
    "request_output_len": "max_tokens",
    "streaming": "stream",
}
PEER_FIELDS = frozenset({*_ALIASES, "input_lengths"})
# Accepted without effect on the answer: ids of a request or sequence, the pad id (nothing is padded here).
_IGNORED = frozenset({"pad_id", "id", "request_id", "sequence_id", "sequence_start", "sequence_end", "input_lengths"})
# Extra outputs this server does not return: refused when asked for.
_REFUSED_OUTPUTS = ("return_perf_metrics", "return_kv_cache_reuse_stats")


def triton_error(err: LmiHttpError) -> web.Response:
    return json_response({"error": err.message}, status=err.status, headers=err.headers or None)


class TritonRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    text_input: str
    max_tokens: int | None = Field(None, ge=1)
    bad_words: Any = None
    stop_words: Any = None
    end_id: int | None = Field(None, ge=0)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    length_penalty: float | None = Field(None, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_tokens: int | None = Field(None, ge=0)
    min_length: int | None = Field(None, ge=0)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**64)
    random_seed: int | None = Field(None, ge=0, lt=2**64)
    return_log_probs: bool = False
    return_context_logits: bool = False
    return_generation_logits: bool = False
    beam_width: int = Field(1, ge=1)
    num_return_sequences: int | None = Field(None, ge=1)
    # tensorrtllm_backend all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt: early_stopping TYPE_BOOL
    # (true: stop once beam_width beams finished; false: transformers' heuristic) and beam_search_diversity_rate
    early_stopping: bool | None = None
    beam_search_diversity_rate: float | None = Field(None, allow_inf_nan=False)
    exclude_input_in_output: bool = True
    stream: bool = False
    # tensorrtllm_backend tensorrt_llm/config.pbtxt: lora_task_id TYPE_UINT64 [1], lora_weights (the model's dtype)
    # [-1, -1], lora_config TYPE_INT32 [-1, 3], each with the request's batch dimension of 1 in front.
    lora_task_id: int | None = Field(None, ge=0, lt=2**64)
    lora_weights: list[Any] | None = None
    lora_config: list[Any] | None = None

    def to_generate(self) -> GenerateParams:
        if self.beam_width == 1 and self.num_return_sequences not in (None, 1):
            raise FieldError(
                "num_return_sequences",
                f"num_return_sequences={self.num_return_sequences} without beam search is not supported: this "
                "server samples one sequence per request; set beam_width, or use 1",
            )
        if self.beam_search_diversity_rate:
            raise FieldError(
                "beam_search_diversity_rate",
                f"beam_search_diversity_rate={self.beam_search_diversity_rate} is not supported: beams here are "
                "scored by log-prob alone; leave it out or send 0",
            )
        for name in ("return_context_logits", "return_generation_logits"):
            if getattr(self, name):
                raise FieldError(name, f"{name} is not supported: logits are not returned by this server")
        refuse_typos(self.model_extra or {}, [*type(self).model_fields, *_IGNORED], PEER_FIELDS)
        for name in self.model_extra or {}:
            if name.startswith(_REFUSED_PREFIXES):
                raise FieldError(
                    name,
                    f"{name} is not supported by this server (no prompt tuning, embedding bias or guided decoding); "
                    "leave it out",
                )
        if self.lora_task_id is None and (self.lora_weights is not None or self.lora_config is not None):
            raise FieldError("lora_task_id", "lora_weights and lora_config come with the lora_task_id they register")
        top_p = self.top_p
        return neutral_params(
            {
                "max_new_tokens": "max_tokens",
                "stop": "stop_words",
                "bad_words": "bad_words",
                "stop_token_ids": "end_id",
                "min_new_tokens": "min_tokens",
                "beam_width": "beam_width",
            },
            max_new_tokens=self.max_tokens,
            min_new_tokens=self.min_tokens if self.min_tokens is not None else (self.min_length or 0),
            temperature=self.temperature,
            top_k=self.top_k or None,
            top_p=top_p if top_p else None,  # TRT-LLM: top_p 0 means "not used"
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed if self.seed is not None else self.random_seed,
            stop=word_list(self.stop_words, "stop_words"),
            bad_words=word_list(self.bad_words, "bad_words"),
            stop_token_ids=[self.end_id] if self.end_id is not None else [],
            logprobs=self.return_log_probs,
            beam_width=self.beam_width,
            num_return_sequences=self.num_return_sequences or self.beam_width,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
        )


def _flatten(body: dict[str, Any]) -> dict[str, Any]:
    """Top-level inputs plus ``parameters``; shape-[1] tensors (one-element lists) as scalars."""
    params = body.get("parameters")
    merged = {k: v for k, v in body.items() if k != "parameters"}
    if params is not None:
        if not isinstance(params, dict):
            raise FieldError("parameters", "parameters must be a JSON object")
        for k, v in params.items():
            if k in merged and merged[k] != v:
                raise FieldError(k, f"{k} is given both at the top level and in parameters, with different values")
            merged[k] = v
    out = {}
    for k, v in merged.items():
        if isinstance(v, list) and len(v) == 1 and (k not in _LISTS or k == "text_input"):
            v = v[0]
        if k in _REFUSED_OUTPUTS and v:
            raise FieldError(k, f"{k} is not supported: this server does not return those figures; leave it out")
        if k in _IGNORED or k in _REFUSED_OUTPUTS or v is None:
            continue
        name = _ALIASES.get(k, k)
        if name in out and out[name] != v:
            alias = next(a for a, n in _ALIASES.items() if n == name)
            raise FieldError(alias, f"{alias} is {name} under another name, and the two are given different values")
        out[name] = v
    return out


def _check_model(request: web.Request) -> tuple[str, str]:
    ctx = request.app[CONTEXT]
    name = request.match_info["model"]
    version = request.match_info.get("version", "1")
    if name != ctx.model_name and name not in TRITON_MODEL_NAMES:
        raise NotFound(
            f"Request for unknown model: {name!r} is not found; this server serves {ctx.model_name!r} "
            f"(also reachable as {' or '.join(repr(n) for n in TRITON_MODEL_NAMES)})"
        )
    return name, version


async def _handle(request: web.Request, force_stream: bool | None) -> web.StreamResponse:
    ctx = request.app[CONTEXT]
    name, version = _check_model(request)
    body = await json_object(request, '{"text_input": "Hello", "max_tokens": 20}')
    if "text_input" not in body and "parameters" not in body:
        raise BadRequest(
            f'text_input is required, e.g. {{"text_input": "Hello", "max_tokens": 20}}; got keys {sorted(body)!r}'
        )
    req: TritonRequest = validate_body(TritonRequest, _flatten(body))
    params = req.to_generate()
    if req.lora_task_id is not None:
        adapter = await ctx.require_service().task_adapter(req.lora_task_id, req.lora_weights, req.lora_config)
        params = params.model_copy(update={"adapter": adapter})
    stream_it = req.stream if force_stream is None else force_stream
    service = ctx.require_service()
    head = {"model_name": name, "model_version": version}
    prefix = "" if req.exclude_input_in_output else req.text_input
    refuse_streamed_beams(params, stream_it, NAMES)
    async with await service.start(
        req.text_input, params, field_name="text_input", max_tokens_field="max_tokens", names=NAMES
    ) as stream:
        if not stream_it and params.beam_width > 1:
            beams = await stream.collect_beams()
            if beams[0].error is not None:
                return triton_error(beams[0].error)
            return json_response({**head, "text_output": [prefix + b.text for b in beams]})
        if not stream_it:
            c = await stream.collect(keep_tokens=req.return_log_probs)
            if c.error is not None:
                return triton_error(c.error)
            out: dict[str, Any] = {**head, "text_output": prefix + c.text}
            if req.return_log_probs:
                lps = [t.logprob for t in c.tokens]
                out["output_log_probs"] = lps
                out["cum_log_probs"] = sum(lp for lp in lps if lp is not None)
            return json_response(out)
        response, first = await open_stream(request, stream, SSE_HEADERS, triton_error)
        if response is None:
            return first  # type: ignore[return-value]
        state = {"prefix": prefix, "sent": False, "cum": 0.0}

        def encode(d: Delta) -> bytes:
            if d.error is not None:
                return sse({"error": d.error.message})
            text = state["prefix"] + d.text
            state["prefix"] = ""
            if not text and (state["sent"] or not d.finished) and not (req.return_log_probs and d.tokens):
                return b""
            state["sent"] = True
            obj: dict[str, Any] = {**head, "text_output": text}
            if req.return_log_probs:
                lps = [t.logprob for t in d.tokens]
                state["cum"] += sum(lp for lp in lps if lp is not None)
                obj["output_log_probs"] = lps
                obj["cum_log_probs"] = state["cum"]
            return sse(obj)

        return await pump(response, stream, first, encode)


@errors_as(triton_error)
async def generate(request: web.Request) -> web.StreamResponse:
    return await _handle(request, None)


@errors_as(triton_error)
async def generate_stream(request: web.Request) -> web.StreamResponse:
    return await _handle(request, True)


async def server_live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def server_ready(request: web.Request) -> web.Response:
    return web.Response(status=200 if request.app[CONTEXT].status is ModelStatus.HEALTHY else 400)


@errors_as(triton_error)
async def model_ready(request: web.Request) -> web.Response:
    _check_model(request)
    return await server_ready(request)


def install(app: web.Application, ctx: ServingContext) -> None:
    for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        add_post(app, base + "/generate", generate, Body((TritonRequest,)))
        add_post(app, base + "/generate_stream", generate_stream, Body((TritonRequest,)))
        app.router.add_get(base + "/ready", model_ready)
    app.router.add_get("/v2/health/live", server_live)
    app.router.add_get("/v2/health/ready", server_ready)
