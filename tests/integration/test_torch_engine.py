"""The embedded torch engine against `model.generate`, for every tiny architecture.

One engine per architecture (module scope). Its EOS list is [</s>, E] where E is a token the
model greedily emits (for the first time, 4th or later) after EOS_PROMPT, so EOS finishes can be
provoked deterministically and a Llama-3 style list of EOS ids is exercised.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
import pytest_asyncio
import torch
from tinymodels import ARCHS, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM

from lmi_trt.engines.base import EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.engines.torch.continuous import CB_IMPORT_ERROR

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

# Without transformers' continuous batching API (the 0.12 and 1.0 images' transformers) the transformers path is static.
_CB = "continuous" if CB_IMPORT_ERROR is None else "static"
# The other architectures take transformers' continuous batching where their model class supports its attention
# backends, which transformers releases add over time (GPT-J gained it in the 5.x line, Falcon has not).
DECODE_LOOP_ARCHS = ("llama", "qwen2", "mistral")


def transformers_path(model: torch.nn.Module) -> str:
    return _CB if getattr(model, "_supports_attention_backend", False) else "static"


def arch_without_attention_backends() -> str:
    """A tiny model whose class the installed transformers cannot page (continuous batching refuses it)."""
    for arch in ("falcon", "gptj", "gpt2"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model(arch)))
        if not getattr(model, "_supports_attention_backend", False):
            return arch
    raise AssertionError("every tiny architecture supports transformers' attention backends now: add one that does not")


MAX_BATCH, MAX_INPUT, MAX_NEW = 4, 32, 200
EOS_PROMPT = [1, 40, 41, 42]
PROMPTS = [
    [1, 5],
    [1, 9, 10, 11, 12],
    [1] + list(range(100, 108)),
    [1] + list(range(200, 216)),
    [1] + list(range(300, 331)),
    [1, 77, 78],
]  # 6 > MAX_BATCH: some wait for a free slot


@dataclass
class Bundle:
    arch: str
    engine: TorchEngine
    ref: torch.nn.Module
    eos: list[int]
    eos_at: int  # index at which the greedy continuation of EOS_PROMPT emits eos[1]

    def generate(self, prompt: list[int], n: int, **kwargs) -> list[int]:
        return reference(self.ref, prompt, n, **{"eos_token_id": self.eos, **kwargs}).tokens

    def assert_greedy(self, got: list[int], prompt: list[int], n: int, **kwargs) -> bool:
        """``got`` is model.generate's greedy continuation wherever that is guaranteed; True when all of it is."""
        return assert_greedy(got, reference(self.ref, prompt, n, **{"eos_token_id": self.eos, **kwargs}))


# Greedy tokens are guaranteed only where the model's choice is clear. The engine computes a request
# in whatever batch it lands in (which depends on timing), and a different batch shape sums the same
# floats in another order: about 1e-6 apart in fp32. Random tiny models have near-tied logits, so a
# step whose top two logits are closer than this may pick either, and the rest follows from it.
MARGIN = 1e-3


class Reference(NamedTuple):
    tokens: list[int]  # model.generate's greedy continuation
    clear: int  # how many leading steps chose with a clear margin
    logits: list[torch.Tensor]  # each step's raw logits


