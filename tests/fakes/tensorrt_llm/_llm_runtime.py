"""The fake LLM API's inside (private): an in-flight-batching step loop over the Hugging Face checkpoint
the LLM was built from. Model loading and token selection are the Executor fake's (``_runtime``).

Kept from the PyTorch backend (tensorrt_llm/_torch/pyexecutor): requests join and leave the running
batch at any step; at most ``max_batch_size`` run and, under GUARANTEED_NO_EVICT, only while the KV cache
(``KvCacheConfig.max_tokens``, in ``tokens_per_block`` blocks) can hold every admitted request's prompt +
max_tokens (MAX_UTILIZATION admits on the prompt alone); the rest wait in arrival order. A sequence ends
at ``max_seq_len``; ``abort_request`` ends it with CANCELLED; a failure of one request becomes an error
response for that request only. Guided decoding (``guided_decoding_backend="xgrammar"``) masks the logits
with the request's grammar before the token is chosen (``_grammar``), after the request's embedding bias
([vocab_size] float32, added to the logits; from 1.1, PR 6464). Log probs come from the raw logits'
log-softmax: 1.0.0 gives the sampled token's only (PR 6097: top-1 on PyTorch), and so does 1.1: PR 7756 (top k) was
reverted on main by PR 7969 the day it merged (2025-09-24) and re-landed as PR 7976 on 2025-09-30, after the
"Bump version to 1.2.0rc0" commit (PR 7941, 2025-09-29) that marks the 1.1 branch cut; from 1.2 the requested top k.
Prompt log probs (from 1.1, PR 7580) are computed from the context logits once the first token is chosen
(tensorrt_llm/executor/base_worker.py ``_compute_pytorch_prompt_logprobs``): one entry per prompt position, the top
``prompt_logprobs`` of the distribution that position predicts; PR 11235 (merged 2026-03-04, before the 1.3.0rc8
bump) adds a prompt token to each entry, but the one the position was computed from (``prompt[t]``), which PR 12499
(in v1.3.0rc11's release notes: "Adjust prompt logprobs to use the correct prompt token id") corrects to the token
that follows (the next prompt token, or the first generated one).
A checkpoint in nvidia-modelopt's unified HF format (``hf_quant_config.json``), which the real backend loads
as pre-quantized (docs/source/features/quantization.md), is loaded for FP8 by dequantizing its weights
(weight × weight_scale, as the FP8 GEMM scales them); other formats are refused.
Simplifications: beam search is decoded in one go by transformers' beam search (one final response); FP8
activations and KV cache stay in fp32.

Which sampler runs (``sampler_of``) and what it does with a request (``_Strategy.of``), per release:
* TRTLLMSampler, the C++ decoder (``GptDecoderBatched`` set up from each request's ``SamplingConfig``,
  tensorrt_llm/_torch/pyexecutor/sampler.py ``TRTLLMSampler.setup_sampler_step``): temperature, top-k/top-p,
  per-request seed, repetition/presence/frequency penalties, min length (on generated tokens), bad words, beam
  search (the 1.0.0 docs, features/sampling.md: "temperature, top-k and top-p sampling, beam search, stop words,
  bad words, penalty, ... log probability, guided decoding"; PR 8127 thread: "Only trtllm sampler in torch path
  supports these penalties"). Whether it adds ``embedding_bias`` and gives more than the sampled token's log prob
  was not read: the fake does neither, so code that relies on them is caught.
* TorchSampler 1.0 (sampler.py of the 1.0 line): ``fast_path = not self.enable_mixed_sampler and ...`` takes
  the argmax for the batch; with ``enable_mixed_sampler`` ``request_strategy`` picks top-p if set, else top-k,
  else greedy, and applies no temperature (and ``torch.topk(logits, 0)`` for top_k 0 fails); no penalties, min
  length, bad words, embedding bias or seed (``torch.multinomial`` on one generator); its constructor asserts
  ``max_beam_width == 1`` ("TorchSampler only supports beam_width = 1").
* TorchSampler 1.1 and 1.2: temperature/top-k/top-p per request (PR 7294; greedy when
  ``params_imply_greedy_decoding``; top_k 0 is no limit, PR 6934), embedding bias (PR 6464); one generator for all
  requests (``_global_seed = 42``: per-request seed came with PR 17172, 2026-08); penalties ignored (PR 16485,
  2026-07); bad words ignored (PR 16052, 2026-07); ``_apply_min_length_penalty`` bans ``py_end_id`` while
  ``max_beam_num_tokens`` (prompt + generated) is below ``min_tokens`` (fixed to generated tokens by PR 12166,
  2026-03, on main), which under ``ignore_eos`` (end id -1) bans the last vocabulary entry (PR 12358).
* TorchSampler on main: all of the above per request, penalties (PR 16485; refused with beam search: "safeguards
  for unsupported penalty combinations with beam search"), seed (PR 17172), bad words (PR 16052), min length on
  generated tokens (PR 12166, PR 12358), and beam search (the only sampler: PR 18232). The 1.3.0 release candidates
  hold these fixes one by one (``_state.FIXES``: the first candidate verified to hold each; the fake's 1.3.0 holds all).
Which sampler: 1.0 TRTLLMSampler iff ``enable_trtllm_sampler`` (_util.py ``instantiate_sampler`` of the 1.0 line);
1.1/1.2 ``sampler_type``, where ``auto`` is TRTLLMSampler iff beam search (``decoding_mode.isBeamSearch()``, i.e.
``max_beam_width > 1``; _util.py of the 1.1 line); main TorchSampler. Which one ``auto`` picks for beams on 1.2 and
the 1.3.0 candidates before PR 18232 was not pinned down (the 1.2-era docs say the TRTLLMSampler; PR 8509 gave 1.2's
TorchSampler beams; PR 14487, 2026-05, says main's ``auto`` picks the TorchSampler): the fake refuses to guess. Beam
search on 1.0's TRTLLMSampler needs the overlap scheduler and CUDA graphs off (docs features/sampling.md of 1.0.0:
"To enable beam search, you must ... Disable overlap scheduling ... Disable the usage of CUDA Graphs"); from 1.1 it
runs beside both (PR 6223 and PR 6217, tested by PR 7326 on main 2025-08-29: "Add beam search CudaGraph + Overlap
Scheduler tests"; 1.2-era tests/unittest/_torch/sampler/test_beam_search.py
``test_beam_search_e2e_cuda_graph_and_overlap``).
Every request's beam width must equal ``max_beam_width`` up to PR 16620 (``BEAM_WIDTH_CHECK``).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace

from lmi_trt.compat import cache_kwargs, returned_cache  # the cache keyword as this transformers spells it
from tensorrt_llm import _state
from tensorrt_llm._grammar import MatcherFactory, tokenizer_info
from tensorrt_llm._lora import Loras
from tensorrt_llm._runtime import _load_model, _select, early_stopping_hf
from tensorrt_llm._state import has
from tensorrt_llm.executor.result import GenerationResult, Logprob, _Response

TORCH, TRTLLM = "TorchSampler", "TRTLLMSampler"
GLOBAL_SEED = 42  # TorchSampler's one generator before PR 17172


def sampler_of(args) -> str:
    """The sampler the LLM's executor builds (see the module docstring); construction-time failures raise."""
    series, beams = _state.series(), (args.max_beam_width or 1) > 1
    spec = args.speculative_config
    if spec is not None and type(spec).__name__ in ("MTPDecodingConfig", "EagleDecodingConfig", "Eagle3DecodingConfig"):
        # _util.py instantiate_sampler: get_spec_decoder (a TorchSampler subclass) where has_spec_decoder(), before
        # enable_trtllm_sampler is looked at (the two pre-1.1 copies read)
        if beams:
            raise AssertionError("TorchSampler only supports beam_width = 1")
        return TORCH
    if series < (1, 1):
        sampler = TRTLLM if args.enable_trtllm_sampler else TORCH
        if sampler == TORCH and beams:
            raise AssertionError("TorchSampler only supports beam_width = 1")
    elif not has("torch_only"):
        chosen = args.sampler_type
        # auto → TRTLLMSampler for beams is read in the 1.1 line's _util.py only (read_file id 843526953); no 1.2
        # instantiate_sampler was read (PR 8509 gave 1.2's TorchSampler beams), nor a 1.3.0 candidate's before PR 18232
        if series >= (1, 2) and beams and chosen == "auto":
            raise NotImplementedError(
                f"fake tensorrt_llm {_state.version()}: which sampler sampler_type='auto' picks for beam search on "
                "this release is not modelled"
            )
        sampler = TRTLLM if chosen == TRTLLM or (chosen == "auto" and beams) else TORCH
        if sampler == TORCH and beams:
            raise NotImplementedError("fake tensorrt_llm: TorchSampler beam search before 1.3.0rc26 is not modelled")
    else:
        sampler = TORCH
    if sampler == TRTLLM and spec is not None:
        raise NotImplementedError("fake tensorrt_llm: the TRTLLMSampler beside draft tokens is not modelled (not read)")
    if series < (1, 1) and beams and (not args.disable_overlap_scheduler or args.cuda_graph_config is not None):
        raise ValueError(
            "beam search on the TRTLLM sampler needs disable_overlap_scheduler=True and cuda_graph_config=None "
            "(docs/source/features/sampling.md of 1.0)"
        )
    return sampler


