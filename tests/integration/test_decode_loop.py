"""The torch engine's built-in decode loop (lmi_trt/engines/torch/decode_loop.py) on CPU.

test_torch_engine.py already runs every protocol test through this loop for the tiny Llama,
Qwen2 and Mistral models (it is what ``auto`` picks for them). Here: Qwen3 (per-head q/k norms),
prompts cut into chunks under a small ``max_num_tokens`` and mixed into steps with other requests'
decode tokens, a KV cache too small for every request at once (preemption), prefix caching (reuse
and eviction), which path runs for which model and option, failures inside a step, and the
cache's figures on a real server's /metrics. Greedy outputs must equal ``model.generate``'s
wherever its choice is clear (test_torch_engine.py's MARGIN rule).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from cliserver import serve
from sinks import RecordingSink, on_the_wire
from test_torch_engine import (
    assert_greedy,
    one_torch_thread,  # noqa: F401 - the same module-wide thread limit
    reference,
)
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM, GenerationConfig

from lmi_trt.engines.base import EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.engines.torch.decode_loop import choose_decode_loop, graph_batch_sizes, plan_blocks
from lmi_trt.engines.torch.llama_decoder import LlamaDecoder, unsupported_reason

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

PROMPTS = [
    [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
    [1, 40],
    [1] + list(range(100, 113)),
    [1, 7, 7, 7],
    [1] + list(range(200, 216)),
    [1, 3],
    [1] + list(range(300, 310)),
    [1] + list(range(400, 419)),
]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    from transformers import Qwen3Config

    out = tmp_path_factory.mktemp("qwen3")
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # well-separated greedy choices, as tests/tinymodels.py does
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out))
    return out


async def run(engine: TorchEngine, rid: str, prompt: list[int], **sampling) -> list:
    return [o async for o in engine.submit(GenerationRequest(rid, prompt, SamplingParams(**sampling)))]


async def collect(outputs) -> list:
    return [o async for o in outputs]


def tokens(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


BUDGET = {"whole": 20, "chunked": 12}


def small_engine(path: Path, **options) -> TorchEngine:
    """3 slots, prompts of up to 20 tokens, up to 24 new ones."""
    return TorchEngine(path, max_batch_size=3, max_input_len=20, max_new_tokens=24, **options)


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=[("qwen3", "whole"), ("llama", "chunked")], ids=lambda p: "-".join(p)
)
async def small_steps(request, qwen3):
    """3 slots for 8 requests, in steps of at most 20 tokens (prompts whole) or 12 (prompts cut
    into chunks, option.enable_chunked_context): prompts join steps that carry other requests'
    decode tokens, and requests join as others leave."""
    arch, prompts = request.param
    path = qwen3 if arch == "qwen3" else tiny_model("llama")
    engine = small_engine(path, max_num_tokens=BUDGET[prompts], enable_chunked_context=prompts == "chunked")
    await engine.start()
    yield path, engine
    await engine.close()


LENGTHS = [24, 3, 17, 9, 24, 1, 12, 10]


async def run_all(engine: TorchEngine, path: Path, prompts=PROMPTS, lengths=LENGTHS) -> None:
    """Every prompt at once, greedy: each stream has one token per delta, ends on its length, and
    equals model.generate wherever its choice is clear."""
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    results = await asyncio.gather(
        *(run(engine, f"r{i}", p, max_new_tokens=n, ignore_eos=True) for i, (p, n) in enumerate(zip(prompts, lengths)))
    )
    for prompt, n, outs in zip(prompts, lengths, results):
        assert [len(o.token_ids) for o in outs] == [1] * n  # nothing repeated, nothing skipped
        assert outs[-1].finish_reason == FinishReason.LENGTH
        assert_greedy(tokens(outs), reference(ref, prompt, n, eos_token_id=None))


async def test_greedy_equals_generate_with_prompt_chunks_mixed_into_decode_steps(small_steps):
    path, engine = small_steps
    assert engine.batching == "decode_loop"
    engine._backend.counters["largest_step"] = 0  # a maximum, the others are totals
    before = dict(engine._backend.counters)
    await run_all(engine, path)
    counters = {k: v - before[k] for k, v in engine._backend.counters.items()}
    # 8 prompts of up to 20 tokens: some steps carry other requests' decode tokens too; nothing
    # is computed twice (the cache holds them all).
    assert counters["mixed_steps"] >= 1 and counters["num_preemptions"] == 0
    assert counters["prompt_tokens"] == sum(len(p) for p in PROMPTS)
    budget = engine.max_num_tokens
    if engine.enable_chunked_context:  # a step never exceeds the budget; 20-token prompts span steps
        assert counters["largest_step"] <= budget and counters["prefill_steps"] >= sum(map(len, PROMPTS)) / budget
    else:  # whole prompts; a step exceeds the budget only by the decode tokens of the 2 other slots
        assert counters["largest_step"] <= budget + 2


async def test_behind_a_sink_a_streams_middle_is_plain_deltas_in_order(small_steps):
    """Behind the engine link (a sink), every output but a stream's first (its queue time) and last (its end) is a
    plain delta, a ``TokenDelta`` tuple; each run of them in one put_deltas, in order with the outputs around
    them; the tokens are those of the same requests through ``submit``. A closed request's deltas are dropped."""
    path, engine = small_steps
    sink = RecordingSink()
    engine.attach(sink)
    lengths = [24, 3, 17, 9]
    requests = [
        GenerationRequest(f"s{i}", p, SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=i == 0))
        for i, (p, n) in enumerate(zip(PROMPTS, lengths))
    ]
    for r in requests:
        engine.submit_to_sink(r)
    await sink.wait(*(r.request_id for r in requests))
    assert engine.stats().active_requests == 0
    for r, n in zip(requests, lengths):
        stream = sink.stream(r.request_id)
        first, *middle, last = stream
        assert first[0] == "put" and first[1].queue_time_s is not None and not first[1].finished
        assert last[0] == "put" and last[1].finish_reason is FinishReason.LENGTH
        assert [kind for kind, _ in middle] == ["deltas"] * (n - 2)
        assert all(len(d) == 3 and len(d[1]) == 1 for _, d in middle)
        if r.sampling.logprobs:
            assert all(isinstance(d[2][0], float) for _, d in middle)
        else:
            assert all(d[2] is None for _, d in middle)
        got = first[1].token_ids + [t for _, d in middle for t in d[1]] + last[1].token_ids
        assert got == tokens(
            await run(engine, f"again-{r.request_id}", r.prompt_token_ids, max_new_tokens=n, ignore_eos=True)
        )
    # A request closed mid-stream: nothing of it reaches the sink after its cancellation, nor the figures; until
    # then it ran (its first output, never a plain delta, started it) and its tokens counted.
    generated = engine.stats().total_generated_tokens
    engine.submit_to_sink(GenerationRequest("gone", PROMPTS[0], SamplingParams(max_new_tokens=24, ignore_eos=True)))
    while not sink.stream("gone"):
        await asyncio.sleep(0.001)
    slot = engine._slots.get("gone")
    assert slot is None or slot.started
    await engine.cancel("gone")
    await asyncio.sleep(0)  # the sink takes a turn of the loop's outputs together, the cancellation's too
    stream = sink.stream("gone")
    await asyncio.sleep(0.2)  # the loop's steps in flight
    assert sink.stream("gone") == stream and stream[-1][1].finish_reason is FinishReason.CANCELLED
    assert engine.stats().active_requests == 0
    got = sum(len(out[1] if kind == "deltas" else out.token_ids) for kind, out in stream)
    assert engine.stats().total_generated_tokens - generated == got


