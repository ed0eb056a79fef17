"""Test helpers for speculative decoding on the Executor through the fake TensorRT-LLM (lookahead, n-gram draft tokens):
greedy references from transformers, an engine started and asked, and a server that JIT-builds its engine from the
Hugging Face checkpoint and answers /ping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from tinymodels import tiny_model
from trtllm_testing import make_engine_dir

from lmi_trt.compat import dtype_kwargs
from lmi_trt.engines.base import GenerationRequest, SamplingParams
from lmi_trt.engines.trtllm import TrtllmEngine, TrtllmSettings


def greedy_reference(hf_dir: Path | None = None) -> Callable[[list[int], int], list[int]]:
    """Greedy continuations from transformers' own generate (decoding without speculation), up to the EOS id 2."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(hf_dir or tiny_model("llama")), **dtype_kwargs(torch.float32)
    ).eval()

    def generate(prompt: list[int], max_new_tokens: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=2, pad_token_id=0
            )[0, len(prompt) :].tolist()
        return out[: out.index(2)] if 2 in out else out

    return generate


def greedy_text_tokens(hf_dir: Path, prompt: str, n: int) -> tuple[str, list[int]]:
    """A text prompt's greedy continuation (token ids up to the tokenizer's EOS) and its decoded text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, **dtype_kwargs(torch.float32)).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1] :].tolist()
    want = want[: want.index(tok.eos_token_id)] if tok.eos_token_id in want else want
    return tok.decode(want, skip_special_tokens=True), want


async def started(engine_dir, settings: TrtllmSettings, eos=(2,)) -> TrtllmEngine:
    engine = TrtllmEngine(engine_dir, settings, eos_token_ids=list(eos), pad_token_id=0, gpu_available=lambda: True)
    await asyncio.wait_for(engine.start(), 60)
    return engine


async def generate(engine: TrtllmEngine, rid: str, prompt: list[int], **sampling) -> list:
    sampling.setdefault("max_new_tokens", 24)
    stops = sampling.pop("stop_token_ids", [])
    request = GenerationRequest(rid, prompt, SamplingParams(**sampling), stop_token_ids=stops, streaming=True)

    async def run():
        return [out async for out in engine.submit(request)]

    return await asyncio.wait_for(run(), 60)


def tokens_of(outputs) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


def spec_engine(out: Path, mode: str, **build) -> Path:
    """A tiny Llama engine built (by the fake) for ``mode``, a SpeculativeDecodingMode member's name."""
    from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode

    return make_engine_dir(tiny_model("llama"), out, **build, speculative_decoding_mode=SpeculativeDecodingMode[mode])


def jit_config(tmp_path: Path, **more):
    """The tiny Llama checkpoint on the tensorrt backend, its engine built by the compile stage (JIT)."""
    from lmi_trt.config import LmiConfig

    return LmiConfig(
        model_id=str(tiny_model("llama")),
        rolling_batch="trtllm",
        backend="tensorrt",
        max_input_len=64,
        max_output_len=32,
        max_rolling_batch_size=4,
        download_dir=tmp_path / "dl",
        **more,
    )


def compiled(tmp_path: Path, monkeypatch, trt, release: str, **more):
    """The engine the compile stage builds for ``jit_config(tmp_path, **more)`` on the fake ``release`` (an H100)."""
    from lmi_trt.compile.jit import ensure_engine
    from lmi_trt.compile.plan import GpuFacts
    from lmi_trt.sources import resolve_model
    from lmi_trt.stages import compile_job, settle

    monkeypatch.setenv("LMI_TRT_FAKE_RELEASE", release)  # what the spawned build workers impersonate too
    trt.__version__ = release
    gpu = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
    config = settle(jit_config(tmp_path, **more), "trtllm")
    return ensure_engine(compile_job(config), resolve_model(config), gpu=gpu, trtllm_version=release)


@asynccontextmanager
async def jit_server(monkeypatch, trt, release: str, config) -> AsyncIterator:
    """The real load path on the fake ``release``: the compile stage builds the engine from ``config``'s checkpoint
    (spawned build workers impersonate the release too), and the server answers /ping once it is up."""
    from aiohttp import ClientSession, ClientTimeout
    from aiohttp.test_utils import TestServer

    import lmi_trt.compile.jit as jit
    import lmi_trt.engines.trtllm as engine_module
    from lmi_trt.compile.plan import GpuFacts
    from lmi_trt.loader import load_model
    from lmi_trt.serving.app import build_app

    monkeypatch.setenv("LMI_TRT_FAKE_RELEASE", release)
    trt.__version__ = release
    monkeypatch.setattr(engine_module, "cuda_available", lambda: True)
    monkeypatch.setattr(jit, "_host_gpu", lambda: GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1))
    monkeypatch.setattr(jit, "_host_trtllm", lambda: release)
    server = TestServer(build_app(lambda: load_model(config, "trtllm"), config, model_name="tiny"), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession(timeout=ClientTimeout(total=120)) as s:
            deadline = asyncio.get_running_loop().time() + 300
            while True:  # a JIT build on a loaded machine takes a while: bounded, not timed
                async with s.get(server.make_url("/ping")) as r:
                    if r.status == 200:
                        break
                    assert "FAILED" not in await r.text()
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
            yield server, s
    finally:
        await server.close()


async def greedy_text_and_sampled_refusal(server, s, prompt: str, text: str, *words: str) -> str:
    """Over HTTP: ``prompt``'s greedy answer is ``text``, a sampled request is a 400 naming temperature (and
    ``words``); the /metrics text afterwards."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 16}}
    async with s.post(server.make_url("/invocations"), json=body) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["generated_text"] == text
    sampled = {"inputs": prompt, "parameters": {"max_new_tokens": 4, "do_sample": True, "temperature": 0.7}}
    async with s.post(server.make_url("/invocations"), json=sampled) as r:
        body_text = await r.text()
        assert r.status == 400 and all(w in body_text for w in ("temperature", *words)), body_text
    async with s.get(server.make_url("/metrics")) as r:
        return await r.text()


async def outputs_accepting_every_draft(engine: TrtllmEngine, monkeypatch, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy output from ``engine`` (closed after) with the fake's verification patched to keep every
    draft token (the tests that show greedy equality can fail)."""
    import tensorrt_llm._runtime as runtime

    monkeypatch.setattr(runtime, "accepts", lambda target, draft: True)
    try:
        return [tokens_of(await generate(engine, f"a{i}", p)) for i, p in enumerate(prompts)]
    finally:
        await engine.close()