def reference(model, prompt: list[int], n: int, **kwargs) -> Reference:
    """Greedy ``model.generate`` (eos_token_id=None ignores EOS), with the margin of each choice
    taken after the logits processors (penalties, min_new_tokens), as the argmax sees them."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=n,
        do_sample=False,
        pad_token_id=0,
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    tokens = out.sequences[0, len(prompt) :].tolist()
    clear = next(
        (i for i, s in enumerate(out.scores) if float(s[0].float().topk(2).values.diff().abs()) < MARGIN), len(tokens)
    )
    return Reference(tokens, clear, [step[0] for step in out.logits])


def assert_greedy(got: list[int], ref: Reference) -> bool:
    if ref.clear == len(ref.tokens):
        assert got == ref.tokens
        return True
    assert got[: ref.clear] == ref.tokens[: ref.clear], (got, ref.tokens, f"clear margin for the first {ref.clear}")
    return False


def pick_eos(continuation: list[int]) -> int:
    """An index whose token first occurs there (and is not a special token)."""
    for i in range(3, len(continuation)):
        if continuation[i] > 4 and continuation[i] not in continuation[:i]:
            return i
    raise AssertionError(f"no usable EOS candidate in {continuation}")


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """CI machines have 2 shared cores; tiny models gain nothing from more threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=ARCHS)
async def bundle(request):
    path = tiny_model(request.param)
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    free_run = ref.generate(
        torch.tensor([EOS_PROMPT]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(EOS_PROMPT) :].tolist()
    at = pick_eos(free_run)
    eos = [2, free_run[at]]
    engine = TorchEngine(
        path, max_batch_size=MAX_BATCH, max_input_len=MAX_INPUT, max_new_tokens=MAX_NEW, eos_token_ids=eos
    )
    await engine.start()
    yield Bundle(request.param, engine, ref, eos, at)
    await engine.close()


async def collect(engine: TorchEngine, request: GenerationRequest):
    outs = [out async for out in engine.submit(request)]
    assert outs and outs[-1].finished and all(not o.finished for o in outs[:-1])
    return outs


def tokens_of(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


def req(rid: str, prompt: list[int], **sampling) -> GenerationRequest:
    stop = sampling.pop("stop_token_ids", [])
    bad = sampling.pop("bad_words_ids", [])
    return GenerationRequest(rid, prompt, SamplingParams(**sampling), stop_token_ids=stop, bad_words_ids=bad)


async def wait_idle(engine: TorchEngine, timeout: float = 60.0) -> None:
    """No open request, and the engine thread stops computing for closed ones (a step already under
    way may finish; on a loaded machine that step may take a while, hence the bound, not a speed)."""
    deadline = time.monotonic() + timeout
    while engine.stats().active_requests or engine.stats().queued_requests:
        assert time.monotonic() < deadline, engine.stats()
        await asyncio.sleep(0.01)
    work = -1
    while work != (work := engine.stats().extra["sampled_rows"]):
        assert time.monotonic() < deadline, "a cancelled request is still being decoded"
        await asyncio.sleep(0.5)


# ------------------------------------------------------------------------------------------


async def test_path_and_limits(bundle):
    expected = "decode_loop" if bundle.arch in DECODE_LOOP_ARCHS else transformers_path(bundle.ref)
    if expected == "decode_loop":
        # The built-in loop needs transformers' shared rotary module (model.model.rotary_emb); older
        # transformers (the 0.12 image's 4.42) keep one per layer, and the engine takes its transformers path.
        from lmi_trt.engines.torch.llama_decoder import unsupported_reason

        ref = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model(bundle.arch)))
        if unsupported_reason(ref, MAX_INPUT + MAX_NEW) is not None:
            expected = _CB
    assert bundle.engine.batching == expected
    assert bundle.engine.healthy
    limits = bundle.engine.limits
    assert (limits.max_batch_size, limits.max_input_len, limits.max_new_tokens) == (MAX_BATCH, MAX_INPUT, MAX_NEW)
    # beams run in the built-in loop only, each beam a batch slot (issue 28)
    assert bundle.engine.capabilities.logprobs.honoured
    assert limits.max_beam_width == (MAX_BATCH if expected == "decode_loop" else 1)


async def test_greedy_matches_generate_concurrently(bundle):
    requests = [req(f"g{i}", p, max_new_tokens=6 + i) for i, p in enumerate(PROMPTS)]
    results = await asyncio.gather(*(collect(bundle.engine, r) for r in requests))
    for r, outs in zip(requests, results):
        got = tokens_of(outs)
        assert all(len(o.token_ids) <= 1 for o in outs)  # streamed one delta per step
        if bundle.assert_greedy(got, r.prompt_token_ids, r.sampling.max_new_tokens):
            reason = FinishReason.EOS if got[-1] in bundle.eos else FinishReason.LENGTH
            assert outs[-1].finish_reason == reason
    stats = bundle.engine.stats()
    assert stats.active_requests == stats.queued_requests == 0
    assert stats.total_generated_tokens >= sum(len(tokens_of(o)) for o in results)
    # Each request's queue time comes once, with its first output (the metric counts it once).
    for outs in results:
        assert outs[0].queue_time_s is not None and outs[0].queue_time_s >= 0, outs[0]
        assert all(o.queue_time_s is None for o in outs[1:])


