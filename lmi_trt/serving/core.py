"""The one request core every wire schema goes through.

Adapters (LMI, TGI, OpenAI, Triton, ...) parse their own body into a neutral
``GenerateParams`` and call ``GenerationService.start`` — which admits, tokenizes, validates
against the engine's limits and submits, raising ``LmiHttpError`` before anything is sent —
then iterate the returned ``GenerationStream`` of neutral ``Delta``s inside ``async with``.
Detokenization, stop strings, cancellation, timeouts and metrics happen here, once.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import logging
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import (
    MAX_TOP_LOGPROBS,
    AdapterHost,
    AdapterInfo,
    Beam,
    Engine,
    EngineError,
    EngineLimits,
    EngineOutput,
    FinishReason,
    GenerationRequest,
    GuidedDecoding,
    SamplingParams,
)
from lmi_trt.engines.guided import guide_problem, schema_text
from lmi_trt.errors import LmiError
from lmi_trt.log_context import REQUEST_ID
from lmi_trt.serving.admission import Admission, LocalAdmission
from lmi_trt.serving.detok import IncrementalDetokenizer, TokenCache, make_token_cache
from lmi_trt.serving.errors import (
    BadRequest,
    Conflict,
    FieldError,
    LmiHttpError,
    ModelError,
    NotFound,
    ServiceUnavailable,
    error_from_code,
)
from lmi_trt.serving.metrics import Metrics
from lmi_trt.serving.stops import StopMatcher
from lmi_trt.serving.tokenizer import tokenizer_facts

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_MAX_NEW_TOKENS = 30  # DJL/TGI default
MAX_STOP_STRINGS = 64
# Stop strings and bad words: each at most this many characters, all of one field together at
# most this many UTF-8 bytes. Their cost per request (matcher, tokenization) is linear in these.
MAX_STOP_CHARS = 1024
MAX_WORDS_BYTES = 16 * 1024
# logit_bias entries: each is applied at every step of the request.
MAX_LOGIT_BIAS = 1024
# Longer texts are tokenized on the tokenizer pool so one big request cannot stall every stream.
THREAD_TOKENIZE_CHARS = 16_384
# Sampling values the arithmetic carries. Below MIN_TEMPERATURE, float32 logits / temperature
# overflow to inf and the softmax turns NaN (vLLM clamps at the same 1e-2 for that reason:
# vllm-project/vllm, vllm/sampling_params.py, _MAX_TEMP). A top_p so small that it is greedy
# rounds to 0 in float32 elsewhere; top_k is a 32-bit SizeType32 in TensorRT-LLM's
# SamplingConfig (NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/executor/executor.h).
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0
MIN_TOP_P = 1e-6
MAX_TOP_K = 2**31 - 1
# repetition_penalty divides or multiplies logits: outside this range a float32 logit overflows
# or vanishes. presence/frequency penalties: OpenAI's documented range [-2, 2].
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-2, 100.0
MAX_ABS_PENALTY = 2.0
# Beams a request may ask for (each takes a batch row of the engine, which bounds it further: Capability.most),
# and the length penalty's range (an exponent of the beam's length: past this a float32 score over- or underflows).
MAX_BEAM_WIDTH = 64
MAX_LENGTH_PENALTY = 10.0
MAX_ADAPTER_NAME = 256
# A LoRA adapter's name: it is a path segment of the adapter routes and an OpenAI model name.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,255}")


def bounded_words(v: list[str], what: str) -> list[str]:
    if any(not w for w in v):
        raise ValueError(f"{what} must be non-empty")
    longest = max(v, key=len, default="")
    if len(longest) > MAX_STOP_CHARS:
        raise ValueError(f"{what} must be at most {MAX_STOP_CHARS} characters each, one has {len(longest)}")
    total = sum(len(w.encode("utf-8", "surrogatepass")) for w in v)
    if total > MAX_WORDS_BYTES:
        raise ValueError(f"{what} must be at most {MAX_WORDS_BYTES} bytes together (UTF-8), got {total}")
    return v


def schema_guide_text(schema: Any, field_name: str) -> str:
    """A JSON schema a client sent as a JSON value, as its guide's text; a 400 naming the field for one nested
    past the bound (which JSON writers cannot take either)."""
    try:
        return schema_text(schema)
    except ValueError as e:
        raise FieldError(field_name, f"{field_name}: {e}") from None


@dataclass(frozen=True)
class LoadedModel:
    """What the loader hands the server: a started engine (``submit()`` works) and its tokenizer."""

    engine: Engine
    tokenizer: Any  # a transformers tokenizer (see serving.tokenizer.load_tokenizer)
    # A LoRA adapter's src (a folder, s3:// or a hub id) → its local folder (lmi_trt.sources.resolve_adapter, bound
    # to the configuration); None where adapters are off.
    adapter_source: Callable[[str], Any] | None = None
    # The folder it was loaded from (front-end processes load their own copy: serving/frontends.py)
    tokenizer_dir: Path | None = None
    # The model's config.json (its module sizes decode Triton's lora_weights rows); None where not known here.
    model_config: Mapping[str, Any] | None = None


class FeatureRefused(BadRequest):
    """A 400 for a request field the engine cannot honour; ``param`` is the adapter's field name."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class GenerateParams(BaseModel):
    """Schema-neutral generation settings. Adapters map their own field names onto these.

    ``None`` means "not given": defaults are applied in ``sampling_params`` so an adapter can
    tell the two apart (LMI infers ``do_sample`` from the sampling fields that were given).
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    max_new_tokens: int | None = Field(None, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    do_sample: bool | None = None
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)
    top_p: float | None = Field(None, ge=MIN_TOP_P, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(
        None, ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY, allow_inf_nan=False
    )
    presence_penalty: float = Field(0.0, ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-MAX_ABS_PENALTY, le=MAX_ABS_PENALTY, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)  # checked every step
    # Words that must never be generated; tokenized here into the engine's bad_words_ids.
    bad_words: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)  # alternatives per token; implies logprobs
    prompt_logprobs: bool = False
    guided: GuidedDecoding | None = None  # constrained decoding (response_format, grammar, guided_*)
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=MAX_LOGIT_BIAS)  # token id → its logit's bias
    truncate: int | None = Field(None, ge=1)  # keep only the last N prompt tokens (TGI)
    # Beam search: beam_width beams, the num_return_sequences best returned (check_beams says what goes with it).
    beam_width: int = Field(1, ge=1, le=MAX_BEAM_WIDTH)
    num_return_sequences: int = Field(1, ge=1, le=MAX_BEAM_WIDTH)
    length_penalty: float | None = Field(None, ge=-MAX_LENGTH_PENALTY, le=MAX_LENGTH_PENALTY, allow_inf_nan=False)
    early_stopping: bool | Literal["never"] | None = None
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    adapter: str | None = Field(None, min_length=1, max_length=MAX_ADAPTER_NAME)  # a registered LoRA adapter's name

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("stop")
    @classmethod
    def _stop_non_empty(cls, v: list[str]) -> list[str]:
        return bounded_words(v, "stop strings")

    @field_validator("temperature")
    @classmethod
    def _temperature_carried(cls, v: float | None) -> float | None:
        if v is not None and 0 < v < MIN_TEMPERATURE:
            raise ValueError(
                f"must be 0 (greedy) or at least {MIN_TEMPERATURE:g}: smaller values overflow the sampling arithmetic"
            )
        return v

    @field_validator("bad_words", mode="before")
    @classmethod
    def _bad_words_as_list(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("bad_words")
    @classmethod
    def _bad_words_non_empty(cls, v: list[str]) -> list[str]:
        return bounded_words(v, "bad words")


# What a request asks of each engine feature (the fields of engines.base.Capabilities), falsy for nothing:
# a bool; for a counted feature how many, checked against its ``most``; for guided decoding its kind.
# check_features refuses by this table, in its order: alternatives imply log-probs, so the field that asked
# for alternatives is named before the one for log-probs.
REQUESTED_FEATURES: dict[str, Callable[[GenerateParams], bool | int | str]] = {
    "top_logprobs": lambda p: p.top_logprobs,
    "prompt_logprobs": lambda p: p.prompt_logprobs,
    "logit_bias": lambda p: bool(p.logit_bias),
    "guided": lambda p: p.guided.kind if p.guided is not None else "",
    "logprobs": lambda p: p.logprobs,
    # a seed matters to a sampled request only (greedy has nothing to draw)
    "seed": lambda p: p.seed is not None and sampling_params(p, max_new_tokens=1, logprobs=False).do_sample,
    "repetition_penalty": lambda p: p.repetition_penalty not in (None, 1.0),
    "presence_penalty": lambda p: p.presence_penalty != 0.0,
    "frequency_penalty": lambda p: p.frequency_penalty != 0.0,
    "min_new_tokens": lambda p: p.min_new_tokens,
    "bad_words": lambda p: bool(p.bad_words),
    "stop_token_ids": lambda p: bool(p.stop_token_ids) and p.ignore_eos,  # some releases drop them then
    "beam_search": lambda p: p.beam_width if p.beam_width > 1 else 0,
    "min_p": lambda p: p.min_p not in (None, 0.0),
    "lora": lambda p: p.adapter or "",
}
# What beam search leaves out on every engine here, by the GenerateParams field that asks for it: the beams are
# scored by the model's log-probs alone (transformers' generate with do_sample=False), returned whole at the end.
BEAMLESS: dict[str, Callable[[GenerateParams], bool]] = {
    "do_sample": lambda p: sampling_params(p, max_new_tokens=1, logprobs=False).do_sample,
    "stop": lambda p: bool(p.stop),
    "logprobs": lambda p: p.logprobs,
    "top_logprobs": lambda p: bool(p.top_logprobs),
    "prompt_logprobs": lambda p: p.prompt_logprobs,
    "guided": lambda p: p.guided is not None,
    "logit_bias": lambda p: bool(p.logit_bias),
    "bad_words": lambda p: bool(p.bad_words),
    "repetition_penalty": lambda p: p.repetition_penalty not in (None, 1.0),
    "presence_penalty": lambda p: p.presence_penalty != 0.0,
    "frequency_penalty": lambda p: p.frequency_penalty != 0.0,
    "min_new_tokens": lambda p: bool(p.min_new_tokens),
}


def beam_problem(p: GenerateParams) -> tuple[str, str] | None:
    """Pure: (field, why) for a request whose beam fields do not go together, else None. Beam search alone sets
    length_penalty and early_stopping (vLLM refuses them without it too: vllm/sampling_params.py,
    _verify_non_beam_search, 0.6); it is not streamed, because beams rewrite their earlier tokens."""
    if p.num_return_sequences > p.beam_width:
        return "num_return_sequences", (
            f"num_return_sequences={p.num_return_sequences} is more than the {p.beam_width} beam(s) searched; "
            "ask for at most as many sequences as beams"
        )
    if p.beam_width == 1:
        if p.length_penalty not in (None, 1.0):
            return "length_penalty", f"length_penalty={p.length_penalty} applies to beam search only; ask for beams"
        if p.early_stopping not in (None, False):
            return "early_stopping", f"early_stopping={p.early_stopping!r} applies to beam search only; ask for beams"
        return None
    for name, asked in BEAMLESS.items():
        if asked(p):
            return name, f"{name} cannot be combined with beam search here (beams are scored by log-prob alone)"
    return None


def refuse_streamed_beams(params: GenerateParams, stream: bool, names: Mapping[str, str]) -> None:
    """A 400 for a streamed beam-search request: beams rewrite their earlier tokens, which deltas cannot say."""
    if stream and params.beam_width > 1:
        field_name = names.get("beam_search", "beam_width")
        raise FeatureRefused(
            field_name,
            f"{field_name}={params.beam_width}: beam search is not streamed (beams rewrite their earlier tokens); "
            "set stream to false, or ask for 1 beam",
        )


def format_validation_error(err: ValidationError, prefix: str = "") -> str:
    """One clause per problem: ``field.path[i]: what is wrong (got value)``."""
    parts = []
    for e in err.errors(include_url=False):
        loc = prefix
        for p in e["loc"]:
            loc = f"{loc}[{p}]" if isinstance(p, int) else f"{loc}.{p}" if loc else str(p)
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] not in ("missing", "extra_forbidden") and "input" in e and not isinstance(e["input"], dict):
            got = repr(e["input"])
            msg = f"{msg} (got {got[:80] + '...' if len(got) > 80 else got})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


# DJL LMI's TensorRT-LLM rule: do_sample=true fills what the request left unset with top_k=5, top_p=0.85,
# temperature=0.8 (deepjavalibrary/djl-serving, engines/python/setup/djl_python/rolling_batch/
# trtllm_rolling_batch.py, TRTLLMRollingBatch.translate_triton_params); applied here for every engine.
DJL_SAMPLING_DEFAULTS: dict[str, Any] = {"top_k": 5, "top_p": 0.85, "temperature": 0.8}
# A greedy request: values that change nothing (top_k 0 = no top-k limit).
NEUTRAL_SAMPLING: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "temperature": 1.0}


def _implies_sampling(p: GenerateParams) -> bool:
    """LMI ≥ 0.32 / TGI: sampling fields that change the distribution switch sampling on."""
    return (
        (p.temperature is not None and p.temperature > 0 and p.temperature != 1.0)
        or bool(p.top_k)
        or (p.top_p is not None and p.top_p < 1.0)
    )


def output_cap(limits: EngineLimits | None, config: LmiConfig) -> int:
    """The most new tokens a request may ask for (less where the prompt fills max_seq_len): the engine's own limit
    where it states one, else option.max_output_len. Decided here only; ``GenerationService`` applies it to each
    request, and /info (TGI) reports it."""
    return limits.max_new_tokens if limits is not None and limits.max_new_tokens is not None else config.max_output_len


def sampling_params(p: GenerateParams, *, max_new_tokens: int, logprobs: bool) -> SamplingParams:
    """One meaning for every engine: here, where "unset" is still known, a sampled request gets DJL's
    defaults for what it left unset; a greedy one the neutral values. Engines apply what they get."""
    do_sample = p.do_sample if p.do_sample is not None else _implies_sampling(p)
    if p.temperature == 0:
        do_sample = False  # temperature 0 is greedy (OpenAI semantics), not a division by zero
    unset = DJL_SAMPLING_DEFAULTS if do_sample else NEUTRAL_SAMPLING
    return SamplingParams(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=unset["temperature"] if p.temperature is None else p.temperature,
        top_k=unset["top_k"] if p.top_k is None else p.top_k,
        top_p=unset["top_p"] if p.top_p is None else p.top_p,
        seed=p.seed,
        repetition_penalty=1.0 if p.repetition_penalty is None else p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        min_new_tokens=p.min_new_tokens,
        beam_width=p.beam_width,
        num_return_sequences=p.num_return_sequences,
        length_penalty=1.0 if p.length_penalty is None else p.length_penalty,
        early_stopping=False if p.early_stopping is None else p.early_stopping,
        logprobs=logprobs,
        top_logprobs=p.top_logprobs if logprobs else 0,
        prompt_logprobs=p.prompt_logprobs,
        ignore_eos=p.ignore_eos,
        guided=p.guided,
        logit_bias=tuple(sorted(p.logit_bias.items())),
    )


@dataclass(slots=True)
class TokenOut:
    id: int
    text: str  # this token's share of the visible text (see Delta.text)
    logprob: float | None
    special: bool
    # The most likely tokens of this step, best first, when top_logprobs was asked for.
    top: list[Alternative] | None = None


@dataclass(slots=True, frozen=True)
class Alternative:
    """A token considered at one step (a top log-prob entry, or a prompt token): its own text."""

    id: int
    text: str
    logprob: float | None
    special: bool


@dataclass(slots=True)
class Delta:
    """New output since the previous delta. ``text`` is the concatenation of ``tokens[*].text``
    plus, on the final delta only, text flushed at the end that no token carried (possible
    when the engine's final output has no tokens)."""

    text: str
    tokens: list[TokenOut]
    generated_tokens: int  # cumulative
    prompt_tokens: int
    finish_reason: FinishReason | None = None
    error: LmiHttpError | None = None  # set iff finish_reason is ERROR
    # On the first delta of a request with prompt_logprobs: each prompt token (the first's logprob None).
    prompt: list[Alternative] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class Completion:
    text: str
    finish_reason: FinishReason
    generated_tokens: int
    prompt_tokens: int
    tokens: list[TokenOut] = field(default_factory=list)  # filled when collect(keep_tokens=True)
    error: LmiHttpError | None = None
    prompt: list[Alternative] | None = None  # with prompt_logprobs
    score: float | None = None  # a beam's score (GenerationStream.collect_beams), where the engine gives it


class GenerationStream:
    """Neutral deltas for one request. Use inside ``async with``: leaving early (client gone,
    handler cancelled) cancels the engine request and frees the admission slot."""

    def __init__(
        self,
        service: GenerationService,
        request_id: str,
        prompt_token_ids: list[int],
        params: GenerateParams,
        max_new_tokens: int,
        engine_iter: AsyncIterator[EngineOutput],
        names: Mapping[str, str] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.max_new_tokens = max_new_tokens
        self.generated_tokens = 0
        self._service = service
        self._it = engine_iter
        self._names = names or {}  # the adapter's names for the fields an engine error may name
        self._detok = IncrementalDetokenizer(
            service.tokenizer, prompt_token_ids, cache=service.token_cache(params.skip_special_tokens)
        )
        self._stops = StopMatcher(params.stop) if params.stop else None
        self._specials = service.facts.special_token_ids
        self._done = False
        self.beams: list[Beam] | None = None  # a beam-search request's beams, once its final output came
        self._timed_out = False
        self._cancel_pending = False  # _process ended the request: cancel the engine side before returning
        self._loop = asyncio.get_running_loop()
        # Metrics use the process clock: uvloop's loop.time() is cached per pass, in milliseconds.
        self._t0 = time.perf_counter()
        self._first_token_at: float | None = None
        self._waiting_since: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        timeout = service.config.predict_timeout
        if timeout and timeout > 0:
            self._watchdog = self._loop.call_later(timeout, self._check_stall)

    @property
    def finished(self) -> bool:
        return self._done

    async def __aenter__(self) -> GenerationStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> Delta:
        if self._done:
            raise StopAsyncIteration
        self._waiting_since = self._loop.time()
        self._service.wait_begins()
        try:
            out = await self._it.__anext__()
        except StopAsyncIteration:
            return await self._fail(ModelError("the engine ended the request without a final output"))
        except Exception as e:  # an engine bug: the contract (engines/base.py) ends requests with an output
            log.exception("engine stream for %s broke the engine contract", self.request_id)
            return await self._fail(ModelError(f"engine failure: {e}"))
        finally:
            self._waiting_since = None
            self._service.wait_ends()
        delta = self._process(out)
        if self._cancel_pending:  # rare: an error, a stop string, a timeout
            self._cancel_pending = False
            await self._cancel_engine()
        return delta

    async def collect(self, keep_tokens: bool = False) -> Completion:
        """Drain to the end; the non-streaming path."""
        texts: list[str] = []
        tokens: list[TokenOut] = []
        last: Delta | None = None
        prompt: list[Alternative] | None = None
        async for last in self:
            if last.prompt is not None:
                prompt = last.prompt
            if last.text:
                texts.append(last.text)
            if keep_tokens:
                tokens.extend(last.tokens)
        assert last is not None and last.finish_reason is not None
        return Completion(
            text="".join(texts),
            finish_reason=last.finish_reason,
            generated_tokens=last.generated_tokens,
            prompt_tokens=self.prompt_tokens,
            tokens=tokens,
            error=last.error,
            prompt=prompt,
        )

    async def collect_beams(self) -> list[Completion]:
        """Drain a beam-search request: one ``Completion`` per beam returned, best first, with its score (an engine
        that returned no beams, or an error: ``collect``'s one)."""
        best = await self.collect()
        if best.error is not None or self.beams is None:
            return [best]
        cache = self._service.token_cache(self.params.skip_special_tokens)
        out = []
        for beam in self.beams:
            detok = IncrementalDetokenizer(self._service.tokenizer, self.prompt_token_ids, cache=cache)
            text = "".join(detok.step(t) for t in beam.token_ids) + detok.finish()
            out.append(Completion(text, beam.finish_reason, len(beam.token_ids), self.prompt_tokens, score=beam.score))
        return out

    async def aclose(self) -> None:
        """Release the request. Early (client gone): cancel the engine request, in the
        background so a second cancellation of the calling task cannot skip it."""
        if self._done:
            # Finished: let the engine's iterator run its cleanup now rather than at GC.
            aclose = getattr(self._it, "aclose", None)
            if aclose is not None:
                await aclose()
            return
        self._finish(FinishReason.CANCELLED)
        self._service.spawn(self._cancel_engine())

    def _process(self, out: EngineOutput) -> Delta:
        """One engine delta → one Delta: one detokenizer pass, the stop check, the token records.
        Sets ``_cancel_pending`` where the engine request must be cancelled (the caller awaits it)."""
        if out.queue_time_s is not None:  # engines send it once, with the request's first output
            self._service.observe_queue_time(out.queue_time_s)
        if out.error is not None or out.finish_reason is FinishReason.ERROR:
            return self._failed(self._engine_error(out))
        if out.beams is not None:
            self.beams = out.beams
        tokens: list[TokenOut] = []
        texts: list[str] = []
        stops = self._stops
        reason: FinishReason | None = None
        token_ids = out.token_ids
        if token_ids:
            # One pass over the delta's tokens: detokenize, stop check, records.
            step = self._detok.step
            lps = out.logprobs
            specials = self._specials
            tops = self._alternatives(out.top_logprobs) if out.top_logprobs else None
            if stops is None:
                for i, tid in enumerate(token_ids):
                    piece = step(tid)
                    tokens.append(
                        TokenOut(tid, piece, lps[i] if lps else None, tid in specials, tops[i] if tops else None)
                    )
                    texts.append(piece)
            else:
                for i, tid in enumerate(token_ids):
                    piece = stops.feed(step(tid))
                    tokens.append(
                        TokenOut(tid, piece, lps[i] if lps else None, tid in specials, tops[i] if tops else None)
                    )
                    if piece:
                        texts.append(piece)
                    if stops.matched is not None:
                        reason = FinishReason.STOP_SEQUENCE
                        break
            self.generated_tokens += len(tokens)
        if reason is None and out.finished:
            reason = out.finish_reason or (
                FinishReason.LENGTH if self.generated_tokens >= self.max_new_tokens else FinishReason.EOS
            )
            if reason is FinishReason.CANCELLED and self._timed_out:
                return self._failed(self._timeout_error())
            tail = self._detok.finish()
            if stops is not None:
                tail = stops.feed(tail)
                if stops.matched is not None:
                    reason = FinishReason.STOP_SEQUENCE
                else:
                    tail += stops.flush()
            if tail:
                texts.append(tail)
                if tokens:
                    tokens[-1].text += tail
        if tokens and self._first_token_at is None:
            self._first_token_at = time.perf_counter()
            self._service.observe_ttft(self._first_token_at - self._t0)
        delta = Delta("".join(texts), tokens, self.generated_tokens, self.prompt_tokens, reason)
        if out.prompt_logprobs is not None:
            delta.prompt = self._prompt_details(out.prompt_logprobs)
        if reason is not None:
            self._finish(reason)
            if not out.finished:  # a stop string ended it while the engine is still generating
                self._cancel_pending = True
        return delta

    def _engine_error(self, out: EngineOutput) -> LmiHttpError:
        """An engine's error output as the answer: a 400 about a request field names it as the client does."""
        message = out.error or "engine error"
        if out.error_code == 400 and out.error_field is not None:
            field_name = self._names.get(out.error_field, out.error_field)
            return FieldError(field_name, f"{field_name}: {message}")
        return error_from_code(message, out.error_code)

    def _token_text(self, token_id: int) -> str:
        return self._service.token_cache(self.params.skip_special_tokens).decode([token_id])

    def _alternatives(self, steps: list[list[tuple[int, float]]]) -> list[list[Alternative]]:
        text, specials = self._token_text, self._specials
        return [[Alternative(tid, text(tid), lp, tid in specials) for tid, lp in step] for step in steps]

    def _prompt_details(self, logprobs: list[float | None]) -> list[Alternative]:
        text, specials = self._token_text, self._specials
        return [
            Alternative(tid, text(tid), lp, tid in specials)
            for tid, lp in zip(self.prompt_token_ids, logprobs, strict=True)
        ]

    def _failed(self, err: LmiHttpError) -> Delta:
        self._finish(FinishReason.ERROR)
        self._cancel_pending = True
        return Delta("", [], self.generated_tokens, self.prompt_tokens, FinishReason.ERROR, err)

    async def _fail(self, err: LmiHttpError) -> Delta:
        self._finish(FinishReason.ERROR)
        await self._cancel_engine()
        return Delta("", [], self.generated_tokens, self.prompt_tokens, FinishReason.ERROR, err)

    def _finish(self, reason: FinishReason) -> None:
        self._done = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._service.release(
            self,
            reason,
            time.perf_counter() - self._t0,
            None if self._first_token_at is None else self._first_token_at - self._t0,
        )

    async def _cancel_engine(self) -> None:
        try:
            await self._service.engine.cancel(self.request_id)
            aclose = getattr(self._it, "aclose", None)
            if aclose is not None:
                await aclose()
        except Exception:
            log.exception("cancelling engine request %s failed", self.request_id)

    def _check_stall(self) -> None:
        """predict_timeout watchdog: one timer per interval instead of a timeout per token."""
        if self._done:
            return
        timeout = self._service.config.predict_timeout
        now = self._loop.time()
        since = self._waiting_since
        if since is not None and now - since >= timeout:
            self._timed_out = True
            # The engine ends the stream with CANCELLED, which _process turns into the error.
            self._service.spawn(self._service.engine.cancel(self.request_id))
            return
        self._watchdog = self._loop.call_at((since if since is not None else now) + timeout, self._check_stall)

    def _timeout_error(self) -> LmiHttpError:
        t = self._service.config.predict_timeout
        return ModelError(
            f"no output from the engine for {t} s (option.predict_timeout={t}); the request was cancelled. "
            "Raise option.predict_timeout or lower the load."
        )


class Reservation:
    """Room under job_queue_size for a batch's prompts, counted when taken (``GenerationService.admit_batch``)."""

    def __init__(self, admission: Admission, n: int) -> None:
        self._admission = admission
        self.left = n

    def use(self) -> None:
        assert self.left > 0, "more prompts started than reserved"
        self.left -= 1

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.left:  # prompts that never started (one failed before them): their room goes back
            self._admission.add(-self.left)
            self.left = 0


TASK_PREFIX = "lora-task-"  # Triton lora_task_id N is served as the adapter "lora-task-N"


def _write_task(model_config: Mapping[str, Any], task_id: int, weights: Any, config: Any) -> Path:
    """Triton's ``lora_weights`` [1, rows, D] and ``lora_config`` [1, rows, 3] (JSON lists) decoded into A and B per
    module and written as a PEFT folder of its own, which the engine registers like any adapter."""
    import torch

    from lmi_trt.engines.adapters import write_adapter
    from lmi_trt.engines.lora_layout import decode, module_dims

    try:
        w = torch.tensor(weights, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise FieldError("lora_weights", f"lora_weights: a [1, rows, D] array of numbers ({e})") from e
    try:
        c = torch.tensor(config, dtype=torch.int64)
    except (TypeError, ValueError, RuntimeError) as e:
        raise FieldError("lora_config", f"lora_config: a [1, rows, 3] array of integers ({e})") from e
    for name, t in (("lora_weights", w), ("lora_config", c)):
        if t.dim() != 3 or t.shape[0] != 1:
            raise FieldError(name, f"{name} of shape {list(t.shape)}: one request's tensor is [1, rows, ...]")
    if not torch.isfinite(w).all():
        raise FieldError("lora_weights", "lora_weights holds a NaN or infinity")
    folder = Path(tempfile.mkdtemp(prefix=f"lmi-lora-task-{task_id}-"))
    try:
        decoded = decode(w[0], c[0], module_dims(model_config), int(model_config["num_hidden_layers"]))
        write_adapter(folder, decoded)
    except EngineError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise FieldError(e.field or "lora_weights", str(e)) from e
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


class GenerationService:
    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        config: LmiConfig,
        *,
        metrics: Metrics | None = None,
        adapter_source: Callable[[str], Any] | None = None,
        admission: Admission | None = None,
        model_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.engine = engine
        # The engine as a LoRA registry, or None: found once, as a runtime-checkable Protocol's isinstance inspects
        # every member on each call (typing._ProtocolMeta.__instancecheck__), and every OpenAI request asks twice.
        self._adapters: AdapterHost | None = engine if isinstance(engine, AdapterHost) else None
        self._adapter_source = adapter_source
        self._model_config = model_config
        # Triton's lora_task_id → (digest of the weights it was sent with, the PEFT folder written for it)
        self._tasks: dict[int, tuple[str, Path]] = {}
        self._tasks_lock = asyncio.Lock()
        self.tokenizer = tokenizer
        self.config = config
        self.metrics = metrics
        self.facts = tokenizer_facts(tokenizer)
        # Per-token decode facts shared by every request's detokenizer (see detok.TokenCache).
        self._token_caches = {flag: make_token_cache(tokenizer, flag) for flag in (True, False)}
        self._in_system = 0  # this process's requests (what its drain waits for)
        # job_queue_size counts every front end's (option.api_server_count)
        self.admission: Admission = admission if admission is not None else LocalAdmission()
        self._ids = itertools.count(1)
        # The progress watchdog's bookkeeping (stalled_for): streams waiting on the engine now, the time
        # streams waited before the current waiting period since the engine last produced a token, when
        # that period began, and the engine's token count when last looked.
        self._waiting = 0
        self._owed = 0.0
        self._owed_since = 0.0
        self._tokens_seen = 0
        self._background: set[asyncio.Task[Any]] = set()
        # Big texts are tokenized here, off the event loop. A job still queued when its client
        # leaves is dropped (its future is cancelled); a running one is bounded by max_prompt_chars.
        self._tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lmi-tokenize")
        # No token is longer than the longest vocabulary entry (byte-level BPE spells each byte
        # as one character), so a text of more characters than this has more than max_input_len
        # tokens: refused before any tokenizer work.
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = engine.limits.max_input_len * max(longest, 1)
        # Special-token texts (``</s>``, ``<|im_end|>``), to find them in a client's chat content.
        specials = sorted(
            {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special}
            | set(tokenizer.all_special_tokens),
            key=len,
            reverse=True,
        )
        self.special_text = re.compile("|".join(map(re.escape, specials))) if specials else None

    # -- LoRA adapters (engines that are an AdapterHost with option.enable_lora) -------------------------

    def adapters(self) -> list[AdapterInfo]:
        return self._adapters.adapters() if self._adapters is not None else []

    def adapter_names(self) -> set[str]:
        return {a.name for a in self.adapters()}

    def _adapter_host(self) -> AdapterHost:
        capability = self.engine.capabilities.lora
        if not capability.honoured or self._adapters is None or self._adapter_source is None:
            raise BadRequest(f"LoRA adapters: {capability.reason or 'not served by this engine'}")
        return self._adapters

    async def register_adapter(self, name: str, src: str) -> AdapterInfo:
        """Fetch ``src`` (a folder, s3:// or a hub id, through the sources) and register it as ``name``."""
        host = self._adapter_host()
        if not isinstance(name, str) or not ADAPTER_NAME.fullmatch(name):
            raise FieldError("name", f"adapter name {name!r}: letters, digits, '.', '_' and '-', up to 256")
        if name == self.config.model_id or name in self.adapter_names():
            raise Conflict(f"adapter name {name!r} is taken; unregister it first or choose another")
        if not isinstance(src, str) or not src:
            raise FieldError("src", "src: the adapter's folder, s3:// URI or Hugging Face repo id")
        try:
            folder = await asyncio.to_thread(self._adapter_source, src)
            return await host.register_adapter(name, src, str(folder))
        except EngineError as e:
            raise error_from_code(str(e), e.code) from e
        except LmiError as e:  # the sources' errors: the src cannot be found or fetched
            raise FieldError("src", f"src={src!r}: {e}") from e

    async def unregister_adapter(self, name: str) -> None:
        host = self._adapter_host()
        try:
            await host.unregister_adapter(name)
        except EngineError as e:
            raise error_from_code(str(e), e.code) from e

    async def task_adapter(self, task_id: int, weights: Any, config: Any) -> str:
        """The adapter serving Triton's ``lora_task_id`` (named ``TASK_PREFIX`` + the id, apart from the engine's own
        task ids): registered from ``lora_weights``/``lora_config`` (TensorRT-LLM's rows, ``engines.lora_layout``)
        when they come, replaced when they differ from the last ones, and reused when only the id comes; 404 naming
        the id for an unknown task without weights. As the backend's cache does (tensorrtllm_backend
        tensorrt_llm/config.pbtxt: "If the cache is full the oldest LoRA will be evicted ... An error is returned if
        `lora_task_id` is not cached"), a full table (option.max_cpu_loras) drops the least recently used task that no
        request uses."""
        name = f"{TASK_PREFIX}{task_id}"
        try:
            host = self._adapter_host()
        except BadRequest as e:
            raise FieldError("lora_task_id", f"lora_task_id={task_id}: {e.message}") from e
        if weights is None and config is None:
            if name not in self.adapter_names():
                raise NotFound(
                    f"lora_task_id={task_id}: LoRA task {task_id} is not registered here; send its lora_weights and "
                    "lora_config with the task's first request"
                )
            if task_id in self._tasks:
                self._tasks[task_id] = self._tasks.pop(task_id)  # most recently used last
            return name
        if weights is None or config is None:
            given, missing = ("lora_weights", "lora_config") if config is None else ("lora_config", "lora_weights")
            raise FieldError(missing, f"{given} without {missing}: a task's first request carries both")
        dims_config = self._model_config
        if dims_config is not None:
            dims_config = dims_config.get("text_config") or dims_config
        if dims_config is None or not dims_config.get("hidden_size") or not dims_config.get("num_hidden_layers"):
            raise FieldError(
                "lora_weights",
                "lora_weights: the model's module sizes, which the rows are read by, are not known (no hidden_size "
                "or num_hidden_layers in its config); register the adapter (POST /adapters) and choose it by name "
                "in another schema",
            )
        digest = hashlib.sha256(orjson.dumps([weights, config])).hexdigest()
        async with self._tasks_lock:
            known = self._tasks.get(task_id)
            if known is not None and known[0] == digest and name in self.adapter_names():
                self._tasks[task_id] = self._tasks.pop(task_id)
                return name
            folder = await asyncio.to_thread(_write_task, dims_config, task_id, weights, config)
            try:
                if name in self.adapter_names():
                    await self.unregister_adapter(name)  # 409 while requests use the task's old weights
                self._drop_task(task_id)
                full: EngineError | None = None
                for victim in [None, *self._tasks]:  # then the oldest tasks, while the table is full
                    if victim is not None and not await self._evict_task(victim):
                        continue
                    try:
                        await host.register_adapter(name, f"lora_task_id={task_id}", str(folder))
                        break
                    except EngineError as e:  # the engine's checks (rank, modules built, ...) on the task's rows
                        if e.code != 409:
                            raise error_from_code(f"lora_weights of lora_task_id={task_id}: {e}", e.code) from e
                        full = e
                else:
                    raise Conflict(f"lora_task_id={task_id}: {full}; every task adapter is in use")
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self._tasks[task_id] = (digest, folder)
        return name

    def _drop_task(self, task_id: int) -> None:
        known = self._tasks.pop(task_id, None)
        if known is not None:
            shutil.rmtree(known[1], ignore_errors=True)

    async def _evict_task(self, task_id: int) -> bool:
        """Unregister a Triton task's adapter to make room; False while requests use it."""
        try:
            await self.unregister_adapter(f"{TASK_PREFIX}{task_id}")
        except Conflict:
            return False
        except NotFound:  # unregistered meanwhile through the adapter routes
            pass
        self._drop_task(task_id)
        return True

    @property
    def in_system(self) -> int:
        """Requests this process admitted and has not finished (what its drain waits for)."""
        return self._in_system

    def _enter(self, reservation: Reservation | None) -> None:
        """One more request in the system: taken within job_queue_size or a 503 (atomically across front ends),
        or one of a batch's ``reservation`` (``admit_batch``)."""
        if reservation is not None:
            reservation.use()
        elif not self.admission.take(1, self.config.job_queue_size):
            self._busy(1)
        self._in_system += 1

    def _leave(self) -> None:
        self._in_system -= 1
        self.admission.add(-1)

    @property
    def waiting_on_engine(self) -> int:
        """Streams waiting for the engine's next output right now."""
        return self._waiting

    def wait_begins(self) -> None:
        if not self._waiting:
            self._owed_since = time.monotonic()
        self._waiting += 1

    def wait_ends(self) -> None:
        self._waiting -= 1
        if not self._waiting:
            self._owed += time.monotonic() - self._owed_since

    def stalled_for(self) -> float:
        """Seconds streams have waited on the engine since it last produced a token (time nobody waited
        does not count; a token anywhere resets it): what option.watchdog_timeout bounds. Polled (by
        /ping and the health watcher): a change in the engine's token count since the last look is
        the progress, so streams cut by option.predict_timeout do not hide a hung engine."""
        now = time.monotonic()
        tokens = self.engine.stats().total_generated_tokens
        if tokens != self._tokens_seen:
            self._tokens_seen, self._owed, self._owed_since = tokens, 0.0, now
        return self._owed + (now - self._owed_since if self._waiting else 0.0)

    def decoder(self, skip_special_tokens: bool):
        return self._token_caches[skip_special_tokens].decode

    def token_cache(self, skip_special_tokens: bool) -> TokenCache:
        """The shared per-token cache (and decode function) for an IncrementalDetokenizer."""
        return self._token_caches[skip_special_tokens]

    def tokenize(self, text: str, add_special_tokens: bool = True, *, user_text: bool = True) -> list[int]:
        """Token ids. ``user_text``: special-token text (``</s>``, ``<|im_end|>``) in it stays text
        unless option.parse_special_tokens; a client's text must not forge control tokens."""
        split = user_text and not self.config.parse_special_tokens
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=split)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the tokenizer pool: work that grows with a request's size."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn, *args)

    def check_prompt_chars(self, text: str, field_name: str) -> None:
        if len(text) > self.max_prompt_chars:
            raise BadRequest(
                f"{field_name} has {len(text)} characters, more than any prompt of option.max_input_len="
                f"{self.engine.limits.max_input_len} tokens can have ({self.max_prompt_chars}); shorten the prompt"
            )

    def admit_batch(self, n: int, field_name: str) -> Reservation:
        """A request of ``n`` prompts: at most option.max_prompts_per_request, and room for all of them under
        job_queue_size (each prompt is one request in the system), taken at once, atomically across front ends
        (so that batches admitted together on several front ends never overshoot it): each ``start`` given the
        reservation uses one; leaving its ``with``, the rest go back."""
        cap = self.config.max_prompts_per_request
        if n > cap:
            raise BadRequest(
                f"{field_name} has {n} prompts, more than option.max_prompts_per_request={cap}; "
                "split them over several requests"
            )
        self.check_admission(n)
        if not self.admission.take(n, self.config.job_queue_size):
            self._busy(n)
        return Reservation(self.admission, n)

    def check_admission(self, n: int = 1) -> None:
        """503 now if a request could not be admitted: unhealthy engine, or job_queue_size reached.

        Also called before a request body is read, so an overload burst of large bodies is not
        buffered only to be refused.
        """
        if not self.engine.healthy:
            raise ServiceUnavailable("the engine is not healthy; the server is restarting or has failed", retry_after=5)
        if self.admission.total() + n > self.config.job_queue_size:
            self._busy(n)

    def _busy(self, n: int) -> NoReturn:
        self._reject(503)
        more = f" and this request brings {n}" if n > 1 else ""
        raise ServiceUnavailable(
            f"server busy: {self.admission.total()} requests in the system{more}, "
            f"job_queue_size={self.config.job_queue_size}; retry later"
        )

    async def start(
        self,
        prompt: str | Sequence[int],
        params: GenerateParams,
        *,
        add_special_tokens: bool = True,
        field_name: str = "inputs",
        max_tokens_field: str = "max_new_tokens",
        admitted: Reservation | None = None,
        user_text: bool = True,
        names: Mapping[str, str] | None = None,
    ) -> GenerationStream:
        """Admit, tokenize, validate and submit. Raises ``LmiHttpError`` (nothing sent yet).

        ``field_name`` and ``max_tokens_field`` are the adapter's names for the prompt and for
        ``max_new_tokens``, used in error messages. ``admitted``: a batch's reservation
        (``admit_batch``), whose prompts start one by one. ``user_text``
        False: a text prompt made by the server (a rendered chat template), whose special tokens count.
        ``names`` maps neutral feature fields (``top_logprobs``, ``prompt_logprobs``, ``guided``, ``logit_bias``)
        to the adapter's, for the 400 that refuses what the engine cannot do.
        """
        self.check_features(params, names or {})
        if admitted is None:
            self.check_admission()
        self._enter(admitted)
        try:
            ids = await self._prompt_ids(prompt, add_special_tokens, field_name, user_text)
            if params.truncate is not None and len(ids) > params.truncate:
                ids = ids[-params.truncate :]
            max_new = self._check_limits(ids, params, field_name, max_tokens_field)
            # The HTTP request's id (X-Request-Id), so that the engine's own log lines name it too.
            request_id = f"{REQUEST_ID.get() or 'req'}-{next(self._ids)}"
            request = GenerationRequest(
                request_id=request_id,
                prompt_token_ids=ids,
                sampling=sampling_params(params, max_new_tokens=max_new, logprobs=params.logprobs),
                stop_token_ids=[[i] for i in params.stop_token_ids],
                bad_words_ids=await self._bad_words_ids(params.bad_words),
                streaming=params.beam_width == 1,  # beams come back whole, at the end
                adapter=params.adapter,
            )
            it = self.engine.submit(request).__aiter__()  # never raises: refusals are final outputs (engines/base.py)
        except LmiHttpError as e:
            self._leave()
            self._reject(e.status)
            raise
        except BaseException:
            self._leave()
            raise
        if self.metrics is not None:
            self.metrics.prompt_tokens.inc(len(ids))
        return GenerationStream(self, request_id, ids, params, max_new, it, names)

    def check_features(self, params: GenerateParams, names: Mapping[str, str]) -> None:
        """A 400 naming the field for what the engine refuses (its ``Capabilities``): never ignored."""
        problem = beam_problem(params)
        if problem is not None:
            field_name = names.get(problem[0], problem[0])
            raise FeatureRefused(field_name, f"{field_name}: {problem[1]}" if field_name != problem[0] else problem[1])
        for feature, asked in REQUESTED_FEATURES.items():
            amount = asked(params)
            if not amount:
                continue
            field_name = names.get(feature, feature)
            shown = (
                field_name
                if isinstance(amount, bool)
                else f"{field_name} ({amount})"
                if isinstance(amount, str)
                else f"{field_name}={amount}"
            )
            capability = getattr(self.engine.capabilities, feature)
            if not capability.honoured:
                raise FeatureRefused(field_name, f"{shown}: {capability.reason}")
            if feature == "lora" and amount not in self.adapter_names():
                err = NotFound(f"{shown}: no LoRA adapter of that name is registered (GET /v1/models lists them)")
                err.param = field_name  # type: ignore[attr-defined]
                raise err
            if isinstance(amount, int) and capability.most is not None and amount > capability.most:
                raise FeatureRefused(
                    field_name, f"{shown}: the {self.engine.name} engine honours at most {capability.most}"
                )
        vocab = self.facts.vocab_size
        bad = next((i for i in params.logit_bias if not 0 <= i < vocab), None)
        if bad is not None:
            field_name = names.get("logit_bias", "logit_bias")
            raise FeatureRefused(field_name, f"{field_name} names token id {bad}; token ids must be in [0, {vocab})")
        if params.guided is not None:
            problem = guide_problem(params.guided)
            if problem is not None:
                field_name = names.get("guided", "guided")
                raise FeatureRefused(field_name, f"{field_name}: {problem}")

    def require(self, feature: str, field_name: str, purpose: str = "") -> None:
        """A 400 naming ``field_name`` when the engine refuses ``feature`` (a ``Capabilities`` field);
        ``purpose`` says why the field needs it when that is not plain (best_of ranks by log-prob)."""
        capability = getattr(self.engine.capabilities, feature)
        if not capability.honoured:
            raise FeatureRefused(field_name, f"{field_name}{purpose}: {capability.reason}")

    def bad_words_ids(self, words: Sequence[str]) -> list[list[int]]:
        """Token-id sequences for bad words: each word as written and, for a word that does
        not start with a space, with one (how a word mid-sentence tokenizes in BPE/SentencePiece)."""
        out: list[list[int]] = []
        for word in words:
            variants = [word] if word[:1].isspace() else [word, " " + word]
            for text in variants:
                ids = self.tokenize(text, add_special_tokens=False)
                if ids and ids not in out:
                    out.append(ids)
        return out

    async def _bad_words_ids(self, words: Sequence[str]) -> list[list[int]]:
        if sum(map(len, words)) > MAX_STOP_CHARS:
            return await self.off_loop(self.bad_words_ids, words)
        return self.bad_words_ids(words)

    async def generate(
        self, prompt: str | Sequence[int], params: GenerateParams, *, keep_tokens: bool = False
    ) -> Completion:
        async with await self.start(prompt, params) as stream:
            return await stream.collect(keep_tokens=keep_tokens)

    async def _prompt_ids(
        self, prompt: str | Sequence[int], add_special_tokens: bool, field_name: str, user_text: bool
    ) -> list[int]:
        if isinstance(prompt, str):
            self.check_prompt_chars(prompt, field_name)
            try:
                if len(prompt) > THREAD_TOKENIZE_CHARS:
                    ids = await self.off_loop(
                        functools.partial(self.tokenize, prompt, add_special_tokens, user_text=user_text)
                    )
                else:
                    ids = self.tokenize(prompt, add_special_tokens, user_text=user_text)
            except Exception as e:  # e.g. lone surrogates that Python's json accepts
                raise BadRequest(f"{field_name} could not be tokenized: {e}") from e
        else:
            ids = list(prompt)
            vocab = self.facts.vocab_size
            bad = next((i for i in ids if not isinstance(i, int) or not 0 <= i < vocab), None)
            if bad is not None:
                raise BadRequest(f"{field_name} contains token id {bad!r}; token ids must be integers in [0, {vocab})")
        if not ids:
            raise BadRequest(f"{field_name} is empty: the prompt has 0 tokens; send at least one character of text")
        return ids

    def _check_limits(
        self, ids: list[int], params: GenerateParams, field_name: str, max_tokens_field: str = "max_new_tokens"
    ) -> int:
        limits = self.engine.limits
        n = len(ids)
        if n > limits.max_input_len:
            raise BadRequest(
                f"{field_name} has {n} tokens, more than option.max_input_len={limits.max_input_len}; "
                "shorten the prompt, set parameters.truncate, or serve with a larger option.max_input_len"
            )
        cap = output_cap(limits, self.config)
        if limits.max_seq_len is not None:
            cap = min(cap, limits.max_seq_len - n)
        if params.max_new_tokens is None:
            max_new = min(DEFAULT_MAX_NEW_TOKENS, cap)  # only the default adapts; a value asked for never does
            if max_new < 1:
                raise BadRequest(
                    f"{field_name} has {n} tokens, leaving no room to generate within the engine's "
                    f"max_seq_len={limits.max_seq_len}"
                )
        else:
            max_new = params.max_new_tokens
            if max_new > cap:
                if limits.max_seq_len is not None and n + max_new > limits.max_seq_len:
                    raise BadRequest(
                        f"{max_tokens_field}={max_new} plus the prompt's {n} tokens exceeds the engine's max_seq_len="
                        f"{limits.max_seq_len}; ask for at most {max(cap, 0)} new tokens"
                    )
                raise BadRequest(
                    f"{max_tokens_field}={max_new} is more than option.max_output_len={cap}; ask for at most {cap}"
                )
        if params.min_new_tokens > max_new:
            raise BadRequest(f"min_new_tokens={params.min_new_tokens} is more than {max_tokens_field}={max_new}")
        vocab = self.facts.vocab_size
        bad = next((i for i in params.stop_token_ids if not 0 <= i < vocab), None)
        if bad is not None:
            raise BadRequest(f"stop_token_ids contains {bad}; token ids must be in [0, {vocab})")
        return max_new

    def release(
        self, stream: GenerationStream, reason: FinishReason, seconds: float, first_token_after: float | None = None
    ) -> None:
        self._leave()
        if self.metrics is not None:
            self.metrics.finished(
                reason.value, stream.generated_tokens, seconds, first_token_after, stream.params.adapter
            )

    def observe_ttft(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.ttft.observe(seconds)

    def observe_queue_time(self, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.queue_time.observe(seconds)

    def _reject(self, status: int) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(str(status)).inc()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run cleanup outside the (possibly cancelled) request task, holding a reference."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background cleanups (shutdown, tests)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)


__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "Alternative",
    "Completion",
    "Delta",
    "GenerateParams",
    "GenerationService",
    "GenerationStream",
    "TokenOut",
    "format_validation_error",
    "refuse_streamed_beams",
    "sampling_params",
]
