"""HTTP through the trtllm engine (fake TensorRT-LLM) along the real load path:
config → sources (engine folder detected) → tokenizer from option.tokenizer_id → TrtllmEngine.

Greedy tokens equal the tiny model's `model.generate`, i.e. what the torch engine serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestServer
from tinymodels import beam_reference, tiny_model
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.config import LmiConfig
from lmi_trt.loader import load_model
from lmi_trt.serving.app import build_app
from lmi_trt.serving.http import CONTEXT
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_dir():
    return tiny_model("llama")


@pytest.fixture
def trtllm(monkeypatch):
    with fake_tensorrt_llm():
        import lmi_trt.engines.trtllm as trt

        # The one hardware seam: this machine has no GPU, the fake Executor needs none.
        monkeypatch.setattr(trt, "cuda_available", lambda: True)
        yield


@pytest.fixture
def engine_dir(trtllm, hf_dir, tmp_path):
    return make_engine_dir(hf_dir, tmp_path / "engine", max_batch_size=4, max_input_len=64, max_seq_len=96)


def _reference(hf_dir, prompt: str, n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


def _config(engine_dir, hf_dir, tmp_path, **more) -> LmiConfig:
    """The trtllm engine on ``engine_dir`` with the checkpoint's tokenizer: prompts of 64 tokens, 32 new ones."""
    return LmiConfig(
        model_id=str(engine_dir),
        tokenizer_id=str(hf_dir),
        rolling_batch="trtllm",
        max_input_len=64,
        max_output_len=32,
        max_rolling_batch_size=4,
        download_dir=tmp_path / "dl",
        **more,
    )


async def _server(config: LmiConfig, adapters=None):
    app = build_app(lambda: load_model(config, "trtllm"), config, model_name="tiny", adapters=adapters)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    # A JIT build on a loaded machine takes minutes: wait for readiness with a bound, not a speed.
    deadline = asyncio.get_running_loop().time() + 300
    async with ClientSession(timeout=ClientTimeout(total=60)) as s:
        while True:
            async with s.get(server.make_url("/ping")) as r:
                if r.status == 200:
                    break
                body = await r.text()
                assert "FAILED" not in body, body
            assert asyncio.get_running_loop().time() < deadline, f"not ready after 300 s: {body}"
            await asyncio.sleep(0.05)
    return server


async def test_greedy_tokens_match_generate_and_errors_stay_isolated(engine_dir, hf_dir, tmp_path):
    config = _config(engine_dir, hf_dir, tmp_path)
    server = await _server(config)
    url = str(server.make_url("/invocations"))
    prompts = ["The quick brown fox", "Serving engines batch", "Grüße aus München", "Once upon a time"]
    try:
        async with ClientSession(timeout=ClientTimeout(total=60)) as s:

            async def one(prompt: str) -> list[int]:
                body = {"inputs": prompt, "parameters": {"max_new_tokens": 10, "details": True, "ignore_eos": True}}
                async with s.post(url, json=body) as r:
                    assert r.status == 200, await r.text()
                    return [t["id"] for t in (await r.json())["details"]["tokens"]]

            async def stream(prompt: str) -> list[int]:
                body = {"inputs": prompt, "parameters": {"max_new_tokens": 10, "ignore_eos": True}, "stream": True}
                async with s.post(url, json=body) as r:
                    assert r.status == 200
                    return [json.loads(line)["token"]["id"] async for line in r.content if line.strip()]

            async def too_long() -> tuple[int, str]:
                body = {"inputs": "word " * 200, "parameters": {"max_new_tokens": 4}}
                async with s.post(url, json=body) as r:
                    return r.status, await r.text()

            results = await asyncio.gather(*(one(p) for p in prompts), *(stream(p) for p in prompts), too_long())
        for i, prompt in enumerate(prompts):
            expected = _reference(hf_dir, prompt, 10)
            assert results[i] == expected, prompt
            assert results[len(prompts) + i] == expected, prompt
        status, text = results[-1]
        assert status == 400 and "option.max_input_len" in text
    finally:
        await server.close()


async def test_disconnect_cancels_inside_the_executor(engine_dir, hf_dir, tmp_path):
    server = await _server(_config(engine_dir, hf_dir, tmp_path))
    try:
        async with ClientSession(timeout=ClientTimeout(total=60)) as s:
            body = {
                "inputs": "Once upon a time",
                "parameters": {"max_new_tokens": 32, "ignore_eos": True},
                "stream": True,
            }
            async with s.post(server.make_url("/invocations"), json=body) as r:
                await r.content.readline()  # one token, then hang up
        service = server.app[CONTEXT].service
        for _ in range(200):
            if service.engine.stats().active_requests == 0:
                break
            await asyncio.sleep(0.05)
        assert service.engine.stats().active_requests == 0
    finally:
        await server.close()