async def same_on_the_wire(engine: TorchEngine, requests: list[GenerationRequest]) -> RecordingSink:
    """Runs ``requests`` through ``submit``, then through the engine's sink, each way all at once: each stream at
    the sink, as the engine link sends it, is what ``submit`` streamed (``_wire`` of each output), its first and
    last outputs whole. Returns the sink."""
    submitted = await asyncio.gather(*(collect(engine.submit(r)) for r in requests))
    sink = RecordingSink()
    engine.attach(sink)
    for r in requests:
        engine.submit_to_sink(r)
    await sink.wait(*(r.request_id for r in requests))
    for r, outs in zip(requests, submitted):
        assert sink.wired(r.request_id) == [on_the_wire(o) for o in outs], r.request_id
        assert sink.stream(r.request_id)[0][0] == sink.stream(r.request_id)[-1][0] == "put"
    return sink


async def test_behind_a_sink_each_stream_is_on_the_wire_what_submit_streams(small_steps):
    """Every kind of request the loop sinks (all but grammars, prompt log-probs and beams: ``sinks``), all at once,
    is on the wire what ``submit`` streams (``same_on_the_wire``), in plain deltas where ``_wire`` makes them:
    log-probs, top log-probs (never plain), stop tokens, EOS, min_new_tokens, bans (the loop waits for each token),
    logit_bias, seeded sampling, one and two tokens, and a failure mid-stream (every token excluded after one)."""
    path, engine = small_steps
    base = tokens(await run(engine, "base", PROMPTS[0], max_new_tokens=24, ignore_eos=True))
    stop = next(t for i, t in enumerate(base[4:], 4) if t not in base[:i])  # first seen mid-way

    def request(rid: str, n: int = 16, stops=(), bad=(), **sampling) -> GenerationRequest:
        return GenerationRequest(
            rid,
            PROMPTS[0],
            SamplingParams(max_new_tokens=n, **sampling),
            stop_token_ids=[list(s) for s in stops],
            bad_words_ids=[list(b) for b in bad],
        )

    requests = [
        request("logprobs", logprobs=True, ignore_eos=True),
        request("top", logprobs=True, top_logprobs=3, ignore_eos=True),
        request("one", 1, ignore_eos=True),
        request("two", 2, logprobs=True, ignore_eos=True),
        request("stop", 24, stops=[[stop]], logprobs=True, ignore_eos=True),
        request("bans", bad=[[base[2], base[3]], [base[5]]], ignore_eos=True),
        request("bias", logit_bias=((base[1], -50.0),), ignore_eos=True),
        request("seeded", do_sample=True, temperature=0.8, top_k=20, seed=3, logprobs=True, ignore_eos=True),
        request("excluded", 24, bad=[[stop, t] for t in range(engine._vocab_size)], ignore_eos=True),
    ]
    sink = await same_on_the_wire(engine, requests)
    ends = {r.request_id: sink.outputs_of(r.request_id)[-1] for r in requests}
    assert ends["stop"].finish_reason is FinishReason.STOP_SEQUENCE and ends["excluded"].error_field == "bad_words"
    for rid in ("logprobs", "stop", "bans", "bias", "seeded", "excluded"):
        assert any(kind == "deltas" for kind, _ in sink.stream(rid)), rid
    assert not any(kind == "deltas" for kind, _ in sink.stream("top"))
    # EOS, and min_new_tokens holding it back: an engine whose EOS is a token the model reaches mid-way.
    eos = small_engine(
        path,
        max_num_tokens=engine.max_num_tokens,
        enable_chunked_context=engine.enable_chunked_context,
        eos_token_ids=[stop],
    )
    await eos.start()
    try:
        sink = await same_on_the_wire(
            eos, [request("eos", 24), request("min", 24, min_new_tokens=base.index(stop) + 3)]
        )
        assert sink.outputs_of("eos")[-1].finish_reason is FinishReason.EOS
        assert len(sink.wired("min")) > len(sink.wired("eos"))
    finally:
        await eos.close()


