"""Draft tokens on TensorRT-LLM's Executor (``draft_tokens_external`` engines): n-gram (prompt lookup) drafts proposed
on the host and verified by the target engine, one Executor request per iteration, as TensorRT-LLM's own examples
drive it. The plan and its checks are pure; ``draft_loop`` runs one client request over the trtllm engine's
per-request path (``TrtllmEngine.verify_drafts``).

What was read (NVIDIA/TensorRT-LLM; the index keeps crawl copies, not tags, dated here by content):

* the loop: examples/prompt_lookup/run_dtm_pld.py (a 1.x copy, ModelRunnerCpp over the Executor): each iteration
  proposes drafts from the sequence so far (``PLDPool.get_draft_tokens``: the continuation of the last
  1..max_matching_ngram_size tokens' earlier occurrence, the oldest by default, ``is_use_oldest=True``), then runs the
  target on ``prefix`` (prompt + tokens so far) with ``draft_tokens_list`` and ``max_new_tokens =
  prompt_lookup_num_tokens + 1``, non-streaming, and appends what the target returned; it stops at the end id, at the
  length, or when nothing changed. ModelRunnerCpp turns each draft list into ``Request(external_draft_tokens_config=
  ExternalDraftTokensConfig(tokens, logits))`` (tensorrt_llm/runtime/model_runner_cpp.py). Accepted drafts are
  counted as the leading draft tokens equal to the target's (``n_accept_token``). lmi-trt's n-gram proposals
  (``lmi_trt.ngram.NgramIndex``) approximate PLDPool, not match it: with ``is_keep_all`` PLDPool replaces a stored
  continuation shorter than ``prompt_lookup_num_tokens`` by a later full-length one, where NgramIndex keeps the first
  occurrence; PLDPool has no minimum n-gram size; and where no n-gram matches the example sends ``[end_id]`` as the
  one draft, where lmi-trt sends no draft config at all (a plain iteration). Only the drafts differ: every draft is
  verified by the target, so the output does not.
* one step per request: tests/bindings/test_executor_bindings.py ``test_request_perf_metrics_draft`` (a 1.x crawl copy,
  an engine built draft_tokens_external) sends ``ExternalDraftTokensConfig([2, 4, 9, 10])`` with ``max_tokens=5`` to
  the prompt [1, 2, 3, 4] and gets a final result of [2, 4, 2] at iteration 0 ("Only first two tokens will be
  accepted", acceptance rate 0.5): the request ends after its verification step, short of max_tokens. Its finish
  reason was not read; the engine takes a final result without one (NOT_FINISHED) as the step's end, not the
  sequence's (``_to_output``).
* the binding: ``ExternalDraftTokensConfig(tokens, logits=None, acceptance_threshold=None, fast_logits=None)``
  (cpp/tensorrt_llm/pybind/executor/request.cpp and the nanobind copy, 1.x; a 0.x copy whose OutputConfig takes five
  flags binds (tokens, logits, acceptance_threshold) without fast_logits). lmi-trt sends tokens only.
* acceptance: cpp/tensorrt_llm/layers/externalDraftTokensLayer.cpp accepts drafts against the target step's tokens
  and forwards the accepted ones plus the target's own next token; without draft logits the drafts are compared by
  id with the target's choice (kernels/speculativeDecoding/externalDraftTokensKernels.cu: ``isAccepted =
  targetOutputIds[batchSlot] == draftOutputTokenId``), which for a greedy request (top-k 1) is its argmax, so the
  output is the greedy one. The only kernel copy read is a newer main one (it has FSD, ``fsdThreshold``), not a
  1.0-1.2 tag; that the by-id branch is the same in 1.0-1.2 is assumed, not read. A GPU run of
  tests/integration/test_trtllm_ngram_drafts.py's greedy-equality tests against each real release would confirm it.
  trtGptModelInflightBatching.cpp ``verifyRequests`` (every 1.x copy read): "Can't use speculative
  decoding with beam search."; llmRequest.cpp ``LlmRequest::validate`` (1.x copies) fails a request with more drafts
  than the engine's max_draft_len ("Draft tokens length (%d) exceeds maximum draft tokens length (%d)."), so the
  loop never proposes more than the engine's draft length.
* the engine: trtllm-build ``--speculative_decoding_mode draft_tokens_external --max_draft_len K``
  (tensorrt_llm/commands/build.py); builder.py raises the recorded max_seq_len by K and max_num_tokens to
  ``max_batch_size * (K + 1)``; config.json keeps SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL, the integer 2
  (tensorrt_llm/models/modeling_utils.py's IntFlag). Each iteration's input is the prompt plus the tokens so far, up
  to max_seq_len - 1 tokens. What bounds it at run time is not the build's max_input_len: trtGptModel.h (the 0.x copy
  taking TrtGptModelOptionalParams and the 1.x one taking an ExecutorConfig) sets the Executor's maxInputLen to
  maxSequenceLen - 1 with chunked context, to min(maxSequenceLen - 1, maxNumTokens) for an engine with context FMHA
  and packed input (every engine served here: paged context FMHA and remove_input_padding are required), and to the
  build's max_input_len only otherwise; LlmRequest::validate fails a longer prompt ("Prompt length (%d) exceeds
  maximum input length (%d)"). model_runner_cpp.py says as much ("model_config.max_input_len is not the upper bound
  of input length"), and examples/draft_target_model/README.md builds its target with MAX_INPUT_LEN=3200 below
  MAX_SEQ_LEN=4800. So an engine is checked for max_num_tokens or chunked context (``input_limit_error``), not for
  its max_input_len; lmi-trt's compile stage still builds max_input_len = max_seq_len - 1.
* KV-cache block reuse is required, not an optimisation: trtGptModelInflightBatching.cpp's constructor (every copy
  read, from a 2024 one under the TensorRT source licence to the 1.2.0rc2 one) refuses a draft_tokens_external engine
  without it ("KV cache block reuse must be enabled for speculative decoding target model"), and the 1.x copy's
  fixExecutorConfig first turns reuse off, with a warning only, for an engine built without paged context FMHA or one
  that gathers context logits.
  examples/draft_target_model/README.md: "--use_paged_context_fmha=enable must be specified since we need KV-Cache
  reuse", "--kv_cache_enable_block_reuse must be specified". So lmi-trt turns option.enable_kv_cache_reuse on for
  draft tokens when it is unset (``block_reuse``), refuses it explicitly false, refuses such engines
  (``engine_draft_errors``), and its compile stage builds draft_tokens_external engines with paged context FMHA.
* a draft model (``DraftModelProposer``): run_dtm_pld.py builds its draft runner with the same runner settings as the
  target's (``common_runner_kwargs``: kv_cache_enable_block_reuse, enable_chunked_context, the memory fraction), so
  the draft engine gets block reuse where its engine has paged context FMHA and does not gather context logits (1.x
  fixExecutorConfig would turn it off otherwise), and the model's option.enable_chunked_context; its input limit is
  checked as the model's. A draft request that fails fails the client's request, as a draft runner's error ends
  run_dtm_pld.py's loop (it has no fallback), rather than the loop going on without drafts unseen.
* releases: the 0.x binding copy above has ExternalDraftTokensConfig, but which 0.x release's Executor accepted it
  beside a draft_tokens_external engine was not pinned (examples/prompt_lookup and draft_target_model are dated here by
  their ModelRunnerCpp/Executor code to the 1.x line), so 0.12 is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from lmi_trt.engines.base import (
    SAMPLING_FEATURES,
    EngineError,
    EngineOutput,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    error_output,
)
from lmi_trt.ngram import NgramIndex
from lmi_trt.speculative import JSON_KEY, Speculation, SpeculationError

DRAFTS_SINCE = (1, 0)
DRAFT_TOKENS_EXTERNAL = 2  # config.json's SpeculativeDecodingMode integer
# run_dtm_pld.py PLDPool(is_use_oldest=True) and NGramDecodingConfig.is_use_oldest's default (llm_args.py): the
# oldest earlier occurrence's continuation, when the configuration does not say.
OLDEST_BY_DEFAULT = True
# cpp/tensorrt_llm/batch_manager/llmRequest.cpp LlmRequest::validate (1.x copies), run on each request before
# trtGptModelInflightBatching.cpp's verifyRequests would see it
DRAFT_COUNT_CHECK = "llmRequest.cpp validate: 'Draft tokens length (%d) exceeds maximum draft tokens length (%d).'"
REUSE_KEY = "option.enable_kv_cache_reuse"
# cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp, the constructor (module docstring)
REUSE_CHECK = (
    "TensorRT-LLM's Executor refuses a draft_tokens_external engine without KV-cache block reuse "
    "(trtGptModelInflightBatching.cpp: 'KV cache block reuse must be enabled for speculative decoding target model')"
)


@dataclass(frozen=True)
class ExternalDrafts:
    """Drafting for a draft_tokens_external engine, up to ``draft_len`` tokens an iteration: prompt lookup (``ngram``:
    the continuation of the longest n-gram in [``ngram_min``, ``ngram_max``] found earlier in the sequence) or a draft
    model (``draft_model``: its engine folder once the compile stage built it, decoding greedily on a second
    Executor)."""

    draft_len: int
    key: str  # the key that turned it on, for messages
    method: str = "ngram"
    ngram_min: int = 1
    ngram_max: int = 2
    oldest: bool = OLDEST_BY_DEFAULT
    draft_model: str | None = None
    # the draft engine's KvCacheConfig.free_gpu_memory_fraction (option.draft_kv_cache_free_gpu_mem_fraction)
    kv_fraction: float | None = None

    def describe(self) -> str:
        if self.method == "draft_model":
            return (
                f"draft-model draft tokens on a draft_tokens_external engine (up to {self.draft_len} a step, from "
                f"{self.draft_model} decoding greedily on a second Executor)"
            )
        return (
            f"n-gram (prompt lookup) draft tokens on a draft_tokens_external engine (up to {self.draft_len} a step, "
            f"n-grams of {self.ngram_min}-{self.ngram_max} tokens, the {'oldest' if self.oldest else 'latest'} "
            "match)"
        )


class Proposer(Protocol):
    """Where an iteration's drafts come from: up to ``k`` tokens to follow ``tokens`` (the prompt and tokens so
    far); none where it has nothing to say."""

    async def propose(self, tokens: list[int], k: int) -> list[int]: ...


class NgramProposer:
    """Prompt lookup over the growing sequence (``lmi_trt.ngram.NgramIndex``, indexed incrementally)."""

    def __init__(self, drafts: ExternalDrafts) -> None:
        self._index = NgramIndex(drafts.ngram_min, drafts.ngram_max, drafts.oldest)

    async def propose(self, tokens: list[int], k: int) -> list[int]:
        self._index.extend(tokens[len(self._index.tokens) :])
        return self._index.propose(k)


class DraftModelProposer:
    """A draft model's greedy continuation of ``k`` tokens, asked of its own engine (a second Executor over the draft
    engine) as one non-streaming request, as run_dtm_pld.py asks its draft runner (``max_new_tokens=draft_len``,
    ``streaming=False``). A failed draft request raises an ``EngineError`` (module docstring), 424 unless the draft's
    engine said 503 (shutting down)."""

    def __init__(self, submit: Callable[[GenerationRequest], AsyncIterator[EngineOutput]], request_id: str) -> None:
        self._submit, self._id, self._n = submit, request_id, 0

    async def propose(self, tokens: list[int], k: int) -> list[int]:
        self._n += 1
        request = GenerationRequest(
            f"{self._id}#draft{self._n}", list(tokens), SamplingParams(max_new_tokens=k), streaming=False
        )
        out: list[int] = []
        async with aclosing(self._submit(request)) as outputs:
            async for delta in outputs:
                if delta.error is not None:
                    code = 503 if delta.error_code == 503 else 424
                    raise EngineError(f"the draft model's request failed: {delta.error}", code)
                out += delta.token_ids
        return out[:k]


def executor_drafts(spec: Speculation | None, max_beam_width: int) -> ExternalDrafts | None:
    """Pure: the n-gram or draft-model drafting ``spec`` asks of the Executor, or None (another method, or none); what
    it cannot run beside is refused, naming the key."""
    if spec is None or spec.method not in ("ngram", "draft_model"):
        return None
    if spec.max_concurrency is not None:
        raise SpeculationError(
            spec.key("max_concurrency"),
            spec.max_concurrency,
            "is the pytorch backend's (TensorRT-LLM's DecodingBaseConfig.max_concurrency); lmi-trt's Executor loop "
            "drafts for every greedy request",
            "leave it out",
        )
    for member, value in spec.options.items():
        raise SpeculationError(
            f"{JSON_KEY}.{member}",
            value,
            "is not something n-gram drafting on TensorRT engines reads",
            "use max_draft_len, max_matching_ngram_size (prompt_lookup_max), prompt_lookup_min, is_use_oldest and "
            "speculative_model",
        )
    if max_beam_width != 1:
        raise SpeculationError(
            "option.max_beam_width",
            max_beam_width,
            "draft tokens run one beam (trtGptModelInflightBatching.cpp: \"Can't use speculative decoding with beam "
            'search.")',
            "set option.max_beam_width=1, or leave speculative decoding out",
        )
    if spec.method == "draft_model":
        return ExternalDrafts(spec.max_draft_len, spec.key("method"), "draft_model", draft_model=spec.draft_model)
    return ExternalDrafts(
        draft_len=spec.max_draft_len,
        key=spec.key("method"),
        ngram_min=spec.min_matching_ngram_size,
        ngram_max=spec.max_matching_ngram_size,
        oldest=OLDEST_BY_DEFAULT if spec.use_oldest is None else spec.use_oldest,
    )


def block_reuse(drafts: ExternalDrafts | None, given: bool, value: bool) -> bool:
    """Pure: option.enable_kv_cache_reuse's value for the Executor: on for draft tokens when it is unset (the Executor
    requires it: module docstring), refused when it is explicitly false; as set otherwise."""
    if drafts is None:
        return value
    if given and not value:
        raise SpeculationError(
            REUSE_KEY,
            False,
            f"{drafts.key}={drafts.method} needs it: {REUSE_CHECK}",
            "set option.enable_kv_cache_reuse=true, or leave it out (lmi-trt turns it on for draft tokens)",
        )
    return True


DRAFT_FRACTION_KEY = "option.draft_kv_cache_free_gpu_mem_fraction"


def with_draft_memory(drafts: ExternalDrafts | None, fraction: float | None) -> ExternalDrafts | None:
    """Pure: ``drafts`` with the draft engine's KV-cache share of free GPU memory (option.draft_kv_cache_free_gpu_mem
    _fraction), required with a draft model and refused without one. Two models share the GPU:
    examples/draft_target_model/README.md (NVIDIA/TensorRT-LLM, a copy of the 0.18-or-later line): "
    --kv_cache_free_gpu_memory_fraction should be specified if we want to place two models on one GPU, or one of the
    models would use out of the GPU memory". Each Executor sizes its KV cache as a fraction of the GPU memory free
    after its own weights load (KvCacheConfig.free_gpu_memory_fraction), so lmi-trt starts the draft's first, with
    this share, and the model's then takes option.kv_cache_free_gpu_mem_fraction of what is left; what the draft may
    take depends on the model's weights, so there is no default."""
    if drafts is None or drafts.method != "draft_model":
        if fraction is not None:
            raise SpeculationError(
                DRAFT_FRACTION_KEY,
                fraction,
                "is the draft model engine's share of GPU memory, and no draft model is served",
                "leave it out, or set option.speculative_draft_model",
            )
        return drafts
    if fraction is None:
        raise SpeculationError(
            DRAFT_FRACTION_KEY,
            None,
            f"{drafts.key}=draft_model puts two engines on the GPU, and the draft's Executor starts first: this is "
            "its KV cache's share of the free GPU memory, which must leave room for the model's weights and its "
            "KV cache (option.kv_cache_free_gpu_mem_fraction of what is left); TensorRT-LLM's "
            "examples/draft_target_model/README.md asks for each model's fraction in this case",
            "set it, e.g. option.draft_kv_cache_free_gpu_mem_fraction=0.1 for a draft much smaller than the model",
        )
    return dataclasses.replace(drafts, kv_fraction=fraction)


