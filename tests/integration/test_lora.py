"""LoRA adapters on `lmi-trt serve` (the torch engine's built-in decode loop, and the LLM API engine over the fake
TensorRT-LLM), driven as a process with real clients.

Adapters are real PEFT adapters (peft's ``get_peft_model`` with random A and B, ``save_pretrained``), each from
another place: the model folder's ``adapters/`` (DJL's local directory, at start-up), the Hugging Face hub cache
(a repo id, offline), S3 (a real S3-compatible server, registered through DJL's management route) and a local
folder (vLLM's ``/v1/load_lora_adapter``). The reference is peft's own ``merge_and_unload()`` model: each request's
greedy output equals the merged model's ``generate`` wherever its choice is clear (test_torch_engine.py's MARGIN
rule), for requests sent together so that base and adapter rows share steps, over LMI, OpenAI and TGI.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import torch
from cliserver import serve
from s3server import s3_env, s3_server  # noqa: F401  (fixtures)
from test_torch_engine import assert_greedy, reference
from tinymodels import make_hub_cache, tiny_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trtllm_testing import fake_server_env

pytestmark = pytest.mark.slow

MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# name → (seed, rank, target modules): different ranks and module sets in one batch.
ADAPTERS = {
    "local-a": (1, 4, ["q_proj", "v_proj"]),
    "hub-b": (2, 8, MODULES),
    "s3-c": (3, 8, ["o_proj", "gate_proj", "down_proj"]),
    "vllm-d": (4, 2, ["k_proj", "up_proj"]),
}
HUB_REPO = "acme/tiny-llama-lora-b"
PROMPTS = ["The quick brown fox", "Serving engines batch", "Once upon a time", "Large language models"]
NEW = 8


def _make_adapter(base_dir: Path, out: Path, seed: int, rank: int, targets: list[str]):
    """A PEFT LoRA adapter with random A and B (peft zeroes B unless init_lora_weights=False), saved to ``out``;
    returns peft's merged model. Where peft is not installed (the release legs: no TensorRT-LLM image has it), the
    same folder and merge by hand (``_make_adapter_by_hand``, checked against peft's in the default run)."""
    if importlib.util.find_spec("peft") is None:
        return _make_adapter_by_hand(base_dir, out, seed, rank, targets)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir))
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out))
    return peft_model.merge_and_unload().eval()


def _make_adapter_by_hand(base_dir: Path, out: Path, seed: int, rank: int, targets: list[str]):
    """peft's layout without peft (save_and_load.py: adapter_config.json and adapter_model.safetensors, tensors
    ``base_model.model.model.layers.{i}.{self_attn|mlp}.{module}.lora_{A|B}.weight``, A [r, in], B [out, r]) and its
    merge (``W += lora_alpha / r · B A``, tuners/lora/layer.py); lora_alpha = 2r as above."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir)).eval()
    tensors = {}
    for index, layer in enumerate(model.model.layers):
        for name in targets:
            where = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            linear = layer.get_submodule(f"{where}.{name}")
            a = torch.randn(rank, linear.in_features) / linear.in_features**0.5
            b = torch.randn(linear.out_features, rank) / rank**0.5
            stem = f"base_model.model.model.layers.{index}.{where}.{name}"
            tensors[f"{stem}.lora_A.weight"], tensors[f"{stem}.lora_B.weight"] = a, b
            with torch.no_grad():
                linear.weight += 2 * (b @ a)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank}
    (out / "adapter_config.json").write_text(json.dumps({**config, "target_modules": targets, "bias": "none"}))
    return model


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The model folder (with adapters/local-a), the adapters elsewhere, and the merged references."""
    root = tmp_path_factory.mktemp("lora")
    llama = tiny_model("llama")
    model_dir = root / "model"
    shutil.copytree(llama, model_dir)
    folders = {
        "local-a": model_dir / "adapters" / "local-a",
        "hub-b": root / "hub-src",
        "s3-c": root / "s3-src",
        "vllm-d": root / "vllm-d",
    }
    merged = {name: _make_adapter(llama, folders[name], *spec) for name, spec in ADAPTERS.items()}
    merged[None] = AutoModelForCausalLM.from_pretrained(str(llama)).eval()
    hf_home = root / "hf-home"
    make_hub_cache(folders["hub-b"], hf_home, repo_id=HUB_REPO)
    return {"model_dir": model_dir, "folders": folders, "merged": merged, "hf_home": hf_home, "root": root}


