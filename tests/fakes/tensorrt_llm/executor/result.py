"""Fake ``tensorrt_llm.executor.result`` (real file: tensorrt_llm/executor/result.py, read @005bc848).

What is kept from the real ``GenerationResultBase``/``GenerationResult``:
* ``CompletionOutput.token_ids`` and ``logprobs`` are cumulative; ``token_ids_diff``/``logprobs_diff`` are
  what the last applied response added (``_last_token_ids_len``/``_last_logprobs_len`` are moved before
  each response is applied);
* the async iterator applies one queued response per ``__anext__`` and returns the same object, so a
  consumer that falls behind still sees every step; ``StopAsyncIteration`` once the final one was applied;
* finish reasons (``_handle_sequence``): END_ID and STOP_WORDS → 'stop' (``stop_reason`` is the stop string
  or token id; the stop tokens are cut unless ``include_stop_str_in_output``), LENGTH → 'length',
  CANCELLED → 'cancelled';
* an error response raises ``RequestError`` out of that request's iteration only (the executor's
  background error handler turns an error message into ``RequestError``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from tensorrt_llm.executor.utils import RequestError


@dataclass(slots=True)
class Logprob:
    """Holds logprob and vocab rank for a token."""

    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] | None = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list | None = field(default_factory=list)
    prompt_logprobs: list | None = field(default_factory=list)
    finish_reason: Literal["stop", "length", "timeout", "cancelled"] | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    disaggregated_params: Any = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list:
        return self.logprobs[self._last_logprobs_len :]


@dataclass
class _Response:
    """What the fake runtime sends for one request and step (private; the real one is a bindings Response)."""

    beams: list[list[int]]  # new tokens per sequence (beam search: all tokens of each beam)
    logprobs: list[dict] | None  # new per-token dicts (sequence 0)
    cum_logprob: float | None
    # "END_ID", "STOP_WORDS", "LENGTH", "CANCELLED" or None; a beam search's final one: one per beam (the real
    # _handle_sequence reads finish_reasons[beam] for each beam's CompletionOutput)
    finish_reason: str | list[str] | None
    is_final: bool
    error: str | None = None
    prompt_logprobs: list[dict] | None = None  # on the first response of a request that asked for them


class GenerationResult:
    """Awaitable, async-iterable result of one request (the fake keeps only the async paths)."""

    def __init__(self, request_id: int, sampling_params, streaming: bool, executor) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise AssertionError("The asyncio event loop was not present during initialization") from None
        self.id = request_id
        self.sampling_params = sampling_params
        self._streaming = streaming
        self._executor = executor
        self._done = False
        self._aborted = False
        self._queue: asyncio.Queue[_Response] = asyncio.Queue()
        self._outputs = [CompletionOutput(i) for i in range(sampling_params.best_of)]

    # called from the runtime thread
    def _enqueue(self, response: _Response) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, response)

    @property
    def request_id(self) -> int:
        return self.id

    @property
    def finished(self) -> bool:
        return self._done

    @property
    def outputs(self) -> list[CompletionOutput]:
        sp = self.sampling_params
        if sp.use_beam_search or sp.n == sp.best_of:
            return self._outputs[: sp.n]
        ranked = sorted(self._outputs, key=lambda o: o.cumulative_logprob or float("-inf"), reverse=True)
        return ranked[: sp.n]

    def abort(self) -> None:
        self._executor.abort_request(self.id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def _handle_response(self, response: _Response) -> None:
        if response.error is not None:
            raise RequestError(response.error)
        self._done = response.is_final
        sp = self.sampling_params
        for index, tokens in enumerate(response.beams):
            out = self._outputs[index]
            out._last_token_ids_len = len(out.token_ids)
            if sp.use_beam_search:
                out.token_ids = list(tokens)
            else:
                out.token_ids.extend(tokens)
            if response.cum_logprob is not None:
                out.cumulative_logprob = response.cum_logprob
            if response.prompt_logprobs is not None and index == 0:
                out.prompt_logprobs = response.prompt_logprobs  # and kept on every later step, as the real one
            if response.logprobs is not None and index == 0:
                out._last_logprobs_len = len(out.logprobs)
                out.logprobs = out.logprobs + response.logprobs
            if response.finish_reason == "CANCELLED":
                out.finish_reason = "cancelled"
            if not self._done:
                continue
            reason = response.finish_reason
            reason = reason[index] if isinstance(reason, list) else reason
            if reason == "END_ID":
                out.finish_reason = "stop"
            elif reason == "STOP_WORDS":
                out.finish_reason = "stop"
                for reason, ids in sp._get_stop_reasons_and_words():
                    if out.token_ids[-len(ids) :] == ids:
                        out.stop_reason = reason
                        if not sp.include_stop_str_in_output:
                            out.token_ids = out.token_ids[: -len(ids)]
                        break
            elif reason == "LENGTH":
                out.finish_reason = "length"

    async def aresult(self) -> GenerationResult:
        while not self._done:
            self._handle_response(await self._queue.get())
        return self

    def __await__(self):
        return self.aresult().__await__()

    def __aiter__(self) -> GenerationResult:
        return self

    async def __anext__(self) -> GenerationResult:
        if self._done:
            raise StopAsyncIteration
        self._handle_response(await self._queue.get())
        return self


class IterationResult:
    """Async iterable of iteration stats (dicts); it stops after ``timeout`` seconds without a new one, and then
    stays done (ends at once) until ``mark_undone``: the executor calls it on every submitted request (result.py
    ``IterationResult.__anext__``: ``if self._done: raise StopAsyncIteration``, a timeout sets ``_done``;
    executor.py ``_maybe_initialize_iteration_results``)."""

    def __init__(self, source, timeout: float | None) -> None:
        self._source = source  # a callable returning the next stats JSON string, or None
        self._timeout = 2.0 if timeout is None else timeout
        self._done = False

    def set_timeout(self, timeout: float | None) -> None:
        self._timeout = 2.0 if timeout is None else timeout

    def mark_undone(self) -> None:
        self._done = False

    def __aiter__(self) -> IterationResult:
        return self

    async def __anext__(self) -> dict:
        if self._done:
            raise StopAsyncIteration
        deadline = asyncio.get_running_loop().time() + self._timeout
        while True:
            item = self._source()
            if item is not None:
                return json.loads(item)
            if asyncio.get_running_loop().time() >= deadline:
                self._done = True
                raise StopAsyncIteration
            await asyncio.sleep(0.01)
