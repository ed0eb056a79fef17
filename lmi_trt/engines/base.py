"""The one engine protocol every backend implements (torch, trtllm, synthetic).

Engines speak token ids only. Tokenization, incremental detokenization, stop strings and
wire formats live in ``lmi_trt.serving``; an engine receives a ``GenerationRequest`` and
yields ``EngineOutput`` deltas until one has ``finished=True``.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Hashable
from dataclasses import dataclass, field, fields
from typing import Literal, Protocol, runtime_checkable

from lmi_trt.errors import LmiError

# Alternatives per generated token a request may ask for (OpenAI chat top_logprobs' bound).
MAX_TOP_LOGPROBS = 20


class FinishReason(str, enum.Enum):
    """Why a sequence ended. Values are the LMI/TGI wire names."""

    LENGTH = "length"
    EOS = "eos_token"
    STOP_SEQUENCE = "stop_sequence"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class GuidedDecoding:
    """Output constrained to a grammar: ``json_schema`` (``value``: the schema as JSON text),
    ``json_object`` (any JSON object; ``value`` empty), ``regex``, or ``grammar`` (EBNF, GBNF style).
    ``after``: the constraint starts after the first ``after`` in the output, and any text comes before it
    (a reasoning model's thinking, up to its closing tag: ``guided.free_text_until``)."""

    kind: Literal["json_schema", "json_object", "regex", "grammar"]
    value: str = ""
    after: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation settings, already validated by the serving layer.

    ``do_sample=False`` means greedy regardless of temperature/top_k/top_p (DJL semantics).
    """

    max_new_tokens: int = 30
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_new_tokens: int = 0
    # Beam search (beam_width > 1): the ``num_return_sequences`` best beams come back in the final output's
    # ``beams``; ``length_penalty`` and ``early_stopping`` as transformers' generate reads them (its defaults).
    beam_width: int = 1
    num_return_sequences: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False
    logprobs: bool = False
    # The ``top_logprobs`` most likely tokens of each step with their log-probs (0: none). Like
    # ``logprobs`` they are of the model's raw distribution (before penalties and warping).
    top_logprobs: int = 0
    # The log-prob of each prompt token given the ones before it (TGI decoder_input_details).
    prompt_logprobs: bool = False
    ignore_eos: bool = False
    guided: GuidedDecoding | None = None
    # (token id, value) pairs added to the logits before sampling (OpenAI logit_bias); not to log-probs.
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Token-id sequences; the engine stops on / never emits them where it can. Stop *strings*
    # are still enforced on text by the serving layer, since tokenization is context dependent.
    stop_token_ids: list[list[int]] = field(default_factory=list)
    bad_words_ids: list[list[int]] = field(default_factory=list)
    streaming: bool = True
    # The LoRA adapter to generate with, by its registered name (None: the base model).
    adapter: str | None = None


@dataclass(frozen=True)
class Beam:
    """One finished beam of a beam-search request: its generated tokens, and its score where the engine knows it
    (the sum of its tokens' log-probs divided by its length ** length_penalty, as transformers scores beams)."""

    token_ids: list[int]
    finish_reason: FinishReason
    score: float | None = None


@dataclass
class EngineOutput:
    """A delta: the tokens generated since the previous output of the same request. Its numbers are Python's own
    (``int``, ``float``, ``bool``; a tensor's ``tolist()``/``item()``), never numpy's or torch's scalars: the engine
    link writes outputs with marshal, which writes any object with a buffer (a numpy scalar, a numpy float64 too)
    as its bytes, without an error (CPython Python/marshal.c, w_complex_object), and checking every token there
    would cost the link more than marshal saves."""

    request_id: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    # Per token of ``token_ids``: (token id, log-prob) of the most likely tokens, best first.
    top_logprobs: list[list[tuple[int, float]]] | None = None
    # On the first output of a request that asked for them: one per prompt token, None for the first.
    prompt_logprobs: list[float | None] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    # HTTP-ish code for errors: 400 bad request, 424 model-side failure, 503 overloaded.
    error_code: int | None = None
    # With a 400: the request field at fault, by its SamplingParams name ("guided", "bad_words"); the serving
    # layer answers with the client's own name for it.
    error_field: str | None = None
    # The final output of a beam-search request: its best beams, best first (``token_ids`` holds the first's).
    beams: list[Beam] | None = None
    # Seconds the request waited in the engine's queue for a batch slot: on its first output, from
    # engines that know it (None otherwise).
    queue_time_s: float | None = None


class OutputChannel:
    """One stream's outputs on their way to its one consumer, both on the event loop: ``asyncio.Queue``'s
    ``put_nowait`` and ``get`` without what many consumers or producers need (queues of waiting getters and
    putters, task counting), which the event loop would pay for every token of every stream
    (``benchmarks/loop_host.py``'s ``event_loop`` figure)."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: deque[EngineOutput] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: EngineOutput) -> None:
        self.items.append(item)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():  # done: its consumer was cancelled while it waited
            waiter.set_result(None)

    async def ready(self) -> None:
        """Once an output is waiting."""
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter

    async def get(self) -> EngineOutput:
        await self.ready()
        return self.items.popleft()


@dataclass(frozen=True)
class EngineLimits:
    """The loaded engine's sizes; the serving layer validates requests against them (what it can
    do at all is its ``Capabilities``)."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int | None = None  # prompt + output; None = only max_new_tokens bounds output
    max_new_tokens: int | None = None
    max_beam_width: int = 1


@dataclass(frozen=True)
class Capability:
    """How an engine treats one request feature: honoured (up to ``most`` where the feature is
    counted), or refused because of ``reason``, a sentence that names the engine (or its release)
    and what would work. The 400 that refuses the feature and ``GET /v1/capabilities`` both print it."""

    honoured: bool
    reason: str = ""  # refused: why; honoured: empty, or a note on how (shown by /v1/capabilities)
    most: int | None = None  # a counted feature (alternatives per token): the largest value honoured


def can(most: int | None = None, note: str = "") -> Capability:
    return Capability(True, note, most)


def cannot(reason: str) -> Capability:
    return Capability(False, reason)


@dataclass(frozen=True)
class Capabilities:
    """The request features that differ between engines and releases, one ``Capability`` each: every
    engine declares all of them (a new feature is a new field, which no engine can leave out). The
    request core refuses by this table (``GenerationService.check_features``) and ``GET /v1/capabilities``
    publishes it, so the two cannot disagree. Field metadata ``doc`` says what the feature is."""

    release: str  # what serves it, e.g. "TensorRT-LLM 1.1.0 (pytorch backend)"; "" when nothing to say
    logprobs: Capability = field(metadata={"doc": "the log-prob of each generated token"})
    top_logprobs: Capability = field(metadata={"doc": "the most likely alternatives of each generated token"})
    prompt_logprobs: Capability = field(metadata={"doc": "the log-prob of each prompt token"})
    logit_bias: Capability = field(metadata={"doc": "values added to chosen tokens' logits before sampling"})
    guided: Capability = field(metadata={"doc": "output constrained to a JSON schema, regex or grammar"})
    seed: Capability = field(metadata={"doc": "the seed a sampled request draws its tokens with"})
    repetition_penalty: Capability = field(metadata={"doc": "logits of tokens already seen divided or multiplied"})
    presence_penalty: Capability = field(metadata={"doc": "a penalty on tokens already generated"})
    frequency_penalty: Capability = field(metadata={"doc": "a penalty per occurrence of a generated token"})
    min_new_tokens: Capability = field(metadata={"doc": "the end of sequence held back for this many tokens"})
    bad_words: Capability = field(metadata={"doc": "token sequences never generated"})
    stop_token_ids: Capability = field(metadata={"doc": "stop tokens of a request that ignores the end of sequence"})
    beam_search: Capability = field(
        metadata={"doc": "beam search (with length_penalty and early_stopping); ``most``: the widest beam"}
    )
    min_p: Capability = field(metadata={"doc": "tokens less likely than min_p times the likeliest one left out"})
    lora: Capability = field(metadata={"doc": "a LoRA adapter chosen per request (option.enable_lora)"})

    def features(self) -> dict[str, Capability]:
        """Feature name → its capability, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "release"}

    @staticmethod
    def doc(feature: str) -> str:
        return next(f.metadata["doc"] for f in fields(Capabilities) if f.name == feature)


# The Capabilities a sampler applies or ignores (the samplers of TensorRT-LLM's LLM API differ by release).
SAMPLING_FEATURES = (
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_new_tokens",
    "bad_words",
    "stop_token_ids",
)


@dataclass
class EngineStats:
    active_requests: int = 0
    queued_requests: int = 0
    max_batch_size: int = 0
    total_requests: int = 0
    total_generated_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


# EngineStats.extra keys that add up across model copies: the KV cache's blocks and the counters
# /metrics exports (lmi_trt/serving/metrics.py); the block size is the same in every copy.
ADDITIVE_STATS = (
    "kv_cache_max_blocks",
    "kv_cache_used_blocks",
    "kv_cache_free_blocks",
    "prefix_cache_blocks",
    "num_preemptions",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
)
# Counters with a key per draft position (…_per_pos_0, _1, ...): additive as well.
ACCEPTED_PER_POSITION = "spec_decode_num_accepted_tokens_per_pos_"
SHARED_STATS = ("kv_cache_block_size",)


class EngineError(LmiError, RuntimeError):
    """An engine-side failure a user can act on; ``code`` is the HTTP status to answer with, ``field`` the
    request field at fault (as ``EngineOutput.error_field``).

    Raised by construction and ``start()`` (the server does not start); never out of ``submit()``
    or a request's iterator, where it becomes the request's final output (``error_output``)."""

    def __init__(self, message: str, code: int = 424, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


def error_output(request_id: str, message: str, code: int, field: str | None = None) -> EngineOutput:
    """A request's final output for a failure: ``code`` 400 (the request cannot be served as asked; ``field``
    the part of it at fault where known), 424 (the model failed it), 503 (the engine is not running or is
    shutting down)."""
    return EngineOutput(
        request_id,
        [],
        finished=True,
        finish_reason=FinishReason.ERROR,
        error=message,
        error_code=code,
        error_field=field,
    )


async def refused(request_id: str, error: EngineError) -> AsyncIterator[EngineOutput]:
    """The iterator ``submit()`` returns for a request it refuses up front: one final error output."""
    yield error_output(request_id, str(error), error.code, error.field)


@dataclass(frozen=True)
class AdapterInfo:
    """A registered LoRA adapter: its name, where it came from (as given), the local folder read, its rank."""

    name: str
    src: str
    folder: str
    rank: int


@runtime_checkable
class AdapterHost(Protocol):
    """An engine that serves LoRA adapters (``capabilities.lora`` honoured): registered by name at run time, chosen
    per request by ``GenerationRequest.adapter``. Errors are ``EngineError``s with the HTTP code to answer: 400 an
    adapter it cannot serve, 404 an unknown name, 409 one that requests are using or a full registry."""

    def adapters(self) -> list[AdapterInfo]: ...

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo: ...

    async def unregister_adapter(self, name: str) -> None: ...


# A plain delta, as an ``OutputSink`` takes it without an ``EngineOutput``: (request id, the new token ids, their
# log-probs or None), nothing else set (not an end, no queue time, no top or prompt log-probs).
TokenDelta = tuple[str, list[int], list[float] | None]


class OutputSink(Protocol):
    """Where a ``BatchedEngine`` hands its outputs: one call per engine step with every output of that step (no
    task, iterator or queue per request), as the engine's process does for its front ends (serving/engine_link)."""

    def put(self, outputs: list[EngineOutput]) -> None:
        """A step's outputs (refusals and cancellations too: every request ends with one final output here)."""
        ...

    def put_deltas(self, deltas: list[TokenDelta]) -> None:
        """A step's plain deltas (``TokenDelta``), what nearly every output is: an engine that has them as such saves
        building an ``EngineOutput`` per token (``put`` takes the rest). Outputs keep the order of the calls."""
        ...

    def consumer(self, request_id: str) -> Hashable:
        """Who takes this request's outputs (a front end): its requests are ``backlogged`` together, so an engine
        that paces itself by its consumers asks once per consumer and step, not once per request."""
        ...

    def backlogged(self, consumer: Hashable) -> bool:
        """Whether outputs put for this ``consumer``'s requests still wait for it to take them."""
        ...

    def taken(self) -> Awaitable[None]:
        """Done once a consumer whose outputs waited has them on their way after this call (at once when none
        waits): an engine that paces itself by its consumers (the synthetic engine, unpaced) steps the requests
        whose consumer is not ``backlogged`` and awaits this when every one is."""
        ...


