"""The torch engine's built-in decode loop (lmi_trt/engines/torch/decode_loop.py) on CPU.

test_torch_engine.py already runs every protocol test through this loop for the tiny Llama,
Qwen2 and Mistral models (it is what ``auto`` picks for them). Here: Qwen3 (per-head q/k norms),
prompts that share prefill steps under a small ``max_num_tokens`` while other requests decode,
which path runs for which model and option, and failures inside a step.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from test_torch_engine import one_torch_thread  # noqa: F401 - the same module-wide thread limit
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM, GenerationConfig

from lmi_trt.engines.base import EngineError, FinishReason, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.engines.torch.decode_loop import choose_decode_loop, graph_batch_sizes, plan_slots
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


def generate(ref, prompt: list[int], n: int) -> list[int]:
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


async def run(engine: TorchEngine, rid: str, prompt: list[int], **sampling) -> list:
    return [o async for o in engine.submit(GenerationRequest(rid, prompt, SamplingParams(**sampling)))]


def tokens(outs) -> list[int]:
    return [t for o in outs for t in o.token_ids]


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["qwen3", "llama"])
async def small_steps(request, qwen3):
    """3 slots for 7 requests, and prefill steps of at most 20 tokens: prompts are spread over
    several steps while earlier requests decode, and requests join as others leave."""
    path = qwen3 if request.param == "qwen3" else tiny_model("llama")
    engine = TorchEngine(path, max_batch_size=3, max_input_len=20, max_new_tokens=24, max_num_tokens=20)
    await engine.start()
    yield path, engine
    await engine.close()


async def test_greedy_equals_generate_with_shared_prefill_steps(small_steps):
    path, engine = small_steps
    assert engine.batching == "decode_loop"
    ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    lengths = [24, 3, 17, 9, 24, 1, 12]
    results = await asyncio.gather(
        *(run(engine, f"r{i}", p, max_new_tokens=n, ignore_eos=True) for i, (p, n) in enumerate(zip(PROMPTS, lengths)))
    )
    for prompt, n, outs in zip(PROMPTS, lengths, results):
        assert tokens(outs) == generate(ref, prompt, n)
        assert outs[-1].finish_reason == FinishReason.LENGTH
    backend = engine._backend
    assert backend.counters["prefill_steps"] >= 3  # 7 prompts of up to 17 tokens in 20-token steps


async def test_prefill_failure_fails_its_requests_only(small_steps, monkeypatch):
    _, engine = small_steps
    poison = 13
    original = LlamaDecoder.prefill

    def prefill(self, tokens, *args):
        if bool((tokens == poison).any()):
            raise RuntimeError("injected prefill failure")
        return original(self, tokens, *args)

    monkeypatch.setattr(LlamaDecoder, "prefill", prefill)
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
    original = LlamaDecoder.decode

    def decode(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected decode failure")
        return original(self, *args)

    monkeypatch.setattr(LlamaDecoder, "decode", decode)
    failed = await run(engine, "f", [1, 5, 6], max_new_tokens=10, ignore_eos=True)
    assert failed[-1].finish_reason == FinishReason.ERROR and "injected decode failure" in failed[-1].error
    monkeypatch.setattr(LlamaDecoder, "decode", original)
    again = await run(engine, "after", [1, 5, 6], max_new_tokens=10, ignore_eos=True)
    assert len(tokens(again)) == 10 and engine.healthy


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

    assert plan_slots(8, 100, None, 0) == 8  # CPU: no device memory to size against
    assert plan_slots(8, 100, 1000, 50) == 8  # 0.85 × 1000 − 50 = 800 bytes: all 8 fit
    assert plan_slots(8, 100, 500, 50) == 3  # (425 − 50) // 100
    with pytest.raises(EngineError, match="max_input_len"):
        plan_slots(8, 1000, 500, 50)
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert graph_batch_sizes(64)[-3:] == [32, 48, 64]