def input_limit_error(who: str, need: int, max_num_tokens: int | None, chunked_context: bool) -> str | None:
    """Pure: why an engine with context FMHA and packed input cannot take inputs of ``need`` tokens, or None.
    cpp/tensorrt_llm/batch_manager/trtGptModel.h (NVIDIA/TensorRT-LLM, 0.x and 1.x copies): without chunked context
    "maxInputLen = min(maxSequenceLen - 1, maxNumTokens)", and LlmRequest::validate throws "Prompt length (%d)
    exceeds maximum input length (%d)" above it."""
    if chunked_context or max_num_tokens is None or max_num_tokens >= need:
        return None
    return (
        f"{who}: the engine's max_num_tokens={max_num_tokens} is below {need}, the longest input a draft iteration "
        "sends (the prompt plus the tokens so far, up to max_seq_len - 1), and without chunked context TensorRT-LLM "
        f"caps the input at max_num_tokens; set option.enable_chunked_context=true, or rebuild with max_num_tokens ≥ "
        f"{need}"
    )


def engine_draft_errors(
    drafts: ExternalDrafts,
    built_mode: int | None,
    built_draft_len: int,
    max_seq_len: int,
    reuse: bool,
    context_logits: bool,
    max_num_tokens: int | None = None,
    chunked_context: bool = False,
) -> list[str]:
    """Pure: why an engine (config.json's build_config) cannot serve ``drafts`` with block reuse ``reuse``
    (option.enable_kv_cache_reuse; paged context FMHA, which reuse needs, is checked beside it in
    ``trtllm.check_settings``)."""
    if built_mode != DRAFT_TOKENS_EXTERNAL:
        return [
            f"{drafts.key}={drafts.method} needs an engine built with --speculative_decoding_mode "
            "draft_tokens_external, and "
            f"config.json's build_config.speculative_decoding_mode is {built_mode or 1} (2 is draft_tokens_external); "
            "rebuild it (lmi-trt's compile stage does, from the Hugging Face checkpoint)"
        ]
    errors = []
    if not reuse:
        errors.append(f"{REUSE_KEY}=false beside {drafts.key}={drafts.method}: {REUSE_CHECK}; set it to true")
    if context_logits:
        errors.append(
            f"{drafts.key}={drafts.method}: the engine's build_config.gather_context_logits is true, and TensorRT-LLM "
            "1.x turns KV-cache block reuse off for it (fixExecutorConfig: 'Context logits cannot be returned for "
            f"reused tokens'), then {REUSE_CHECK}; rebuild it without --gather_context_logits"
        )
    too_long = input_limit_error(f"{drafts.key}={drafts.method}", max_seq_len - 1, max_num_tokens, chunked_context)
    if too_long is not None:
        errors.append(too_long)
    if built_draft_len < drafts.draft_len:
        errors.append(
            f"{drafts.key}={drafts.method}: the engine was built with build_config.max_draft_len={built_draft_len} and "
            f"{drafts.draft_len} draft tokens a step were asked for ({DRAFT_COUNT_CHECK}); lower max_draft_len to "
            f"{built_draft_len} or rebuild"
        )
    # no check of the build's max_input_len: it does not bound the input at run time (module docstring)
    return errors