class FakeEvent:
    """``torch.cuda.Event`` on a CPU: records when it was synchronized."""

    def __init__(self) -> None:
        self.synchronized = False

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        self.synchronized = True


async def test_step_downloads_are_reused_only_once_read(small_steps, monkeypatch):
    """The GPU path's host copies (``_to_host``'s CUDA branch, host_copies.Downloads) run on a CPU, a fake event
    standing for the copy: a buffer is given back only after the step's event was synchronized and its tokens read
    (``_drain`` then ``_emit``), never taken again while a step in flight holds it, and reused, not taken anew per
    step; the streams are those of the CPU path."""
    from lmi_trt.engines.torch import host_copies

    path, engine = small_steps
    backend = engine._backend
    expected = [
        tokens(await run(engine, f"cpu{i}", p, max_new_tokens=n, ignore_eos=True))
        for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))
    ]
    held: dict[int, FakeEvent] = {}  # buffers of the steps in flight, by id, with their step's event
    created: list[int] = []
    to_host, give = type(backend)._to_host, host_copies.Downloads.give

    def gpu_to_host(self, out, rows):
        self._cuda = True  # the CUDA branch, for this call only (the engine's thread)
        try:
            launch = to_host(self, out, rows)
        finally:
            self._cuda = False
        assert id(launch.host) not in held  # a buffer a step in flight still holds is never taken
        held[id(launch.host)] = launch.event
        return launch

    def checked_give(self, host):
        assert held.pop(id(host)).synchronized  # read after the copy was waited for
        give(self, host)

    def unpinned(shape, dtype, pin_memory):
        created.append(1)
        return torch.empty(shape, dtype=dtype)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(host_copies, "torch", type("Torch", (), {"empty": staticmethod(unpinned)}))
    monkeypatch.setattr(type(backend), "_to_host", gpu_to_host)
    monkeypatch.setattr(host_copies.Downloads, "give", checked_give)
    before = backend.counters["decode_steps"] + backend.counters["prefill_steps"]
    results = await asyncio.gather(
        *(
            run(engine, f"gpu{i}", p, max_new_tokens=n, ignore_eos=True)
            for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))
        )
    )
    assert [tokens(outs) for outs in results] == expected
    while held:  # a step launched before its rows ended, drained (and its buffer given back) once the loop turns
        await asyncio.sleep(0.01)
    steps = backend.counters["decode_steps"] + backend.counters["prefill_steps"] - before
    assert 0 < len(created) < steps / 4


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
async def test_a_cache_too_small_for_every_request_preempts_and_resumes(arch, qwen3):
    """6 blocks of 8 tokens: one request of 20 + 24 positions fits, three do not; requests that
    run out of blocks give them back and resume where they were, their streams unchanged."""
    path = qwen3 if arch == "qwen3" else tiny_model("llama")
    engine = small_engine(path, max_num_tokens=20, tokens_per_block=8, max_tokens_in_paged_kv_cache=48)
    await engine.start()
    try:
        await run_all(engine, path)
        stats = engine.stats().extra
        assert stats["num_preemptions"] > 0
        assert stats["kv_cache_max_blocks"] == 6 and stats["kv_cache_used_blocks"] == 0
        # The pool holds one sequence of the full 44 positions, yet the short ones ran 3 at once.
        assert stats["peak_running_requests"] == 3 and stats["running_requests"] == 0
        # Behind a sink, the same: a resumed request goes on in plain deltas (its queue time went with its first
        # output), its stream on the wire what submit streams.
        requests = [
            GenerationRequest(f"p{i}", p, SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=i % 2 == 0))
            for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS))
        ]
        before = engine.stats()
        sink = await same_on_the_wire(engine, requests)
        after = engine.stats()
        for r in requests:  # one queue time, on the first output, however often the request was preempted
            outs = sink.outputs_of(r.request_id)
            assert [o for o in outs if o.queue_time_s is not None] == outs[:1]
        assert after.extra["num_preemptions"] - before.extra["num_preemptions"] > stats["num_preemptions"]
        assert after.total_generated_tokens - before.total_generated_tokens == 2 * sum(LENGTHS)
    finally:
        await engine.close()