# The engines that serve adapters: the torch engine's decode loop, and the LLM API's PyTorch backend through the fake
# TensorRT-LLM (the release LMI_TRT_FAKE_RELEASE names; tests/integration/test_llmapi_lora.py plays each release).
# The tensorrt backend's (an engine built with the LoRA plugin): tests/integration/test_trtllm_lora.py.
ENGINES = {"torch": ["--engine", "torch"], "trtllm-pytorch": ["--engine", "trtllm", "-o", "option.backend=pytorch"]}


@contextmanager
def lora_server(
    world,  # noqa: F811
    s3_server,  # noqa: F811
    engine_args: list[str],
    max_loras: int,
    env: dict | None = None,
    model_dir=None,
    kv_reuse: bool = True,
):
    """`lmi-trt serve` of the model folder (or ``model_dir``: one with the same adapters/) with ``engine_args`` and
    its adapters from the four places, KV cache block reuse on where ``kv_reuse``; yields the server."""
    env = {**s3_server.env, "HF_HOME": str(world["hf_home"]), **(env or {})}
    args = [*engine_args, "--model-id", str(model_dir or world["model_dir"]), "--model-name", "tiny-llama"]
    for option in (
        "option.enable_lora=true",
        f"option.max_loras={max_loras}",
        "option.max_lora_rank=8",
        "option.max_rolling_batch_size=8",
        "option.max_input_len=64",
        "option.max_output_len=400",
        f"option.enable_kv_cache_reuse={str(kv_reuse).lower()}",
    ):
        args += ["-o", option]
    with serve(args, world["root"], env=env, ready_timeout=600) as server:
        bucket = s3_server.new_bucket("adapters")
        s3_server.upload_folder(world["folders"]["s3-c"], f"s3://{bucket}/lora/c")
        hub = requests.post(f"{server.url}/models/tiny-llama/adapters", params={"name": "hub-b", "src": HUB_REPO})
        assert hub.status_code == 200, hub.text
        s3 = requests.post(f"{server.url}/adapters", params={"name": "s3-c", "src": f"s3://{bucket}/lora/c"})
        assert s3.status_code == 200 and s3.json() == {"status": "Adapter s3-c registered"}, s3.text
        load = requests.post(
            f"{server.url}/v1/load_lora_adapter",
            json={"lora_name": "vllm-d", "lora_path": str(world["folders"]["vllm-d"])},
        )
        assert load.status_code == 200 and "vllm-d" in load.text, load.text
        yield server


@pytest.fixture(scope="module", params=list(ENGINES))
def srv(request, world, s3_server, tmp_path_factory):  # noqa: F811
    env = fake_server_env(tmp_path_factory.mktemp("site")) if request.param != "torch" else {}
    with lora_server(world, s3_server, ENGINES[request.param], 3, env) as server:  # 4 adapters: one waits for a slot
        yield server


def _expected(world, adapter: str | None, prompt: str):
    ids = AutoTokenizer.from_pretrained(world["model_dir"])(prompt).input_ids
    return reference(world["merged"][adapter], ids, NEW, eos_token_id=None)


def check_mixed_batch(world, jobs: list[tuple[str | None, str]], got: list[list[int]]) -> None:  # noqa: F811
    """Each (adapter, prompt) job's greedy tokens are its merged model's, and each adapter changes some output."""
    outputs = {}
    for (adapter, prompt), tokens in zip(jobs, got, strict=True):
        ref = _expected(world, adapter, prompt)
        assert ref.clear >= 3, (adapter, prompt, "too few clear choices to compare")
        assert_greedy(tokens, ref)
        outputs[adapter, prompt] = ref.tokens
    for adapter in {a for a, _ in jobs} - {None}:  # a test that cannot fail is no test
        assert any(outputs[adapter, p] != outputs[None, p] for a, p in jobs if a == adapter), adapter


def _lmi(srv, prompt: str, adapter: str | None) -> list[int]:
    body = {"inputs": prompt, "parameters": {"max_new_tokens": NEW, "details": True, "ignore_eos": True}}
    if adapter is not None:
        body["adapters"] = adapter
    r = requests.post(f"{srv.url}/invocations", json=body)
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()["details"]["tokens"]]