@runtime_checkable
class BatchedEngine(Protocol):
    """An engine that can deliver to an ``OutputSink`` instead of one iterator per request."""

    def attach(self, sink: OutputSink) -> None:
        """The sink of every ``submit_to_sink`` request (one per engine)."""
        ...

    def sinks(self, request: GenerationRequest) -> bool:
        """Whether ``submit_to_sink`` takes ``request``; one that needs ``submit``'s own per-request work (beams,
        prompt log-probs, a grammar compiled off the loop, a draft loop) goes through ``submit``, relayed."""
        ...

    def submit_to_sink(self, request: GenerationRequest) -> None:
        """As ``submit`` (never raises) for a request it ``sinks``, the outputs going to the attached sink."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Lifecycle: construct (cheap) → ``await start()`` (loads weights) → submit … → ``await close()``."""

    name: str

    @property
    def limits(self) -> EngineLimits: ...

    @property
    def capabilities(self) -> Capabilities:
        """The features it honours and refuses (once started: some depend on the release it found)."""
        ...

    @property
    def healthy(self) -> bool:
        """False once the engine has died; /ping turns 503 and the process exits."""
        ...

    async def start(self) -> None: ...

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        """Enqueue and stream deltas. The last output has ``finished=True``.

        The error contract, the same for every engine: ``submit`` never raises and no iterator
        raises. Whatever ends a request badly — refused up front (400), failed by the model (424),
        the engine not running or closing (503) — arrives as that request's final output with
        ``finish_reason=ERROR``, ``error`` and ``error_code`` (``error_output``), and never ends
        another request. Closing the iterator early (client gone) cancels.
        tests/integration/test_engine_contract.py holds every engine to it.
        """
        ...

    async def cancel(self, request_id: str) -> None:
        """Stop a request and free its slot; its iterator ends with ``FinishReason.CANCELLED``."""
        ...

    def stats(self) -> EngineStats: ...

    async def close(self) -> None: ...