SHARED = [1] + list(range(60, 83))  # 24 tokens: three blocks of 8


async def test_prefix_caching_reuses_evicts_and_keeps_outputs():
    """Blocks of 8 in a pool of 12 (96 tokens); a request of 31 + 12 positions needs 6."""
    path = tiny_model("llama")
    engine = TorchEngine(
        path,
        max_batch_size=3,
        max_input_len=48,
        max_new_tokens=12,
        max_num_tokens=64,
        tokens_per_block=8,
        max_tokens_in_paged_kv_cache=96,
        enable_kv_cache_reuse=True,
    )
    await engine.start()
    backend = engine._backend
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()

    async def greedy(rid: str, prompt: list[int], n: int = 12) -> tuple[int, int]:
        """Runs it; returns the prompt tokens found in the cache and the prompt tokens computed."""
        before = dict(backend.counters)
        outs = await run(engine, rid, prompt, max_new_tokens=n, ignore_eos=True)
        assert_greedy(tokens(outs), reference(ref, prompt, n, eos_token_id=None))
        after = backend.counters
        return after["prefix_cache_hits"] - before["prefix_cache_hits"], after["prompt_tokens"] - before[
            "prompt_tokens"
        ]

    try:
        assert await greedy("first", SHARED + [5, 6]) == (0, 26)
        # The same 24-token prefix, another suffix: its three blocks are found, two tokens computed.
        assert await greedy("again", SHARED + [7, 8]) == (24, 2)
        # A prompt of exactly the cached blocks still computes its last token (its logits are needed).
        assert await greedy("whole", SHARED) == (16, 8)
        # Several at once with a new shared prefix: the first computes it, the others reuse its
        # blocks in the same step (each layer writes the step's keys before reading any).
        fresh = [1] + list(range(120, 143))
        before = backend.counters["prefix_cache_hits"]
        results = await asyncio.gather(
            *(run(engine, f"s{i}", fresh + [9 + i], max_new_tokens=4, ignore_eos=True) for i in range(3))
        )
        for i, outs in enumerate(results):
            assert_greedy(tokens(outs), reference(ref, fresh + [9 + i], 4, eos_token_id=None))
        assert backend.counters["prefix_cache_hits"] - before == 2 * 24
        # Generated tokens are cached when a request ends: a follow-up turn finds them.
        turn = SHARED + [5, 6]
        outs = await run(engine, "turn1", turn, max_new_tokens=12, ignore_eos=True)
        hits, _ = await greedy("turn2", turn + tokens(outs) + [3])
        assert hits == 32  # 26 + 12 tokens, of which the first 37 were written: four full blocks
        # Eviction, least recently used first: unrelated prompts that need the whole pool push the
        # oldest cached blocks out, while the newest survive.
        for i in range(2):
            await greedy(f"other{i}", [1] + list(range(200 + 31 * i, 230 + 31 * i)))
        assert (await greedy("evicted", fresh + [9]))[0] == 0
        assert (await greedy("kept", [1] + list(range(231, 254)) + [4]))[0] == 24
        assert engine.stats().extra["kv_cache_used_blocks"] == 0
    finally:
        await engine.close()


