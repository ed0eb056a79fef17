"""The torch engine's built-in decode loop for Llama-shaped models: continuous batching on its own
forward pass (``llama_decoder``) and sampler (``gpu_sampler``) over a paged KV cache (``kv_blocks``),
decode steps as CUDA graphs.

Memory. The KV cache is a pool of fixed-size blocks (``option.tokens_per_block``, 16 by default,
vLLM's default); each request holds the blocks its positions need, listed in its block table, and
takes another as it grows. The pool is sized in tokens: on CUDA from the device memory free once
the weights are loaded, on CPU for every request at full length, both capped by
``option.max_tokens_in_paged_kv_cache``. How many requests run at once is therefore set by the
tokens they hold, not by ``max_rolling_batch_size`` × the longest sequence.

One thread runs the loop. Each iteration it

1. frees the blocks and batch slots of requests that finished, were cancelled or failed;
2. plans one step under the ``max_num_tokens`` budget (vLLM's chunked-prefill scheduler, in
   vllm/v1/core/sched/scheduler.py, is the model): first a decode token for every request whose
   prompt is in the cache, then the next chunk of prompts being prefilled, oldest first, then new
   requests while a batch slot, budget and blocks are free. With ``option.enable_chunked_context``
   a prompt longer than what is left of the budget is cut into chunks over several steps (and
   ``max_num_tokens`` may be below ``max_input_len``), so a step, and the gap it puts between the
   running streams' tokens, is bounded by the budget whatever the prompts; without it a prompt
   runs whole (the first of a step even past the budget, by at most the decode tokens), as
   TensorRT-LLM does without chunked context. Requests resumed after preemption are recomputed
   in chunks either way;
3. launches it: a step of decode tokens only runs as the CUDA graph of the smallest captured
   batch size covering the highest slot in use (idle slots inside it write nothing and are
   ignored), which also advances its rows' positions and counts on the device, so the next step of
   the same rows uploads nothing; a step that carries prompt tokens runs eagerly, one forward pass over decode tokens
   and prompt chunks together (its shapes change every step; vLLM captures such steps as
   piecewise graphs around attention, docs/design/cuda_graphs.md, which would spare the host its
   ~200 launches, about as long as the device's 2,048-token step on an H100); requests whose
   prompt ends in the step sample their first token in it;
4. only then hands the tokens emitted last iteration to the event loop (which turns them into
   responses while this thread waits, not while it plans: both need the GIL), waits for the
   *previous* iteration's tokens (a pinned device→host copy and an event) and emits them.

The GPU therefore always has the next step queued while the host turns the last one into outputs;
the only synchronisation is that copy of finished tokens (benchmarks/gpu_syncs.py lists any other
call that waits for the device: one would let the device run dry). Stop conditions (EOS, stop sequences)
are seen one step late, so a finishing request costs one discarded token of work;
``max_new_tokens`` is known in advance and costs nothing. Multi-token bad words and grammars need
the newest token before the next step can ban anything, so while such a request decodes the loop
waits for each step before planning the next.

Out of blocks. A request that needs a block when none is free (none free, none cached to evict)
takes it from the most recently admitted request (vLLM v1's recompute preemption): that request's
tokens so far are delivered, its blocks released, and it goes back to the front of the queue with
its prompt and generated tokens as the prompt to prefill; its stream simply continues. New
requests are admitted only while a small reserve of blocks stays free (a watermark of 1 %).

Prefix caching (``option.enable_kv_cache_reuse``). Full blocks of prompts are registered under a
key naming their tokens and everything before them as the step that computes them is planned (so
a request later in the same step reuses them: each layer writes the step's keys before it reads
any), and a finished request's full blocks are registered too; a new request starts from the
longest cached prefix of its prompt (less the last token, whose logits it needs) and computes the
rest. Released blocks stay cached until evicted, least recently used first (see ``kv_blocks``).

Beam search (``beams``). A request with ``beam_width`` k is admitted, in its turn in the queue, when k batch
slots and the blocks every beam could need at once are free (set aside for it, so it is never preempted and
never preempts); its slots stay idle in the CUDA-graph decode steps. Each iteration, after the other rows'
step, every beam request advances one token eagerly: its k beams (at first its prompt) in one forward pass,
their log-probs read back, the next beams chosen by ``beams.BeamSearch``; each new beam takes its parent's
block table, so the beams share the prompt's blocks and whatever else they have in common, and a beam about
to write into a block another beam still reads copies it first (every layer's k and v). Its beams come back
whole in its one final output.

Failures: a row whose logits are NaN/inf or whose every token is banned ends with an error, the
rest of its batch carries on (the sampler reports a status per row). An exception in a step with
prompt tokens fails the requests whose prompts were in it, and the step's decode tokens run again
alone; in a decode step, the requests in that step; the engine lives on. An exception elsewhere in
the loop marks the engine unhealthy.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..adapters import LoraAdapter
from ..base import MAX_TOP_LOGPROBS, Beam, EngineError, EngineOutput, FinishReason, TokenDelta, error_output
from ..guided import allowed_tokens
from ..lora_sizes import buffer_bytes
from . import decode_kernels
from .backend import (
    EXCLUDED,
    Host,
    QueuedBackend,
    Slot,
    banned_next_tokens,
    default_max_num_tokens,
    excluded_field,
    finish_reason,
)
from .beams import BeamSearch
from .gpu_sampler import Mode, SamplerState, row_mode, sample, top_logprobs
from .host_copies import Downloads
from .kv_blocks import BlockPool
from .llama_decoder import LAYOUT, Batch, LlamaDecoder, batch_layout, unsupported_reason
from .speculation import DEFAULT_MAX_CONCURRENCY, Drafting, NgramIndex, position_rows, verify

log = logging.getLogger(__name__)

DECODE_LOOPS = ("auto", "builtin", "transformers")
# vLLM's default block size on CUDA (vllm/platforms/cuda.py, check_and_update_config); option.tokens_per_block
# sets another.
DEFAULT_BLOCK_SIZE = 16
# Fraction of the free device memory the KV cache, the per-slot sampling state and the step's
# activations may take; the rest is left for CUDA graphs and the allocator's slack.
_MEMORY_FRACTION = 0.85
# Blocks kept free when admitting a request, so that running ones can grow without preempting it
# at once: vLLM's watermark ("to avoid frequent preemptions", vllm/v1/core/kv_cache_manager.py),
# at the 1 % its v0 block manager defaulted to (vllm/core/block_manager.py; v1 defaults to 0).
_WATERMARK = 0.01
_NAN_LOGITS, _EXCLUDED_STATUS = 1, 2  # gpu_sampler.sample's row status


def choose_decode_loop(requested: str, batching: str, model: torch.nn.Module, max_seq_len: int) -> tuple[bool, str]:
    """Pure: run the built-in loop? and the sentence saying why (logged at startup)."""
    if requested not in DECODE_LOOPS:
        raise EngineError(f"option.torch_decode_loop={requested!r} is not one of {', '.join(DECODE_LOOPS)}", code=400)
    if requested == "transformers":
        return False, "option.torch_decode_loop=transformers"
    if requested == "auto" and batching != "auto":
        return False, f"option.torch_batching={batching} asks for a transformers batching path"
    problem = unsupported_reason(model, max_seq_len)
    if problem is None:
        return True, f"{type(model).__name__} is Llama-shaped (option.torch_decode_loop={requested})"
    if requested == "builtin":
        raise EngineError(
            f"option.torch_decode_loop=builtin cannot serve this model: {problem}; "
            "set option.torch_decode_loop=auto or transformers",
            code=400,
        )
    return False, f"the built-in decode loop cannot serve it: {problem}"


def plan_blocks(
    *,
    block_bytes: int,
    block_size: int,
    max_seq_len: int,
    slots: int,
    caching: bool,
    free_bytes: int | None,
    reserved_bytes: int,
    max_tokens: int | None,
) -> tuple[int, str]:
    """Pure: how many KV blocks the pool gets, and what set that number (logged). On CUDA what
    fits in the free memory after the step's own needs (``reserved_bytes``), no more than every
    slot at full length unless the blocks are kept for prefix caching; on CPU (``free_bytes``
    None) every slot at full length; both capped by ``max_tokens``
    (option.max_tokens_in_paged_kv_cache). At least one sequence of ``max_seq_len`` must fit."""
    per_sequence = -(-max_seq_len // block_size)
    everyone = slots * per_sequence, "every request at its full length"
    if free_bytes is None:
        blocks, why = everyone
    else:
        fits = max(0, int((free_bytes * _MEMORY_FRACTION - reserved_bytes) // block_bytes))
        blocks, why = fits, f"{_MEMORY_FRACTION:.0%} of the free device memory, less the steps' needs"
        if not caching and everyone[0] < blocks:
            blocks, why = everyone
    if max_tokens is not None and (free_bytes is None or max_tokens // block_size < blocks):
        blocks, why = max_tokens // block_size, f"option.max_tokens_in_paged_kv_cache={max_tokens}"
    if blocks < per_sequence:
        raise EngineError(
            f"the KV cache holds {blocks * block_size} tokens ({why}), fewer than one sequence of "
            f"option.max_input_len + option.max_output_len = {max_seq_len} tokens: raise "
            "option.max_tokens_in_paged_kv_cache (or free device memory), or lower the lengths",
            code=400,
        )
    return blocks, why


def graph_batch_sizes(slots: int) -> list[int]:
    """Pure: the batch sizes captured as CUDA graphs (a step runs the smallest one that fits)."""
    sizes = {b for b in (1, 2, 4, 8) if b < slots} | set(range(16, slots, 16)) | {slots}
    return sorted(sizes)


@dataclass(eq=False)
class _Row:
    """A request of the loop, from admission to its end (across preemptions)."""

    slot: Slot
    prompt: list[int]
    single_bad: list[int]
    multi_bad: list[list[int]]
    seed: int
    index: int = -1  # its batch slot while admitted
    seq: list[int] = field(default_factory=list)  # tokens to prefill: the prompt, or prompt + generated when resumed
    filled: int = 0  # positions whose k and v are written (or being written by a launched step)
    launched: int = 0  # tokens whose sampling has been launched (delivered or in flight)
    blocks: list[int] = field(default_factory=list)  # its block table
    keys: list[bytes] = field(default_factory=list)  # prefix keys of seq's first full blocks
    registered: int = 0  # leading blocks findable in the prefix cache
    broken: bool = False  # a failed step wrote its cache: never register its blocks
    drafting: Drafting | None = None  # its speculation state, when speculation is on
    lora: int = -1  # the LoRA slot of its adapter while admitted (-1: the base model)

    def __post_init__(self) -> None:
        self.seq = list(self.prompt)
        sampling = self.slot.sampling
        # Read every step, so computed once: the mode once min_new_tokens is behind it, ...
        # The prefix cache keys an adapter's blocks apart from the base model's and other adapters'.
        self.salt = self.slot.adapter.key if self.slot.adapter is not None else b""
        self.settled = row_mode(
            sampling, sampling.min_new_tokens, bool(self.single_bad or self.multi_bad or self.slot.matcher is not None)
        )
        self.min_new, self.max_new = sampling.min_new_tokens, sampling.max_new_tokens
        # ... whether its next step's bans depend on the token it generated last, and whether a
        # step needs anything for it beyond its token (bans, top log-probs, a logit bias).
        self.needs_newest = bool(self.multi_bad) or self.slot.matcher is not None
        self.top_k, self.logprobs = sampling.top_logprobs, sampling.logprobs  # what its outputs carry
        self.plain = not (self.needs_newest or sampling.top_logprobs or sampling.logit_bias)

    @property
    def done(self) -> bool:
        return self.slot.finished or self.slot.cancelled or self.slot.closed

    def decodable(self) -> bool:
        return not self.done and self.filled >= len(self.seq) and self.launched < self.max_new

    def mode(self) -> Mode:
        if self.launched >= self.min_new:
            return self.settled
        return max(self.settled, Mode.PROCESSED)


@dataclass
class _Launch:
    """A step on its way: which row each output column belongs to, and the tokens' host copy."""

    rows: list[_Row | None]
    # [3, n] f32: token, raw log-probability, status; with top log-probs 2 * MAX_TOP_LOGPROBS more
    # rows (gpu_sampler.top_logprobs). A verification step has ``width`` positions per row (n = rows ×
    # width) and a fourth row, the tokens each row emits (on its first position), before the top ones.
    host: torch.Tensor
    event: torch.cuda.Event | None = None
    width: int = 1
    proposed: list[int] | None = None  # a verification step: the drafts each row proposed


