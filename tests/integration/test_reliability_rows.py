"""Defence in depth behind the request validation: a row whose sampling arithmetic breaks (here a
temperature the serving layer refuses, sent to the engine directly) fails alone, in the torch
engine's continuous and static batches; the other rows' tokens are exactly their solo tokens.
On 4dccd9d `torch.multinomial` raised for the whole batched draw and every row failed."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_torch_engine import collect, req, tokens_of
from tinymodels import tiny_model

from lmi_trt.engines.base import FinishReason
from lmi_trt.engines.torch import TorchEngine

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

PROMPTS = [[1, 5, 6], [1, 9, 10, 11], [1, 20, 21, 22, 23]]
N = 12


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("batching", ["continuous", "static"])
async def test_a_row_whose_sampling_breaks_fails_alone(batching):
    engine = TorchEngine(tiny_model("llama"), max_batch_size=8, max_input_len=32, max_new_tokens=N, batching=batching)
    await engine.start()
    try:
        assert engine.batching == batching

        def victims(tag: str):
            greedy = [req(f"{tag}g{i}", p, max_new_tokens=N, ignore_eos=True) for i, p in enumerate(PROMPTS)]
            seeded = req(
                f"{tag}s", PROMPTS[0], max_new_tokens=N, ignore_eos=True, do_sample=True, temperature=0.8, seed=7
            )
            return [*greedy, seeded]

        alone = [tokens_of(await collect(engine, r)) for r in victims("a")]
        poisoned = [
            req("p1", [1, 7, 8], max_new_tokens=N, do_sample=True, temperature=1e-40),
            req("p2", [1, 7, 9], max_new_tokens=N, do_sample=True, temperature=1e-300, seed=3),
        ]
        results = await asyncio.gather(*(collect(engine, r) for r in [*poisoned, *victims("b")]))
        for outs in results[:2]:
            assert outs[-1].finish_reason is FinishReason.ERROR and "invalid probabilities" in outs[-1].error, outs[-1]
        assert [tokens_of(outs) for outs in results[2:]] == alone
        assert all(outs[-1].finish_reason is FinishReason.LENGTH for outs in results[2:])
        assert engine.healthy
    finally:
        await engine.close()