def release_error(drafts: ExternalDrafts | None, version: str, series: tuple[int, int]) -> str | None:
    if drafts is None or series >= DRAFTS_SINCE:
        return None
    return (
        f"{drafts.key}={drafts.method}: draft tokens on TensorRT-LLM {version}'s Executor are not verified here "
        "(module lmi_trt.engines.trtllm_drafts: its examples are read on the 1.x line only); use a 1.x image, or "
        "leave speculative decoding out"
    )


def draft_refusals() -> dict[str, str]:
    """Pure: request feature → why, for what the draft loop does not do (or lmi-trt has not read) beside drafts."""
    unread = (
        "not read beside draft tokens on TensorRT-LLM's Executor (each iteration is a new request, and how the "
        "decoder applies it across them was not read), so lmi-trt refuses it rather than assume; leave it out, or "
        "serve without speculation"
    )
    greedy = (
        "draft tokens are accepted by id against the target's choice (externalDraftTokensLayer.cpp without draft "
        "logits), which lmi-trt verifies for greedy requests only; send a greedy request (temperature 0), or serve "
        "without speculation"
    )
    return {
        # stop tokens are looked for on the host as well (stop_at), so they stay honoured
        **dict.fromkeys(
            ("guided", "logit_bias", "lora", *(f for f in SAMPLING_FEATURES if f != "stop_token_ids")), unread
        ),
        "sampling": greedy,
        "seed": greedy,
        "logprobs": "the draft loop does not return log-probs (not read beside draft tokens); leave them out, or serve "
        "without speculation",
        "beam_search": 'draft tokens run one beam ("Can\'t use speculative decoding with beam search."); ask for 1 '
        "beam",
    }