async def test_eos_versus_length(bundle):
    eos_run = await collect(bundle.engine, req("eos", EOS_PROMPT, max_new_tokens=10))
    if bundle.assert_greedy(tokens_of(eos_run), EOS_PROMPT, 10):
        assert len(tokens_of(eos_run)) == bundle.eos_at + 1 and tokens_of(eos_run)[-1] == bundle.eos[1]
    if tokens_of(eos_run)[-1] in bundle.eos:
        assert eos_run[-1].finish_reason == FinishReason.EOS

    length_run = await collect(bundle.engine, req("len", EOS_PROMPT, max_new_tokens=10, ignore_eos=True))
    assert len(tokens_of(length_run)) == 10 and length_run[-1].finish_reason == FinishReason.LENGTH
    assert tokens_of(length_run)[: bundle.eos_at + 1] == tokens_of(eos_run)


async def test_stop_token_ids(bundle):
    prompt = PROMPTS[2]
    free = tokens_of(await collect(bundle.engine, req("free", prompt, max_new_tokens=8, ignore_eos=True)))
    stop = free[3:5]
    first = next(i for i in range(len(free) - 1) if free[i : i + 2] == stop)
    outs = await collect(
        bundle.engine, req("stop", prompt, max_new_tokens=8, ignore_eos=True, stop_token_ids=[[499, 498], stop])
    )
    assert tokens_of(outs) == free[: first + 2]
    assert outs[-1].finish_reason == FinishReason.STOP_SEQUENCE


async def test_bad_words_never_appear(bundle):
    prompt = PROMPTS[1]
    free = tokens_of(await collect(bundle.engine, req("free", prompt, max_new_tokens=8, ignore_eos=True)))
    banned_single, banned_pair = free[0], free[2:4]
    requests = [
        req("bad-greedy", prompt, max_new_tokens=8, ignore_eos=True, bad_words_ids=[[banned_single], banned_pair]),
        req(
            "bad-sample",
            prompt,
            max_new_tokens=8,
            ignore_eos=True,
            do_sample=True,
            temperature=1.5,
            seed=3,
            bad_words_ids=[[banned_single], banned_pair],
        ),
    ]
    for outs in await asyncio.gather(*(collect(bundle.engine, r) for r in requests)):
        got = tokens_of(outs)
        assert len(got) == 8 and banned_single not in got
        context = prompt + got
        assert not any(context[i : i + 2] == banned_pair for i in range(len(context) - 1))


async def test_seed_reproducible(bundle):
    def sampled(rid, seed):
        return req(
            rid,
            PROMPTS[3],
            max_new_tokens=10,
            ignore_eos=True,
            do_sample=True,
            temperature=2.0,
            top_k=50,
            top_p=0.95,
            seed=seed,
        )

    a, b, *others = await asyncio.gather(
        *(collect(bundle.engine, sampled(f"s{i}", seed)) for i, seed in enumerate([7, 7, 8, 9, 10]))
    )
    assert tokens_of(a) == tokens_of(b)
    assert any(tokens_of(o) != tokens_of(a) for o in others)
    greedy = bundle.generate(PROMPTS[3], 10)
    assert tokens_of(a) != greedy  # sampling really happened


async def test_do_sample_false_is_greedy_whatever_the_temperature(bundle):
    outs = await collect(bundle.engine, req("hot", PROMPTS[0], max_new_tokens=6, temperature=5.0, top_k=3, seed=1))
    bundle.assert_greedy(tokens_of(outs), PROMPTS[0], 6)


