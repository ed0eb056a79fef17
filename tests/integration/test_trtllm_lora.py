"""LoRA adapters on the tensorrt backend (TrtllmEngine over the fake Executor): an engine built with the LoRA plugin,
PEFT adapters converted to ``LoraConfig``'s layout, and the fake decoding that layout back into per-module A and B and
applying them in its tiny torch model, so a wrong conversion changes the tokens. The adapters and the references are
test_lora.py's (peft's ``merge_and_unload()`` models), the batch mixes the base model and four adapters."""

from __future__ import annotations

import asyncio
import logging

import pytest
from test_lora import ADAPTERS, NEW, PROMPTS, _expected, _make_adapter, check_mixed_batch, world  # noqa: F401
from test_torch_engine import assert_greedy
from tinymodels import tiny_model
from transformers import AutoTokenizer
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.engines.base import EngineError, GenerationRequest, SamplingParams
from lmi_trt.engines.trtllm import TrtllmConfigError, TrtllmEngine, TrtllmSettings

pytestmark = pytest.mark.slow

ALL = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h"]
BUILD = dict(max_batch_size=16, max_input_len=64, max_seq_len=128)


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


def _engine_dir(world, out, targets=ALL, rank=8):  # noqa: F811
    """trtllm-build --lora_plugin auto --lora_target_modules ... --max_lora_rank ``rank`` (commands/build.py)."""
    from tensorrt_llm.lora_manager import LoraConfig

    lora = LoraConfig(lora_dir=[], lora_ckpt_source="hf", max_lora_rank=rank)
    lora.lora_target_modules = list(targets)
    return make_engine_dir(world["model_dir"], out, plugin_config={"lora_plugin": "auto"}, lora_config=lora, **BUILD)


@pytest.fixture(scope="module")
def lora_dir(trt, world, tmp_path_factory):  # noqa: F811
    return _engine_dir(world, tmp_path_factory.mktemp("trt-lora") / "engine")


async def _started(engine_dir, **lora) -> TrtllmEngine:
    settings = TrtllmSettings(enable_lora=True, max_lora_rank=8, **lora)
    engine = TrtllmEngine(engine_dir, settings, eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True)
    await asyncio.wait_for(engine.start(), 60)
    return engine


async def _generate(engine, world, prompt: str, adapter: str | None, rid: str) -> list[int]:  # noqa: F811
    ids = AutoTokenizer.from_pretrained(world["model_dir"])(prompt).input_ids
    request = GenerationRequest(rid, ids, SamplingParams(max_new_tokens=NEW, ignore_eos=True), adapter=adapter)
    outs = [out async for out in engine.submit(request)]
    assert outs[-1].error is None, outs[-1].error
    return [t for out in outs for t in out.token_ids]


async def _register(engine, world, names) -> None:  # noqa: F811
    for name in names:
        folder = str(world["folders"][name])
        await engine.register_adapter(name, folder, folder)


async def test_each_adapter_on_the_executor_generates_as_the_peft_merged_model(lora_dir, world):  # noqa: F811
    engine = await _started(lora_dir, max_loras=4)
    try:
        assert engine.capabilities.lora.honoured
        await _register(engine, world, ADAPTERS)
        for round_ in range(2):  # the second round sends no weights: the Executor holds the tasks
            jobs = [(adapter, prompt) for adapter in [None, *ADAPTERS] for prompt in PROMPTS[:2]]
            got = await asyncio.gather(
                *(_generate(engine, world, p, a, f"r{round_}-{i}") for i, (a, p) in enumerate(jobs))
            )
            check_mixed_batch(world, jobs, got)
    finally:
        await engine.close()


