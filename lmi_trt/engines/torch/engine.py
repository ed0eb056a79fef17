"""The embedded ``torch`` engine: transformers models served with the engine protocol.

The engine loads the model and picks a backend: the built-in decode loop (``decode_loop.py``) for
Llama-shaped models unless ``option.torch_decode_loop`` says otherwise, else one of two transformers
batching paths, which share one sampler (``sampler.py``) and one delivery mechanism (the engine's):

* **continuous** (``continuous.py``) — transformers' continuous batching manager (paged KV cache,
  requests join and leave between steps). Its built-in per-request processors only cover temperature/top_k/top_p,
  see only the last token of each row, and share one RNG and one ``do_sample`` flag across the
  batch. So the engine installs its own hook in the manager's logits-processor slot: the hook
  receives every step's logits rows (one per request that gets a token), runs the engine's
  sampler with the request's full history, seed and settings, and hands back a one-hot score row
  so that the manager's greedy pick is exactly the token chosen here. Every ``SamplingParams``
  field is therefore honoured per request inside CB; nothing is routed elsewhere.
  CUDA graphs, torch.compile and async double-buffering are turned off because the hook is
  Python running between prepare and update of the same step.
* **static** (``static.py``) — for models whose ``_supports_attention_backend`` is False (they error or silently
  produce wrong tokens under CB: Falcon, and GPT-J before transformers gave it the attention
  interface), when the installed transformers lacks the CB API or
  its manager cannot be set up (logged), or when ``batching="static"`` is asked for:
  a left-padded batch decoded step by step with ``past_key_values``. Requests that arrive while
  a batch runs wait for the next one; finished or cancelled rows are dropped from the batch (and
  its KV cache) between steps.

Threads: the engine thread (the CB manager's, the static loop or the built-in decode loop) samples
and hands deltas over with at most one ``loop.call_soon_threadsafe`` per step (none while the
loop has not yet pushed the previous ones: they join them); all per-request bookkeeping visible to callers lives
on the event loop that ran ``start()``. Use the engine from that loop only.

Log-probabilities are the log-softmax of the raw model logits at the chosen token, before
penalties, masks, temperature or top-k/top-p (vLLM's default ``raw_logprobs`` mode).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from ...compat import dtype_kwargs, text_config
from ...speculative import Speculation, SpeculationError
from ..adapters import AdapterTable, LoraAdapter, read_adapter
from ..base import (
    MAX_TOP_LOGPROBS,
    SAMPLING_FEATURES,
    AdapterInfo,
    Capabilities,
    Capability,
    EngineError,
    EngineLimits,
    EngineOutput,
    EngineStats,
    FinishReason,
    GenerationRequest,
    OutputChannel,
    OutputSink,
    SamplingParams,
    TokenDelta,
    can,
    cannot,
    error_output,
    refused,
)
from ..guided import Grammars, Guide
from ..registry import TORCH
from .backend import Backend, Slot, finish_reason
from .continuous import CB_IMPORT_ERROR, ContinuousBackend
from .decode_loop import DecodeLoopBackend, choose_decode_loop
from .llama_decoder import unsupported_reason
from .sampler import Pick, sample_next_tokens
from .static import StaticBackend

# Constrained decoding needs xgrammar, a dependency of lmi-trt; a Python without it (an install with --no-deps, an
# image that removed it) answers such requests with a 400 that says how to install it, and start() logs it.
_HAS_XGRAMMAR = importlib.util.find_spec("xgrammar") is not None
XGRAMMAR_MISSING = 'xgrammar is not installed here: pip install "xgrammar>=0.1.21" and restart the server'

log = logging.getLogger(__name__)

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
_BATCHING = ("auto", "continuous", "static")
# One from_pretrained at a time per process: transformers (5.x, src/transformers/initialization.py
# no_tie_weights / no_init_weights) patches PreTrainedModel.tie_weights and torch's init functions
# for the duration of a load and restores what it saved, so two overlapping loads (model copies
# starting together) can leave them patched for good: tied lm_heads of every later load are then
# left uninitialized (GPT-2, Falcon: garbage or NaN logits).
_LOAD_LOCK = threading.Lock()


# ----------------------------------------------------------------------------------------------
# Pure helpers
# ----------------------------------------------------------------------------------------------


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype | str:
    """``auto`` keeps the checkpoint dtype on accelerators; on CPU half precision is slow, so fp32."""
    if dtype == "auto":
        return "auto" if device.type != "cpu" else torch.float32
    if dtype not in _DTYPES:
        raise EngineError(f"dtype={dtype!r} is not one of auto, {', '.join(_DTYPES)}", code=400)
    return _DTYPES[dtype]


def as_id_list(value: int | Sequence[int] | None) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def check_sampling(params: SamplingParams, max_new_tokens: int) -> None:
    """Reject what the engine cannot honour, naming the parameter (HTTP 400)."""
    problems = []
    if not 1 <= params.max_new_tokens <= max_new_tokens:
        problems.append(f"max_new_tokens={params.max_new_tokens} must be in [1, {max_new_tokens}]")
    if params.do_sample and not params.temperature > 0:
        problems.append(f"temperature={params.temperature} must be > 0 when do_sample is true")
    if params.top_k < 0:
        problems.append(f"top_k={params.top_k} must be >= 0")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p={params.top_p} must be in (0, 1]")
    if not params.repetition_penalty > 0:
        problems.append(f"repetition_penalty={params.repetition_penalty} must be > 0")
    if params.min_new_tokens < 0:
        problems.append(f"min_new_tokens={params.min_new_tokens} must be >= 0")
    if problems:
        raise EngineError("; ".join(problems), code=400)


def check_beams(request: GenerationRequest, capability: Capability) -> None:
    """A beam-search request this engine cannot run: a 400 naming the field (beams are scored by the model's
    log-probs alone, as transformers' generate(do_sample=False) scores them; serving.core refuses the rest)."""
    width = request.sampling.beam_width
    if not capability.honoured:
        raise EngineError(f"beam_width={width}: {capability.reason}", code=400, field="beam_search")
    if capability.most is not None and width > capability.most:
        raise EngineError(
            f"beam_width={width}: each beam takes a batch slot, and this engine has {capability.most} "
            "(option.max_rolling_batch_size)",
            code=400,
            field="beam_search",
        )
    if request.streaming:
        raise EngineError(
            f"beam_width={width}: beam search is not streamed: its beams rewrite earlier tokens", code=400
        )
    if request.stop_token_ids:
        raise EngineError(
            "stop_token_ids cannot be combined with beam search on the torch engine (transformers' beam search "
            "ends beams on the EOS ids only); leave them out",
            code=400,
            field="stop_token_ids",
        )
    if request.adapter is not None:  # a beam step runs the base model's layers (decode_loop._beam_step)
        raise EngineError(
            "beam search runs the base model here, not a LoRA adapter; ask for 1 beam with an adapter",
            code=400,
            field="adapter",
        )


def decode_loop_options(
    enable_kv_cache_reuse: bool,
    max_tokens_in_paged_kv_cache: int | None,
    tokens_per_block: int | None,
    enable_chunked_context: bool,
    speculative: Speculation | None = None,
    enable_lora: bool = False,
) -> list[str]:
    """Pure: the options set that only the built-in decode loop honours."""
    given = ["option.enable_lora=true (LoRA adapters)"] if enable_lora else []
    if speculative is not None:
        given.append(f"{speculative.key('method')}={speculative.method} (speculative decoding)")
    if enable_kv_cache_reuse:
        given.append("option.enable_kv_cache_reuse=true")
    if max_tokens_in_paged_kv_cache is not None:
        given.append(f"option.max_tokens_in_paged_kv_cache={max_tokens_in_paged_kv_cache}")
    if tokens_per_block is not None:
        given.append(f"option.tokens_per_block={tokens_per_block}")
    if enable_chunked_context:
        given.append("option.enable_chunked_context=true")
    return given


def check_token_ids(request: GenerationRequest, vocab_size: int, max_input_len: int) -> None:
    prompt = request.prompt_token_ids
    if not prompt:
        raise EngineError("prompt_token_ids is empty", code=400)
    if len(prompt) > max_input_len:
        raise EngineError(f"prompt has {len(prompt)} tokens, more than max_input_len={max_input_len}", code=400)
    named = [("prompt_token_ids", [prompt])]
    named += [("stop_token_ids", request.stop_token_ids), ("bad_words_ids", request.bad_words_ids)]
    for name, sequences in named:
        for seq in sequences:
            if not seq:
                raise EngineError(f"{name} contains an empty sequence", code=400)
            bad = [t for t in seq if not 0 <= t < vocab_size]
            if bad:
                raise EngineError(f"{name} has token ids outside [0, {vocab_size}): {bad[:5]}", code=400)


# ----------------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------------


class TorchEngine:
    """transformers on CPU or CUDA behind the engine protocol (see the module docstring)."""

    name = "torch"

    def __init__(
        self,
        model_path: Path,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int = TORCH.default_batch,  # the registry's, for direct construction
        max_input_len: int = 1024,
        max_new_tokens: int = 512,
        trust_remote_code: bool = False,
        eos_token_ids: list[int] | None = None,
        pad_token_id: int | None = None,
        batching: str = "auto",
        max_num_tokens: int | None = None,
        decode_loop: str = "auto",
        enable_kv_cache_reuse: bool = False,
        max_tokens_in_paged_kv_cache: int | None = None,
        tokens_per_block: int | None = None,
        enable_chunked_context: bool = False,
        grammar_compile_timeout: float = 10.0,
        speculative: Speculation | None = None,
        enable_lora: bool = False,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        max_cpu_loras: int | None = None,
    ) -> None:
        if batching not in _BATCHING:
            raise EngineError(f"batching={batching!r} is not one of {', '.join(_BATCHING)}", code=400)
        for option, value in (
            ("max_batch_size", max_batch_size),
            ("max_input_len", max_input_len),
            ("max_new_tokens", max_new_tokens),
            ("max_tokens_in_paged_kv_cache", max_tokens_in_paged_kv_cache or 1),
            ("tokens_per_block", tokens_per_block or 1),
        ):
            if value < 1:
                raise EngineError(f"{option}={value} must be >= 1", code=400)
        self.model_path = Path(model_path)
        self.dtype = dtype
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_input_len = max_input_len
        self.max_new_tokens = max_new_tokens
        if max_num_tokens is not None and max_num_tokens < max_input_len and not enable_chunked_context:
            raise EngineError(
                f"option.max_num_tokens={max_num_tokens} is below option.max_input_len={max_input_len}: "
                "a prompt of max_input_len tokens could never be scheduled; raise it, or set "
                "option.enable_chunked_context=true",
                code=400,
            )
        self.max_num_tokens = max_num_tokens
        self.trust_remote_code = trust_remote_code
        self.requested_batching = batching
        self.decode_loop = decode_loop  # auto | builtin | transformers (see decode_loop.py)
        # The built-in decode loop's paged KV cache (prefix caching, its size in tokens, its block
        # size) and its prompt chunks.
        self.enable_kv_cache_reuse = enable_kv_cache_reuse
        self.max_tokens_in_paged_kv_cache = max_tokens_in_paged_kv_cache
        self.tokens_per_block = tokens_per_block
        self.enable_chunked_context = enable_chunked_context
        self.grammar_compile_timeout = grammar_compile_timeout  # seconds (guided.Grammars)
        # Speculative decoding (n-gram or a draft model, whose id is a local folder by now).
        self.speculative = speculative
        # LoRA adapters (the built-in decode loop): max_loras device slots of rank max_lora_rank; registered
        # adapters (at most max_cpu_loras) by name, read into host memory.
        if enable_lora and speculative is not None:
            raise EngineError(
                f"option.enable_lora=true with {speculative.key('method')}={speculative.method}: the decode loop "
                "does not apply adapters to speculative decoding's steps; leave one of them out",
                code=400,
            )
        self.enable_lora = enable_lora
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self._adapters: AdapterTable[LoraAdapter] = AdapterTable(
            enabled=enable_lora,
            max_registered=max_cpu_loras,
            using=lambda name: sum(1 for slot in self._slots.values() if slot.request.adapter == name),
        )
        self.eos_token_ids: tuple[int, ...] = tuple(eos_token_ids or ())
        self._explicit_eos = eos_token_ids is not None
        self.pad_token_id = pad_token_id
        self.batching: str | None = None  # "continuous" | "static" once started
        self._backend: Backend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sink: OutputSink | None = None
        self._sunk: list[EngineOutput | TokenDelta] = []  # the sink's outputs of this turn of the loop
        # Outputs the engine thread handed over that the event loop has not pushed yet; while a
        # push is scheduled, more outputs join it rather than scheduling another (a wake-up of the
        # loop through its self-pipe costs a syscall and a GIL hand-over per call).
        self._handed: list[tuple[Slot, EngineOutput | TokenDelta]] = []
        self._handed_lock = threading.Lock()
        self._push_scheduled = False
        self._vocab_size = 0
        self._grammars: Grammars | None = None  # once loaded
        self._model_device = torch.device("cpu")
        self._score_lock = threading.Lock()
        self._healthy = False
        self._closed = False
        self._slots: dict[str, Slot] = {}  # open requests by request_id (event loop only)
        self._by_key: dict[str, Slot] = {}  # the same by internal key (read by engine threads)
        self._keys = itertools.count()
        self._total_requests = 0
        self._total_tokens = 0
        self.sampled_rows = 0  # engine-side work, including rows nobody listens to any more

    # -- protocol ------------------------------------------------------------------------------

    @property
    def limits(self) -> EngineLimits:
        return EngineLimits(
            max_batch_size=self.max_batch_size,
            max_input_len=self.max_input_len,
            max_seq_len=self.max_input_len + self.max_new_tokens,
            max_new_tokens=self.max_new_tokens,
            max_beam_width=self.max_batch_size if self.batching == DecodeLoopBackend.name else 1,
        )

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            release=f"transformers {transformers.__version__}, torch {torch.__version__}",
            logprobs=can(),
            top_logprobs=can(most=MAX_TOP_LOGPROBS),
            prompt_logprobs=can(),
            logit_bias=can(),
            guided=can()
            if _HAS_XGRAMMAR
            else cannot(f"the torch engine constrains decoding with xgrammar, and {XGRAMMAR_MISSING}"),
            # its own sampler applies them all (gpu_sampler.py, sampler.py)
            **dict.fromkeys(SAMPLING_FEATURES, can()),
            # each beam takes a batch slot (option.max_rolling_batch_size bounds the width)
            beam_search=can(most=self.max_batch_size, note="transformers' beam search, each beam a batch slot")
            if self.batching == DecodeLoopBackend.name
            else cannot(
                f"the torch engine runs beam search in its built-in decode loop only, and this model runs on "
                f"{self.batching or 'another path'} (option.torch_decode_loop, option.torch_batching); ask for 1 beam"
            ),
            min_p=cannot("the torch engine's sampler has no min_p; leave it out, or use top_p or top_k"),
            lora=can(
                most=self.max_loras, note=f"up to {self.max_loras} adapters in a step, rank ≤ {self.max_lora_rank}"
            )
            if self.enable_lora
            else cannot("LoRA adapters are off: set option.enable_lora=true (the torch engine's built-in decode loop)"),
        )

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def start(self) -> None:
        if self._backend is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._backend = await asyncio.to_thread(self._load)
        self.batching = self._backend.name
        # The heap built so far (the model, transformers, torch) lives as long as the engine: out
        # of the collector's sight, the collections that every step's outputs set off stop
        # scanning it (on a CPU, the decode loop's own Python per step of 256 decode tokens fell
        # from 6.2 to 2.2 ms). vLLM does the same once started (vllm/entrypoints/openai/
        # api_server.py: "Mark the startup heap as static so that it's ignored by GC",
        # gc.collect(); gc.freeze()). close() hands it back.
        gc.collect()
        gc.freeze()
        if not _HAS_XGRAMMAR:
            log.warning(
                "constrained decoding is off (OpenAI response_format and tool_choice required/named, TGI grammar, "
                "LMI guided_json/regex/grammar answer 400): %s",
                XGRAMMAR_MISSING,
            )
        self._healthy = True

    def submit(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        """Validate now (a refusal is the request's one, final output: base.py's contract), stream
        deltas once iterated.

        Nothing is enqueued until the iterator is first awaited, so an iterator that is never
        consumed never occupies a slot. Closing it early cancels the request.
        """
        try:
            self._check_request(request)
        except EngineError as exc:
            return refused(request.request_id, exc)
        return self._stream(request)

    # -- BatchedEngine (base.py): the engine's process of several front ends (serving/engine_link.py) ----------

    def attach(self, sink: OutputSink) -> None:
        self._sink = sink

    def sinks(self, request: GenerationRequest) -> bool:
        """A plain streamed request: one that needs ``_stream``'s own work (aggregating beams, scoring the prompt,
        compiling a grammar) goes through ``submit``."""
        sampling = request.sampling
        return request.streaming and not sampling.prompt_logprobs and sampling.guided is None

    def submit_to_sink(self, request: GenerationRequest) -> None:
        """Straight to a slot whose outputs ``_push`` hands to the sink, a step's together."""
        assert self._sink is not None, "attach() a sink first"
        try:
            self._check_request(request)
            slot = self._open(request, None)
        except EngineError as exc:
            self._sink.put([error_output(request.request_id, str(exc), exc.code, exc.field)])
            return
        slot.sunk = True
        self._backend.enqueue(slot)

    def _put_sunk(self) -> None:
        outs, self._sunk = self._sunk, []
        sink = self._sink
        # In order: each run of plain deltas in one put_deltas, each run of outputs in one put.
        for plain, run in itertools.groupby(outs, key=lambda out: out.__class__ is tuple):
            (sink.put_deltas if plain else sink.put)(list(run))  # type: ignore[union-attr]

    def _check_request(self, request: GenerationRequest) -> None:
        self._check_ready()
        check_sampling(request.sampling, self.max_new_tokens)
        check_token_ids(request, self._vocab_size, self.max_input_len)
        if request.sampling.beam_width > 1:
            check_beams(request, self.capabilities.beam_search)
        self._adapter(request)
        if request.sampling.guided is not None and request.sampling.ignore_eos:
            raise EngineError(
                "ignore_eos cannot be combined with constrained decoding: the grammar ends the "
                "output with EOS; leave ignore_eos out",
                code=400,
            )

    async def cancel(self, request_id: str) -> None:
        slot = self._slots.get(request_id)
        if slot is not None:
            self._push(slot, EngineOutput(request_id, [], finished=True, finish_reason=FinishReason.CANCELLED))
            self._backend.cancel(slot)

    def stats(self) -> EngineStats:
        active = sum(s.started for s in self._slots.values())  # closed slots are forgotten at once
        return EngineStats(
            active_requests=active,
            queued_requests=len(self._slots) - active,
            max_batch_size=self.max_batch_size,
            total_requests=self._total_requests,
            total_generated_tokens=self._total_tokens,
            extra={
                "continuous_batching": float(self.batching in ("continuous", "decode_loop")),
                "sampled_rows": self.sampled_rows,
            }
            | (self._backend.stats() if self._backend is not None else {}),
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._healthy = False
        # End the streams first, so that what the stopping threads report is not relayed.
        self._fail_open("the engine was shut down", 503)
        if self._backend is not None:
            await asyncio.to_thread(self._backend.close)
        if self._grammars is not None:
            self._grammars.close()
        gc.unfreeze()  # what only cycles hold (the model, the KV cache) can go now

    # -- loading -------------------------------------------------------------------------------

    def _load(self) -> Backend:
        if not self.model_path.is_dir():
            raise EngineError(f"model folder {self.model_path} does not exist", code=400)
        device = resolve_device(self.device)
        dtype = resolve_dtype(self.dtype, device)
        kwargs = {"device_map": str(device)} if device.type != "cpu" else {}
        try:
            with _LOAD_LOCK:
                model = AutoModelForCausalLM.from_pretrained(
                    str(self.model_path), **dtype_kwargs(dtype), trust_remote_code=self.trust_remote_code, **kwargs
                ).eval()
        except ValueError as exc:
            if self.trust_remote_code or "trust_remote_code" not in str(exc):
                raise
            raise EngineError(
                f"the model in {self.model_path} needs its own Python code (auto_map in config.json), which is not "
                "run unless you allow it: set option.trust_remote_code=true (HF_MODEL_TRUST_REMOTE_CODE=true) if "
                "you trust that code",
                code=400,
            ) from exc
        self._configure_tokens(model)
        self._check_positions(model)
        self._vocab_size = model.get_input_embeddings().num_embeddings
        if _HAS_XGRAMMAR:
            self._grammars = Grammars(
                self.model_path, self._vocab_size, self.eos_token_ids, timeout_s=self.grammar_compile_timeout
            )
        self._model_device = model.device
        self._model = model  # prompt log-probs score the prompt with it (_score_prompt)
        builtin, why = choose_decode_loop(
            self.decode_loop, self.requested_batching, model, self.max_input_len + self.max_new_tokens
        )
        if builtin:
            log.info(
                "torch engine: %s on %s (%s), the built-in decode loop because %s",
                type(model).__name__,
                model.device,
                model.dtype,
                why,
            )
            return DecodeLoopBackend(self, model, self._load_draft(model, dtype, kwargs))
        given = decode_loop_options(
            self.enable_kv_cache_reuse,
            self.max_tokens_in_paged_kv_cache,
            self.tokens_per_block,
            self.enable_chunked_context,
            self.speculative,
            self.enable_lora,
        )
        if given:
            raise EngineError(
                f"{', '.join(given)} configure{'s' if len(given) == 1 else ''} the torch engine's built-in "
                f"decode loop (its paged KV cache, its prompt chunks), which does not run here ({why}); leave "
                f"{'it' if len(given) == 1 else 'them'} out",
                code=400,
            )
        batching, reason = self._choose_batching(model)
        log.info(
            "torch engine: %s on %s (%s), transformers %s batching because %s; not the built-in decode loop: %s",
            type(model).__name__,
            model.device,
            model.dtype,
            batching,
            reason,
            why,
        )
        if batching == "static":
            return StaticBackend(self, model)
        try:
            return ContinuousBackend(self, model)
        except Exception as exc:
            if self.requested_batching == "continuous":
                raise EngineError(f"continuous batching could not be set up: {exc}", code=424) from exc
            log.warning("continuous batching could not be set up (%s): using static batching", exc, exc_info=True)
            return StaticBackend(self, model)

    def _load_draft(
        self, model: PreTrainedModel, dtype: torch.dtype | str, kwargs: dict[str, str]
    ) -> PreTrainedModel | None:
        """The draft model of draft-model speculation, on the target's device and dtype; it must be
        Llama-shaped (the loop runs it on its own forward pass) and share the target's vocabulary."""
        spec = self.speculative
        if spec is None or spec.method != "draft_model":
            return None
        key, folder = spec.key("draft_model"), Path(spec.draft_model)
        if not (folder / "config.json").is_file():
            raise SpeculationError(key, spec.draft_model, "has no config.json", "name a Hugging Face model folder")
        with _LOAD_LOCK:
            draft = AutoModelForCausalLM.from_pretrained(
                str(folder), **dtype_kwargs(dtype), trust_remote_code=self.trust_remote_code, **kwargs
            ).eval()
        problem = unsupported_reason(draft, self.max_input_len + self.max_new_tokens)
        if problem is not None:
            raise SpeculationError(
                key, spec.draft_model, f"the decode loop cannot run it: {problem}", "use a Llama-shaped draft model"
            )
        vocab, draft_vocab = model.lm_head.out_features, draft.lm_head.out_features
        if draft_vocab != vocab or draft.get_input_embeddings().num_embeddings != self._vocab_size:
            raise SpeculationError(
                key,
                spec.draft_model,
                f"its vocabulary has {draft_vocab} tokens, the model's {vocab} (a draft model shares its tokenizer)",
                "use a draft model of the same family and tokenizer",
            )
        log.info("torch engine: draft model %s (%s) loaded from %s", type(draft).__name__, key, folder)
        return draft

    def _configure_tokens(self, model: PreTrainedModel) -> None:
        """EOS and pad ids: explicit options, else generation_config.json, else config.json."""

        def ids(name: str) -> list[int]:
            return as_id_list(getattr(model.generation_config, name, None)) or as_id_list(
                getattr(model.config, name, None)
            )

        if not self._explicit_eos:
            self.eos_token_ids = tuple(ids("eos_token_id"))
        if self.pad_token_id is None:
            self.pad_token_id = (ids("pad_token_id") or list(self.eos_token_ids) or [0])[0]
        if not self.eos_token_ids:
            log.warning("no EOS token id in the model config: requests end on max_new_tokens or stop tokens only")

    def _check_positions(self, model: PreTrainedModel) -> None:
        config = text_config(model.config)
        limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        if limit and self.max_input_len + self.max_new_tokens > limit:
            out = max(1, min(self.max_new_tokens, limit // 4))
            raise EngineError(
                f"option.max_input_len={self.max_input_len} + option.max_output_len={self.max_new_tokens} = "
                f"{self.max_input_len + self.max_new_tokens} exceeds the model's {limit} positions "
                f"(max_position_embeddings); set them to fit, e.g. option.max_input_len={limit - out} "
                f"option.max_output_len={out}",
                code=400,
            )

    def _choose_batching(self, model: PreTrainedModel) -> tuple[str, str]:
        supported = bool(getattr(model, "_supports_attention_backend", False))
        if self.requested_batching == "static":
            return "static", "batching=static was requested"
        if CB_IMPORT_ERROR is not None:
            problem = CB_IMPORT_ERROR
        elif not supported:
            problem = (
                f"{type(model).__name__} does not support transformers' attention backends "
                "(_supports_attention_backend=False), which paged continuous batching needs"
            )
        else:
            return "continuous", "the model supports paged attention"
        if self.requested_batching == "continuous":
            raise EngineError(f"batching=continuous is not possible: {problem}", code=400)
        return "static", problem

    # -- request lifecycle (event loop) --------------------------------------------------------

    def _check_ready(self) -> None:
        if self._backend is None or self._closed:
            raise EngineError("the torch engine is not started", code=503)
        if not self._healthy:
            raise EngineError("the torch engine has failed", code=503)

    # -- LoRA adapters (AdapterHost) ------------------------------------------------------------

    def adapters(self) -> list[AdapterInfo]:
        return self._adapters.infos()

    async def register_adapter(self, name: str, src: str, folder: str) -> AdapterInfo:
        """Read the adapter in ``folder`` (off the event loop) and serve it as ``name``; 409 for a name taken or
        ``option.max_cpu_loras`` reached, 400 for an adapter the decode loop cannot apply."""
        self._check_ready()
        self._adapters.check_room(name)
        config = self._model.config
        adapter = await asyncio.to_thread(
            read_adapter,
            name,
            Path(folder),
            max_rank=self.max_lora_rank,
            num_layers=config.num_hidden_layers,
            dtype=self._model.dtype,
        )
        info = AdapterInfo(name=name, src=src, folder=str(folder), rank=adapter.rank)
        self._adapters.add(info, adapter)
        log.info(
            "LoRA adapter %r registered from %s (rank %d, %.1f MiB)", name, src, adapter.rank, adapter.nbytes / 2**20
        )
        return info

    async def unregister_adapter(self, name: str) -> None:
        """404 for a name not registered; 409 while a request uses it."""
        self._adapters.remove(name)
        log.info("LoRA adapter %r unregistered", name)

    def _adapter(self, request: GenerationRequest) -> LoraAdapter | None:
        """The registered adapter the request names (None: the base model); 404 for an unknown name."""
        if request.adapter is None:
            return None
        adapter = self._adapters.get(request.adapter)
        if request.sampling.prompt_logprobs:
            raise EngineError(
                "prompt log-probs are scored by the base model, not an adapter; leave them out of adapter requests",
                code=400,
                field="prompt_logprobs",
            )
        return adapter

    def _open(self, request: GenerationRequest, matcher: Guide | None) -> Slot:
        self._check_ready()
        if request.request_id in self._slots:
            raise EngineError(f"request_id {request.request_id!r} is already in flight", code=400)
        generator = None
        if request.sampling.seed is not None:
            generator = torch.Generator(device=self._model_device)
            generator.manual_seed(request.sampling.seed)
        slot = Slot(
            request=request,
            key=f"{request.request_id}#{next(self._keys)}",
            eos_ids=() if request.sampling.ignore_eos else self.eos_token_ids,
            generator=generator,
            queue=OutputChannel(),
            prompt_set=frozenset(request.prompt_token_ids),
            matcher=matcher,
            adapter=self._adapter(request),
        )
        self._slots[request.request_id] = slot
        self._by_key[slot.key] = slot
        self._total_requests += 1
        return slot

    def _release(self, slot: Slot) -> None:
        if not slot.closed:  # the consumer left before the end: client gone, task cancelled
            slot.closed = slot.cancelled = True
            self._backend.cancel(slot)
        self._forget(slot)

    def _forget(self, slot: Slot) -> None:
        if self._slots.get(slot.request.request_id) is slot:
            del self._slots[slot.request.request_id]
        self._by_key.pop(slot.key, None)

    async def _stream(self, request: GenerationRequest) -> AsyncIterator[EngineOutput]:
        try:  # checked again when first awaited: the engine may have closed, the id may be taken by now
            guided = request.sampling.guided  # compiled off the event loop, within its time bound
            slot = self._open(request, await self._grammars.guide(guided) if guided is not None else None)  # type: ignore[union-attr]
        except EngineError as exc:
            yield error_output(request.request_id, str(exc), exc.code, exc.field)
            return
        prompt_lps: list[float | None] | None = None
        try:
            if request.sampling.prompt_logprobs:
                try:
                    prompt_lps = await asyncio.to_thread(self._score_prompt, request.prompt_token_ids)
                except Exception as exc:  # noqa: BLE001 — this request's failure, not the engine's
                    yield error_output(request.request_id, f"scoring the prompt failed: {exc}", 424)
                    return
            if not slot.closed:  # cancelled or failed while its prompt was scored: its end is queued already
                self._backend.enqueue(slot)
            tokens: list[int] = []
            logprobs: list[float] = []
            tops: list[list[tuple[int, float]]] = []
            queue_time: float | None = None
            while True:
                out = await slot.queue.get()
                if prompt_lps is not None and (request.streaming or out.finished):
                    out.prompt_logprobs, prompt_lps = prompt_lps, None  # on the request's first output
                if request.streaming:
                    yield out
                else:  # one aggregated output at the end
                    tokens += out.token_ids
                    logprobs += out.logprobs or []
                    tops += out.top_logprobs or []
                    queue_time = queue_time if queue_time is not None else out.queue_time_s
                    if out.finished:
                        out.token_ids, out.logprobs = tokens, (logprobs if request.sampling.logprobs else None)
                        out.top_logprobs = tops if request.sampling.top_logprobs else None
                        out.queue_time_s = queue_time
                        yield out
                if out.finished:
                    return
        finally:
            self._release(slot)

    def _score_prompt(self, ids: list[int]) -> list[float | None]:
        """Each prompt token's log-prob given the ones before it (None for the first), from the model's raw
        logits: one forward pass over the prompt beside the batch (read-only use of the weights), one at a
        time so that long prompts do not stack their activations."""
        with self._score_lock, torch.inference_mode():
            x = torch.tensor([ids], device=self._model_device)
            logits = self._model(x).logits[0, :-1].float()
            scores = logits.log_softmax(-1).gather(1, x[0, 1:, None])[:, 0]
        return [None, *scores.tolist()]

    def _push(self, slot: Slot, out: EngineOutput) -> None:
        """The only place outputs reach a client; runs on the loop, so ordering is total."""
        if slot.closed:
            return
        if out.token_ids:
            slot.started = True
            self._total_tokens += len(out.token_ids)
        if out.finished:
            slot.closed = True
            slot.cancelled = slot.cancelled or out.finish_reason == FinishReason.CANCELLED
            self._forget(slot)
        if slot.sunk:
            self._to_sink(out)
        else:
            slot.queue.put_nowait(out)

    def _to_sink(self, out: EngineOutput | TokenDelta) -> None:
        """To the sink, with the other outputs of this turn of the loop (one engine step)."""
        self._sunk.append(out)
        if len(self._sunk) == 1:
            self._loop.call_soon(self._put_sunk)  # type: ignore[union-attr]

    def _push_handed(self) -> None:
        with self._handed_lock:
            items, self._handed, self._push_scheduled = self._handed, [], False
        for slot, out in items:
            if out.__class__ is tuple:  # a sunk slot's plain delta (TokenDelta): what _push does for one
                if not slot.closed:
                    self._total_tokens += len(out[1])  # type: ignore[arg-type]
                    self._to_sink(out)
            else:
                self._push(slot, out)  # type: ignore[arg-type]

    def _fail_open(self, message: str, code: int) -> None:
        self._push_handed()  # what came before the failure first
        for slot in list(self._slots.values()):
            self._push(slot, error_output(slot.request.request_id, message, code))

    # -- called from engine threads ------------------------------------------------------------

    def slot_by_key(self, key: str) -> Slot | None:
        return self._by_key.get(key)

    def deliver(self, items: list[tuple[Slot, EngineOutput | TokenDelta]]) -> None:
        if not items:
            return
        with self._handed_lock:
            self._handed += items
            if self._push_scheduled:
                return
            self._push_scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._push_handed)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            log.debug("dropping %d outputs: event loop closed", len(items))

    def advance(
        self,
        slots: Sequence[Slot | None],
        logits: torch.Tensor,
        on_finished: Callable[[Slot, FinishReason], None],
    ) -> list[int]:
        """Sample one step for ``slots`` (rows of ``logits``), emit the deltas, return the tokens."""
        picks = sample_next_tokens(logits, slots)
        self.sampled_rows += len(picks)  # one engine thread writes it
        items = []
        for slot, pick in zip(slots, picks):
            if slot is None or slot.finished or slot.cancelled:
                continue
            if pick.error is None and slot.matcher is not None:
                slot.matcher.accept(pick.token)
                if slot.matcher.error is not None:  # too slow to take it: this request fails alone
                    pick = Pick(pick.token, error=slot.matcher.error, field="guided")
            if pick.error is not None:
                slot.finished = True
                code = 424 if pick.field is None else 400
                items.append((slot, error_output(slot.request.request_id, pick.error, code, pick.field)))
                on_finished(slot, FinishReason.ERROR)
                continue
            slot.generated.append(pick.token)
            reason = finish_reason(slot.generated, slot.eos_ids, slot.request)
            slot.finished = reason is not None
            logprobs = [pick.logprob] if pick.logprob is not None else None
            items.append(
                (
                    slot,
                    EngineOutput(
                        slot.request.request_id,
                        [pick.token],
                        logprobs,
                        [pick.top] if pick.top is not None else None,
                        finished=slot.finished,
                        finish_reason=reason,
                        queue_time_s=slot.take_queue_time(),
                    ),
                )
            )
            if reason is not None:
                on_finished(slot, reason)
        self.deliver(items)
        return [p.token for p in picks]

    def fail(self, slot: Slot, message: str, code: int, field: str | None = None) -> None:
        slot.finished = True
        self.deliver([(slot, error_output(slot.request.request_id, message, code, field))])

    def die(self, message: str) -> None:
        log.error("torch engine is unhealthy: %s", message)
        self._healthy = False
        try:
            self._loop.call_soon_threadsafe(self._fail_open, message, 424)
        except RuntimeError:
            log.debug("event loop closed: no open request to fail")