@dataclass(frozen=True)
class _Strategy:
    """What the sampler applies to one request, in the shape ``_runtime._select`` reads (greedy = top_k 1)."""

    top_k: int
    top_p: float
    temperature: float | None
    seed: int | None
    min_tokens: int | None  # EOS banned while fewer tokens were generated
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    shared_generator: bool = False  # one generator for every request: the request's seed is not used
    min_length_total: int | None = None  # 1.1/1.2 TorchSampler: bans the end id while prompt + generated < this
    bans: bool = True  # bad words applied
    bias: bool = True  # embedding bias applied
    ban_end_when_ignoring_eos: bool = False  # min length under ignore_eos bans logits[-1] (TorchSampler before 12358)

    @classmethod
    def of(cls, sp, sampler: str, *, mixed: bool) -> _Strategy:
        series = _state.series()
        if sampler == TRTLLM:
            # C++ SamplingConfig: top_k 0 (no limit) with top_p 0 is greedy, as in the Executor fake
            greedy = sp.top_k == 1 or (not sp.top_k and not sp.top_p)
            return cls._make(sp, greedy, seed=sp.seed, min_tokens=sp.min_tokens, penalties=True, bias=False)
        if series < (1, 1):
            if not mixed:  # the fast path: argmax for everyone
                return cls._make(sp, True, penalties=False, bans=False, bias=False, shared=True)
            if sp.top_p is not None:
                top_k, top_p = 0, sp.top_p
            elif sp.top_k is not None:
                if sp.top_k == 0:
                    raise RuntimeError("selected index k out of range")  # torch.topk(logits, 0)[..., -1]
                top_k, top_p = sp.top_k, 1.0
            else:
                top_k, top_p = 1, 1.0
            return cls(top_k, top_p, None, None, None, None, None, None, shared_generator=True, bans=False, bias=False)
        greedy = sp.params_imply_greedy_decoding(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k)
        if sp.use_beam_search and any(
            v not in (None, 0.0, 1.0) for v in (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty)
        ):
            raise ValueError("penalties are not supported with beam search in TorchSampler")
        on_generated = has("min_tokens_on_generated")
        return cls._make(
            sp,
            greedy,
            seed=sp.seed if has("seed") else None,
            min_tokens=sp.min_tokens if on_generated else None,
            penalties=has("penalties"),
            bans=has("bad_words"),
            shared=not has("seed"),
            min_length_total=None if on_generated else sp.min_tokens or None,
            # before PR 12358 an ignore_eos request's end id (-1) indexes the last vocabulary entry
            ban_end_when_ignoring_eos=not has("ignore_eos_min_tokens"),
        )

    @classmethod
    def _make(cls, sp, greedy: bool, *, seed=None, min_tokens=None, penalties: bool, **flags) -> _Strategy:
        shared = flags.pop("shared", False)
        return cls(
            top_k=1 if greedy else (sp.top_k or 0),
            top_p=1.0 if greedy or sp.top_p is None else sp.top_p,
            temperature=sp.temperature,
            seed=seed,
            min_tokens=min_tokens,
            repetition_penalty=sp.repetition_penalty if penalties else None,
            presence_penalty=sp.presence_penalty if penalties else None,
            frequency_penalty=sp.frequency_penalty if penalties else None,
            shared_generator=shared,
            **flags,
        )