def test_engine_folder_without_tokenizer_needs_tokenizer_id(engine_dir, tmp_path):
    from lmi_trt.sources import SourceError, resolve_model, resolve_tokenizer

    config = LmiConfig(model_id=str(engine_dir), download_dir=tmp_path / "dl")
    artifact = resolve_model(config)
    assert artifact.kind == "trtllm_engine"
    with pytest.raises(SourceError, match="option.tokenizer_id"):
        resolve_tokenizer(config, artifact)


def test_engine_folder_with_tokenizer_files_serves_alone(engine_dir, hf_dir, tmp_path):
    from lmi_trt.sources import resolve_model, resolve_tokenizer

    for f in hf_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name.endswith(".jinja"):
            shutil.copy(f, engine_dir / f.name)
    config = LmiConfig(model_id=str(engine_dir), download_dir=tmp_path / "dl")
    artifact = resolve_model(config)
    assert resolve_tokenizer(config, artifact) == engine_dir


async def test_hf_checkpoint_is_compiled_once_then_served_and_a_second_replica_reuses_it(
    trtllm, hf_dir, tmp_path, monkeypatch, caplog
):
    """JIT through the real load path: checkpoint → plan → build (fake TRT-LLM) → cache → Executor."""
    import lmi_trt.compile.jit as jit
    from lmi_trt.compile.plan import GpuFacts

    monkeypatch.setattr(jit, "_host_gpu", lambda: GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1))
    import tensorrt_llm  # the fake, impersonating LMI_TRT_FAKE_RELEASE

    monkeypatch.setattr(jit, "_host_trtllm", lambda: tensorrt_llm.__version__)
    shared_cache = tmp_path / "shared-engine-cache"
    config = LmiConfig(
        model_id=str(hf_dir),
        rolling_batch="trtllm",
        backend="tensorrt",
        max_input_len=64,
        max_output_len=32,
        max_rolling_batch_size=4,
        download_dir=tmp_path / "replica1",
        engine_cache_uri=str(shared_cache),
    )
    expected = _reference(hf_dir, "The quick brown fox", 8)
    for replica, download_dir in enumerate((tmp_path / "replica1", tmp_path / "replica2")):
        caplog.clear()
        with caplog.at_level("INFO"):
            server = await _server(config.model_copy(update={"download_dir": download_dir}))
        try:
            async with ClientSession(timeout=ClientTimeout(total=60)) as s:
                body = {
                    "inputs": "The quick brown fox",
                    "parameters": {"max_new_tokens": 8, "details": True, "ignore_eos": True},
                }
                async with s.post(server.make_url("/invocations"), json=body) as r:
                    assert r.status == 200, await r.text()
                    assert [t["id"] for t in (await r.json())["details"]["tokens"]] == expected
        finally:
            await server.close()
        built = "(built," in caplog.text
        assert built is (replica == 0), caplog.text[-3000:]


SITECUSTOMIZE = """\
import lmi_trt.engines.trtllm as _trt
_trt.cuda_available = lambda: True
"""


def test_ping_answers_pending_while_the_engine_load_holds_the_gil(engine_dir, hf_dir, tmp_path):
    """TensorRT-LLM's Executor constructor holds the GIL for the whole load, freezing every thread of the
    server; /ping must still answer 503 PENDING (a liveness probe would otherwise kill the container),
    then 200 once the engine is up, and requests are served by the server itself after the handover."""
    import time

    import requests
    from cliserver import serve, wait_ready
    from trtllm_testing import FAKES

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)  # the one hardware seam: no GPU here
    # The fake Executor's constructor blocks in C without releasing the GIL until a byte is written to this FIFO
    # (once the answers below are in). Opened both ways here: neither side's open waits for the other, and the
    # byte waits in the pipe until the load reads it.
    load_end = tmp_path / "engine-load"
    os.mkfifo(load_end)
    load_end_fd = os.open(load_end, os.O_RDWR)
    env = {
        "PYTHONPATH": os.pathsep.join([str(site), str(FAKES), os.environ.get("PYTHONPATH", "")]),
        "LMI_TRT_FAKE_ENGINE_LOAD_UNTIL": str(load_end),
    }
    args = [
        "--model-id",
        str(engine_dir),
        "--engine",
        "trtllm",
        "-o",
        f"option.tokenizer_id={hf_dir}",
        "-o",
        "option.max_input_len=64",
        "-o",
        "option.max_output_len=32",
        "-o",
        "option.max_rolling_batch_size=4",
    ]
    with os.fdopen(load_end_fd, "wb", buffering=0) as load_end_w, serve(args, tmp_path, env=env, ready=False) as server:
        deadline = time.monotonic() + 120
        while "holds the GIL" not in server.log():
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()[-4000:]
            time.sleep(0.05)
        answers = []
        for _ in range(5):
            t0 = time.monotonic()
            r = server.get("/ping", timeout=5)
            answers.append((r.status_code, r.json(), time.monotonic() - t0))
            other = server.post("/invocations", json={"inputs": "hi"}, timeout=5)
            assert other.status_code == 503 and other.headers["Retry-After"] and "loading" in other.json()["error"]
        assert "released the GIL" not in server.log(), "the answers must have come while the GIL was held"
        assert all(code == 503 and list(body.values()) == [{"status": "PENDING"}] for code, body, _ in answers), answers
        print(f"/ping during the GIL-holding load: {max(a[2] for a in answers) * 1000:.0f} ms at most")
        load_end_w.write(b"x")  # the load ends
        wait_ready(server, timeout=120)
        body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 4, "ignore_eos": True}}
        r = server.post("/invocations", json=body)
        assert r.status_code == 200, r.text
        responder_pid = int(server.log().split("health responder (pid ")[1].split(")")[0])
        deadline = time.monotonic() + 60  # the server answers before it stops the responder: no connection unanswered
        while "health responder stopped" not in server.log():
            assert time.monotonic() < deadline, server.log()[-4000:]
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{responder_pid}")  # exited and reaped at the handover
        assert requests.get(server.url + "/ping", timeout=30).status_code == 200


