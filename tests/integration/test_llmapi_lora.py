"""LoRA adapters on the LLM API engine (the PyTorch backend's LoraConfig and per-request LoRARequest) against the
fake LLM API, which applies each request's adapter to its tiny Llama's projections as TensorRT-LLM's loader reads it
(tests/fakes/tensorrt_llm/_lora.py).

The reference is test_lora.py's: peft's ``merge_and_unload()`` model of each adapter (its ``world``), generated
greedily, for requests sent together so that base and adapter rows share the executor's steps, on every release the
fake plays. The release legs install no peft (ci/pins, the ``test-core`` extra; the fake does not use it), so they
deselect those tests (ci/release-tests.txt), left to the default run, which plays every release; the rest
(registration, refusals, 409 in use) runs in each leg, on adapters written here without peft.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import save_file
from test_lora import ADAPTERS, PROMPTS, check_mixed_batch, world  # noqa: F401  (world: a fixture)
from test_torch_engine import reference
from tinymodels import tiny_model
from transformers import AutoTokenizer
from trtllm_testing import fake_tensorrt_llm

from lmi_trt.engines.base import EngineError, GenerationRequest, SamplingParams
from lmi_trt.engines.llmapi import LlmApiEngine, LlmApiSettings
from lmi_trt.engines.lora_sizes import GROUPS, group_sizes
from lmi_trt.engines.trtllm import TrtllmConfigError, TrtllmSettings

# 1.3.0rc1 and rc2: either side of PR 8279 (CUDA graphs beside LoRA), so the engine and the fake must agree
RELEASES = ["1.0.0", "1.1.0", "1.2.1", "1.3.0rc1", "1.3.0rc2"]
NEW = 8


def lora_settings(**lora) -> LlmApiSettings:
    lora = {"enable_lora": True, "max_loras": 4, "max_lora_rank": 8, **lora}
    runtime = TrtllmSettings(max_batch_size=16, max_batch_size_key="option.max_rolling_batch_size")
    return LlmApiSettings(runtime=runtime, max_input_len=64, max_seq_len=200, **lora)


async def started(model_dir, settings: LlmApiSettings) -> LlmApiEngine:
    engine = LlmApiEngine(model_dir, settings, eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True)
    await asyncio.wait_for(engine.start(), 120)
    return engine


async def generate(engine: LlmApiEngine, rid: str, prompt: list[int], adapter: str | None, n: int = NEW):
    params = SamplingParams(max_new_tokens=n, ignore_eos=True)
    outputs = [o async for o in engine.submit(GenerationRequest(rid, prompt, params, adapter=adapter))]
    assert outputs[-1].error is None, outputs[-1].error
    return [t for o in outputs for t in o.token_ids]


@pytest.fixture
def peft_world(request):
    """test_lora.py's world, whose reference is peft's merged model (the release legs deselect its users: no peft)."""
    return request.getfixturevalue("world")


@pytest.mark.parametrize("release", RELEASES)
async def test_each_adapter_generates_as_the_peft_merged_model_in_one_mixed_batch(peft_world, release):
    made = peft_world
    tokenizer = AutoTokenizer.from_pretrained(made["model_dir"])
    with fake_tensorrt_llm(release):
        # unset option.use_cuda_graph: the release's CUDA graphs, which lmi-trt turns off beside adapters before 1.3
        # (the fake drops the adapter from decode steps under CUDA graphs there, as PR 5480 reports)
        engine = await started(made["model_dir"], lora_settings())
        try:
            for name in ADAPTERS:
                folder = str(made["folders"][name])
                await engine.register_adapter(name, folder, folder)
            jobs = [(adapter, prompt) for adapter in [None, *ADAPTERS] for prompt in PROMPTS[:2]]
            got = await asyncio.gather(
                *(generate(engine, f"r{i}", tokenizer(p).input_ids, a) for i, (a, p) in enumerate(jobs))
            )
        finally:
            await engine.close()
    check_mixed_batch(made, jobs, got)


async def test_an_rslora_adapter_generates_as_peft_scales_it(peft_world, tmp_path):
    """use_rslora: the release's loader scales by lora_alpha / sqrt(r) (lora_manager.py load_from_hf, PR 1669), as
    peft does; rank 4 and alpha 8 make that 4 where alpha / r would be 2, so a wrong scaling changes the tokens."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir = peft_world["model_dir"]
    torch.manual_seed(5)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False, use_rslora=True
    )
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)), config)
    peft_model.save_pretrained(str(tmp_path / "rs"))
    merged = peft_model.merge_and_unload().eval()
    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPTS[0]).input_ids
    with fake_tensorrt_llm("1.0.0"):
        engine = await started(model_dir, lora_settings())
        try:
            await engine.register_adapter("rs", str(tmp_path / "rs"), str(tmp_path / "rs"))
            got = await generate(engine, "rs", ids, "rs")
        finally:
            await engine.close()
    assert got == reference(merged, ids, NEW, eos_token_id=None).tokens