def _tgi(srv, prompt: str, adapter: str | None) -> list[int]:
    params = {"max_new_tokens": NEW, "details": True, "ignore_eos": True}
    if adapter is not None:
        params["adapter_id"] = adapter
    r = requests.post(f"{srv.url}/generate", json={"inputs": prompt, "parameters": params})
    assert r.status_code == 200, r.text
    return [t["id"] for t in r.json()["details"]["tokens"]]


def _openai(srv, prompt: str, adapter: str | None) -> str:
    """OpenAI answers text: compared with the reference tokens' text (``_check``)."""
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    out = client.completions.create(
        model=adapter or "tiny-llama", prompt=prompt, max_tokens=NEW, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.model == (adapter or "tiny-llama")
    return out.choices[0].text


SCHEMAS = {"lmi": _lmi, "tgi": _tgi, "openai": _openai}


@pytest.mark.parametrize("schema", SCHEMAS)
def test_each_adapter_generates_as_the_peft_merged_model_in_one_mixed_batch(srv, world, schema):
    send = SCHEMAS[schema]
    jobs = [(adapter, prompt) for adapter in [None, *ADAPTERS] for prompt in PROMPTS[:2]]
    with ThreadPoolExecutor(len(jobs)) as pool:  # together: base and adapter rows share the decode steps
        got = list(pool.map(lambda job: send(srv, job[1], job[0]), jobs))
    outputs = {}
    for (adapter, prompt), tokens in zip(jobs, got, strict=True):
        ref = _expected(world, adapter, prompt)
        assert ref.clear >= 3, (adapter, prompt, "too few clear choices to compare")
        if isinstance(tokens, str):  # text: as the reference's tokens read, over their clear prefix
            tok = AutoTokenizer.from_pretrained(world["model_dir"])
            whole = tok.decode(ref.tokens, skip_special_tokens=True) if ref.clear == len(ref.tokens) else None
            expected = whole if whole is not None else tok.decode(ref.tokens[: ref.clear], skip_special_tokens=True)
            assert tokens == expected if whole is not None else tokens.startswith(expected), (adapter, tokens, expected)
        else:
            assert_greedy(tokens, ref)
        outputs[adapter, prompt] = ref.tokens
    # The adapters change the output (a test that cannot fail is no test): each differs from the base model.
    for adapter in ADAPTERS:
        assert any(outputs[adapter, p] != outputs[None, p] for p in PROMPTS[:2]), adapter


def test_metrics_count_per_adapter_and_the_models_list_them(srv):
    metrics = requests.get(f"{srv.url}/metrics").text  # the mixed batches above, counted per adapter
    for adapter in ADAPTERS:
        assert f'lmi_lora_generation_tokens_total{{lora_name="{adapter}",model_name="tiny-llama"}}' in metrics
    listed = requests.get(f"{srv.url}/v1/models").json()["data"]
    assert listed[0]["id"] == "tiny-llama" and {m["id"] for m in listed[1:]} == set(ADAPTERS)
    assert all(m["parent"] == "tiny-llama" for m in listed[1:])
    djl = requests.get(f"{srv.url}/models/tiny-llama/adapters").json()["adapters"]
    assert {a["name"] for a in djl} == set(ADAPTERS)
    one = requests.get(f"{srv.url}/adapters/hub-b").json()
    assert one == [{"name": "hub-b", "src": HUB_REPO, "pin": False}]


def test_an_unknown_adapter_is_a_404_naming_it_in_every_schema(srv):
    lmi = requests.post(f"{srv.url}/invocations", json={"inputs": "Hi", "adapters": "nope"})
    tgi = requests.post(f"{srv.url}/generate", json={"inputs": "Hi", "parameters": {"adapter_id": "nope"}})
    oai = requests.post(f"{srv.url}/v1/completions", json={"model": "nope", "prompt": "Hi"})
    for r in (lmi, tgi, oai):
        assert r.status_code == 404 and "nope" in r.text, r.text
    assert requests.get(f"{srv.url}/adapters/nope").status_code == 404
    assert requests.delete(f"{srv.url}/adapters/nope").status_code == 404


def test_adapters_per_input_in_an_lmi_batch_and_the_query_parameter(srv, world):
    body = {"inputs": PROMPTS[:2], "adapters": ["local-a", ""], "parameters": {"max_new_tokens": NEW}}
    r = requests.post(f"{srv.url}/invocations", json=body)
    assert r.status_code == 200, r.text
    by_query = requests.post(
        f"{srv.url}/invocations?adapter=local-a", json={"inputs": PROMPTS[0], "parameters": {"max_new_tokens": NEW}}
    )
    assert by_query.json()["generated_text"] == r.json()[0]["generated_text"]
    base = requests.post(f"{srv.url}/invocations", json={"inputs": PROMPTS[1], "parameters": {"max_new_tokens": NEW}})
    assert base.json()["generated_text"] == r.json()[1]["generated_text"]
    wrong = requests.post(f"{srv.url}/invocations", json={**body, "adapters": ["local-a"]})
    assert wrong.status_code == 400 and "adapters" in wrong.text


def test_an_adapter_in_use_is_not_unloaded_then_is(srv, world):
    folder = str(world["folders"]["vllm-d"])
    assert requests.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "tmp-d", "lora_path": folder}).ok
    again = requests.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "tmp-d", "lora_path": folder})
    assert again.status_code == 409, again.text
    body = {"inputs": "Hi", "parameters": {"adapter_id": "tmp-d", "max_new_tokens": 390, "ignore_eos": True}}
    with requests.post(f"{srv.url}/generate_stream", json=body, stream=True) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line).startswith(b"data:")  # generating with it now
        busy = requests.post(f"{srv.url}/v1/unload_lora_adapter", json={"lora_name": "tmp-d"})
        assert busy.status_code == 409 and "in use" in busy.text, busy.text
    while True:  # the stream's cancellation reaches the engine shortly; then it goes
        gone = requests.post(f"{srv.url}/v1/unload_lora_adapter", json={"lora_name": "tmp-d"})
        if gone.status_code != 409:
            break
    assert gone.status_code == 200, gone.text
    after = requests.post(f"{srv.url}/generate", json={"inputs": "Hi", "parameters": {"adapter_id": "tmp-d"}})
    assert after.status_code == 404