@dataclass
class _Proposal:
    """A step's drafting, per decoding row: drafts to verify, their tokens (n-gram; the draft model's
    are drafted on the device), and tokens the draft model reads first (its backlog)."""

    counts: list[int] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    catch_up: list[int] = field(default_factory=list)


@dataclass
class _Step:
    """What one step computes: a token for each decoding row, then prompt chunks (row, first position, count)."""

    decode: list[_Row] = field(default_factory=list)
    chunks: list[tuple[_Row, int, int]] = field(default_factory=list)
    keyed: list[int] = field(default_factory=list)  # blocks registered while planning it (undone if it fails)


@dataclass(eq=False)
class _BeamGroup:
    """A beam-search request: ``width`` batch slots, and KV blocks set aside for it at admission (enough for
    every beam at full length), so that it never preempts or is preempted. The beams share the prompt's
    blocks, and any full block they have in common; a beam that writes into a block another beam still
    reads gets its own copy first (copy-on-write). ``refs`` counts the beams holding each block."""

    slot: Slot
    search: BeamSearch
    indices: list[int]  # its batch slots (idle in every decode step: nothing else runs in them)
    spare: list[int]  # blocks set aside and not in use
    owned: list[int]  # every block set aside (released at the end)
    tables: list[list[int]] = field(default_factory=list)  # per running beam
    tokens: list[int] = field(default_factory=list)  # per running beam: its newest token, the next input
    refs: dict[int, int] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.slot.finished or self.slot.cancelled or self.slot.closed