async def test_logprobs_are_the_models(bundle):
    prompt = PROMPTS[1]
    outs = await collect(bundle.engine, req("lp", prompt, max_new_tokens=5, ignore_eos=True, logprobs=True))
    got = tokens_of(outs)
    ref = reference(bundle.ref, prompt, 5, eos_token_id=None)
    assert_greedy(got, ref)
    # Log-probs of the same tokens after the same context agree to float noise; compared where the
    # context is guaranteed the same (the clear prefix, and the step right after it).
    n = min(ref.clear + 1, len(got))
    expected = [float(step.float().log_softmax(-1)[t]) for step, t in zip(ref.logits[:n], got[:n])]
    assert [lp for o in outs for lp in o.logprobs][:n] == pytest.approx(expected, abs=1e-4)


async def test_repetition_penalty_and_min_new_tokens_match_generate(bundle):
    rep = await collect(bundle.engine, req("rep", PROMPTS[3], max_new_tokens=8, repetition_penalty=1.8))
    bundle.assert_greedy(tokens_of(rep), PROMPTS[3], 8, repetition_penalty=1.8)

    min_len = bundle.eos_at + 3
    outs = await collect(bundle.engine, req("min", EOS_PROMPT, max_new_tokens=10, min_new_tokens=min_len))
    got = tokens_of(outs)
    bundle.assert_greedy(got, EOS_PROMPT, 10, min_new_tokens=min_len)
    assert len(got) >= min_len and not set(got[:min_len]) & set(bundle.eos)


async def test_frequency_and_presence_penalties(bundle):
    outs = await collect(
        bundle.engine, req("freq", PROMPTS[4], max_new_tokens=12, ignore_eos=True, frequency_penalty=100.0)
    )
    assert len(set(tokens_of(outs))) == 12  # every generated token is pushed out of reach once used
    outs = await collect(
        bundle.engine, req("pres", PROMPTS[4], max_new_tokens=12, ignore_eos=True, presence_penalty=100.0)
    )
    assert len(set(tokens_of(outs))) == 12


async def test_non_streaming_aggregates_one_output(bundle):
    request = GenerationRequest(
        "ns", PROMPTS[2], SamplingParams(max_new_tokens=7, ignore_eos=True, logprobs=True), streaming=False
    )
    outs = [o async for o in bundle.engine.submit(request)]
    assert len(outs) == 1 and outs[0].finished and outs[0].finish_reason == FinishReason.LENGTH
    bundle.assert_greedy(outs[0].token_ids, PROMPTS[2], 7, eos_token_id=None)
    assert len(outs[0].token_ids) == len(outs[0].logprobs) == 7


async def test_cancel_mid_generation_frees_the_slot(bundle):
    engine = bundle.engine
    outs = []
    async for out in engine.submit(req("long", PROMPTS[0], max_new_tokens=MAX_NEW, ignore_eos=True)):
        outs.append(out)
        if len(outs) == 2:
            assert engine.stats().active_requests == 1
            await engine.cancel("long")
    assert outs[-1].finished and outs[-1].finish_reason == FinishReason.CANCELLED
    assert len(tokens_of(outs)) < MAX_NEW
    await wait_idle(engine)
    # The freed cache and batch slots are usable: a full batch of long requests still runs.
    full = [req(f"after{i}", PROMPTS[i], max_new_tokens=40, ignore_eos=True) for i in range(MAX_BATCH)]
    assert all(len(tokens_of(o)) == 40 for o in await asyncio.gather(*(collect(engine, r) for r in full)))