def test_adapters_the_decode_loop_cannot_apply_are_refused_naming_why(srv, world):
    from peft import LoraConfig, get_peft_model

    llama = tiny_model("llama")
    too_big = world["root"] / "rank16"
    get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(llama)), LoraConfig(r=16, target_modules=["q_proj"])
    ).save_pretrained(str(too_big))
    r = requests.post(f"{srv.url}/adapters", params={"name": "big", "src": str(too_big)})
    assert r.status_code == 400 and "option.max_lora_rank=8" in r.text, r.text
    dora = world["root"] / "dora"
    get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(llama)), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)
    ).save_pretrained(str(dora))
    r = requests.post(f"{srv.url}/adapters", params={"name": "dora", "src": str(dora)})
    assert r.status_code == 400 and "use_dora" in r.text, r.text
    pinned = requests.post(f"{srv.url}/adapters", params={"name": "p", "src": str(dora), "pin": "true"})
    assert pinned.status_code == 400 and "pin" in pinned.text
    missing = requests.post(f"{srv.url}/adapters", params={"name": "m", "src": str(world["root"] / "none")})
    assert missing.status_code == 400 and "src" in missing.text


def test_other_engines_refuse_option_enable_lora_at_startup(tmp_path):
    with serve(
        ["--engine", "synthetic", "--model-id", str(tiny_model("llama")), "-o", "option.enable_lora=true"],
        tmp_path,
        ready=False,
    ) as server:
        assert server.proc.wait(timeout=120) != 0
    assert "option.enable_lora" in server.log_path.read_text()


async def test_replicas_register_on_every_copy_and_keep_an_adapter_one_copy_uses(world):
    from lmi_trt.engines.base import EngineError, GenerationRequest, SamplingParams
    from lmi_trt.engines.replicas import ReplicaSet
    from lmi_trt.engines.torch import TorchEngine

    copies = [
        TorchEngine(world["model_dir"], max_batch_size=2, max_input_len=64, max_new_tokens=400, enable_lora=True)
        for _ in range(2)
    ]
    replicas = ReplicaSet(copies)
    await replicas.start()
    try:
        folder = str(world["folders"]["vllm-d"])
        await replicas.register_adapter("d", folder, folder)
        assert [[a.name for a in c.adapters()] for c in copies] == [["d"], ["d"]]
        request = GenerationRequest("r", [1, 5, 6], SamplingParams(max_new_tokens=390, ignore_eos=True), adapter="d")
        outputs = replicas.submit(request)
        first = await outputs.__anext__()
        assert first.error is None
        with pytest.raises(EngineError) as busy:  # one copy generates with it: neither copy lets it go
            await replicas.unregister_adapter("d")
        assert busy.value.code == 409
        assert [[a.name for a in c.adapters()] for c in copies] == [["d"], ["d"]]
        await outputs.aclose()  # cancels inside the copy
        while True:
            try:
                await replicas.unregister_adapter("d")
                break
            except EngineError as e:  # the cancellation reaches the copy's loop shortly
                assert e.code == 409
                await asyncio.sleep(0.05)
        assert [c.adapters() for c in copies] == [[], []]
    finally:
        await replicas.close()