async def test_beams_through_the_openai_lmi_and_triton_schemas(trtllm, hf_dir, tmp_path):
    """The Executor path: an engine built for 3 beams, served with option.max_beam_width=3. The beams the clients
    get back are transformers' (the fake Executor decodes beams with generate) for the SamplingConfig the engine
    sent: beamWidth, numReturnSequences, lengthPenalty and earlyStopping (executor.h)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    engine = make_engine_dir(
        hf_dir, tmp_path / "engine", max_batch_size=4, max_input_len=64, max_seq_len=96, max_beam_width=3
    )
    config = _config(engine, hf_dir, tmp_path, max_beam_width=3)
    tok = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    prompt = "The quick brown fox"
    ids = tok(prompt)["input_ids"]

    def beams(k: int, n: int, length_penalty: float, early_stopping: bool) -> list[str]:
        rows, _ = beam_reference(
            model,
            ids,
            beams=k,
            returned=n,
            max_new=8,
            eos=tok.eos_token_id,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        return [tok.decode(row, skip_special_tokens=True) for row in rows]

    import tensorrt_llm  # the fake, impersonating LMI_TRT_FAKE_RELEASE

    server = await _server(config, DEFAULT_ADAPTERS)
    # Plain HTTP, as the openai client sends extra_body's fields: the release legs install .[test-core], no openai.
    extra = {"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True}

    async def complete(**fields) -> tuple[int, dict]:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "n": 2, **extra, **fields}
        async with ClientSession(timeout=ClientTimeout(total=60)) as s:
            async with s.post(server.make_url("/v1/completions"), json=body) as r:
                return r.status, await r.json()

    def texts(answer: dict) -> list[str]:
        return [c["text"] for c in sorted(answer["choices"], key=lambda c: c["index"])]

    try:
        if tensorrt_llm.__version__.startswith("0."):  # 0.12's beam settings are unread: refused, not assumed
            status, answer = await complete()
            error = answer["error"]
            assert status == 400 and error["param"] == "use_beam_search" and "TensorRT-LLM 0.12" in error["message"]
            return
        status, out = await complete()
        assert status == 200 and texts(out) == beams(2, 2, 0.5, True), out  # n beams searched, n returned
        status, wide = await complete(best_of=3)
        assert status == 200 and texts(wide) == beams(3, 2, 0.5, True), wide
        status, answer = await complete(n=4)  # wider than option.max_beam_width
        assert status == 400 and answer["error"]["param"] == "use_beam_search", answer
        assert "at most 3" in answer["error"]["message"]
        status, answer = await complete(early_stopping="never")  # no SamplingConfig value says "never"
        assert status == 400 and answer["error"]["param"] == "early_stopping", answer
        status, answer = await complete(length_penalty=-1.0)  # samplingConfig.cpp (1.x): lengthPenalty >= 0
        assert status == 400 and answer["error"]["param"] == "length_penalty", answer
        assert "0 or more" in answer["error"]["message"]
        async with ClientSession(timeout=ClientTimeout(total=60)) as s:
            body = {"inputs": prompt, "parameters": {"max_new_tokens": 8, "num_beams": 3, "early_stopping": True}}
            async with s.post(server.make_url("/invocations"), json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["generated_text"] == beams(3, 1, 1.0, True)[0]
            triton = {"text_input": prompt, "max_tokens": 8, "beam_width": 3, "length_penalty": 0.0}
            async with s.post(server.make_url("/v2/models/ensemble/generate"), json=triton) as r:
                assert r.status == 200, await r.text()
                # all beamWidth beams come back when num_return_sequences is not given (numReturnBeams)
                assert (await r.json())["text_output"] == beams(3, 3, 0.0, False)
            # tensorrt_llm/config.pbtxt's early_stopping (TYPE_BOOL) reaches SamplingConfig.earlyStopping
            async with s.post(
                server.make_url("/v2/models/ensemble/generate"), json={**triton, "early_stopping": True}
            ) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["text_output"] == beams(3, 3, 0.0, True)
    finally:
        await server.close()