async def test_prefill_failure_fails_its_requests_only(small_steps, monkeypatch):
    _, engine = small_steps
    poison = 13
    original = LlamaDecoder.forward

    def forward(self, batch):
        if batch.max_q > 1 and bool((batch.tokens == poison).any()):  # a step with the poisoned prompt's chunk
            raise RuntimeError("injected prefill failure")
        return original(self, batch)

    monkeypatch.setattr(LlamaDecoder, "forward", forward)
    bystander = asyncio.create_task(run(engine, "by", [1, 5, 6], max_new_tokens=24, ignore_eos=True))
    while not engine.stats().active_requests:
        await asyncio.sleep(0.01)  # the bystander is decoding before the poisoned prompt arrives
    poisoned = await run(engine, "poison", [1, poison], max_new_tokens=4)
    assert poisoned[-1].finish_reason == FinishReason.ERROR and poisoned[-1].error_code == 424
    assert "injected prefill failure" in poisoned[-1].error
    done = await bystander
    assert len(tokens(done)) == 24 and done[-1].finish_reason == FinishReason.LENGTH
    assert engine.healthy


async def test_decode_failure_fails_that_step_and_the_engine_lives_on(small_steps, monkeypatch):
    _, engine = small_steps
    calls = {"n": 0}
    original = LlamaDecoder.forward

    def forward(self, batch):
        calls["n"] += 1
        if calls["n"] == 3:  # the prompt's step, a decode step, then this one
            raise RuntimeError("injected decode failure")
        return original(self, batch)

    monkeypatch.setattr(LlamaDecoder, "forward", forward)
    failed = await run(engine, "f", [1, 5, 6], max_new_tokens=10, ignore_eos=True)
    assert failed[-1].finish_reason == FinishReason.ERROR and "injected decode failure" in failed[-1].error
    monkeypatch.setattr(LlamaDecoder, "forward", original)
    again = await run(engine, "after", [1, 5, 6], max_new_tokens=10, ignore_eos=True)
    assert len(tokens(again)) == 10 and engine.healthy
    # Every token the steps before the failure made reaches the stream before its error: the prompt's step's and
    # the decode step's still in flight when the next one failed.
    assert tokens(failed) == tokens(again)[:2]


