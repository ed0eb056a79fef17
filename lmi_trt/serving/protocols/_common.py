"""Glue shared by the schema adapters (OpenAI, TGI, Triton, Truss): how a stream is opened,
written and ended. Generation semantics stay in ``serving.core``; this is wire plumbing only.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from lmi_trt.engines.base import SAMPLING_FEATURES
from lmi_trt.serving.core import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    Completion,
    Delta,
    GenerateParams,
    GenerationStream,
    format_validation_error,
)
from lmi_trt.serving.errors import BadRequest, FieldError, LmiHttpError
from lmi_trt.serving.http import CONTEXT, json_response, load_json, read_body
from lmi_trt.spelling import did_you_mean, within_a_typo

log = logging.getLogger(__name__)

_MAX_WORD_LIST_CHARS = MAX_STOP_STRINGS * (MAX_STOP_CHARS + 3)  # each word quoted, and a comma
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def param_of(err: LmiHttpError) -> str | None:
    return getattr(err, "param", None)


def validate_body(model: type[BaseModel], data: Any, prefix: str = "") -> Any:
    """pydantic validation whose failure is a 400 naming each field (and the first as ``param``)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]["loc"] if e.errors() else ()
        param = prefix
        for p in first:
            param = f"{param}[{p}]" if isinstance(p, int) else f"{param}.{p}" if param else str(p)
        raise FieldError(param or None, f"invalid request: {format_validation_error(e, prefix)}") from None


# LMI's and TGI's ``parameters`` carry GenerateParams' own field names for the sampling features an engine may
# refuse (lmi_trt.engines.base.Capabilities), as the request spells them.
PARAMETERS_NAMES = {name: f"parameters.{name}" for name in SAMPLING_FEATURES}


def refuse_typos(extras: Iterable[str], known: Iterable[str], peers: Iterable[str] = (), prefix: str = "") -> None:
    """A 400 for the first field the schema does not know that is within a typo of one it does (``temprature``:
    did you mean temperature?), as OpenAI refuses an unrecognized argument; ``peers`` are fields other servers of the
    schema accept, which are never taken for typos. Other unknown fields keep their schema's handling."""
    allowed, known = frozenset(peers), sorted(known)
    for name in extras:
        near = [] if name in allowed else within_a_typo(name, known)
        if near:
            raise FieldError(
                prefix + name,
                f"{prefix}{name} is not a field of this request; did you mean "
                f"{did_you_mean([prefix + n for n in near])}?",
            )


def neutral_params(names: dict[str, str] | None = None, **fields: Any) -> GenerateParams:
    """``GenerateParams(**fields)``, its validation failures as a 400 that uses the adapter's
    field names (``names`` maps a neutral name, e.g. ``stop``, to the schema's, e.g. ``stop_words``)."""
    try:
        return GenerateParams(**fields)
    except ValidationError as e:
        names = names or {}
        first = e.errors(include_url=False)[0]["loc"][0] if e.errors() else None
        msg = format_validation_error(e)
        for neutral, theirs in names.items():
            msg = msg.replace(f"{neutral}:", f"{theirs}:").replace(f"{neutral}[", f"{theirs}[")
        param = names.get(str(first), str(first)) if first is not None else None
        raise FieldError(param, f"invalid request: {msg}") from None