def drafted_request_refusal(request: GenerationRequest) -> tuple[str | None, str | None]:
    """Pure: (field, why) for a request the draft loop refuses at the engine (what the serving layer's capability
    check does not see), or (None, None)."""
    if request.sampling.do_sample:
        return "temperature", draft_refusals()["sampling"]
    return None, None


def stop_at(
    tokens: list[int], start: int, eos: frozenset[int], stops: list[list[int]]
) -> tuple[int, FinishReason] | None:
    """Pure: where the generated ``tokens`` end, looking at positions from ``start`` on (earlier ones were looked at
    already): (tokens kept, why) at the first EOS id (dropped, as the Executor drops its end id) or completed stop
    sequence (kept, as without drafts), or None. The loop applies this on the host: DecodingMode::ExternalDraftTokens()
    is kExternalDraftTokens | kUsePenalties | kUseBanTokens | kStandardStopCriteria (cpp/include/tensorrt_llm/executor/
    types.h, 1.x copies), and whether its stop criteria see a stop token inside the accepted drafts, or a stop
    sequence begun in the previous iteration's request, was not read."""
    for end in range(start + 1, len(tokens) + 1):
        if tokens[end - 1] in eos:
            return end - 1, FinishReason.EOS
        if any(stop and end >= len(stop) and tokens[end - len(stop) : end] == stop for stop in stops):
            return end, FinishReason.STOP_SEQUENCE
    return None