async def test_which_path_runs():
    llama, gpt2 = tiny_model("llama"), tiny_model("gpt2")
    for path, kwargs, expected in [
        (llama, {"decode_loop": "transformers"}, "continuous"),
        (llama, {"batching": "static"}, "static"),
        (gpt2, {}, "continuous"),
    ]:
        engine = TorchEngine(path, max_batch_size=2, max_input_len=16, max_new_tokens=8, **kwargs)
        await engine.start()
        try:
            assert engine.batching == expected, kwargs
        finally:
            await engine.close()
    with pytest.raises(EngineError, match="model_type 'gpt2'") as err:
        await TorchEngine(gpt2, max_input_len=16, max_new_tokens=8, decode_loop="builtin").start()
    assert err.value.code == 400
    # The paged cache's options configure the built-in loop only: elsewhere they are refused.
    for path, kwargs in [(gpt2, {}), (llama, {"decode_loop": "transformers"})]:
        refused = "option.enable_kv_cache_reuse=true, option.tokens_per_block=8, option.enable_chunked_context=true"
        with pytest.raises(EngineError, match=refused) as err:
            await TorchEngine(
                path,
                max_input_len=16,
                max_new_tokens=8,
                enable_kv_cache_reuse=True,
                tokens_per_block=8,
                enable_chunked_context=True,
                **kwargs,
            ).start()
        assert err.value.code == 400
    with pytest.raises(EngineError, match="option.max_tokens_in_paged_kv_cache=20") as err:
        await TorchEngine(llama, max_input_len=16, max_new_tokens=8, max_tokens_in_paged_kv_cache=20).start()
    assert err.value.code == 400 and "fewer than one sequence" in str(err.value)


async def test_choice_and_planning_rules():
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model("mistral")))
    assert choose_decode_loop("auto", "auto", model, 64)[0]
    assert not choose_decode_loop("auto", "continuous", model, 64)[0]
    assert not choose_decode_loop("transformers", "auto", model, 64)[0]
    with pytest.raises(EngineError, match="torch_decode_loop"):
        choose_decode_loop("fast", "auto", model, 64)
    model.config.sliding_window = 32  # a window shorter than a sequence needs its own masks
    assert "sliding_window=32" in unsupported_reason(model, 64)
    assert unsupported_reason(model, 32) is None
    model.config.hidden_act = "gelu"
    assert "hidden_act" in unsupported_reason(model, 32)

    def blocks(free: int | None, max_tokens: int | None = None, caching: bool = False) -> int:
        # blocks of 16 tokens, 100 bytes each; 8 slots of up to 40 positions (3 blocks each)
        shape = dict(block_bytes=100, block_size=16, max_seq_len=40, slots=8, reserved_bytes=50)
        return plan_blocks(**shape, caching=caching, free_bytes=free, max_tokens=max_tokens)[0]

    assert blocks(None) == 24  # CPU: every slot at full length
    assert blocks(None, max_tokens=100) == 6  # ... or what option.max_tokens_in_paged_kv_cache says
    assert blocks(10_000) == 24  # 0.85 × 10000 − 50 = 8450 bytes hold 84 blocks, no use for more than 24
    assert blocks(10_000, caching=True) == 84  # unless they hold a prefix cache
    assert blocks(10_000, max_tokens=320, caching=True) == 20
    assert blocks(1_000) == 8  # (850 − 50) // 100: two sequences at full length, more when shorter
    with pytest.raises(EngineError, match="fewer than one sequence"):
        blocks(400)  # (340 − 50) // 100 = 2 blocks of the 3 one sequence needs
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(64)[-3:] == [32, 48, 64]


async def test_the_cache_on_a_real_servers_metrics(tmp_path):
    """option.* keys → the engine → /metrics: a prompt sent twice is found in the prefix cache the
    second time, and the cache's usage, block size and preemption count are exported."""
    args = ["--engine", "torch", "--model-id", str(tiny_model("llama")), "--model-name", "tiny"]
    for key, value in [
        ("max_input_len", 64),
        ("max_output_len", 8),
        ("enable_kv_cache_reuse", "true"),
        ("tokens_per_block", 8),
        ("max_tokens_in_paged_kv_cache", 256),
    ]:
        args += ["-o", f"option.{key}={value}"]
    with serve(args, tmp_path) as server:
        assert "KV cache of 32 blocks of 8 tokens = 256 tokens" in server.log()
        prompt = "The quick brown fox jumps over the lazy dog. " * 3
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 4}}
        first, second = (server.post("/invocations", json=body) for _ in range(2))
        assert first.status_code == second.status_code == 200 and first.json() == second.json()
        metrics = server.get("/metrics").text
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("lmi_") and "{" in line
    }
    assert values["lmi_prefix_cache_hits_total"] >= 8 and values["lmi_prefix_cache_queries_total"] > 0
    assert values["lmi_num_preemptions_total"] == 0 and values["lmi_kv_cache_usage_perc"] == 0
    assert 'lmi_cache_config_info{block_size="8",model_name="tiny",num_gpu_blocks="32"} 1.0' in metrics
    assert "\nlmi_engine_peak_running_requests 1.0\n" in metrics  # one request at a time
