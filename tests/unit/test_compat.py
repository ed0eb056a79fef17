"""The torch engine with whichever transformers is installed: in the release legs of .ci/run, the one each
TensorRT-LLM image pins (4.42.4, 4.53.1, 4.56.0, 4.57.3); in the default run, the newest."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from tinymodels import tiny_model
from transformers import AutoModelForCausalLM

from lmi_trt.engines.base import EngineError, GenerationRequest, SamplingParams
from lmi_trt.engines.torch import TorchEngine
from lmi_trt.engines.torch.continuous import CB_IMPORT_ERROR

pytestmark = pytest.mark.asyncio


async def test_fp32_load_and_greedy_generation_match_transformers(caplog):
    """dtype goes to from_pretrained under the keyword this transformers knows (on 4dccd9d, `dtype=` raised
    TypeError below transformers 4.56: the 0.12 and 1.0 images), and batching=auto starts whichever path this
    transformers supports, saying which and why."""
    path = tiny_model("llama")
    # The transformers path (llama would otherwise take the built-in decode loop, which needs no transformers API).
    engine = TorchEngine(
        path,
        dtype="fp32",
        max_batch_size=2,
        max_input_len=16,
        max_new_tokens=6,
        eos_token_ids=[2],
        decode_loop="transformers",
    )
    with caplog.at_level(logging.INFO, logger="lmi_trt.engines.torch"):
        await engine.start()
    try:
        prompt = [1, 5, 6, 7]
        outs = [o async for o in engine.submit(GenerationRequest("r", prompt, SamplingParams(max_new_tokens=6)))]
        ref = AutoModelForCausalLM.from_pretrained(str(path)).eval()
        expected = ref.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=[2], pad_token_id=0
        )[0, len(prompt) :].tolist()
        assert [t for o in outs for t in o.token_ids] == expected
        if CB_IMPORT_ERROR is not None:  # transformers without the continuous batching API
            assert engine.batching == "static"
            assert any(
                "static batching because this transformers has no usable continuous batching API" in r.getMessage()
                for r in caplog.records
            ), transformers.__version__
        else:
            assert engine.batching == "continuous"
    finally:
        await engine.close()


@pytest.mark.skipif(CB_IMPORT_ERROR is None, reason="this transformers has continuous batching")
async def test_continuous_batching_asked_for_without_the_api_names_the_reason():
    with pytest.raises(EngineError) as err:
        await TorchEngine(tiny_model("llama"), max_input_len=16, max_new_tokens=4, batching="continuous").start()
    assert err.value.code == 400
    assert "batching=continuous is not possible" in str(err.value) and "continuous batching API" in str(err.value)
