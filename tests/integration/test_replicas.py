"""Two copies of the torch engine behind one front end (ReplicaSet), through the real load path
(config → sources → ``load_model(..., plan)``) and HTTP: concurrent requests use both copies
(least-loaded routing) and the greedy outputs equal a single copy's."""

from __future__ import annotations

import asyncio

import pytest
import torch
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestServer
from tinymodels import tiny_model

from lmi_trt.config import LmiConfig
from lmi_trt.engines.replicas import ReplicaSet
from lmi_trt.launch import LaunchPlan, plan_launch
from lmi_trt.loader import load_model
from lmi_trt.serving.app import build_app
from lmi_trt.serving.http import CONTEXT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PROMPTS = [
    "The quick brown fox",
    "Serving engines batch",
    "Once upon a time",
    "def hello(name):",
    "Grüße aus München",
    "In a hole in the ground",
    "One, two, three,",
    "Large language models",
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2 shared cores; two copies gain nothing from more threads each
    yield
    torch.set_num_threads(before)


def _config(tmp_path) -> LmiConfig:
    return LmiConfig(
        model_id=str(tiny_model("llama")),
        rolling_batch="torch",
        device="cpu",
        max_input_len=64,
        max_output_len=32,
        max_rolling_batch_size=4,
        download_dir=tmp_path / "dl",
    )


async def _answers(config: LmiConfig, plan: LaunchPlan | None) -> tuple[list[str], object]:
    app = build_app(lambda: load_model(config, "torch", plan), config, model_name="tiny")
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession(timeout=ClientTimeout(total=120)) as s:
            for _ in range(1200):
                async with s.get(server.make_url("/ping")) as r:
                    if r.status == 200:
                        break
                    assert "FAILED" not in await r.text()
                await asyncio.sleep(0.05)

            async def ask(prompt: str) -> str:
                body = {"inputs": prompt, "parameters": {"max_new_tokens": 12, "do_sample": False}}
                async with s.post(server.make_url("/invocations"), json=body) as r:
                    assert r.status == 200, await r.text()
                    return (await r.json())["generated_text"]

            texts = await asyncio.gather(*(ask(p) for p in PROMPTS))  # all at once
            engine = app[CONTEXT].service.engine
            return list(texts), engine
    finally:
        await server.close()


async def test_two_torch_copies_share_the_load_and_answer_like_one(tmp_path):
    config = _config(tmp_path)
    single, engine = await _answers(config, None)
    assert not isinstance(engine, ReplicaSet)

    # Two CPU copies; on a GPU host plan_launch gives one per GPU (cuda:0, cuda:1, ...).
    assert [p.torch_device for p in plan_launch(1, 1, 2, "torch").placements()] == ["cuda:0", "cuda:1"]
    two = LaunchPlan("torch", 1, 1, 0, ((), ()), 0)
    double, replicas = await _answers(config, two)
    assert isinstance(replicas, ReplicaSet) and replicas.copies == 2 and replicas.name == "torchx2"

    assert double == single  # greedy: the copy a request lands on does not matter
    per_copy = [e.stats().total_requests for e in replicas.engines]
    assert all(n > 0 for n in per_copy), f"least-loaded routing used only some copies: {per_copy}"
    assert sum(per_copy) == len(PROMPTS) == replicas.stats().total_requests
    assert replicas.limits.max_batch_size == 2 * 4