@dataclass(eq=False)
class _Seq:
    result: GenerationResult
    prompt: list[int]
    max_tokens: int
    end_id: int
    sampling: _Strategy
    bad_words: list[list[int]]
    stop_words: list[list[int]]
    top_logprobs: int
    streaming: bool
    beam_width: int
    guide: tuple[str, str | None] | None = None  # (guide type, guide): see _grammar
    # SamplingParams.length_penalty / early_stopping: the C++ SamplingConfig's (None: its defaults, 0 and 1)
    length_penalty: float | None = None
    early_stopping: int | None = None
    prompt_logprobs: int = 0  # SamplingParams.prompt_logprobs (0: none)
    embedding_bias: object = None  # SamplingParams.embedding_bias, added to the logits by _select
    lora: object = None  # the request's LoRARequest (_lora)
    context_logprobs: object = None  # [prompt len, vocab] log-softmax of the context logits
    prompt_entries: list | None = None  # the prompt log probs, until a response carries them
    matcher: object = None
    generated: list[int] = field(default_factory=list)
    cum_logprob: float = 0.0
    sent: int = 0
    pending_logprobs: list = field(default_factory=list)  # per-token dicts not sent yet
    past: object = None
    logits: object = None
    features: list = field(default_factory=list)  # a draft head's input from the target, per position
    generator: object = None

    @property
    def id(self) -> int:
        return self.result.id


