"""Issue 14, item 2: one meaning per request. DJL's sampling defaults are applied in the core, where
"unset" is still known, and every engine applies the resulting parameters as they are."""

from __future__ import annotations

import pytest

from lmi_trt.engines.base import GenerationRequest
from lmi_trt.engines.llmapi import Codec, plan_request
from lmi_trt.engines.trtllm import sampling_kwargs
from lmi_trt.serving.core import GenerateParams, sampling_params

CODEC = Codec(decode=lambda ids: "|".join(map(str, ids)), encode=lambda text: [int(t) for t in text.split("|")])
REQUESTS = [
    GenerateParams(do_sample=True),  # DJL: top_k 5, top_p 0.85, temperature 0.8
    GenerateParams(do_sample=True, top_p=1.0),  # an explicit 1.0 stays 1.0 (trtllm made it 0.85)
    GenerateParams(do_sample=True, top_k=0, temperature=1.0),
    GenerateParams(temperature=0.7),  # implies sampling: the rest from DJL's defaults
    GenerateParams(top_k=40, top_p=0.9, temperature=0.6, seed=3),
    GenerateParams(),  # greedy
    GenerateParams(do_sample=True, temperature=0),  # temperature 0 is greedy
]


def _engine_views(params: GenerateParams):
    sp = sampling_params(params, max_new_tokens=8, logprobs=False)
    trtllm = sampling_kwargs(sp, seed=7)
    llmapi = plan_request(
        GenerationRequest("r", [1, 2], sp),
        eos_token_ids=[2],
        end_id=2,
        pad_token_id=0,
        max_beam_width=1,
        seed=7,
        codec=CODEC,
    ).sampling
    return sp, trtllm, llmapi


@pytest.mark.parametrize("params", REQUESTS, ids=repr)
def test_every_engine_applies_the_same_sampling(params):
    sp, trtllm, llmapi = _engine_views(params)
    # The torch engine (transformers paths and the built-in decode loop) samples from ``sp`` itself.
    if sp.do_sample:
        torch_view = (sp.top_k, sp.top_p, sp.temperature)
        assert (trtllm["top_k"], trtllm["top_p"], trtllm["temperature"]) == torch_view
        assert (llmapi["top_k"], llmapi["top_p"], llmapi["temperature"]) == torch_view
    else:
        assert trtllm["top_k"] == 1 and llmapi["top_k"] == 1  # greedy everywhere


def test_djl_defaults_fill_only_what_was_unset():
    sp = sampling_params(GenerateParams(do_sample=True), max_new_tokens=8, logprobs=False)
    assert (sp.top_k, sp.top_p, sp.temperature) == (5, 0.85, 0.8)
    sp = sampling_params(GenerateParams(do_sample=True, top_p=1.0, top_k=0), max_new_tokens=8, logprobs=False)
    assert (sp.top_k, sp.top_p, sp.temperature) == (0, 1.0, 0.8)
    greedy = sampling_params(GenerateParams(), max_new_tokens=8, logprobs=False)
    assert not greedy.do_sample and (greedy.top_k, greedy.top_p, greedy.temperature) == (0, 1.0, 1.0)