class DraftVerifier(Protocol):
    """The engine side of the loop: one Executor request over ``request`` carrying ``drafts`` (none: plain)."""

    def verify_drafts(self, request: GenerationRequest, drafts: list[int]) -> AsyncIterator[EngineOutput]: ...


def accepted_drafts(drafts: list[int], tokens: list[int]) -> int:
    """The leading draft tokens the target kept: equal to its tokens at the same positions (run_dtm_pld.py's
    ``n_accept_token``)."""
    n = 0
    while n < min(len(drafts), len(tokens)) and drafts[n] == tokens[n]:
        n += 1
    return n


async def draft_loop(
    engine: DraftVerifier,
    request: GenerationRequest,
    drafts: ExternalDrafts,
    proposer: Proposer,
    max_seq_len: int,
    count: Callable[[int, int], Any],
    eos: frozenset[int],
    cancelled: Callable[[], bool],
) -> AsyncIterator[EngineOutput]:
    """One client request as draft iterations (module docstring): each proposes up to ``draft_len`` tokens from the
    sequence so far, asks the engine for ``drafts + 1`` tokens verified against them, and streams what came back.
    EOS, stop words, errors (the draft model's too) and cancellation end it as they end the iteration's
    request; ``max_new_tokens`` and the
    engine's ``max_seq_len`` as without drafts; EOS ids (``eos``: none for ignore_eos) and stop sequences are also
    looked for on the host (``stop_at``). ``count(proposed, accepted)`` records each iteration; ``cancelled()`` says
    the request was cancelled between iterations (one in flight ends with its Executor request's CANCELLED)."""
    sampling = request.sampling
    sequence = list(request.prompt_token_ids)
    generated: list[int] = []
    stops = [list(s) for s in request.stop_token_ids if s]
    while True:
        if cancelled():
            yield EngineOutput(request.request_id, [], finished=True, finish_reason=FinishReason.CANCELLED)
            return
        room = min(sampling.max_new_tokens - len(generated), max_seq_len - len(sequence))
        # at most room - 1 drafts: the target's own token after them must fit too
        try:
            proposal = await proposer.propose(sequence, min(drafts.draft_len, room - 1)) if room > 1 else []
        except EngineError as failed:
            yield error_output(request.request_id, str(failed), failed.code)
            return
        step = dataclasses.replace(
            request,
            prompt_token_ids=list(sequence),
            sampling=dataclasses.replace(
                sampling, max_new_tokens=min(len(proposal) + 1 if proposal else drafts.draft_len + 1, room)
            ),
            streaming=False,
        )
        tokens: list[int] = []
        last: EngineOutput | None = None
        # aclosing: a client gone mid-iteration cancels the iteration's Executor request (the engine's finally)
        async with aclosing(engine.verify_drafts(step, proposal)) as outputs:
            async for out in outputs:
                if out.error is not None:
                    yield out
                    return
                tokens += out.token_ids
                last = out
        if last is None:  # the engine ended the iteration without a final output: nothing more to say
            return
        if proposal:
            count(len(proposal), accepted_drafts(proposal, tokens))
        before = len(generated)
        generated += tokens
        stopped = stop_at(generated, before, frozenset() if sampling.ignore_eos else eos, stops)
        if stopped is not None:
            kept, reason = stopped
            yield EngineOutput(request.request_id, generated[before:kept], finished=True, finish_reason=reason)
            return
        sequence += tokens
        ended = last.finish_reason not in (None, FinishReason.LENGTH)
        if ended or len(generated) >= sampling.max_new_tokens or len(sequence) >= max_seq_len or not tokens:
            reason = last.finish_reason if ended else FinishReason.LENGTH
            yield EngineOutput(request.request_id, tokens, finished=True, finish_reason=reason)
            return
        yield EngineOutput(request.request_id, tokens)