async def test_closing_the_iterator_cancels(bundle):
    engine = bundle.engine
    stream = engine.submit(req("gone", PROMPTS[1], max_new_tokens=MAX_NEW, ignore_eos=True))
    first = await anext(stream)
    assert first.token_ids and engine.stats().active_requests == 1
    await stream.aclose()
    assert engine.stats().active_requests == 0
    task = asyncio.create_task(collect(engine, req("gone-task", PROMPTS[1], max_new_tokens=MAX_NEW, ignore_eos=True)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(engine)
    # Same request_id again right away: a fresh request, not the cancelled one.
    again = await collect(engine, req("gone", PROMPTS[1], max_new_tokens=4, ignore_eos=True))
    bundle.assert_greedy(tokens_of(again), PROMPTS[1], 4, eos_token_id=None)


async def test_bad_requests_are_rejected_and_isolated(bundle):
    engine = bundle.engine
    good = asyncio.create_task(collect(engine, req("good", PROMPTS[3], max_new_tokens=12, ignore_eos=True)))
    for bad, needle in [
        (req("v", [1, 600]), "prompt_token_ids"),
        (req("len", list(range(1, 40))), "max_input_len"),
        (req("beam", PROMPTS[0], beam_width=2), "beam_width"),
        (req("mnt", PROMPTS[0], max_new_tokens=MAX_NEW + 1), "max_new_tokens"),
        (req("stop", PROMPTS[0], stop_token_ids=[[5000]]), "stop_token_ids"),
        (req("temp", PROMPTS[0], do_sample=True, temperature=0.0), "temperature"),
    ]:
        refusal = await collect(engine, bad)  # base.py's contract: the one, final output; never a raise
        assert len(refusal) == 1 and refusal[0].finish_reason == FinishReason.ERROR
        assert refusal[0].error_code == 400 and needle in refusal[0].error
    # A failure inside the step, next to a good request in the same batch: every token but EOS
    # is banned and EOS is forbidden by min_new_tokens, a constraint no token meets: the client's (400).
    everything = [[t] for t in range(512) if t not in bundle.eos]
    doomed = await collect(
        engine, req("doomed", PROMPTS[3], max_new_tokens=12, min_new_tokens=3, bad_words_ids=everything)
    )
    assert doomed[-1].finish_reason == FinishReason.ERROR and doomed[-1].error_code == 400
    assert doomed[-1].error_field == "bad_words" and "every token is excluded" in doomed[-1].error
    bundle.assert_greedy(tokens_of(await good), PROMPTS[3], 12, eos_token_id=None)
    assert engine.healthy
    await wait_idle(engine)


# ------------------------------------------------------------------------------------------
# Failures of the engine itself, and shutdown, on one engine per path.

POISON = 13


def poison_forward(monkeypatch, model_cls) -> None:
    """Make the model's forward raise whenever the batch contains the POISON token."""
    original = model_cls.forward

    def forward(self, input_ids=None, **kwargs):
        if input_ids is not None and bool((input_ids == POISON).any()):
            raise RuntimeError("injected forward failure")
        return original(self, input_ids=input_ids, **kwargs)

    monkeypatch.setattr(model_cls, "forward", forward)


@pytest.mark.skipif(_CB != "continuous", reason="this transformers has no continuous batching API")
async def test_continuous_engine_death_fails_everything(monkeypatch):
    from transformers import LlamaForCausalLM

    poison_forward(monkeypatch, LlamaForCausalLM)
    engine = TorchEngine(
        tiny_model("llama"), max_batch_size=2, max_input_len=16, max_new_tokens=MAX_NEW, decode_loop="transformers"
    )
    await engine.start()
    try:
        bystander = asyncio.create_task(collect(engine, req("by", [1, 5, 6], max_new_tokens=MAX_NEW, ignore_eos=True)))
        await asyncio.sleep(0.05)
        poisoned = await collect(engine, req("poison", [1, POISON]))
        assert poisoned[-1].finish_reason == FinishReason.ERROR
        assert (await bystander)[-1].finish_reason == FinishReason.ERROR
        deadline = time.monotonic() + 5
        while engine.healthy:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        late = await collect(engine, req("late", [1, 5]))
        assert late[-1].finish_reason == FinishReason.ERROR and late[-1].error_code == 503
    finally:
        await engine.close()


async def test_static_batch_failure_spares_the_engine(monkeypatch):
    from transformers import FalconForCausalLM

    poison_forward(monkeypatch, FalconForCausalLM)
    engine = TorchEngine(tiny_model("falcon"), max_batch_size=2, max_input_len=16, max_new_tokens=MAX_NEW)
    await engine.start()
    try:
        poisoned = await collect(engine, req("poison", [1, POISON]))
        assert poisoned[-1].finish_reason == FinishReason.ERROR and "injected" in poisoned[-1].error
        assert engine.healthy
        assert len(tokens_of(await collect(engine, req("fine", [1, 5, 6], max_new_tokens=5, ignore_eos=True)))) == 5
    finally:
        await engine.close()


@pytest.mark.parametrize("arch", ["llama", "falcon"])
async def test_close_is_prompt_and_ends_streams(arch):
    engine = TorchEngine(tiny_model(arch), max_batch_size=2, max_input_len=16, max_new_tokens=MAX_NEW)
    await engine.start()
    stream = engine.submit(req("inflight", [1, 5, 6], max_new_tokens=MAX_NEW, ignore_eos=True))
    await anext(stream)
    # Prompt = it does not wait for the request's 200 tokens; the bound holds on a loaded machine.
    await asyncio.wait_for(engine.close(), timeout=60)
    rest = [o async for o in stream]
    assert rest[-1].finished and rest[-1].finish_reason == FinishReason.ERROR and rest[-1].error_code == 503
    assert not engine.healthy
    after = await collect(engine, req("after", [1, 5]))
    assert after[-1].finish_reason == FinishReason.ERROR and after[-1].error_code == 503


async def test_forced_static_batching_with_absolute_positions():
    # GPT-2's learned absolute positions make any left-padding mistake visible (RoPE would hide it).
    path = tiny_model("gpt2")
    engine = TorchEngine(path, max_batch_size=4, max_input_len=32, max_new_tokens=8, batching="static")
    await engine.start()
    try:
        assert engine.batching == "static"
        ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        prompts = PROMPTS[:4]
        results = await asyncio.gather(
            *(collect(engine, req(f"s{i}", p, max_new_tokens=8, ignore_eos=True)) for i, p in enumerate(prompts))
        )
        for prompt, outs in zip(prompts, results):
            assert_greedy(tokens_of(outs), reference(ref, prompt, 8, eos_token_id=None))
    finally:
        await engine.close()


async def test_startup_errors(tmp_path: Path):
    # Without transformers' continuous batching API, that is the reason given for every model.
    reason = "_supports_attention_backend" if _CB == "continuous" else "continuous batching API"
    with pytest.raises(EngineError, match=reason):
        await TorchEngine(
            tiny_model(arch_without_attention_backends()), max_input_len=16, max_new_tokens=8, batching="continuous"
        ).start()
    with pytest.raises(EngineError, match="does not exist"):
        await TorchEngine(tmp_path / "missing").start()
    with pytest.raises(EngineError, match="positions"):
        await TorchEngine(tiny_model("gpt2"), max_input_len=500, max_new_tokens=100).start()
    with pytest.raises(EngineError, match="dtype"):
        await TorchEngine(tiny_model("gpt2"), dtype="int8").start()


async def test_copies_loading_together_load_tied_weights():
    # transformers patches PreTrainedModel.tie_weights while it loads; overlapping loads (copies
    # starting together) must neither untie a model nor leave the patch behind for later loads.
    from transformers import PreTrainedModel

    tie_weights = PreTrainedModel.tie_weights
    path = tiny_model("gpt2")
    engines = [TorchEngine(path, max_batch_size=1, max_input_len=16, max_new_tokens=8) for _ in range(3)]
    try:
        await asyncio.gather(*(e.start() for e in engines))
        assert PreTrainedModel.tie_weights is tie_weights
        ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        assert ref.lm_head.weight.data_ptr() == ref.transformer.wte.weight.data_ptr()
        for i, engine in enumerate(engines):
            outs = await collect(engine, req(f"tied{i}", PROMPTS[1], max_new_tokens=6, ignore_eos=True))
            assert_greedy(tokens_of(outs), reference(ref, PROMPTS[1], 6, eos_token_id=None))
    finally:
        for engine in engines:
            await engine.close()