async def json_object(request: web.Request, example: str) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that shows what a body looks like."""
    body = await load_json(request, await read_body(request))
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object such as {example}, got a JSON {type(body).__name__}")
    return body


def word_list(value: Any, field: str) -> list[str]:
    """Triton/Truss word lists: a string is comma-separated (Triton's preprocessing parses it as
    CSV, so ``"a,b"`` is two words and ``""`` none); a list holds one word per item (empty items,
    Truss' default ``[""]``, are skipped)."""
    if value is None:
        return []
    if isinstance(value, str):
        if len(value) > _MAX_WORD_LIST_CHARS:  # parsed on the event loop: bounded before it is
            raise FieldError(
                field,
                f"{field} has {len(value)} characters, more than {MAX_STOP_STRINGS} words of {MAX_STOP_CHARS} "
                f"characters can take ({_MAX_WORD_LIST_CHARS}); shorten it",
            )
        try:
            return [w for row in csv.reader([value]) for w in row if w]
        except csv.Error as e:  # e.g. a bare carriage return inside an unquoted word
            raise FieldError(
                field, f"{field} is not a valid comma-separated list of words ({e}); send a list of strings instead"
            ) from None
    if isinstance(value, list) and all(isinstance(w, str) for w in value):
        return [w for w in value if w]
    raise FieldError(field, f"{field} must be a string (comma-separated words) or a list of strings, got {value!r}")


async def open_stream(
    request: web.Request,
    stream: GenerationStream,
    headers: dict[str, str],
    render_error: Callable[[LmiHttpError], web.StreamResponse],
) -> tuple[web.StreamResponse | None, Delta | web.StreamResponse]:
    """Wait for the first delta before sending headers (as DJL's front end does), so an error
    that comes before any token still gets its HTTP status. Returns (prepared response, first
    delta), or (None, error response)."""
    first = await stream.__anext__()
    if first.error is not None:
        return None, render_error(first.error)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    return response, first


async def pump(
    response: web.StreamResponse,
    stream: GenerationStream,
    first: Delta,
    encode: Callable[[Delta], Iterable[bytes] | bytes],
    *,
    trailer: bytes = b"",
) -> web.StreamResponse:
    """Write ``encode(delta)`` for every delta from ``first`` to the final one, then ``trailer``.

    A client that went away ends the loop quietly; leaving the caller's ``async with`` cancels
    the generation.
    """
    delta = first
    try:
        while True:
            chunk = encode(delta)
            if not isinstance(chunk, bytes):
                chunk = b"".join(chunk)
            if delta.finished:
                break
            if chunk:
                await response.write(chunk)
            delta = await stream.__anext__()
        # The last delta, the trailer and the end of the chunked body in one write (one send, not three).
        await response.write_eof(chunk + trailer)
    except ConnectionResetError:
        pass
    return response


async def open_streams(
    request: web.Request,
    streams: list[GenerationStream],
    headers: dict[str, str],
    render_error: Callable[[LmiHttpError], web.StreamResponse],
) -> tuple[web.StreamResponse | None, list[Delta] | web.StreamResponse]:
    """``open_stream`` for the several sequences of one request (OpenAI ``n``): the headers go out once every
    sequence has its first delta, so an error before any token still gets its status."""
    firsts = [await stream.__anext__() for stream in streams]  # they run together in the engine meanwhile
    error = next((first.error for first in firsts if first.error is not None), None)
    if error is not None:
        return None, render_error(error)
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    return response, firsts


async def pump_all(
    response: web.StreamResponse,
    streams: list[GenerationStream],
    firsts: list[Delta],
    encoders: list[Callable[[Delta], Iterable[bytes]]],
    *,
    closing: Callable[[list[Delta]], Iterable[bytes]] = lambda finals: (),
    trailer: bytes = b"",
) -> web.StreamResponse:
    """``pump`` for several sequences of one request: each delta is written as it arrives, by its sequence's
    encoder; when all have ended, ``closing(final deltas)`` (e.g. one usage record for the request), then
    ``trailer``. An error in one sequence is written and ends the response (the caller closes the others)."""
    arrivals: asyncio.Queue[tuple[int, Delta]] = asyncio.Queue()

    async def forward(i: int) -> None:
        delta = firsts[i]
        while True:
            arrivals.put_nowait((i, delta))
            if delta.finished:
                return
            delta = await streams[i].__anext__()

    tasks = [asyncio.get_running_loop().create_task(forward(i)) for i in range(len(streams))]
    finals: list[Delta] = []
    tail = b""
    try:
        while len(finals) < len(streams):
            i, delta = await arrivals.get()
            chunk = b"".join(encoders[i](delta))
            if chunk:
                await response.write(chunk)
            if delta.finished:
                finals.append(delta)
                if delta.error is not None:
                    break
        else:
            tail = b"".join(closing(finals)) + trailer
        await response.write_eof(tail)  # with the end of the chunked body: one write
    except ConnectionResetError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return response


async def start_n(
    service: Any,
    prompt: Any,
    params: GenerateParams,
    n: int,
    streams: list[GenerationStream],
    what: str = "n",
    **start_kw: Any,
) -> list[GenerationStream]:
    """``n`` sequences of one request into ``streams`` (the caller closes them): ``n`` engine requests of the
    prompt, admitted together; a given seed becomes seed, seed + 1, ... so that sampled choices differ yet stay
    reproducible, streamed or not."""
    with service.admit_batch(n, what) if n > 1 else contextlib.nullcontext() as reservation:
        for i in range(n):
            seed = params.seed
            p = params if seed is None or i == 0 else params.model_copy(update={"seed": (seed + i) % 2**64})
            streams.append(await service.start(prompt, p, admitted=reservation, **start_kw))
    return streams


async def collect_n(
    service: Any, prompt: Any, params: GenerateParams, n: int, what: str = "n", **start_kw: Any
) -> list[Completion]:
    """``start_n``, each sequence collected (with its tokens where log-probs are asked for), all closed after.
    A beam-search request is one request whose beams are the sequences."""
    streams: list[GenerationStream] = []
    try:
        if params.beam_width > 1:
            await start_n(service, prompt, params, 1, streams, what, **start_kw)
            return await streams[0].collect_beams()
        await start_n(service, prompt, params, n, streams, what, **start_kw)
        return list(await asyncio.gather(*(s.collect(keep_tokens=params.logprobs) for s in streams)))
    finally:
        for s in streams:
            await s.aclose()


def best_n(completions: list[Completion], n: int) -> list[Completion]:
    """The ``n`` of ``best_of`` sequences with the highest log-prob per token, best first: OpenAI's rule for
    completions ``best_of`` ("the one with the highest log probability per token") and TGI's for its own."""

    def per_token(c: Completion) -> float:
        lps = [t.logprob for t in c.tokens if t.logprob is not None]
        return sum(lps) / len(lps) if lps else float("-inf")

    return sorted(completions, key=per_token, reverse=True)[:n]


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def model_name(request: web.Request) -> str:
    return request.app[CONTEXT].model_name


__all__ = [
    "SSE_HEADERS",
    "FieldError",
    "best_n",
    "collect_n",
    "json_object",
    "json_response",
    "open_stream",
    "open_streams",
    "param_of",
    "pump",
    "pump_all",
    "sse",
    "start_n",
    "validate_body",
    "word_list",
]


def errors_as(render: Callable[[LmiHttpError], web.StreamResponse]):
    """Decorate a handler so the request core's errors come back in the adapter's own shape."""
    import functools

    def wrap(handler: Callable[[web.Request], Any]):
        @functools.wraps(handler)
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except LmiHttpError as e:
                return render(e)

        return wrapped

    return wrap