def test_openai_chat_generates_with_the_adapter_its_model_names(srv, world):
    from openai import OpenAI

    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "The quick brown fox"}]
    tok = AutoTokenizer.from_pretrained(world["model_dir"])
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    answers = {}
    for model in ("tiny-llama", "local-a"):
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=NEW, temperature=0)
        plain = client.completions.create(model=model, prompt=ids, max_tokens=NEW, temperature=0)
        assert chat.model == model and chat.choices[0].message.content == plain.choices[0].text
        answers[model] = plain.choices[0].text
    ref = reference(world["merged"]["local-a"], ids, NEW, eos_token_id=None)
    assert ref.tokens != reference(world["merged"][None], ids, NEW, eos_token_id=None).tokens
    assert answers["local-a"] != answers["tiny-llama"]


async def test_steps_without_adapter_rows_run_the_base_models_pass(world, monkeypatch):
    """A step none of whose rows uses an adapter passes no slot indices: the decoder runs no LoRA kernel (the decode
    loop's base graphs on a GPU), and the outputs are the base model's; a step with one runs them. Before, every step
    of a LoRA engine ran them, for base rows too."""
    from lmi_trt.engines.base import GenerationRequest, SamplingParams
    from lmi_trt.engines.torch import TorchEngine
    from lmi_trt.engines.torch.llama_decoder import LlamaDecoder
    from lmi_trt.engines.torch.lora import LoraSlots

    passes, deltas = [], []
    forward, project = LlamaDecoder.forward, LoraSlots.project
    monkeypatch.setattr(LlamaDecoder, "forward", lambda self, batch: passes.append(batch.lora) or forward(self, batch))
    monkeypatch.setattr(LoraSlots, "project", lambda self, *a, **k: deltas.append(a[1]) or project(self, *a, **k))
    engine = TorchEngine(world["model_dir"], max_batch_size=4, max_input_len=64, max_new_tokens=64, enable_lora=True)
    await engine.start()
    tokenizer = AutoTokenizer.from_pretrained(world["model_dir"])

    async def generate(prompt: str, adapter: str | None) -> list[int]:
        params = SamplingParams(max_new_tokens=NEW, ignore_eos=True)
        request = GenerationRequest(prompt, tokenizer(prompt).input_ids, params, adapter=adapter)
        return [t for out in [o async for o in engine.submit(request)] for t in out.token_ids]

    try:
        folder = str(world["folders"]["vllm-d"])
        await engine.register_adapter("vllm-d", folder, folder)
        passes.clear()
        base = await asyncio.gather(*(generate(p, None) for p in PROMPTS))
        assert len(passes) >= NEW and all(lora is None for lora in passes) and not deltas
        for prompt, tokens in zip(PROMPTS, base):
            assert_greedy(tokens, _expected(world, None, prompt))
        passes.clear()
        mixed = await asyncio.gather(generate(PROMPTS[0], "vllm-d"), generate(PROMPTS[1], None))
        assert any(lora is not None for lora in passes) and {"qkv", "o", "gate_up", "down"} <= set(deltas)
        assert_greedy(mixed[0], _expected(world, "vllm-d", PROMPTS[0]))
        assert_greedy(mixed[1], _expected(world, None, PROMPTS[1]))
    finally:
        await engine.close()


def test_the_adapter_made_by_hand_is_what_peft_loads_and_merges(tmp_path):
    """The release legs' adapters (no peft there) against peft here: peft reads the folder, and its merged model's
    weights are the hand-merged ones."""
    from peft import PeftModel

    llama = tiny_model("llama")
    by_hand = _make_adapter_by_hand(llama, tmp_path / "a", 7, 4, ["q_proj", "v_proj", "down_proj"])
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(llama)), str(tmp_path / "a"))
    merged = merged.merge_and_unload()
    for (name, want), (_, got) in zip(merged.state_dict().items(), by_hand.state_dict().items(), strict=True):
        assert torch.allclose(want, got, atol=1e-6), name