class LlmRuntime:
    def __init__(self, hf_dir: str, args, tokenizer=None) -> None:
        import torch

        self.args = args
        self.sampler = sampler_of(args)
        self._generator = torch.Generator().manual_seed(GLOBAL_SEED)  # the samplers' one shared generator
        # load_format=dummy: "Initialize all weights randomly" (llm_args.py LoadFormat.DUMMY).
        self._model = _random_model(hf_dir) if args.load_format.name == "DUMMY" else _load_checkpoint(hf_dir)
        self._grammars = None
        if (
            args.guided_decoding_backend is not None
            and args.speculative_config is not None
            and _state.series() < (1, 1)
        ):
            # py_executor_creator.py of the 1.0 line (NVIDIA/TensorRT-LLM, before PR 6300, which 1.1 carries; still on
            # main at 425dad01 per NVIDIA/TensorRT-LLM#7006): guided_decoding_config beside any spec_config raises
            raise ValueError("Guided decoding is not supported with speculative decoding.")
        if args.guided_decoding_backend == "xgrammar":
            self._grammars = MatcherFactory(tokenizer_info(tokenizer), self._model.config.vocab_size)
        self._loras = (
            Loras(self._model, args.lora_config, cuda_graphs=args.cuda_graph_config is not None)
            if args.lora_config is not None
            else None
        )
        self.max_seq_len = _model_engine_max_seq_len(hf_dir, args.max_seq_len, args.trust_remote_code)
        self.tokens_per_block = args.kv_cache_config.tokens_per_block
        kv_tokens = args.kv_cache_config.max_tokens or args.max_batch_size * self.max_seq_len
        self.kv_blocks = kv_tokens // self.tokens_per_block
        self._cv = threading.Condition()
        self._waiting: deque[_Seq] = deque()
        self._active: list[_Seq] = []
        self._cancel: set[int] = set()
        self._stats: deque[str] = deque(maxlen=args.max_stats_len)
        self._spec = _Speculation.of(args.speculative_config, self._active, self._model, hf_dir)
        self._iter_spec = [0, 0, 0]  # this iteration's draft tokens, accepted ones, requests with drafts
        self._iter = 0
        self._stop = False
        self.dead: Exception | None = None  # what ended the executor loop
        self._thread = threading.Thread(target=self._event_loop, name="fake-llmapi-executor", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ client side (event loop thread)

    def submit(self, seq: _Seq) -> None:
        with self._cv:
            if self._stop:
                raise RuntimeError("LLM is shutting down")
            self._waiting.append(seq)
            self._cv.notify_all()

    def abort_request(self, request_id: int) -> None:
        with self._cv:
            self._cancel.add(request_id)
            self._cv.notify_all()

    def next_stats(self) -> str | None:
        with self._cv:
            return self._stats.popleft() if self._stats else None

    def shutdown(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    # ------------------------------------------------------------ step loop

    def _event_loop(self) -> None:
        """PyExecutor._event_loop_wrapper: an exception out of the loop is logged and ends it; nothing answers the
        requests left in it, and later ones are queued for a loop that is gone (py_executor.py, every copy read)."""
        try:
            self._loop()
        except Exception as exc:  # noqa: BLE001 — as the real wrapper: log, then the thread ends
            print(f"[TensorRT-LLM][ERROR] Error in event loop: {exc}", flush=True)
            self.dead = exc
            raise

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stop and not self._waiting and not self._active:
                    self._cv.wait()
                if self._stop:
                    return
                started = time.monotonic()
                self._take_cancellations()
                admitted = self._admit()
            finished = 0
            for seq in list(self._active):
                if self._step(seq, seq in admitted):
                    finished += 1
                    self._active.remove(seq)
            with self._cv:
                self._record_stats(started, len(admitted), finished)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.tokens_per_block)

    def _reserved_blocks(self, seq: _Seq) -> int:
        policy = self.args.scheduler_config.capacity_scheduler_policy.value
        tokens = len(seq.prompt) + (seq.max_tokens if policy == "GUARANTEED_NO_EVICT" else len(seq.generated))
        return self._blocks(tokens)

    def _take_cancellations(self) -> None:
        for seq in [s for s in (*self._waiting, *self._active) if s.id in self._cancel]:
            (self._active if seq in self._active else self._waiting).remove(seq)
            seq.result._enqueue(self._response(seq, "CANCELLED"))
        self._cancel.clear()

    def _admit(self) -> set[_Seq]:
        admitted: set[_Seq] = set()
        used = sum(self._reserved_blocks(s) for s in self._active)
        while self._waiting and len(self._active) < self.args.max_batch_size:
            seq = self._waiting[0]
            refused = _beam_width_problem(seq, self.args.max_beam_width or 1)  # raises where the real one asserts
            if refused is not None:
                self._waiting.popleft()
                seq.result._enqueue(_Response([], None, None, None, True, error=refused))
                continue
            if len(seq.prompt) >= self.max_seq_len:
                # A stand-in for a run-time failure of one request: PyExecutor answers it with an error
                # response for that request (the LLM API raises it as RequestError from its iterator).
                self._waiting.popleft()
                seq.result._enqueue(
                    _Response(
                        [],
                        None,
                        None,
                        None,
                        True,
                        error=(
                            f"The prompt length ({len(seq.prompt)}) must be smaller than "
                            f"max_seq_len ({self.max_seq_len})"
                        ),
                    )
                )
                continue
            need = self._reserved_blocks(seq)
            if self._active and used + need > self.kv_blocks:
                break  # wait for KV cache room (a lone request always runs)
            self._waiting.popleft()
            # executor/base_worker.py _deduce_max_tokens: a max_tokens beyond max_seq_len - prompt is cut to it, with
            # a log line only ("User-specified `max_tokens` (...) is greater than deduced `default_max_tokens`")
            seq.max_tokens = min(seq.max_tokens, self.max_seq_len - len(seq.prompt))
            self._active.append(seq)
            admitted.add(seq)
            used += need
        return admitted

    def _step(self, seq: _Seq, new: bool) -> bool:
        """One decoding step; True when the sequence ended."""
        import torch

        try:
            with torch.no_grad():
                if seq.beam_width > 1:
                    if seq.lora is not None:
                        raise NotImplementedError("fake tensorrt_llm: beam search with a LoRA adapter is not modelled")
                    seq.result._enqueue(self._beam_search(seq))
                    return True
                if new:
                    if self._spec is not None and self._spec.greedy_only:  # the one-model worker's argmax
                        seq.sampling = replace(seq.sampling, top_k=1, top_p=1.0, temperature=None)
                    if seq.guide is not None:  # compiled in the executor loop: a bad guide fails this request only
                        seq.matcher = self._grammars.create(*seq.guide)
                    self._check_bias(seq)
                    if seq.lora is not None:  # the worker loads a request's adapter when it takes the request
                        self._loras.load(seq.lora)
                    self._forward(seq, seq.prompt, prefill=True)
                drafts = [] if new or self._spec is None else self._spec.propose(seq, self._model)
                if drafts:
                    reason = self._verify(seq, drafts)
                else:
                    token = self._choose(seq)
                    if new:
                        seq.prompt_entries = self._prompt_logprobs(seq, token)
                    reason = self._advance(seq, token)
                    if reason is None:
                        self._forward(seq, [token])
        except Exception as exc:  # one request's failure must not end the others
            seq.result._enqueue(_Response([], None, None, None, True, error=f"{type(exc).__name__}: {exc}"))
            return True
        if reason is not None or seq.streaming:
            seq.result._enqueue(self._response(seq, reason))
        return reason is not None

    def _choose(self, seq: _Seq) -> int:
        """The next token as this release's sampler picks it (``_Strategy``)."""
        sc = seq.sampling
        if sc.shared_generator:
            seq.generator = self._generator
        total = len(seq.prompt) + len(seq.generated)
        # _apply_min_length_penalty: logits[py_end_id] = -inf while short of min_tokens (1.1/1.2: prompt + generated;
        # from PR 12166 generated only, which _select applies); an ignore_eos end id of -1 indexes the last entry
        # until PR 12358
        short_on_total = sc.min_length_total is not None and total < sc.min_length_total
        short_ignoring_eos = (
            sc.ban_end_when_ignoring_eos
            and seq.end_id < 0
            and bool(sc.min_tokens)
            and len(seq.generated) < sc.min_tokens
        )
        if not (short_on_total or short_ignoring_eos):
            return _select(seq)[0]
        raw = seq.logits
        seq.logits = raw.clone()
        seq.logits[seq.end_id] = float("-inf")
        try:
            return _select(seq)[0]
        finally:
            seq.logits = raw

    def _verify(self, seq: _Seq, drafts: list[int]) -> str | None:
        """One speculative step: the target reads the draft tokens in one forward, then the sampler chooses a token
        at each position, as it would without drafts, keeping drafts while they equal its choice; the first choice
        that differs (or the one after the last draft) is its own token. The KV cache drops the rejected drafts.
        (_torch/pyexecutor/sampler.py: the TorchSampler samples the target at every draft position and accepts the
        draft tokens up to the first mismatch; the resource manager rewinds the rest.)"""
        first = seq.logits
        res = self._run(seq, drafts)
        positions = [first, *res.logits[0].float()]
        accepted, reason = 0, None
        for i, logits in enumerate(positions):
            seq.logits = logits
            token = self._choose(seq)
            reason = self._advance(seq, token)
            if reason is not None or i == len(drafts) or token != drafts[i]:
                break
            accepted += 1
        self._iter_spec[0] += len(drafts)
        self._iter_spec[1] += accepted
        self._iter_spec[2] += 1
        seq.past = returned_cache(res)
        del seq.features[len(seq.prompt) + len(seq.generated) - 1 :]  # the last token's comes with its forward
        if accepted < len(
            drafts
        ):  # the accepted drafts stay (a negative crop drops from the end, transformers 4.x/5.x)
            seq.past.crop(-(len(drafts) - accepted))
        if reason is None:
            self._forward(seq, [seq.generated[-1]])
        return reason

    def _adapter(self, seq: _Seq, prefill: bool):
        return self._loras.applying(seq.lora, prefill) if self._loras is not None else contextlib.nullcontext()

    def _run(self, seq: _Seq, ids: list[int], prefill: bool = False):
        """The target over ``ids`` after the cached ones; a draft head's features of each position are kept."""
        heads = self._spec is not None and self._spec.head is not None
        with self._adapter(seq, prefill):
            res = self._model(
                input_ids=_tensor([ids]), use_cache=True, output_hidden_states=heads, **cache_kwargs(seq.past)
            )
        if heads:
            seq.features.extend(self._spec.feature(res.hidden_states))
        return res

    def _forward(self, seq: _Seq, ids: list[int], prefill: bool = False) -> None:
        import torch

        res = self._run(seq, ids, prefill)
        seq.past, seq.logits = returned_cache(res), res.logits[0, -1].float()
        if seq.prompt_logprobs and seq.context_logprobs is None:
            seq.context_logprobs = torch.log_softmax(res.logits[0].float(), -1)

    def _check_bias(self, seq: _Seq) -> None:
        import torch

        bias = seq.embedding_bias
        if bias is None:
            return
        vocab = self._model.config.vocab_size
        bias = torch.as_tensor(bias, dtype=torch.float32).reshape(-1)  # SamplingParams keeps an fp32 copy
        if tuple(bias.shape) != (vocab,):
            raise ValueError(f"embedding_bias must have shape [{vocab}], got {list(bias.shape)}")
        seq.embedding_bias = bias

    def _prompt_logprobs(self, seq: _Seq, first_token: int) -> list[dict[int, Logprob]] | None:
        if seq.context_logprobs is None:
            return None
        # PR 11235: each entry also holds a prompt token, prompt[t] (the one position t was computed from) until
        # PR 12499 made it the one that follows (the next prompt token, or the first generated one)
        if has("prompt_token_entry_fixed"):
            held = seq.prompt[1:] + [first_token]
        elif has("prompt_token_entry"):
            held = list(seq.prompt)
        else:
            held = None
        entries = [
            _top_entry(row, seq.prompt_logprobs, held[t] if held else None)
            for t, row in enumerate(seq.context_logprobs)
        ]
        seq.context_logprobs = None
        return entries

    def _advance(self, seq: _Seq, token: int) -> str | None:
        import torch

        if token == seq.end_id:
            return "END_ID"
        if seq.matcher is not None:
            seq.matcher.accept_token(token)
        logprobs = torch.log_softmax(seq.logits, -1)
        seq.cum_logprob += float(logprobs[token])
        seq.generated.append(token)
        if seq.top_logprobs:
            # top k from PR 7976 (1.2; PR 7756 was reverted before the 1.1 cut); the TRTLLMSampler: the sampled one's
            sampled_only = _state.series() < (1, 2) or self.sampler == TRTLLM
            seq.pending_logprobs.append(_logprob_entry(logprobs, token, None if sampled_only else seq.top_logprobs))
        if any(w and seq.generated[-len(w) :] == w for w in seq.stop_words):
            return "STOP_WORDS"
        if len(seq.generated) >= seq.max_tokens:
            return "LENGTH"
        return None

    def _response(self, seq: _Seq, reason: str | None) -> _Response:
        start = seq.sent if seq.streaming else 0
        seq.sent = len(seq.generated)
        logprobs = None
        if seq.top_logprobs:
            logprobs, seq.pending_logprobs = seq.pending_logprobs, []
        final = reason is not None
        prompt, seq.prompt_entries = seq.prompt_entries, None
        return _Response([seq.generated[start:]], logprobs, seq.cum_logprob, reason, final, prompt_logprobs=prompt)

    def _beam_search(self, seq: _Seq) -> _Response:
        import torch

        gen = self._model.generate(
            torch.tensor([seq.prompt]),
            num_beams=seq.beam_width,
            num_return_sequences=seq.beam_width,
            max_new_tokens=seq.max_tokens,
            do_sample=False,
            eos_token_id=seq.end_id if seq.end_id >= 0 else None,
            pad_token_id=max(seq.end_id, 0),
            # as the Executor fake reads them (tests/fakes/tensorrt_llm/_runtime.py): executor.h's defaults
            length_penalty=seq.length_penalty if seq.length_penalty is not None else 0.0,
            early_stopping=early_stopping_hf(seq.early_stopping),
        )
        beams, reasons = [], []
        for row in gen[:, len(seq.prompt) :].tolist():
            ended = seq.end_id in row
            beams.append(row[: row.index(seq.end_id)] if ended else row)
            reasons.append("END_ID" if ended else "LENGTH")
        return _Response(beams, None, None, reasons, True)

    def _record_stats(self, started: float, new: int, finished: int) -> None:
        if not self.args.enable_iter_perf_stats:
            return
        used = sum(self._blocks(len(s.prompt) + len(s.generated)) for s in self._active)
        self._stats.append(
            json.dumps(
                {
                    "iter": self._iter,
                    "iterLatencyMS": (time.monotonic() - started) * 1000.0,
                    "numNewActiveRequests": new,
                    "numActiveRequests": len(self._active),
                    "numQueuedRequests": len(self._waiting),
                    "numCompletedRequests": finished,
                    "maxNumActiveRequests": self.args.max_batch_size,
                    "kvCacheStats": {
                        "maxNumBlocks": self.kv_blocks,
                        "freeNumBlocks": max(self.kv_blocks - used, 0),
                        "usedNumBlocks": used,
                        "tokensPerBlock": self.tokens_per_block,
                    },
                    **self._spec_stats(),
                }
            )
        )
        self._iter += 1

    def _spec_stats(self) -> dict:
        """``specDecodingStats`` of an iteration while speculation is configured (py_executor.py fills
        ``stats.specdec_stats`` from each scheduled request's draft tokens and ``py_num_accepted_draft_tokens``:
        acceptance length = (accepted + requests with drafts) / requests with drafts; the JSON names are
        cpp/include/tensorrt_llm/executor/types.h SpecDecodingStats')."""
        if self._spec is None or not self._spec.reports:  # _Speculation.reports
            return {}
        drafted, accepted, requests = self._iter_spec
        self._iter_spec = [0, 0, 0]
        return {
            "specDecodingStats": {
                "numDraftTokens": drafted,
                "numAcceptedTokens": accepted,
                "numRequestsWithDraftTokens": requests,
                "acceptanceLength": (accepted + requests) / requests if requests else 1.0,
                "iterLatencyMS": 0.0,
                "draftOverhead": 0.0,
            }
        }


def _tensor(ids):
    import torch

    return torch.tensor(ids)


def _stack(rows):
    import torch

    return torch.stack(rows)


def _advanced_sampling_status() -> str | None:
    from tensorrt_llm.llmapi.llm_args import _advanced_sampling_status as status

    return status()


class _Speculation:
    """The drafter of the LLM's ``speculative_config``: n-gram lookup (``NGramDecodingConfig``, the field
    descriptions of llm_args.py: the longest n-gram up to ``max_matching_ngram_size`` tokens that matched before,
    ``is_use_oldest`` "the oldest match when pattern is hit, the newest one ... if False", ``is_public_pool`` "a
    common pool for all requests, or the pool is private for each request"), a draft model
    (``DraftTargetDecodingConfig``: a Hugging Face checkpoint at ``speculative_model_dir``, drafting greedily), an
    EAGLE-3 draft head (``EagleDecodingConfig`` / ``Eagle3DecodingConfig``) or the checkpoint's MTP layers
    (``MTPDecodingConfig``), both run on the target's hidden states (``_spec_heads``).
    No drafts above ``max_concurrency`` requests ("speculation will be disabled at batch sizes above this value").

    ``one_model``: EAGLE-3 with ``eagle3_one_model`` (its default) and MTP run inside the target's engine and verify
    in their own worker (_torch/speculative/utils.py ``get_spec_worker``: MTPWorker, MTPEagleWorker,
    Eagle3OneModelWorker; id 13542650405), which takes the argmax of the target's logits for every token
    (``sample_and_accept_draft_tokens``, eagle3.py id 52274957693, mtp.py id 9034879030), unless
    ``allow_advanced_sampling`` is set where it is a prototype (llm_args.py: "allows non-greedy sampling ... Only
    applicable to 1-model code paths") or it is deprecated, sampling being per request since PR 14745. Sampled there,
    the fake draws the target's token at each position and keeps drafts while equal (main's llm_args.py
    ``use_rejection_sampling`` default: "exact-match verification on non-greedy batches"; which verification the
    prototype flag used was not read). Two-model EAGLE-3 drafts with the same head and verifies in the TorchSampler
    (``get_spec_decoder``: TorchSampler for EAGLE3), like the other drafters."""

    def __init__(self, config, active: list, draft_model=None, head=None) -> None:
        self.config, self._active, self._draft, self.head = config, active, draft_model, head
        kind = type(config).__name__
        self.one_model = kind == "MTPDecodingConfig" or (
            kind != "DraftTargetDecodingConfig" and head is not None and bool(config.eagle3_one_model)
        )
        status = _advanced_sampling_status()
        self.greedy_only = self.one_model and not (
            status == "deprecated" or (status == "prototype" and getattr(config, "allow_advanced_sampling", False))
        )
        # specDecodingStats: py_executor.py of the 1.1 line fills stats.specdec_stats only ``if spec_resource_manager
        # is not None``, and utils.py get_spec_resource_manager (id 13542650405) gives none to DRAFT_TARGET,
        # EAGLE3_ONE_MODEL and MTP_EAGLE_ONE_MODEL (without relaxed acceptance), one to NGRAM, EAGLE3 (two-model) and
        # MTP (vanilla); a later copy adds ``or has_spec_config`` (one-model), in a release not pinned, so the fake
        # keeps the older behaviour on every release
        self.reports = (
            kind == "NGramDecodingConfig"
            or (head is not None and not self.one_model)
            or (kind == "MTPDecodingConfig" and head.vanilla)
        )

    @classmethod
    def of(cls, config, active: list, target=None, hf_dir: str | None = None) -> _Speculation | None:
        from tensorrt_llm import _spec_heads

        if config is None:
            return None
        kind = type(config).__name__
        if kind == "DraftTargetDecodingConfig":
            return cls(config, active, _load_model(config.speculative_model_dir))
        if kind in ("EagleDecodingConfig", "Eagle3DecodingConfig"):
            return cls(
                config, active, head=_spec_heads.Eagle3Head(config.speculative_model_dir, target, _state.series())
            )
        if kind == "MTPDecodingConfig":
            return cls(config, active, head=_spec_heads.MtpHead(hf_dir, target, config))
        return cls(config, active)

    def feature(self, hidden_states):
        """What the head reads from the target at each position (None: no head)."""
        return None if self.head is None else self.head.feature(hidden_states)

    def propose(self, seq: _Seq, target) -> list[int]:
        cfg = self.config
        # read by the drafter only (py_executor.py of the 1.1 line: ``if self.drafter is not None``): the one-model
        # paths have none (utils.py get_spec_drafter)
        if cfg.max_concurrency is not None and not self.one_model and len(self._active) > cfg.max_concurrency:
            return []
        room = min(cfg.max_draft_len, seq.max_tokens - len(seq.generated) - 1)
        if room <= 0:
            return []
        if self._draft is not None:
            return self._draft_tokens(seq, room)
        if self.head is not None:  # the features of every position but the last token's (its state comes next step)
            tokens = seq.prompt + seq.generated
            return self.head.draft(tokens, _stack(seq.features[: len(tokens) - 1]), room)
        return self._lookup(seq, room)

    def _draft_tokens(self, seq: _Seq, k: int) -> list[int]:
        import torch

        ids = seq.prompt + seq.generated
        out: list[int] = []
        with torch.no_grad():
            for _ in range(k):
                logits = self._draft(input_ids=torch.tensor([ids + out])).logits[0, -1]
                out.append(int(torch.argmax(logits)))
        return out

    def _lookup(self, seq: _Seq, k: int) -> list[int]:
        cfg = self.config
        tokens = seq.prompt + seq.generated
        pools = [tokens]
        if cfg.is_public_pool:
            pools += [s.prompt + s.generated for s in self._active if s is not seq]
        for n in range(min(cfg.max_matching_ngram_size, len(tokens) - 1), 0, -1):
            pattern = tokens[-n:]
            found = []
            for pool in pools:
                end = len(pool) - n if pool is tokens else len(pool) - n + 1  # not the pattern itself
                found += [pool[i + n : i + n + k] for i in range(end) if pool[i : i + n] == pattern]
            found = [f for f in found if f]
            if found:
                return found[0] if cfg.is_use_oldest else found[-1]
        return []


def _beam_width_problem(seq: _Seq, max_beam_width: int) -> str | None:
    """Why the executor refuses a request's beam width (an error response for it), None when it runs. Up to PR 16620
    the width must equal ``max_beam_width`` ("Request beam width 1 is not equal to max_beam_width 8. This is not
    supported!", NVIDIA/TensorRT-LLM#7368 on 1.1.0rc1): on 1.0 and 1.1 an ``assert`` in the executor's request loop
    (added with beam search, PR 5333; executor_request_queue.py ``_validate_and_filter_requests`` on the 1.1 line),
    which ends the loop; from 1.2 ``PyExecutor._validate_request``'s ValueError, that request's RequestError (1.2-era
    test_beam_search.py ``test_smaller_beam_width``). PR 16620 (1.3.0rc26) refuses only a width above it, or below
    it with log probs ("variable/smaller beam width is not yet wired through the log-probs path")."""
    width = seq.beam_width
    if has("torch_only"):
        if width > max_beam_width:
            return f"Request beam width {width} exceeds max_beam_width {max_beam_width}. This is not supported!"
        if width < max_beam_width and seq.top_logprobs:
            return (
                f"Request beam width {width} is below max_beam_width {max_beam_width}, which log probs do not support"
            )
        return None
    if width == max_beam_width:
        return None
    message = f"Request beam width {width} is not equal to max_beam_width {max_beam_width}. This is not supported!"
    if _state.series() < (1, 2):
        raise AssertionError(message)
    return message


def _model_engine_max_seq_len(hf_dir: str, given: int | None, trust_remote_code: bool = False) -> int:
    """The executor's max_seq_len (PyTorchModelEngine ``_init_max_seq_len`` / ``_infer_max_seq_len_from_config``,
    model_engine.py, copies of the 1.x line and main): ``getattr`` on the model's ``pretrained_config``, which
    ``ModelConfig.from_pretrained`` loads with ``transformers.AutoConfig.from_pretrained`` (_torch/model_config.py),
    so attribute_map aliases such as GPT-2's ``n_positions`` count: ``max_position_embeddings`` (or its text_config's;
    2048 when neither says), times the RoPE scaling ``factor`` unless the type is su, longrope, llama3 or yarn; a
    larger ``max_seq_len`` given to the LLM is lowered to it with a warning. It lives in the worker: the LLM's own
    ``args.max_seq_len`` keeps what was passed (None when nothing was)."""
    import math

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    rope = getattr(config, "rope_scaling", None)
    scale = 1
    if rope and rope.get("type", rope.get("rope_type")) not in ("su", "longrope", "llama3", "yarn"):
        scale = rope.get("factor", 1.0)
    length = getattr(config, "max_position_embeddings", None)
    if length is None and hasattr(config, "text_config"):
        length = getattr(config.text_config, "max_position_embeddings", None)
    length = length or 2048
    if scale != 1:
        length = int(math.ceil(length * scale))
    if given is not None and given > length:
        print(f"Specified self.max_seq_len={given} is larger than what the model can support ({length}).", flush=True)
        return length
    return given or length


def _logprob_entry(logprobs, token: int, k: int | None) -> dict[int, Logprob]:
    """A generated token's entry: the sampled token's log prob only (k None: the TorchSampler before 1.2, PR 6097; the
    TRTLLMSampler, see the module docstring), else the top k (PR 7976)."""
    if k is None:  # 1.0's TorchSampler.handle_logits: {int(token): Logprob(logprob=logprob, rank=1)}
        return {token: Logprob(float(logprobs[token]), 1)}
    return _top_entry(logprobs, k)


def _top_entry(logprobs, k: int, token: int | None = None) -> dict[int, Logprob]:
    """The top ``k`` of one position, best first, plus ``token`` with its rank when it is not among them
    (tensorrt_llm/executor/result.py ``compute_logprobs``)."""
    import torch

    values, indices = torch.topk(logprobs, min(k, logprobs.numel()))
    entry = {int(i): Logprob(float(v), rank) for rank, (v, i) in enumerate(zip(values, indices), start=1)}
    if token is not None and token not in entry:
        entry[token] = Logprob(float(logprobs[token]), int((logprobs > logprobs[token]).sum()) + 1)
    return entry


def _random_model(hf_dir: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from lmi_trt.compat import dtype_kwargs

    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf_dir), **dtype_kwargs(torch.float32)).eval()


def _load_checkpoint(hf_dir: str):
    """The model the LLM serves: a plain HF checkpoint as the Executor fake loads it, or a modelopt FP8 one."""
    from pathlib import Path

    quant_file = Path(hf_dir) / "hf_quant_config.json"
    if not quant_file.is_file():
        return _load_model(hf_dir)
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from lmi_trt.compat import dtype_kwargs

    algo = json.loads(quant_file.read_text())["quantization"].get("quant_algo")
    if algo != "FP8":
        raise NotImplementedError(f"fake tensorrt_llm loads modelopt FP8 checkpoints only, not quant_algo={algo}")
    config = AutoConfig.from_pretrained(hf_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(torch.float32))
    state = {}
    for shard in sorted(Path(hf_dir).glob("*.safetensors")):
        state.update(load_file(shard))
    for name in [n for n in state if n.endswith(".weight_scale")]:
        weight = name[: -len("_scale")]
        state[weight] = state[weight].float() * state.pop(name).float()
    state = {n: t.float() for n, t in state.items() if not n.endswith(("_scale", ".k_scale", ".v_scale"))}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{hf_dir}: weights missing {sorted(set(missing) - tied)[:5]}, unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()
    return model.eval()