# Page arithmetic for the tiny Llama (hidden 64, kv 32, mlp 128, 2 layers) at rank 8 (peftCacheManager.cpp
# getPageManagerConfig, as the fake models it): a slot is 96 values (k/v: 64 + 32), a page 8 × 12 slots × 2 layers =
# 192 slots; every test adapter (local-a rank 4 q/v: 20 slots, hub-b rank 8 all: 172, s3-c rank 8 o/gate/down: 86)
# takes one page. max_loras=1 sizes each cache at 8 × 2 × 7 = 112 module-layers = 224 slots = 2 pages.


async def test_an_evicted_adapter_is_sent_again(trt, lora_dir, world, caplog):  # noqa: F811
    """max_loras=1: the host cache holds two pages; s3-c evicts local-a (the least recently used done task), whose
    next request (sent without weights) meets the Executor's cache miss and goes again with them. On 0.12 every
    request carries its weights (as that release's LLM API sends them), so none is sent again."""
    engine = await _started(lora_dir, max_loras=1)
    try:
        await _register(engine, world, ["local-a", "hub-b", "s3-c"])
        caplog.set_level(logging.INFO, logger="lmi_trt.engines.trtllm")
        for i, adapter in enumerate(["local-a", "hub-b", "hub-b", "s3-c", "local-a"]):
            tokens = await _generate(engine, world, PROMPTS[0], adapter, f"e{i}")
            assert_greedy(tokens, _expected(world, adapter, PROMPTS[0]))
        resent = caplog.text.count("was evicted from TensorRT-LLM's cache: sent again")
        assert resent == (0 if trt.__version__.startswith("0.") else 1)
    finally:
        await engine.close()


async def test_adapters_beyond_the_device_cache_wait_in_the_scheduler(lora_dir, world):  # noqa: F811
    """max_loras=1 (two device pages), three adapters in host memory and in flight at once: the third's request
    waits in the Executor's capacity scheduler until a page frees, and all answer as their merged models (the
    device cache refusing it would fail the request)."""
    engine = await _started(lora_dir, max_loras=1, max_cpu_loras=3)
    try:
        names = ["local-a", "hub-b", "s3-c"]
        await _register(engine, world, names)
        jobs = [(a, PROMPTS[0]) for a in names] + [(None, PROMPTS[1])]
        got = await asyncio.gather(*(_generate(engine, world, p, a, f"w{i}") for i, (a, p) in enumerate(jobs)))
        for (adapter, prompt), tokens in zip(jobs, got, strict=True):
            assert_greedy(tokens, _expected(world, adapter, prompt))
    finally:
        await engine.close()


async def test_more_adapters_in_flight_than_the_host_cache_holds_wait_here(lora_dir, world):  # noqa: F811
    """option.max_cpu_loras unset, max_loras=1: the Executor puts every fetched request's task in its host cache
    (two pages) and fails one with no done task to evict ("PEFT Cache is full"); the engine holds such requests back
    until their adapter can get room, so every request answers."""
    engine = await _started(lora_dir, max_loras=1)
    try:
        names = ["local-a", "hub-b", "s3-c", "vllm-d"]
        await _register(engine, world, names)
        jobs = [(a, p) for a in names for p in PROMPTS[:2]]
        got = await asyncio.gather(*(_generate(engine, world, p, a, f"h{i}") for i, (a, p) in enumerate(jobs)))
        for (adapter, prompt), tokens in zip(jobs, got, strict=True):
            assert_greedy(tokens, _expected(world, adapter, prompt))
    finally:
        await engine.close()


async def test_a_prebuilt_engine_of_a_higher_rank_starts_with_a_small_cache(trt, world, tmp_path):  # noqa: F811
    """trtllm-build's default --max_lora_rank 64 with option.max_lora_rank=8, max_loras=1: the PEFT cache holds one
    rank-8 adapter, which the Executor accepts only when told adapters go no higher (max_adapter_size); else it
    wants room for a rank-64 one and refuses to start."""
    engine = await _started(_engine_dir(world, tmp_path / "rank64", rank=64), max_loras=1)
    try:
        await _register(engine, world, ["hub-b"])
        tokens = await _generate(engine, world, PROMPTS[0], "hub-b", "r64")
        assert_greedy(tokens, _expected(world, "hub-b", PROMPTS[0]))
    finally:
        await engine.close()


