"""engines/base.py's error contract, held against every engine: ``submit`` never raises and no
iterator raises; a request that cannot be served ends with its one final output (ERROR, error,
error_code) and never touches another request; an engine not running answers 503 the same way.

One table of engines: the synthetic engine, the torch engine on both of its paths (the built-in
decode loop for Llama, transformers' for GPT-2), and both TensorRT-LLM backends through the fake
(the Executor over a built engine folder, the LLM API over the checkpoint)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from tinymodels import tiny_model
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.engines.base import Engine, EngineOutput, FinishReason, GenerationRequest, SamplingParams

MAX_INPUT = 16


async def _synthetic(tmp_path) -> Engine:
    from lmi_trt.engines.synthetic import SyntheticEngine

    return SyntheticEngine(512, tokens_per_second=50, max_batch_size=4, max_input_len=MAX_INPUT, max_new_tokens=64)


def _torch(arch: str):
    async def build(tmp_path) -> Engine:
        from lmi_trt.engines.torch import TorchEngine

        return TorchEngine(
            tiny_model(arch),
            max_batch_size=4,
            max_input_len=MAX_INPUT,
            max_new_tokens=64,
            eos_token_ids=[2],
            pad_token_id=0,
        )

    return build


async def _executor(tmp_path) -> Engine:
    from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings

    engine_dir = make_engine_dir(
        tiny_model("llama"), tmp_path / "engine", max_batch_size=4, max_input_len=MAX_INPUT, max_seq_len=80
    )
    return TrtllmEngine(
        engine_dir, TrtllmSettings(max_batch_size=4), eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True
    )


async def _llmapi(tmp_path) -> Engine:
    from lmi_trt.engines.llmapi import LlmApiEngine, LlmApiSettings
    from lmi_trt.engines.trtllm import TrtllmSettings

    settings = LlmApiSettings(
        runtime=TrtllmSettings(max_batch_size=4, max_batch_size_key="option.max_rolling_batch_size"),
        max_input_len=MAX_INPUT,
        max_seq_len=80,
    )
    return LlmApiEngine(tiny_model("llama"), settings, eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True)


def _release_backends() -> dict[str, Callable[..., Awaitable[Engine]]]:
    """The TensorRT-LLM backends of the release the fake impersonates (LMI_TRT_FAKE_RELEASE): the
    Executor where it exists (≤ 1.2), the PyTorch LLM API from 1.0."""
    from lmi_trt.engines import probe_trtllm
    from lmi_trt.engines.registry import PYTORCH

    with fake_tensorrt_llm():
        facts = probe_trtllm()
    return {
        name: build
        for name, build, present in (
            ("trtllm-executor", _executor, facts.has_executor),
            ("trtllm-llmapi", _llmapi, facts.has(PYTORCH)),
        )
        if present
    }


ENGINES: dict[str, Callable[..., Awaitable[Engine]]] = {
    "synthetic": _synthetic,
    "torch-decode-loop": _torch("llama"),
    "torch-transformers": _torch("gpt2"),
    **_release_backends(),
}


@pytest.fixture(params=list(ENGINES))
async def engine(request, tmp_path) -> AsyncIterator[Engine]:
    with fake_tensorrt_llm():
        built = await ENGINES[request.param](tmp_path)
        yield built
        await built.close()


def req(rid: str, prompt: list[int], max_new_tokens: int = 8) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))


async def outputs(engine: Engine, request: GenerationRequest) -> list[EngineOutput]:
    async def run() -> list[EngineOutput]:
        return [out async for out in engine.submit(request)]  # a raise here breaks the contract

    return await asyncio.wait_for(run(), 120)


def assert_refused(outs: list[EngineOutput], code: int) -> None:
    assert len(outs) == 1, outs
    (out,) = outs
    assert out.finished and out.finish_reason is FinishReason.ERROR and out.error and out.error_code == code, out


async def test_submit_before_start_is_a_503_output(engine):
    assert_refused(await outputs(engine, req("early", [1, 5, 6])), 503)


async def test_a_refused_request_is_its_final_output_and_spares_the_others(engine):
    await asyncio.wait_for(engine.start(), 120)
    bystander = asyncio.create_task(outputs(engine, req("bystander", [1, 5, 6], max_new_tokens=12)))
    # The same id twice while the first is in flight: every engine refuses the second with a 400.
    first = engine.submit(req("twice", [1, 7, 8], max_new_tokens=40))
    head = await asyncio.wait_for(anext(first), 120)
    assert head.error is None
    assert_refused(await outputs(engine, req("twice", [1, 9])), 400)
    await first.aclose()
    done = await bystander
    assert done[-1].finish_reason is FinishReason.LENGTH and sum(len(o.token_ids) for o in done) == 12
    assert engine.healthy


async def test_after_close_a_request_is_a_503_output(engine):
    await asyncio.wait_for(engine.start(), 120)
    await asyncio.wait_for(engine.close(), 120)
    assert_refused(await outputs(engine, req("late", [1, 5, 6])), 503)