async def test_a_quantized_checkpoint_with_adapters_stops_start_up_on_10(tmp_path):
    """The engine reads the checkpoint's modelopt hf_quant_config.json and refuses LoRA beside it on 1.0 (PR 7014,
    FP8 with LoRA, first in 1.1), naming option.enable_lora and the release."""
    import shutil

    model_dir = tmp_path / "fp8"
    shutil.copytree(tiny_model("llama"), model_dir)
    (model_dir / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    with fake_tensorrt_llm("1.0.0"):
        engine = LlmApiEngine(model_dir, lora_settings(), eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True)
        with pytest.raises(TrtllmConfigError, match=r"option.enable_lora=true with a quantized checkpoint .*1\.0\.0"):
            await engine.start()
        await engine.close()


def write_adapter(folder, rank: int, modules=("q_proj", "v_proj"), seed: int = 0, **config):
    """A PEFT-layout LoRA adapter for the tiny Llama, without peft (its adapter_config.json fields and tensor names,
    huggingface/peft save_pretrained), A and B random."""
    model_config = json.loads((tiny_model("llama") / "config.json").read_text())
    sizes = group_sizes(model_config)
    shapes = {}
    for group, parts in GROUPS.items():
        fan_in, _, outs = sizes[group]
        shapes.update({module: (fan_in, out) for module, out in zip(parts, outs, strict=True)})
    torch.manual_seed(seed)
    tensors = {}
    for layer in range(model_config["num_hidden_layers"]):
        for module in modules:
            where = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            stem = f"base_model.model.model.layers.{layer}.{where}.{module}"
            fan_in, fan_out = shapes[module]
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, fan_in)
            tensors[f"{stem}.lora_B.weight"] = torch.randn(fan_out, rank)
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(modules), **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    return str(folder)


@pytest.fixture(scope="module")
def fake():
    with fake_tensorrt_llm() as module:  # each release leg's own release (LMI_TRT_FAKE_RELEASE)
        yield module


async def test_an_adapter_in_use_is_kept_and_a_name_registered_again_is_a_new_adapter(fake, tmp_path):
    model_dir = tiny_model("llama")
    engine = await started(model_dir, lora_settings(max_cpu_loras=4))
    try:
        first = write_adapter(tmp_path / "a", 4, seed=1)
        await engine.register_adapter("a", first, first)
        with pytest.raises(EngineError) as taken:
            await engine.register_adapter("a", first, first)
        assert taken.value.code == 409
        prompt = [1, 45, 67, 89, 100]
        params = SamplingParams(max_new_tokens=150, ignore_eos=True)
        stream = engine.submit(GenerationRequest("long", prompt, params, adapter="a"))
        assert (await stream.__anext__()).error is None  # generating with it now
        with pytest.raises(EngineError) as busy:
            await engine.unregister_adapter("a")
        assert busy.value.code == 409 and "in use" in str(busy.value)
        await stream.aclose()  # the consumer leaves: the request is aborted and forgotten
        with_a = await generate(engine, "a1", prompt, "a")
        await engine.unregister_adapter("a")
        assert [a.name for a in engine.adapters()] == []
        gone = [o async for o in engine.submit(GenerationRequest("gone", prompt, SamplingParams(), adapter="a"))]
        assert gone[-1].error_code == 404 and "'a' is not registered" in gone[-1].error
    finally:
        await engine.close()
    # registered again under the same name with other weights: a new id, so the worker loads the new weights
    engine = await started(model_dir, lora_settings())
    try:
        second = write_adapter(tmp_path / "b", 4, seed=2)
        await engine.register_adapter("a", first, first)
        assert await generate(engine, "x", prompt, "a") == with_a
        await engine.unregister_adapter("a")
        await engine.register_adapter("a", second, second)
        assert await generate(engine, "y", prompt, "a") != with_a
        assert await generate(engine, "base", prompt, None) != with_a
    finally:
        await engine.close()


async def test_adapters_the_release_would_not_serve_as_peft_does_are_refused_naming_why(fake, tmp_path):
    engine = await started(tiny_model("llama"), lora_settings(max_cpu_loras=4))
    try:
        cases = [
            ("big", write_adapter(tmp_path / "big", 16), "option.max_lora_rank=8"),
            ("head", write_adapter(tmp_path / "head", 4, modules_to_save=["lm_head"]), "modules_to_save"),
            ("dora", write_adapter(tmp_path / "dora", 4, use_dora=True), "use_dora"),
        ]
        for name, folder, why in cases:
            with pytest.raises(EngineError) as refused:
                await engine.register_adapter(name, folder, folder)
            assert refused.value.code == 400 and why in str(refused.value) and name in str(refused.value)
        assert engine.adapters() == []
        outputs = [o async for o in engine.submit(GenerationRequest("u", [1, 5], SamplingParams(), adapter="nope"))]
        assert outputs[-1].error_code == 404 and "nope" in outputs[-1].error
        assert engine.capabilities.lora.honoured
    finally:
        await engine.close()
    off = await started(tiny_model("llama"), lora_settings(enable_lora=False))
    try:
        assert not off.capabilities.lora.honoured
        with pytest.raises(EngineError) as refused:
            await off.register_adapter("a", str(tmp_path / "big"), str(tmp_path / "big"))
        assert refused.value.code == 400 and "option.enable_lora=true" in str(refused.value)
    finally:
        await off.close()