class DecodeLoopBackend(QueuedBackend):
    """The ``Backend`` of ``TorchEngine`` that runs the built-in loop (see the module docstring)."""

    name = "decode_loop"

    def __init__(self, engine: Host, model: torch.nn.Module, draft: torch.nn.Module | None = None) -> None:
        """``draft``: the draft model of draft-model speculation (engine.speculative says which runs)."""
        self._engine = engine
        self._device = model.device
        self._cuda = self._device.type == "cuda"
        self._max_seq = engine.max_input_len + engine.max_new_tokens
        self._budget = engine.max_num_tokens or default_max_num_tokens(engine.max_batch_size, engine.max_input_len)
        self._chunked = engine.enable_chunked_context
        self.slots = engine.max_batch_size
        block_size = engine.tokens_per_block or DEFAULT_BLOCK_SIZE
        vocab = model.lm_head.out_features
        config = model.config
        free = None
        if self._cuda:
            torch.cuda.set_device(self._device)
            free = torch.cuda.mem_get_info(self._device)[0]
        position_bytes = LlamaDecoder.block_bytes(model, 1)
        # Step activations (hidden, q/k/v, MLP), the per-slot sampling state and a few fp32
        # [slots, vocab] temporaries; the torch attention path also gathers one layer's rows.
        reserved = self._budget * (6 * config.hidden_size + 3 * config.intermediate_size) * 2 * 2
        reserved += self.slots * (SamplerState.bytes_per_slot(vocab) + 16 * vocab)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        if not decode_kernels.available(self._device, head_dim):
            reserved += 2 * self.slots * self._max_seq * position_bytes // config.num_hidden_layers
        spec = self._spec = engine.speculative
        self._draft_len = spec.max_draft_len if spec is not None else 0
        # Requests above which no step drafts; a verification step's per-position sampler temporaries
        # (counts, bans, scores: fp32 [rows × (k + 1), vocab], a handful of them).
        self._spec_limit = min(self.slots, (spec.max_concurrency or DEFAULT_MAX_CONCURRENCY) if spec else 0)
        reserved += self._spec_limit * (self._draft_len + 1) * vocab * 4 * 8
        lora_slots = engine.max_loras if engine.enable_lora else 0
        # LoRA: the stacked adapter buffers, and each step's [tokens, slots × rank] low-rank activations.
        itemsize = torch.empty(0, dtype=model.dtype).element_size()
        reserved += buffer_bytes(config, lora_slots, engine.max_lora_rank, itemsize)
        reserved += self._budget * 3 * lora_slots * engine.max_lora_rank * itemsize * 2
        # The draft model's cache shares the target's block tables: a block holds both models' k and v.
        block_bytes = LlamaDecoder.block_bytes(model, block_size)
        if draft is not None:
            block_bytes += LlamaDecoder.block_bytes(draft, block_size)
        num_blocks, sized_by = plan_blocks(
            block_bytes=block_bytes,
            block_size=block_size,
            max_seq_len=self._max_seq,
            slots=self.slots,
            caching=engine.enable_kv_cache_reuse,
            free_bytes=free,
            reserved_bytes=reserved,
            max_tokens=engine.max_tokens_in_paged_kv_cache,
        )
        self._pool = BlockPool(num_blocks, block_size, caching=engine.enable_kv_cache_reuse)
        self._watermark = int(_WATERMARK * num_blocks)
        self._decoder = LlamaDecoder(
            model,
            num_blocks=num_blocks,
            block_size=block_size,
            max_seq_len=self._max_seq,
            lora=(lora_slots, engine.max_lora_rank) if lora_slots else None,
        )
        self._drafter = (
            LlamaDecoder(draft, num_blocks=num_blocks, block_size=block_size, max_seq_len=self._max_seq)
            if draft is not None
            else None
        )
        # LoRA adapters: max_loras slots of stacked weights (lora.py); per batch slot, the LoRA slot its row reads
        # (-1: the base model), which the LoRA decode graphs read at a fixed address; per LoRA slot, the adapter it
        # holds, the rows using it, and when it was last taken (the least recently used free one is replaced).
        self._lora = self._decoder.lora
        self._lora_of = torch.full((self.slots,), -1, dtype=torch.long, device=self._device)
        self._lora_held: list[LoraAdapter | None] = [None] * lora_slots
        self._lora_users = [0] * lora_slots
        self._lora_taken = [0] * lora_slots
        self._downloads = Downloads()  # where each step's tokens come back
        # One slot more than requests: the slot a verification step's padding rows point at.
        self._state = SamplerState(self.slots + 1, vocab, self._device, engine.eos_token_ids)
        self._width = -(-self._max_seq // block_size)  # block-table entries per slot
        # Device buffers the decode graphs read and write at fixed addresses. The tables have spare
        # entries (block 0) past a slot's last: a verification step's padding queries read there.
        spare = -(-self._draft_len // block_size) + 1 if spec else 0
        self._tables = torch.zeros(self.slots + 1, self._width + spare, dtype=torch.long, device=self._device)
        self._next = torch.zeros(self.slots + 1, dtype=torch.long, device=self._device)  # next input token per slot
        # Per slot: position, live (< 0: idle, nothing written), context, tokens generated. (On the host: an
        # idle slot's, the template of each decode step's.) A decode step advances its live slots' position,
        # context and count by one (``_step``), so a step of the same rows as the last one uploads nothing.
        self._idle_meta = torch.tensor([[0], [-1], [1], [0]]).repeat(1, self.slots)
        self._meta = self._idle_meta.to(self._device, copy=True)
        self._step = torch.tensor([[1], [0], [1], [1]], device=self._device)
        # The last decode step's rows, columns and what it ran, while ``_meta`` holds those rows' state (after it):
        # (rows, columns, size, settled mode, rows needing more than a token, some row uses LoRA, steps left
        # before every row is past min_new_tokens). None once any other step or a failure may have moved them.
        self._decoded: tuple | None = None
        self._out = torch.zeros(3 + 2 * MAX_TOP_LOGPROBS, self.slots, dtype=torch.float32, device=self._device)
        self._arange = torch.arange(self.slots, device=self._device)
        self._pad = torch.zeros(1, dtype=torch.long)  # on the host: _upload's padding
        self._ones, self._zeros = torch.ones_like(self._arange), torch.zeros_like(self._arange)
        self._sizes = graph_batch_sizes(self.slots) if self._cuda else []
        self._graphs: dict[tuple[int, Mode], torch.cuda.CUDAGraph] = {}
        # With LoRA, the decode steps some row of which uses an adapter (lora.py's kernels); the others replay
        # ``_graphs``, the base model's, so base-only steps cost what they cost without option.enable_lora.
        self._lora_graphs: dict[tuple[int, Mode], torch.cuda.CUDAGraph] = {}
        # Verification steps (speculation): rows packed at positions 0..n-1, each with k + 1 tokens,
        # read from these buffers; a padding row points at the spare slot and proposes -1 drafts.
        limit, width = max(self._spec_limit, 1), self._draft_len + 1
        self._spec_index = torch.full((limit,), self.slots, dtype=torch.long, device=self._device)  # its slot
        # Per row: its first position, the drafts it proposes (-1: padding), the tokens it generated so far.
        self._spec_plan = torch.tensor([[0], [-1], [0]], device=self._device).repeat(1, limit)
        self._spec_drafts = torch.zeros(limit, max(self._draft_len, 1), dtype=torch.long, device=self._device)
        self._spec_out = torch.zeros(4, limit, width, dtype=torch.float32, device=self._device)
        self._spec_j = torch.arange(width, device=self._device)
        self._spec_start = torch.arange(limit, device=self._device) * width
        self._spec_len = torch.full((limit,), width, dtype=torch.long, device=self._device)
        self._spec_pad = torch.arange(limit * width, device=self._device)
        self._spec_sizes = graph_batch_sizes(self._spec_limit) if self._cuda and spec is not None else []
        self._spec_tiles = {size: self._tile_plan(size) for size in self._spec_sizes}
        self._spec_graphs: dict[tuple[int, Mode], torch.cuda.CUDAGraph] = {}
        if self._cuda:
            self._capture()
        # Where the loop's time goes (read by benchmarks): steps launched and what they carried,
        # seconds spent waiting for the device and on the host; and what /metrics reports (stats()).
        self.counters = {
            "prefill_steps": 0,  # steps with prompt tokens
            "mixed_steps": 0,  # steps with prompt tokens and decode tokens
            "decode_steps": 0,  # steps with decode tokens only
            "largest_step": 0,  # tokens
            "decode_rows": 0,
            "prompt_tokens": 0,
            "wait_s": 0.0,
            # Host seconds (these and wait_s include time waiting for the GIL): planning steps,
            # launching them, turning their tokens into outputs for the event loop.
            "plan_s": 0.0,
            "launch_s": 0.0,
            "emit_s": 0.0,
            "peak_rows": 0,
            "num_preemptions": 0,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            # Speculation, vLLM's figures (vllm/v1/spec_decode/metrics.py SpecDecodingStats): drafts
            # verified (a row's proposal in a step), draft tokens in them, drafts kept; and steps.
            "spec_decode_num_drafts": 0,
            "spec_decode_num_draft_tokens": 0,
            "spec_decode_num_accepted_tokens": 0,
            "verify_steps": 0,
            "lora_takes": 0,  # rows admitted with an adapter
        }
        self.accepted_per_position = [0] * self._draft_len  # drafts kept at each draft position
        self._free = list(range(self.slots - 1, -1, -1))  # pop() hands out the lowest slot
        self._rows: list[_Row] = []  # admitted, in admission order (the preemption order, reversed)
        self._beams: list[_BeamGroup] = []  # beam-search requests running (each advanced eagerly per iteration)
        self._waiting: deque[_Row] = deque()  # preempted, to resume before any new request
        # Block-table entries (slot, entry) → block not yet on the device; a dict, so that a slot
        # handed to another request in the same step keeps only its last value (a scatter with
        # repeated indices writes any of them).
        self._table_writes: dict[tuple[int, int], int] = {}
        self._inflight: list[_Launch] = []
        self._outbox: list[tuple[Slot, EngineOutput | TokenDelta]] = []  # emitted, not yet handed to the event loop
        log.info(
            "built-in decode loop: KV cache of %d blocks of %d tokens = %d tokens (%.2f GiB, %s), "
            "%d sequences of the full %d positions; up to %d requests at once, %d tokens per step, "
            "prefix caching %s, %s, %s; %s",
            num_blocks,
            block_size,
            num_blocks * block_size,
            num_blocks * LlamaDecoder.block_bytes(model, block_size) / 2**30,
            sized_by,
            num_blocks * block_size // self._max_seq,
            self._max_seq,
            self.slots,
            self._budget,
            "on" if engine.enable_kv_cache_reuse else "off",
            f"CUDA graphs for batch sizes {self._sizes}" if self._cuda else "eager (no CUDA graphs on CPU)",
            "Triton kernels" if self._decoder.fused_kernels else "torch operations only",
            self._speculation_line(draft),
        )
        self._start("torch-engine-decode-loop")

    def _speculation_line(self, draft: torch.nn.Module | None) -> str:
        spec = self._spec
        if spec is None:
            return "no speculative decoding"
        if draft is not None:
            drafter = (
                f"a draft model ({type(draft).__name__}, {sum(p.numel() for p in draft.parameters()):,} parameters)"
            )
        else:
            look = "the first" if spec.use_oldest else "the latest"  # unset: the latest, this engine's default
            drafter = (
                f"n-gram prompt lookup ({look} match of the last {spec.min_matching_ngram_size}–"
                f"{spec.max_matching_ngram_size} tokens)"
            )
        graphs = f"verification steps as CUDA graphs for {self._spec_sizes} requests" if self._spec_sizes else "eager"
        limit = f"{spec.key('max_concurrency')}" if spec.max_concurrency else "the default"
        return (
            f"speculative decoding: {drafter}, up to {spec.max_draft_len} draft tokens a step, in steps of at most "
            f"{self._spec_limit} requests ({limit}), {graphs}"
        )

    def stats(self) -> dict[str, float]:
        """KV-cache and scheduler figures for /metrics (read on the event loop: plain numbers)."""
        pool = self._pool
        return {
            "kv_cache_max_blocks": float(pool.num_blocks),
            "kv_cache_used_blocks": float(pool.used),
            "kv_cache_free_blocks": float(pool.free),
            "kv_cache_block_size": float(pool.block_size),
            "prefix_cache_blocks": float(pool.cached),
            "num_preemptions": float(self.counters["num_preemptions"]),
            "prefix_cache_queries": float(self.counters["prefix_cache_queries"]),
            "prefix_cache_hits": float(self.counters["prefix_cache_hits"]),
            # Requests holding blocks now, and the most at once (the pool, not the slots, sets it).
            "running_requests": float(len(self._rows)),
            "peak_running_requests": float(self.counters["peak_rows"]),
        } | self._speculation_stats()

    def _speculation_stats(self) -> dict[str, float]:
        if self._spec is None:
            return {}
        names = ("spec_decode_num_drafts", "spec_decode_num_draft_tokens", "spec_decode_num_accepted_tokens")
        out = {name: float(self.counters[name]) for name in names}
        out |= {
            f"spec_decode_num_accepted_tokens_per_pos_{i}": float(n) for i, n in enumerate(self.accepted_per_position)
        }
        return out

    # -- the device steps ------------------------------------------------------------------------

    def _decode_batch(self, size: int, max_context: int | None = None, lora: bool = False) -> Batch:
        """Slots ``0..size-1`` one token each, read from the fixed buffers (graph-capturable); ``lora``: with
        each slot's adapter (``_lora_of``), else the base model's pass."""
        rows, block = self._arange[:size], self._pool.block_size
        positions = self._meta[0, :size]
        # Each live slot's cache slot, from its block table (written before the step): an idle one writes nothing.
        cells = self._tables[:size].gather(1, (positions // block).unsqueeze(1)).squeeze(1) * block + positions % block
        return Batch(
            tokens=self._next[:size],
            positions=positions,
            slots=torch.where(self._meta[1, :size] >= 0, cells, -1),
            seq_start=rows,
            seq_len=self._ones[:size],
            context=self._meta[2, :size],
            tables=self._tables[:size],
            tile_seq=rows,
            tile_row=self._zeros[:size],
            max_q=1,
            max_context=max_context or self._width * self._pool.block_size,
            lora=self._lora_of[:size] if lora else None,
        )

    def _decode_step(
        self,
        size: int,
        mode: Mode,
        top: bool = False,
        bias: torch.Tensor | None = None,
        max_context: int | None = None,
        lora: bool = False,
    ) -> None:
        """Everything a decode step does on the device, for slots ``0..size-1`` (graph-capturable).
        ``top``: also the top log-probs; ``bias``: logit_bias per slot (eager steps only: few
        requests ask, the graphs stay lean); ``lora``: some row uses an adapter."""
        logits = self._decoder.forward(self._decode_batch(size, max_context, lora))
        valid = self._meta[1, :size] >= 0
        tokens, logprobs, status = sample(
            logits, self._state.rows(slice(0, size)), self._meta[3, :size], self._state.eos, mode, bias
        )
        self._record(self._arange[:size], tokens, valid)
        self._out[:3, :size] = torch.stack((tokens.float(), logprobs, status.float()))
        if top:
            self._out[3:, :size] = top_logprobs(logits, MAX_TOP_LOGPROBS)
        self._meta[:, :size] += self._step * valid  # the live slots' next position, context and count

    def _tile_plan(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The attention programs of a verification step of ``size`` rows of k + 1 tokens."""
        width = self._draft_len + 1
        tiles = decode_kernels.tile_plan([width] * size, self._decoder.group, decode_kernels.config_for(width))
        return tuple(torch.tensor(t, dtype=torch.long, device=self._device) for t in tiles)

    def _spec_step(
        self, size: int, mode: Mode, top: bool = False, bias: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Everything a verification step does on the device, for packed rows ``0..size-1`` of the
        ``_spec_*`` buffers (graph-capturable): the last token and the drafts of each row through the
        model, the target's token at each position (``speculation.verify``), the emitted tokens
        recorded in the slot's history and its next input. Padding positions (past a row's drafts)
        write no cache and their tokens are never kept. Returns the top log-probs of every position
        with ``top`` (eager steps only)."""
        width, size_block = self._draft_len + 1, self._pool.block_size
        index = self._spec_index[:size]
        first, proposed, generated = self._spec_plan[:, :size]
        drafts = self._spec_drafts[:size, : self._draft_len]
        j = self._spec_j
        # Padding positions past the sequence limit read its last table entry and rotary row (never kept).
        at = (first.unsqueeze(1) + j).clamp(max=self._max_seq - 1)
        tables = self._tables[index]
        cells = tables.gather(1, at // size_block) * size_block + at % size_block
        kept = j.unsqueeze(0) <= proposed.unsqueeze(1)
        tiles = self._spec_tiles.get(size) or self._tile_plan(size)
        logits = self._decoder.forward(
            Batch(
                tokens=torch.cat((self._next[index].unsqueeze(1), drafts), 1).flatten(),
                positions=at.flatten(),
                slots=torch.where(kept, cells, -1).flatten(),
                seq_start=self._spec_start[:size],
                seq_len=self._spec_len[:size],
                context=first + width,
                tables=tables,
                tile_seq=tiles[0],
                tile_row=tiles[1],
                max_q=width,
                max_context=self._width * size_block,
                pad_index=self._spec_pad[: size * width],
            )
        )
        each = index.unsqueeze(1).expand(size, width).flatten()  # every position's slot
        rows = None if mode == Mode.GREEDY else position_rows(self._state.rows(each), drafts, proposed)
        position_generated = (generated.unsqueeze(1) + j).flatten()
        tokens, logprobs, status, emitted = verify(
            logits, rows, drafts, proposed, position_generated, self._state.eos, mode, bias
        )
        # The emitted tokens join the slot's history, the last one is its next input (real rows only).
        real = proposed >= 0
        last = tokens.gather(1, (emitted - 1).unsqueeze(1)).squeeze(1)
        self._next[index] = torch.where(real, last, self._next[index])
        taken = (j.unsqueeze(0) < emitted.unsqueeze(1)) & real.unsqueeze(1)
        vocab = self._state.vocab
        self._state.counts.view(-1).scatter_add_(
            0, (index.unsqueeze(1) * vocab + tokens).flatten(), taken.flatten().float()
        )
        out = self._spec_out[:, :size]
        out[0], out[1], out[2] = tokens.float(), logprobs, status.float()
        out[3] = emitted.unsqueeze(1).float()
        return top_logprobs(logits, MAX_TOP_LOGPROBS) if top else None

    def _record(self, slots: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor) -> None:
        """The sampled token becomes the slot's next input and joins its history (valid rows only)."""
        self._next[slots] = torch.where(valid, tokens, self._next[slots])
        self._state.counts[slots, tokens] += valid.float()

    def _warm_mixed(self) -> None:
        """An eager pass shaped like a mixed step (a decode token beside a prompt chunk) writing
        only the scratch block: the kernels of such steps compile now, not in the first
        requests' time to first token."""
        scratch = [self._pool.num_blocks] * self._width
        spans = [(scratch, 0, 1), (scratch, 0, 64)]
        layout, sizes = batch_layout(spans, self._pool.block_size, self._decoder.group)
        parts = layout | {"tokens": torch.zeros(65, dtype=torch.long)}
        if self._lora is not None:  # the LoRA expand kernel's variants too (no row's adapter: adds zeros)
            parts["lora"] = torch.full((65,), -1, dtype=torch.long)
        device = self._upload(parts)
        # As wide as the real steps' tables: Triton specializes on their stride too.
        tables = torch.full((2, self._tables.size(1)), self._pool.num_blocks, device=self._device)
        self._decoder.forward(Batch(tokens=device.pop("tokens"), tables=tables, **device, **sizes))

    def _capture(self) -> None:
        with torch.inference_mode():
            self._warm_mixed()
            pool = self._capture_steps(self._decode_step, self._sizes, self._graphs, "decode", None)
            if self._lora is not None:
                lora_step = functools.partial(self._decode_step, lora=True)
                pool = self._capture_steps(lora_step, self._sizes, self._lora_graphs, "LoRA decode", pool)
            # The verification buffers hold padding rows only: capturing writes nothing.
            self._capture_steps(self._spec_step, self._spec_sizes, self._spec_graphs, "verification", pool)

    def _capture_steps(self, step, sizes: list[int], graphs: dict, what: str, pool):
        """A CUDA graph of ``step(size, mode)`` for each size and mode, into ``graphs``; a mode that
        cannot be captured runs eagerly (slower, still correct). Returns the memory pool, shared."""
        if not sizes:
            return pool
        for mode in Mode:  # warm-up: cuBLAS handles and lazy initialisation stay out of capture
            step(sizes[-1], mode)
        torch.cuda.synchronize()
        for mode in Mode:
            for size in reversed(sizes):  # largest first: smaller graphs reuse its memory
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                        step(size, mode)
                except RuntimeError:
                    log.warning(
                        "built-in decode loop: %s %s steps cannot be captured as CUDA graphs",
                        mode.name,
                        what,
                        exc_info=True,
                    )
                    torch.cuda.synchronize()
                    break
                pool = graph.pool()
                graphs[size, mode] = graph
        torch.cuda.synchronize()
        return pool

    def _put(self, values) -> torch.Tensor:
        cpu = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
        if self._cuda:
            return cpu.pin_memory().to(self._device, non_blocking=True)
        return cpu

    def _upload(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host int64 tensors to the device in one copy, each starting 16 bytes apart: Triton
        compiles a kernel once per alignment of its pointer arguments (triton/runtime/jit.py,
        ``specialize_impl``), so unaligned parts would compile new variants in the middle of serving."""
        lengths = [len(v) for v in parts.values()]
        pieces = []  # one concatenation on the host: each part, and a zero after an odd one
        for v, n in zip(parts.values(), lengths):
            pieces += (v, self._pad) if n % 2 else (v,)
        packed = self._put(torch.cat(pieces)).split([n + n % 2 for n in lengths])
        return {name: part[:n] for (name, part), n in zip(zip(parts, packed), lengths)}

    def _to_host(self, out: torch.Tensor, rows: list[_Row | None]) -> _Launch:
        if not self._cuda:
            return _Launch(rows, out.clone())
        host = self._downloads.take(out.shape, out.dtype)
        host.copy_(out, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return _Launch(rows, host, event)

    def _bias(self, rows: Sequence[_Row | None]) -> torch.Tensor | None:
        """[len(rows), vocab] logit_bias of a step's rows, or None when no row has one."""
        if not any(r is not None and r.slot.sampling.logit_bias for r in rows):
            return None
        dense = torch.zeros(len(rows), self._state.vocab)
        for i, r in enumerate(rows):
            if r is not None and r.slot.sampling.logit_bias:
                ids, values = zip(*r.slot.sampling.logit_bias)
                dense[i, list(ids)] = torch.tensor(values)
        return self._put(dense)

    def _step_bans(self, rows: Sequence[_Row], value: bool) -> None:
        """Set (before a step) or clear (after it) the bans of multi-token bad words whose prefix
        ends the row's context, transformers' NoBadWordsLogitsProcessor rule, and of every token a
        constrained row's grammar cannot take next."""
        guided = [r for r in rows if r.slot.matcher is not None]
        if guided:
            index = self._put([r.index for r in guided])
            if value:
                allowed = allowed_tokens([r.slot.matcher for r in guided], self._state.vocab)
                self._state.banned_now[index] = ~allowed.to(self._device)
            else:
                self._state.banned_now.index_fill_(0, index, False)  # a Python value: no wait for the device
        rows = [r for r in rows if r.multi_bad]
        if rows:
            bans = [banned_next_tokens(r.prompt + r.slot.generated, r.multi_bad) for r in rows]
            self._state.mark(self._state.banned_now, [r.index for r in rows], bans, value)

    def _write_tables(self) -> None:
        """Block-table entries assigned since the last step, to the device in one scatter."""
        if self._table_writes:
            writes = [(slot, entry, block) for (slot, entry), block in self._table_writes.items()]
            slot, entry, block = self._put(list(zip(*writes)))
            self._tables[slot, entry] = block
            self._table_writes = {}

    def _launch_mixed(self, step: _Step) -> _Launch | None:
        """An eager step of decode tokens and prompt chunks; rows whose prompt ends in it sample
        their first token. None when no row samples (chunks of longer prompts only)."""
        self._decoded = None  # its decode rows advance on the host only
        decode, chunks = step.decode, step.chunks
        spans = [(r.blocks, r.filled, 1) for r in decode] + [(row.blocks, first, count) for row, first, count in chunks]
        layout, sizes = batch_layout(spans, self._pool.block_size, self._decoder.group)
        starts = layout["seq_start"].tolist()
        sampled = [(r, i) for i, r in enumerate(decode)]
        sampled += [
            (row, starts[len(decode) + j] + count - 1)
            for j, (row, first, count) in enumerate(chunks)
            if first + count == len(row.seq)
        ]
        rows = [r for r, _ in sampled]
        chunk_tokens = array("q")
        for row, first, count in chunks:
            chunk_tokens.extend(row.seq[first : first + count])
        parts = layout | {
            "chunk_tokens": torch.frombuffer(chunk_tokens, dtype=torch.long),
            "rows": torch.tensor([r.index for r in decode] + [row.index for row, _, _ in chunks]),
            "logits_at": torch.tensor([i for _, i in sampled], dtype=torch.long),
            "sampled": torch.tensor([r.index for r in rows], dtype=torch.long),
            "generated": torch.tensor([r.launched for r in rows], dtype=torch.long),
        }
        if any(r.lora >= 0 for r in decode) or any(row.lora >= 0 for row, _, _ in chunks):  # each token's LoRA slot
            lora = array("q", [r.lora for r in decode])
            for row, _, count in chunks:
                lora.extend([row.lora] * count)
            parts["lora"] = torch.frombuffer(lora, dtype=torch.long)
        device = self._upload(parts)
        self._write_tables()
        batch = Batch(
            tokens=torch.cat((self._next[device["rows"][: len(decode)]], device["chunk_tokens"])),
            tables=self._tables[device["rows"]],
            logits_at=device["logits_at"],
            lora=device.get("lora"),
            **{name: device[name] for name in LAYOUT},
            **sizes,
        )
        self._step_bans(rows, True)
        logits = self._decoder.forward(batch)
        launch = None
        if rows:
            index = device["sampled"]
            mode = max(r.mode() for r in rows)
            tokens, logprobs, status = sample(
                logits,
                None if mode == Mode.GREEDY else self._state.rows(index),  # greedy reads no state: 14 gathers saved
                device["generated"],
                self._state.eos,
                mode,
                self._bias(rows),
            )
            out = torch.stack((tokens.float(), logprobs, status.float()))
            if any(r.slot.sampling.top_logprobs for r in rows):
                out = torch.cat((out, top_logprobs(logits, MAX_TOP_LOGPROBS)))
            # Last: until here the step's decode rows are unchanged, and can run again if it fails.
            self._record(index, tokens, torch.ones_like(index, dtype=torch.bool))
            launch = self._to_host(out, list(rows))
        self._step_bans(rows, False)
        for r in decode:
            r.filled += 1
        for row, first, count in chunks:
            row.filled = first + count
            self.counters["prompt_tokens"] += count
        for r in rows:
            r.launched += 1
        self.counters["prefill_steps"] += 1
        self.counters["mixed_steps"] += bool(decode)
        tokens_in_step = len(decode) + sum(count for _, _, count in chunks)
        self.counters["largest_step"] = max(self.counters["largest_step"], tokens_in_step)
        self.counters["decode_rows"] += len(decode)
        return launch

    def _launch_decode(self, rows: list[_Row]) -> _Launch:
        # Runs every few milliseconds over every running row. The same rows as the last decode step (the
        # usual case) are already in place on the device, advanced by that step: nothing to upload, and what
        # the step runs is known but for min_new_tokens' mode; else their inputs scattered as one tensor.
        decoded, self._decoded = self._decoded, None  # until this step is launched
        if decoded is not None and decoded[0] == rows:
            _, columns, size, settled, special, lora, held = decoded
        else:
            index = [r.index for r in rows]
            highest = max(index) + 1
            size = next(s for s in self._sizes if s >= highest) if self._cuda else highest
            values = array("q", [r.filled for r in rows])
            values.extend([r.launched for r in rows])
            position, generated = torch.frombuffer(values, dtype=torch.long).view(2, -1)
            meta = self._idle_meta[:, :size].clone()
            meta[:, torch.frombuffer(array("q", index), dtype=torch.long)] = torch.stack(
                (position, torch.zeros_like(position), position + 1, generated)
            )
            self._meta[:, :size].copy_(self._put(meta), non_blocking=True)
            columns: list[_Row | None] = [None] * size
            for i, r in zip(index, rows):
                columns[i] = r
            settled = max(r.settled for r in rows)
            special = [r for r in rows if not r.plain]
            # some row uses an adapter: else the base model's step, no LoRA kernels
            lora = any(r.lora >= 0 for r in rows)
            held = max(r.min_new - r.launched for r in rows)
        # The slowest mode any row needs; min_new_tokens holds a row in a slower one for its first tokens.
        mode = max(settled, Mode.PROCESSED) if held > 0 else settled
        self._write_tables()
        self._step_bans(special, True)
        top = any(r.slot.sampling.top_logprobs for r in special)
        bias = self._bias(columns) if special else None
        graphs = self._lora_graphs if lora else self._graphs
        graph = None if top or bias is not None else graphs.get((size, mode))
        if graph is not None:
            graph.replay()
        else:
            self._decode_step(size, mode, top, bias, max(r.filled for r in rows) + 1, lora)
        self._step_bans(special, False)
        for r in rows:
            r.filled += 1
            r.launched += 1
        self._decoded = (rows, columns, size, settled, special, lora, held - 1)
        self.counters["decode_steps"] += 1
        self.counters["decode_rows"] += len(rows)
        return self._to_host(self._out[:, :size] if top else self._out[:3, :size], columns)

    # -- speculation ---------------------------------------------------------------------------------

    def _may_speculate(self, step: _Step) -> bool:
        """Whether this planned step may verify drafts: it has no prompt tokens (a step with some verifies
        none), few enough requests decode, and one of them drafts (its rows' pauses count the step first).
        Decided on the plan, so that the loop waits for the device only before a step that may verify (64
        streams arriving together are admitted over steps with prompt tokens, which stay pipelined while
        the first rows decode), and a step of more requests costs nothing per row."""
        rows = step.decode
        if step.chunks or not 0 < len(rows) <= self._spec_limit:
            return False
        for row in rows:
            row.drafting.stepped()
        return any(r.drafting.eligible and not r.needs_newest for r in rows)

    def _propose(self, rows: list[_Row]) -> _Proposal:
        """What each decoding row drafts this step (n-gram: the tokens; draft model: how many, drafted on
        the device at launch), within its remaining max_new_tokens, the step's token budget and the
        blocks free now (never by preempting). The draft model first reads what its cache lacks for the
        row (the tokens since it last ran), within the budget too: a row whose backlog does not fit
        reads part of it and drafts in a later step."""
        budget = backlog = self._budget - len(rows)
        spare = {id(r) for r in rows}
        proposal = _Proposal()
        for row in rows:
            state, drafts, catch_up = row.drafting, [], 0
            k = min(self._draft_len, row.slot.sampling.max_new_tokens - row.launched - 1, budget)
            if k <= 0 or not state.eligible or row.needs_newest:
                k = 0
            elif self._drafter is None:
                drafts = self._ngram(row).propose(k)
                if not drafts:
                    state.missed()
                k = len(drafts)
            else:
                need = row.filled + 1 - state.draft_filled
                catch_up = min(need, backlog)
                backlog -= catch_up
                if catch_up < need:
                    k = 0  # it reads part of its backlog, and drafts in a later step
            if k > 0:
                k = min(k, self._grow(row, row.filled + 1 + k, spare) - row.filled - 1)
                drafts = drafts[:k]
            budget -= k
            proposal.counts.append(k)
            proposal.drafts.append(drafts)
            proposal.catch_up.append(catch_up)
        return proposal

    def _ngram(self, row: _Row) -> NgramIndex:
        """The row's n-gram index, up to its newest token (built on its first use)."""
        state, spec = row.drafting, self._spec
        if state.ngram is None:
            state.ngram = NgramIndex(spec.min_matching_ngram_size, spec.max_matching_ngram_size, bool(spec.use_oldest))
            state.ngram.extend(row.prompt)
        state.ngram.extend(row.slot.generated[len(state.ngram.tokens) - len(row.prompt) :])
        return state.ngram

    def _launch_spec(self, rows: list[_Row], proposal: _Proposal) -> _Launch:
        """A verification step: every decoding row's last token and drafts (none for some), packed."""
        n, width, counts = len(rows), self._draft_len + 1, proposal.counts
        self._decoded = None  # its rows advance by what they keep
        size = next(s for s in self._spec_sizes if s >= n) if self._spec_sizes else n
        pad = size - n
        plan = [
            [r.index for r in rows] + [self.slots] * pad,
            [r.filled for r in rows] + [0] * pad,
            counts + [-1] * pad,
            [r.launched for r in rows] + [0] * pad,
        ]
        if self._drafter is None:
            drafts = [(d + [0] * self._draft_len)[: self._draft_len] for d in proposal.drafts]
            plan += drafts + [[0] * self._draft_len] * pad
        packed = self._put([v for part in plan for v in part])
        self._spec_index[:size].copy_(packed[:size], non_blocking=True)
        self._spec_plan[:, :size].copy_(packed[size : 4 * size].view(3, size), non_blocking=True)
        if self._drafter is None:
            self._spec_drafts[:size, : self._draft_len].copy_(packed[4 * size :].view(size, -1), non_blocking=True)
        self._write_tables()
        if self._drafter is not None:
            self._draft(rows, proposal)
        mode = max(r.mode() for r in rows)
        self._step_bans(rows, True)
        top = any(r.slot.sampling.top_logprobs for r in rows)
        bias = self._bias(rows + [None] * pad)
        graph = None if top or bias is not None else self._spec_graphs.get((size, mode))
        if graph is not None:
            graph.replay()
            alternatives = None
        else:
            bias = bias.repeat_interleave(width, 0) if bias is not None else None
            alternatives = self._spec_step(size, mode, top, bias)
        self._step_bans(rows, False)
        out = self._spec_out[:, :size].reshape(4, size * width)
        if alternatives is not None:
            out = torch.cat((out, alternatives))
        self.counters["verify_steps"] += 1
        self.counters["decode_rows"] += n
        launch = self._to_host(out, list(rows) + [None] * pad)
        launch.width, launch.proposed = width, counts + [0] * pad
        return launch

    def _draft(self, rows: list[_Row], proposal: _Proposal) -> None:
        """The draft model's tokens for the rows that draft, into ``_spec_drafts`` at their packed
        position (device only): one pass over what its cache lacks (the tokens since it last ran, up
        to the newest; rows that read only part of that backlog this step come along), then one pass
        per further draft, each feeding the draft before it."""
        drafter, size = self._drafter, self._pool.block_size
        reading = [(r, n) for r, n in zip(rows, proposal.catch_up) if n > 0]
        live = [(c, r, k) for c, (r, k) in enumerate(zip(rows, proposal.counts)) if k > 0]
        drafting = {id(r) for _, r, _ in live}  # each of them reads its whole backlog, in `reading` order
        spans = [(r.blocks, r.drafting.draft_filled, n) for r, n in reading]
        layout, sizes = batch_layout(spans, size, drafter.group)
        tokens = array("q")
        for row, n in reading:
            start = row.drafting.draft_filled
            tokens.extend((row.prompt + row.slot.generated)[start : start + n])
        starts = layout["seq_start"].tolist()
        ends = [start + n - 1 for start, (r, n) in zip(starts, reading) if id(r) in drafting]
        # Later passes: a token per drafting row at its next position, written only within its drafts
        # (past them, and past the last position, a row's token is padding).
        later: list[int] = []
        for j in range(1, max(proposal.counts, default=0)):
            positions = [min(row.filled + j, self._max_seq - 1) for _, row, _ in live]
            later += positions
            later += [
                row.blocks[at // size] * size + at % size if j < k else -1 for (_, row, k), at in zip(live, positions)
            ]
            later += [at + 1 for at in positions]
        parts = layout | {
            "tokens": torch.frombuffer(tokens, dtype=torch.long),
            "ends": torch.tensor(ends, dtype=torch.long),
            "reading": torch.tensor([r.index for r, _ in reading], dtype=torch.long),
            "drafting": torch.tensor([r.index for _, r, _ in live], dtype=torch.long),
            "columns": torch.tensor([c for c, _, _ in live], dtype=torch.long),
            "later": torch.tensor(later, dtype=torch.long),
        }
        device = self._upload(parts)
        batch = Batch(
            tokens=device["tokens"],
            tables=self._tables[device["reading"]],
            logits_at=device["ends"],
            **{name: device[name] for name in LAYOUT},
            **sizes,
        )
        logits = drafter.forward(batch)
        for row, n in reading:
            if id(row) not in drafting:
                row.drafting.draft_filled += n
        if not live:
            return
        columns, m = device["columns"], len(live)
        self._spec_drafts[columns, 0] = logits.argmax(-1)
        tables = self._tables[device["drafting"]]
        ones, ordinal = torch.ones_like(columns), torch.arange(m, device=self._device)
        for j, (positions, cells, context) in enumerate(device["later"].view(-1, 3, m), start=1):
            batch = Batch(
                tokens=self._spec_drafts[columns, j - 1],
                positions=positions,
                slots=cells,
                seq_start=ordinal,
                seq_len=ones,
                context=context,
                tables=tables,
                tile_seq=ordinal,
                tile_row=torch.zeros_like(ordinal),
                max_q=1,
                max_context=self._width * size,
            )
            self._spec_drafts[columns, j] = drafter.forward(batch).argmax(-1)

    def _read_backlog(self, rows: list[_Row], proposal: _Proposal) -> _Launch:
        """A decode step after the draft model read (part of) some rows' backlog, none drafting."""
        self._write_tables()
        self._draft(rows, proposal)
        return self._launch_decode(rows)

    def _verified(self, row: _Row, proposed: int, emitted: int) -> None:
        """A verification step's outcome for ``row``: the positions it wrote and kept, the blocks of its
        rejected drafts given back, its drafting policy and the speculation counters."""
        accepted, before = emitted - 1, row.filled
        row.filled += emitted
        row.launched += emitted
        keep = row.filled // self._pool.block_size + 1  # the block its next token goes to, at most
        if len(row.blocks) > keep:
            self._pool.release(row.blocks[keep:])
            del row.blocks[keep:]
        if proposed <= 0:
            return
        row.drafting.verified(proposed, accepted)
        row.drafting.draft_filled = before + 1 + min(accepted, proposed - 1)
        self.counters["spec_decode_num_drafts"] += 1
        self.counters["spec_decode_num_draft_tokens"] += proposed
        self.counters["spec_decode_num_accepted_tokens"] += accepted
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    # -- the loop ----------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._cuda:
                torch.cuda.set_device(self._device)
            with torch.inference_mode():
                while self._wait_for_work():
                    self._iterate()
        except BaseException as exc:
            log.exception("the built-in decode loop died")
            self._engine.die(f"the decode loop died: {exc}")

    def _wait_for_work(self) -> bool:
        self._flush()
        with self._wake:
            while not (self._stopping or self._pending or self._rows or self._waiting or self._inflight or self._beams):
                self._wake.wait()
            return not self._stopping

    def _iterate(self) -> None:
        # Bans and grammars need the newest token of each row; a verification step's outcome (how many
        # tokens each row kept) is known only once it is drained.
        if any(launch.proposed is not None for launch in self._inflight):
            self._drain([])
        elif any(r.needs_newest and r.decodable() for r in self._rows):
            self._drain([])
        started = time.perf_counter()
        self._reap()
        step = self._plan()
        speculate = self._spec is not None and self._may_speculate(step)
        if speculate and self._inflight:
            # Drafts need the newest tokens too. The plan stands: the steps in flight advanced their rows at
            # launch (a verification step, which does not, was drained before planning); a row they ended
            # (EOS, a stop) is left out.
            self._drain([])
            step.decode = [r for r in step.decode if not r.done]
        planned = time.perf_counter()
        launched: list[_Launch] = []
        if step.chunks:
            launched = self._launch_guarded(step)
        elif step.decode:
            proposal = self._propose(step.decode) if speculate else _Proposal()
            if any(proposal.counts):
                launch = functools.partial(self._launch_spec, proposal=proposal)
                launched = self._guarded(launch, step.decode, "verification")
            elif any(proposal.catch_up):
                launch = functools.partial(self._read_backlog, proposal=proposal)
                launched = self._guarded(launch, step.decode, "decode")
            else:
                launched = self._guarded(self._launch_decode, step.decode, "decode")
        self.counters["plan_s"] += planned - started
        self.counters["launch_s"] += time.perf_counter() - planned
        self._drain([])
        self._inflight = launched
        if self._beams:
            self._advance_beams()
        if not (launched and self._cuda):  # else handed over while waiting for this step
            self._flush()
        self.counters["peak_rows"] = max(self.counters["peak_rows"], len(self._rows))

    def _guarded(self, launch, rows: list[_Row], what: str) -> list[_Launch]:
        try:
            result = launch(rows)
        except Exception as exc:  # noqa: BLE001 - the step's requests fail, the loop goes on
            log.exception("a %s step of %d requests failed", what, len(rows))
            self._fail(rows, exc)
            return []
        return [result]

    def _launch_guarded(self, step: _Step) -> list[_Launch]:
        """A step with prompt tokens; if it fails, its prompts' requests fail and its decode tokens
        run again on their own (they did not change: the sampled tokens are recorded last)."""
        try:
            launch = self._launch_mixed(step)
        except Exception as exc:  # noqa: BLE001 - the step's prompts fail, the loop goes on
            log.exception("a step of %d prompt chunks and %d decode tokens failed", len(step.chunks), len(step.decode))
            for block in step.keyed:
                self._pool.unregister(block)
            self._fail([row for row, _, _ in step.chunks], exc)
            return self._guarded(self._launch_decode, step.decode, "decode") if step.decode else []
        return [launch] if launch is not None else []

    def _fail(self, rows: list[_Row], exc: Exception) -> None:
        # The tokens before the error first: the step still in flight (it ran; only the next one failed), then
        # everything emitted.
        self._drain([])
        self._flush()
        for row in rows:
            row.broken = True
            if not row.done:
                self._engine.fail(row.slot, f"generation failed: {exc}", 424)

    # -- blocks and planning -----------------------------------------------------------------------

    def _reap(self) -> None:
        keep = []
        for row in self._rows:  # every row every step: row.done, inlined
            slot = row.slot
            if slot.finished or slot.cancelled or slot.closed:
                self._retire(row)
            else:
                keep.append(row)
        self._rows = keep

    def _retire(self, row: _Row) -> None:
        """Give back the row's blocks (caching the full ones of known tokens) and its batch slot."""
        if self._pool.caching and not row.broken:
            known = row.prompt + row.slot.generated
            full = min(row.filled, len(known)) // self._pool.block_size  # blocks whose tokens are known and written
            keys = self._pool.keys(known, row.keys, full, row.salt)
            for i in range(row.registered, full):
                self._pool.register(row.blocks[i], keys[i])
        self._pool.release(row.blocks)
        if row.lora >= 0:
            self._lora_users[row.lora] -= 1
            row.lora = -1
        row.blocks, row.registered, row.filled = [], 0, 0
        if row.drafting is not None:
            row.drafting.draft_filled = 0
        self._free.append(row.index)
        self._free.sort(reverse=True)
        row.index = -1

    def _preempt(self, row: _Row) -> None:
        """Take the row's blocks: its tokens so far reach its client, then it waits at the front
        of the queue to be prefilled again with them."""
        self._drain([])
        self._rows.remove(row)
        self._retire(row)
        if row.done:
            return
        row.seq = row.prompt + row.slot.generated
        row.launched = len(row.slot.generated)
        self._waiting.appendleft(row)
        self.counters["num_preemptions"] += 1

    def _grow(self, row: _Row, want: int, spare: set[int]) -> int:
        """Give ``row`` blocks for up to its first ``want`` positions, as many as are free; only
        when not even its next position fits, take blocks from rows admitted after it (newest
        first) that are not in ``spare`` (planned into this step already). Returns how many
        positions it has room for."""
        size = self._pool.block_size
        while True:
            need = -(-want // size) - len(row.blocks)
            if need > 0 and self._pool.free:
                self._grant(row, self._pool.allocate(min(need, self._pool.free)))
            room = min(want, len(row.blocks) * size)
            if room > row.filled or need <= 0:
                return room
            victims = [r for r in self._rows[self._rows.index(row) + 1 :] if id(r) not in spare]
            if not victims:
                return room
            self._preempt(victims[-1])

    def _grant(self, row: _Row, blocks: list[int]) -> None:
        for block in blocks:
            self._table_writes[row.index, len(row.blocks)] = block
            row.blocks.append(block)

    def _plan(self) -> _Step:
        step = _Step()
        planned: set[int] = set()
        # 1. a decode token for every row whose prompt is in the cache, oldest first; a row that
        #    cannot get a block takes one from a newer row, or gives its own back.
        #    One pass over the rows (this runs every few milliseconds), which also finds the prompts
        #    being prefilled.
        room = self._pool.block_size
        prefilling = []
        for row in list(self._rows):
            slot = row.slot
            if row.index < 0 or slot.finished or slot.cancelled or slot.closed:  # row.done, inlined
                continue
            if row.filled < len(row.seq):
                prefilling.append(row)
                continue
            if row.launched >= row.max_new:
                continue
            if row.filled < len(row.blocks) * room or self._grow(row, row.filled + 1, planned) > row.filled:
                step.decode.append(row)
                planned.add(id(row))
            elif row.index >= 0:
                self._preempt(row)
        budget = self._budget - len(step.decode)
        # 2. the next chunk of every prompt being prefilled, oldest first (one preempted or ended meanwhile is
        #    passed over).
        for row in prefilling:
            if budget <= 0:
                break
            if row.index < 0 or row.done:
                continue
            room = self._grow(row, min(len(row.seq), row.filled + budget), planned)
            if room <= row.filled:
                break
            budget -= self._chunk(step, row, room - row.filled)
            planned.add(id(row))
        # 3. new requests (preempted ones first) while a batch slot, budget and blocks are free.
        #    Without option.enable_chunked_context a prompt runs whole, and the first one of a step
        #    even past the budget (by at most the decode tokens), so that none waits for ever.
        admitted = []
        while self._free:
            row = self._next_waiting()
            if row is None:
                break
            if row.slot.sampling.beam_width > 1:
                if not self._admit_beams(row.slot):
                    self._waiting.appendleft(row)
                    break
                continue
            whole = not self._chunked and not row.slot.generated  # a prompt, not a request resumed
            room = max(budget, len(row.seq)) if whole and not step.chunks else budget
            count = self._admit(row, room, whole) if room > 0 else 0
            if not count:
                self._waiting.appendleft(row)
                break
            admitted.append(row)
            budget -= self._chunk(step, row, count)
        if admitted:
            self._state.admit(
                [r.index for r in admitted],
                [r.slot.sampling for r in admitted],
                [r.seed for r in admitted],
                [bool(r.slot.eos_ids) for r in admitted],
                [r.prompt for r in admitted],
                [r.single_bad for r in admitted],
                [r.slot.generated for r in admitted],
            )
        return step

    def _chunk(self, step: _Step, row: _Row, count: int) -> int:
        """Plan ``count`` prompt tokens of ``row`` into the step, and make the full blocks they
        complete findable (rows planned after it in this step may reuse them)."""
        step.chunks.append((row, row.filled, count))
        if self._pool.caching:
            full = (row.filled + count) // self._pool.block_size
            keys = self._pool.keys(row.seq, row.keys, full, row.salt)
            for i in range(row.registered, full):
                if self._pool.register(row.blocks[i], keys[i]):
                    step.keyed.append(row.blocks[i])
            row.registered = max(row.registered, full)
        return count

    def _next_waiting(self) -> _Row | None:
        """The next request to admit: a preempted one, else a new one (its queue time ends)."""
        while self._waiting:
            row = self._waiting.popleft()
            if not row.done:
                return row
        with self._wake:
            while self._pending:
                slot = self._pending.popleft()
                if slot.cancelled or slot.closed:
                    continue
                bad = slot.request.bad_words_ids
                # An unseeded request's seed needs no secrecy: random's generator (seeded from os.urandom once) spares
                # a getrandom() call per request, which lets go of the GIL (CPython Python/bootstrap_hash.c,
                # py_getrandom) to the event loop, busy with the burst's other requests, at each admission.
                seed = slot.sampling.seed if slot.sampling.seed is not None else random.getrandbits(63)
                return _Row(
                    slot,
                    list(slot.request.prompt_token_ids),
                    single_bad=[w[0] for w in bad if len(w) == 1],
                    multi_bad=[list(w) for w in bad if len(w) > 1],
                    seed=seed,
                    drafting=Drafting() if self._spec is not None else None,
                )
        return None

    def _admit(self, row: _Row, budget: int, whole: bool) -> int:
        """Give ``row`` a batch slot, the cached blocks of its longest known prefix and blocks for
        the next ``budget`` tokens at most (``whole``: for all of them, or nothing), keeping the
        watermark free; returns the tokens planned (0: it does not fit now, nothing taken). Its
        sampling state is written by the caller."""
        size, pool = self._pool.block_size, self._pool
        lora = self._lora_slot(row.slot.adapter)
        if lora is None:  # every LoRA slot holds another adapter that running rows use
            return 0
        hits: list[int] = []
        if pool.caching:  # never the whole sequence: its last token's logits are needed (vLLM does the same)
            hits = pool.match(pool.keys(row.seq, row.keys, (len(row.seq) - 1) // size, row.salt))
        start = len(hits) * size
        room = (pool.free - self._watermark) * size
        count = min(len(row.seq) - start, budget, room)
        if count <= 0 or (whole and count < len(row.seq) - start):
            pool.release(hits)
            return 0
        row.slot.scheduled()
        row.index = self._free.pop()
        self._take_lora(row, lora)
        self._grant(row, hits)
        self._grant(row, pool.allocate(-(-(start + count) // size) - len(hits)))
        row.filled, row.registered = start, len(hits)
        if pool.caching:
            self.counters["prefix_cache_queries"] += len(row.seq)
            self.counters["prefix_cache_hits"] += start
        self._rows.append(row)
        return count

    # -- beam search -------------------------------------------------------------------------------

    def _beam_blocks(self, prompt: int, width: int, max_new: int) -> int:
        """Blocks a beam-search request may hold at once: the prompt's, and per beam those of its own tokens plus
        the copy of the block it shares when it first writes into it."""
        size = self._pool.block_size
        return -(-prompt // size) + width * (-(-max_new // size) + 1)

    def _admit_beams(self, slot: Slot) -> bool:
        """Set aside ``beam_width`` batch slots and the blocks of ``_beam_blocks`` (above the watermark), or
        nothing when they are not free now (False); a request the whole cache could not hold fails (True)."""
        sampling, prompt = slot.sampling, slot.request.prompt_token_ids
        width = sampling.beam_width
        need = self._beam_blocks(len(prompt), width, sampling.max_new_tokens)
        if need > self._pool.num_blocks - self._watermark:  # it would wait for ever, and the queue behind it
            self._engine.fail(
                slot,
                f"{width} beams of {len(prompt)} + {sampling.max_new_tokens} tokens may hold {need} KV blocks, more "
                f"than the cache has ({self._pool.num_blocks - self._watermark}); ask for fewer beams or tokens",
                400,
                "beam_search",
            )
            return True
        if len(self._free) < width or self._pool.free - self._watermark < need:
            return False
        blocks = self._pool.allocate(need)
        assert blocks is not None
        slot.scheduled()
        search = BeamSearch(
            width,
            eos_ids=slot.eos_ids,
            max_new_tokens=sampling.max_new_tokens,
            length_penalty=sampling.length_penalty,
            early_stopping=sampling.early_stopping,
        )
        indices = [self._free.pop() for _ in range(width)]
        self._beams.append(_BeamGroup(slot, search, indices, spare=list(blocks), owned=blocks))
        return True

    def _advance_beams(self) -> None:
        """One step of every beam-search request, eagerly (each reads its log-probs before choosing its beams),
        after the step of the other rows."""
        keep = []
        for group in self._beams:
            if not group.done:
                try:
                    self._beam_step(group)
                except Exception as exc:  # noqa: BLE001 - this request fails, the loop goes on
                    log.exception("a beam-search step failed")
                    self._engine.fail(group.slot, f"generation failed: {exc}", 424)
            if group.done or group.search.done:
                self._end_beams(group)
            else:
                keep.append(group)
        self._beams = keep

    def _beam_step(self, group: _BeamGroup) -> None:
        search, size = group.search, self._pool.block_size
        prompt = group.slot.request.prompt_token_ids
        if not group.tables:  # the prompt, once: its last position's log-probs start every beam
            table = [group.spare.pop() for _ in range(-(-len(prompt) // size))]
            spans, tokens = [(table, 0, len(prompt))], list(prompt)
            group.tables, group.refs = [table], dict.fromkeys(table, 1)
        else:
            position = len(prompt) + search.length - 1  # every running beam's newest token
            self._own_block(group, position)
            spans = [(table, position, 1) for table in group.tables]
            tokens = group.tokens
        layout, sizes = batch_layout(spans, size, self._decoder.group)
        last = [start + count - 1 for start, (_, _, count) in zip(layout["seq_start"].tolist(), spans, strict=True)]
        tables = torch.zeros(len(spans), self._tables.shape[1], dtype=torch.long)
        for i, (table, _, _) in enumerate(spans):
            tables[i, : len(table)] = torch.tensor(table, dtype=torch.long)
        parts = layout | {
            "tokens": torch.tensor(tokens, dtype=torch.long),
            "tables": tables.reshape(-1),
            "logits_at": torch.tensor(last, dtype=torch.long),
        }
        device = self._upload(parts)
        batch = Batch(
            tokens=device["tokens"],
            tables=device["tables"].view(len(spans), -1),
            logits_at=device["logits_at"],
            **{name: device[name] for name in LAYOUT},
            **sizes,
        )
        log_probs = torch.log_softmax(self._decoder.forward(batch), dim=-1).cpu()
        if torch.isnan(log_probs).any():
            self._engine.fail(group.slot, "the model produced NaN/inf logits", 424)
            return
        if len(spans) == 1:
            log_probs = log_probs.expand(search.width, -1)
            self.counters["prompt_tokens"] += len(prompt)
        parents, group.tokens = search.step(log_probs)
        self._engine.sampled_rows += search.width
        # each new beam continues its parent's cache: it holds the parent's blocks (copied on first write)
        tables = [list(group.tables[p]) for p in parents]
        for table in tables:
            for block in table:
                group.refs[block] += 1
        self._drop_tables(group, group.tables)
        group.tables = tables

    def _own_block(self, group: _BeamGroup, position: int) -> None:
        """Before the beams write ``position``: each beam gets a block of its own there, a fresh one past its
        table's end, or a copy of the block it shares with another beam (every layer's k and v)."""
        size = self._pool.block_size
        copies: list[tuple[int, int]] = []
        for table in group.tables:
            index = position // size
            if index == len(table):
                block = group.spare.pop()
                table.append(block)
                group.refs[block] = 1
            elif group.refs[table[index]] > 1:
                block = group.spare.pop()
                copies.append((table[index], block))
                group.refs[table[index]] -= 1
                table[index] = block
                group.refs[block] = 1
        if copies:
            source, target = (self._put(list(c)) for c in zip(*copies))
            for cache in (*self._decoder.k_cache, *self._decoder.v_cache):
                cache.index_copy_(0, target, cache.index_select(0, source))

    @staticmethod
    def _drop_tables(group: _BeamGroup, tables: list[list[int]]) -> None:
        for table in tables:
            for block in table:
                group.refs[block] -= 1
                if group.refs[block] == 0:
                    del group.refs[block]
                    group.spare.append(block)

    def _end_beams(self, group: _BeamGroup) -> None:
        """Give back the request's blocks and slots; a finished search sends its beams as the final output."""
        slot = group.slot
        if not group.done and group.search.done:
            hypotheses = group.search.best(slot.sampling.num_return_sequences)
            beams = [
                Beam(h.tokens, FinishReason.EOS if h.ended_by_eos else FinishReason.LENGTH, h.score) for h in hypotheses
            ]
            slot.generated.extend(beams[0].token_ids)
            slot.finished = True
            output = EngineOutput(
                slot.request.request_id,
                list(beams[0].token_ids),
                finished=True,
                finish_reason=beams[0].finish_reason,
                beams=beams,
                queue_time_s=slot.take_queue_time(),
            )
            self._outbox.append((slot, output))
        self._pool.release(group.owned)
        self._free.extend(group.indices)
        self._free.sort(reverse=True)

    def _lora_slot(self, adapter: LoraAdapter | None) -> int | None:
        """The LoRA slot a row of ``adapter`` would read: -1 for the base model (or no LoRA), the slot holding
        it already, else the least recently taken slot no admitted row uses; None when there is none."""
        if adapter is None or self._lora is None:
            return -1
        free = None
        for slot, held in enumerate(self._lora_held):
            if held is adapter:  # the same registration (a name registered again is another object)
                return slot
            if self._lora_users[slot] == 0 and (free is None or self._lora_taken[slot] < self._lora_taken[free]):
                free = slot
        return free

    def _take_lora(self, row: _Row, slot: int) -> None:
        """Admit ``row`` to LoRA ``slot`` (``_lora_slot``'s), loading its adapter's weights there if another
        adapter was in it, and point its batch slot at it."""
        if self._lora is None:
            return
        if slot >= 0:
            adapter = row.slot.adapter
            if self._lora_held[slot] is not adapter:
                self._lora.write(slot, adapter)
                self._lora_held[slot] = adapter
            self._lora_users[slot] += 1
            self.counters["lora_takes"] += 1
            self._lora_taken[slot] = self.counters["lora_takes"]
        row.lora = slot
        self._lora_of[row.index] = slot

    # -- delivery ----------------------------------------------------------------------------------

    def _drain(self, more: list[_Launch]) -> None:
        """Hand the tokens of every launch in flight (then of ``more``) to the server, in order."""
        launches, self._inflight = self._inflight + more, []
        for launch in launches:
            if launch.event is not None:
                # The event loop (which needs the GIL) turns the tokens emitted last into
                # responses while this thread waits for the device, not while it plans the next step.
                self._flush()
                started = time.perf_counter()
                launch.event.synchronize()
                self.counters["wait_s"] += time.perf_counter() - started
            started = time.perf_counter()
            self._emit(launch)
            self.counters["emit_s"] += time.perf_counter() - started

    @staticmethod
    def _row_error(slot: Slot, status: int) -> EngineOutput:
        """A row's failure: NaN logits are the model's (424); every token excluded, or a grammar too slow to
        follow, the request's constraint (a 400 naming it)."""
        request_id = slot.request.request_id
        if status == _NAN_LOGITS:
            return error_output(request_id, "the model produced NaN/inf logits", 424)
        if status == _EXCLUDED_STATUS:
            return error_output(request_id, EXCLUDED, 400, excluded_field(slot))
        return error_output(request_id, slot.matcher.error, 400, "guided")  # type: ignore[union-attr]

    def _emit(self, launch: _Launch) -> None:
        tokens, logprobs, status, *more = launch.host.tolist()
        if launch.event is not None:  # read: its pinned buffer takes the next step's tokens
            self._downloads.give(launch.host)
        emitted, top = (more[0], more[1:]) if launch.proposed is not None else (None, more)
        items: list[tuple[Slot, EngineOutput | TokenDelta]] = []
        width = launch.width
        for column, row in enumerate(launch.rows):  # every row of every step passes here: locals, no properties
            if row is None:
                continue
            slot = row.slot
            if slot.finished or slot.cancelled or slot.closed:  # row.done, inlined
                continue
            request, generated = slot.request, slot.generated
            if emitted is None and not row.top_k and slot.matcher is None:  # one token, nothing else: the short way
                reason = alternatives = None
                failure = int(status[column]) or None
                if failure is None:
                    token = int(tokens[column])
                    generated.append(token)
                    new, lps = [token], [logprobs[column]]
                    reason = finish_reason(generated, slot.eos_ids, request)
                else:
                    new = lps = []
            else:
                first, count = column * width, 1
                if emitted is not None:
                    count = int(emitted[first])
                    self._verified(row, launch.proposed[column], count)
                new, lps, alternatives, reason, failure = self._take(row, tokens, logprobs, status, top, first, count)
            if new:
                slot.finished = reason is not None
                queue_time = slot.take_queue_time()
                if slot.sunk and reason is None and queue_time is None and alternatives is None:
                    # A plain delta for the engine's sink (nearly every output behind the engine link): its tuple,
                    # no EngineOutput to build here and take apart again on the event loop (engines/base.py).
                    items.append((slot, (request.request_id, new, lps if row.logprobs else None)))
                else:
                    output = EngineOutput(
                        request.request_id,
                        new,
                        lps if row.logprobs else None,
                        alternatives,
                        finished=slot.finished,
                        finish_reason=reason,
                        queue_time_s=queue_time,
                    )
                    items.append((slot, output))
            if failure is not None:
                slot.finished = True
                row.broken = row.broken or failure == _NAN_LOGITS  # NaN/inf: its cache may hold them too
                items.append((slot, self._row_error(slot, failure)))
        self._engine.sampled_rows += len(items)  # only this thread writes it
        self._outbox += items

    @staticmethod
    def _take(row: _Row, tokens: list, logprobs: list, status: list, top: list, first: int, count: int) -> tuple:
        """The tokens a row keeps of positions ``first..first+count-1`` (a verification step's, or with top
        log-probs or a grammar to follow), their log-probs and top ones, why it ends, and its failure: a stop,
        EOS or max_new_tokens among them ends it there."""
        slot = row.slot
        k, matcher, request, generated = row.top_k, slot.matcher, slot.request, slot.generated
        new: list[int] = []
        lps: list[float] = []
        alternatives: list[list[tuple[int, float]]] | None = [] if k else None
        reason = failure = None
        for position in range(first, first + count):
            if status[position] or (matcher is not None and matcher.error is not None):
                failure = int(status[position])
                break
            token = int(tokens[position])
            if matcher is not None:
                matcher.accept(token)
                if matcher.error is not None:  # too slow to take it: this request fails alone
                    failure = 0
                    break
            generated.append(token)
            new.append(token)
            lps.append(logprobs[position])
            if k:
                alternatives.append([(int(top[j][position]), top[MAX_TOP_LOGPROBS + j][position]) for j in range(k)])
            reason = finish_reason(generated, slot.eos_ids, request)
            if reason is not None:
                break
        return new, lps, alternatives, reason, failure

    def _flush(self) -> None:
        """Hand the outputs emitted so far to the event loop."""
        if self._outbox:
            items, self._outbox = self._outbox, []
            self._engine.deliver(items)