async def test_an_adapter_for_another_model_shape_is_a_400_naming_the_sizes(trt, lora_dir, world, tmp_path):  # noqa: F811
    """An adapter trained on a model with another MLP width: the Executor would read its rows at the engine's sizes
    without a word; registration refuses it naming the module and both sizes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(world["model_dir"])
    config.intermediate_size = 2 * config.intermediate_size
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "wide-model")
    _make_adapter(tmp_path / "wide-model", tmp_path / "wide", 6, 4, ["up_proj"])
    engine = await _started(lora_dir)
    try:
        with pytest.raises(EngineError) as wrong:
            await engine.register_adapter("wide", str(tmp_path / "wide"), str(tmp_path / "wide"))
        assert wrong.value.code == 400
        assert "'wide': up_proj of layer 0 maps 64 → 256 values, but the engine's up_proj maps 64 → 128" in str(
            wrong.value
        )
    finally:
        await engine.close()


async def test_adapters_the_engine_cannot_apply_are_a_400_naming_why(trt, world, tmp_path):  # noqa: F811
    qkv_only = _engine_dir(world, tmp_path / "qkv", targets=["attn_q", "attn_k", "attn_v"])
    engine = await _started(qkv_only)
    try:
        folder = str(world["folders"]["s3-c"])  # o_proj, gate_proj, down_proj
        with pytest.raises(EngineError) as modules:
            await engine.register_adapter("c", folder, folder)
        assert (
            modules.value.code == 400 and "o_proj" in str(modules.value) and "lora_target_modules" in str(modules.value)
        )
        big = tmp_path / "rank16"
        _make_adapter(tiny_model("llama"), big, 5, 16, ["q_proj"])
        with pytest.raises(EngineError) as rank:
            await engine.register_adapter("big", str(big), str(big))
        assert rank.value.code == 400 and "option.max_lora_rank=8" in str(rank.value)
        request = GenerationRequest("u", [1, 5], SamplingParams(max_new_tokens=2), adapter="nope")
        unknown = [out async for out in engine.submit(request)][-1]
        assert unknown.error_code == 404 and "'nope' is not registered" in unknown.error
    finally:
        await engine.close()


async def test_an_adapter_in_use_is_not_unregistered(lora_dir, world):  # noqa: F811
    engine = await _started(lora_dir)
    try:
        await _register(engine, world, ["vllm-d"])
        ids = [1, 5, 6]
        request = GenerationRequest("long", ids, SamplingParams(max_new_tokens=60, ignore_eos=True), adapter="vllm-d")
        outputs = engine.submit(request)
        first = await outputs.__anext__()
        assert first.error is None
        with pytest.raises(EngineError) as busy:
            await engine.unregister_adapter("vllm-d")
        assert busy.value.code == 409 and "in use" in str(busy.value)
        await outputs.aclose()  # cancels it; the Executor's final result for it comes shortly
        while True:
            try:
                await engine.unregister_adapter("vllm-d")
                break
            except EngineError as e:
                assert e.code == 409
                await asyncio.sleep(0.05)
        assert engine.adapters() == []
    finally:
        await engine.close()


def test_option_enable_lora_needs_an_engine_built_with_the_lora_plugin(trt, world, tmp_path):  # noqa: F811
    plain = make_engine_dir(world["model_dir"], tmp_path / "plain", **BUILD)
    with pytest.raises(TrtllmConfigError, match="lora_plugin"):
        TrtllmEngine(plain, TrtllmSettings(enable_lora=True), eos_token_ids=[2])
    rank4 = _engine_dir(world, tmp_path / "rank4", rank=4)
    with pytest.raises(TrtllmConfigError, match="option.max_lora_rank=8 exceeds the engine's built max_lora_rank=4"):
        TrtllmEngine(rank4, TrtllmSettings(enable_lora=True, max_lora_rank=8), eos_token_ids=[2])


async def test_the_jit_build_takes_the_lora_plugin_and_its_engine_serves_adapters(trt, world, tmp_path):  # noqa: F811
    """option.enable_lora on a Hugging Face checkpoint: lmi-trt's build asks for the LoRA plugin as trtllm-build does,
    config.json says so, and the engine it made serves an adapter as the peft-merged model generates."""
    import json

    from lmi_trt.compile.build import build_engine
    from lmi_trt.compile.lora import TARGET_MODULES
    from lmi_trt.compile.options import CompileOptions
    from lmi_trt.compile.plan import GpuFacts, make_plan
    from lmi_trt.engines.trtllm import read_engine_facts
    from lmi_trt.engines.trtllm_lora import LoraBuild

    hf = json.loads((world["model_dir"] / "config.json").read_text())
    opts = CompileOptions(max_input_len=64, max_output_len=64, max_batch_size=8, enable_lora=True, max_lora_rank=8)
    gpu = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
    out = tmp_path / "jit"
    build_engine(make_plan(opts, hf, gpu, trt.__version__), world["model_dir"], out)
    assert read_engine_facts(out).lora == LoraBuild(True, 8, TARGET_MODULES)
    engine = await _started(out, max_loras=2)
    try:
        await _register(engine, world, ["hub-b", "s3-c"])
        for adapter in (None, "hub-b", "s3-c"):
            tokens = await _generate(engine, world, PROMPTS[1], adapter, f"jit-{adapter}")
            assert_greedy(tokens, _expected(world, adapter, PROMPTS[1]))
    finally:
        await engine.close()


# Over HTTP (every schema), the server compiling the Hugging Face folder with the LoRA plugin: test_lora.py's tests
# of the torch engine, here with the tensorrt backend behind them (srv below).
from s3server import s3_env, s3_server  # noqa: E402, F401  (fixtures)
from test_lora import (  # noqa: E402
    lora_server,
    test_an_adapter_in_use_is_not_unloaded_then_is,  # noqa: F401
    test_an_unknown_adapter_is_a_404_naming_it_in_every_schema,  # noqa: F401
    test_each_adapter_generates_as_the_peft_merged_model_in_one_mixed_batch,  # noqa: F401
)


@pytest.fixture(scope="module")
def srv(world, s3_server, tmp_path_factory):  # noqa: F811
    """The server over an engine lmi-trt built with the LoRA plugin (the fake builder, as the JIT stage builds it on a
    GPU host), its folder holding the model folder's adapters/ (DJL's start-up adapters)."""
    import json
    import shutil

    from trtllm_testing import fake_server_env

    from lmi_trt.compile.build import build_engine
    from lmi_trt.compile.options import CompileOptions
    from lmi_trt.compile.plan import GpuFacts, make_plan

    out = tmp_path_factory.mktemp("served") / "engine"
    with fake_tensorrt_llm() as trt:
        reuse = not trt.__version__.startswith("0.")  # 0.12: LoRA beside block reuse is refused (trtllm.lora_errors)
        hf = json.loads((world["model_dir"] / "config.json").read_text())
        opts = CompileOptions(
            max_input_len=64, max_output_len=400, max_batch_size=8, enable_lora=True, max_lora_rank=8
        ).model_copy(update={"enable_kv_cache_reuse": reuse})
        gpu = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
        build_engine(
            make_plan(opts, hf, gpu, trt.__version__), world["model_dir"], out, tokenizer_dir=world["model_dir"]
        )
    shutil.copytree(world["model_dir"] / "adapters", out / "adapters")
    env = fake_server_env(tmp_path_factory.mktemp("site"))
    with lora_server(world, s3_server, ["--engine", "trtllm"], 4, env, model_dir=out, kv_reuse=reuse) as server:
        yield server
