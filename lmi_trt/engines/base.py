"""The one engine protocol every backend implements (torch, trtllm, synthetic).

Engines speak token ids only. Tokenization, incremental detokenization, stop strings and
wire formats live in ``lmi_trt.serving``; an engine receives a ``GenerationRequest`` and
yields ``EngineOutput`` deltas until one has ``finished=True``.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
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
    ``json_object`` (any JSON object; ``value`` empty), ``regex``, or ``grammar`` (EBNF, GBNF style)."""

    kind: Literal["json_schema", "json_object", "regex", "grammar"]
    value: str = ""


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
    beam_width: int = 1
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


@dataclass
class EngineOutput:
    """A delta: the tokens generated since the previous output of the same request."""

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
    # Seconds the request waited in the engine's queue for a batch slot: on its first output, from
    # engines that know it (None otherwise).
    queue_time_s: float | None = None


@dataclass(frozen=True)
class EngineLimits:
    """What the loaded engine can honour; the serving layer validates requests against it."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int | None = None  # prompt + output; None = only max_new_tokens bounds output
    max_new_tokens: int | None = None
    max_beam_width: int = 1
    supports_logprobs: bool = False
    max_top_logprobs: int = 0  # the most alternatives per token it reports (0: none)
    supports_prompt_logprobs: bool = False
    supports_guided_decoding: bool = False
    supports_logit_bias: bool = False
    # (feature, why): features (``features_used``) this engine refuses however it is built, the reason naming
    # what refuses it (TensorRT-LLM's release and sampler, on the LLM API: lmi_trt/engines/llmapi_releases.py).
    refused: tuple[tuple[str, str], ...] = ()


def features_used(sampling: SamplingParams, *, bad_words: bool, stop_token_ids: bool) -> frozenset[str]:
    """Pure: the request features an engine may refuse, named as ``GenerateParams``' fields (the serving layer
    maps them to each protocol's names): the ones a request sets to something other than their no-op value."""
    s = sampling
    used = {
        "sampling": s.do_sample,
        "seed": s.do_sample and s.seed is not None,
        "repetition_penalty": s.repetition_penalty != 1.0,
        "presence_penalty": s.presence_penalty != 0.0,
        "frequency_penalty": s.frequency_penalty != 0.0,
        "min_new_tokens": s.min_new_tokens > 0,
        "bad_words": bad_words,
        # an explicit stop token while EOS is ignored (some releases drop every stop word then)
        "stop_token_ids": stop_token_ids and s.ignore_eos,
        "logprobs": s.logprobs,
        "top_logprobs": s.top_logprobs > 0,
        "prompt_logprobs": s.prompt_logprobs,
        "logit_bias": bool(s.logit_bias),
        "guided": s.guided is not None,
        "beam_width": s.beam_width > 1,
    }
    return frozenset(name for name, on in used.items() if on)


def refusal(refused: Iterable[tuple[str, str]], used: frozenset[str]) -> tuple[str, str] | None:
    """Pure: the first (feature, why) of ``refused`` (``EngineLimits.refused``) that a request using ``used`` asks
    for; a feature
    ``a+b`` is the two together, reported as the last (``beam_width+logprobs``: logprobs, with beam search)."""
    for name, why in refused:
        parts = name.split("+")
        if all(part in used for part in parts):
            return parts[-1], why if len(parts) == 1 else f"with {' and '.join(parts[:-1])}: {why}"
    return None


@dataclass
class EngineStats:
    active_requests: int = 0
    queued_requests: int = 0
    max_batch_size: int = 0
    total_requests: int = 0
    total_generated_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class EngineError(LmiError, RuntimeError):
    """An engine-side failure a user can act on; ``code`` is the HTTP status to answer with.

    Raised by construction and ``start()`` (the server does not start); never out of ``submit()``
    or a request's iterator, where it becomes the request's final output (``error_output``)."""

    def __init__(self, message: str, code: int = 424) -> None:
        super().__init__(message)
        self.code = code


def error_output(request_id: str, message: str, code: int) -> EngineOutput:
    """A request's final output for a failure: ``code`` 400 (the request cannot be served as asked),
    424 (the model failed it), 503 (the engine is not running or is shutting down)."""
    return EngineOutput(request_id, [], finished=True, finish_reason=FinishReason.ERROR, error=message, error_code=code)


async def refused(request_id: str, error: EngineError) -> AsyncIterator[EngineOutput]:
    """The iterator ``submit()`` returns for a request it refuses up front: one final error output."""
    yield error_output(request_id, str(error), error.code)


@runtime_checkable
class Engine(Protocol):
    """Lifecycle: construct (cheap) → ``await start()`` (loads weights) → submit … → ``await close()``."""

    name: str

    @property
    def limits(self) -> EngineLimits: ...

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
