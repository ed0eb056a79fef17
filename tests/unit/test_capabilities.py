"""GET /v1/capabilities and the 400s that refuse a feature come from one table (the engine's
``Capabilities``): every feature an engine refuses, asked for through every field a schema has for it,
gets a 400 naming that field with the reason the route shows; what it honours is served."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from serverproc import serve_all_schemas

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import Capabilities, Capability, can, cannot
from lmi_trt.engines.llmapi import llm_api_release, release_capabilities
from lmi_trt.engines.llmapi_releases import TRTLLM, llm_sampler
from lmi_trt.engines.replicas import common_capabilities
from lmi_trt.engines.synthetic import CAPABILITIES, SyntheticEngine
from lmi_trt.engines.trtllm import executor_capabilities
from lmi_trt.serving.core import REQUESTED_FEATURES

USER = [{"role": "user", "content": "Hi there"}]
# The sampling features (engines.base.SAMPLING_FEATURES) as OpenAI bodies and as LMI/TGI parameters ask for them.
PARAMETERS_SAMPLING: dict[str, dict[str, Any]] = {
    "seed": {"seed": 5, "do_sample": True},  # a seed counts for a sampled request only
    "repetition_penalty": {"repetition_penalty": 1.2},
    "presence_penalty": {"presence_penalty": 0.5},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "min_new_tokens": {"min_new_tokens": 1},
    "bad_words": {"bad_words": ["x"]},
    "stop_token_ids": {"stop_token_ids": [5], "ignore_eos": True},  # counts with ignore_eos only
}
OPENAI_SAMPLING: dict[str, dict[str, Any]] = {
    **PARAMETERS_SAMPLING,
    "beam_search": {"use_beam_search": True, "n": 2},  # vLLM's extension: n beams come back as the choices
    "min_p": {"min_p": 0.1},
    "seed": {"seed": 5, "temperature": 0.7},
    "min_new_tokens": {"min_tokens": 1},
}
# Per schema: the route, a request that asks for nothing special, and per feature what asking for it adds.
SCHEMAS: dict[str, tuple[str, dict[str, Any], dict[str, dict[str, Any]]]] = {
    "openai.chat": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": USER, "max_tokens": 2},
        {
            "logprobs": {"logprobs": True},
            "top_logprobs": {"logprobs": True, "top_logprobs": 2},
            "logit_bias": {"logit_bias": {"5": 1}},
            "guided": {"response_format": {"type": "json_object"}},
            **OPENAI_SAMPLING,
        },
    ),
    "openai.completions": (
        "/v1/completions",
        {"model": "tiny", "prompt": "Hi there", "max_tokens": 2},
        {
            "logprobs": {"logprobs": 0},
            "top_logprobs": {"logprobs": 2},
            "prompt_logprobs": {"echo": True, "logprobs": 0},
            "logit_bias": {"logit_bias": {"5": 1}},
            **OPENAI_SAMPLING,
        },
    ),
    "lmi": (
        "/invocations",
        {"inputs": "Hi there", "parameters": {"max_new_tokens": 2}},
        {
            "logprobs": {"details": True},
            "top_logprobs": {"top_n_tokens": 2},
            "prompt_logprobs": {"decoder_input_details": True},
            "guided": {"guided_regex": "a+"},
            "beam_search": {"num_beams": 2},
            "min_p": {"min_p": 0.1},
            "lora": {"adapters": "sql"},  # top-level (TOP_LEVEL)
            **PARAMETERS_SAMPLING,
        },
    ),
    "tgi": (
        "/generate",
        {"inputs": "Hi there", "parameters": {"max_new_tokens": 2}},
        {
            "logprobs": {"details": True},
            "top_logprobs": {"top_n_tokens": 2},
            "prompt_logprobs": {"decoder_input_details": True},
            "guided": {"grammar": {"type": "regex", "value": "a+"}},
            "min_p": {"min_p": 0.1},
            "lora": {"adapter_id": "sql"},
            **PARAMETERS_SAMPLING,
        },
    ),
}


# Fields a schema takes beside "parameters" (DJL's adapters); OpenAI names an adapter as its model, which is a 404
# where no adapter of that name is registered (vLLM's answer), not a feature to refuse.
TOP_LEVEL = {("lmi", "lora")}


def asking(schema: str, feature: str) -> tuple[str, dict[str, Any]]:
    path, base, features = SCHEMAS[schema]
    extra = features[feature]
    if "parameters" in base and (schema, feature) not in TOP_LEVEL:
        return path, {**base, "parameters": {**base["parameters"], **extra}}
    return path, {**base, **extra}


class RefusesEverything(SyntheticEngine):
    """The synthetic engine declaring that it honours none of the features (so that logprobs, which the
    synthetic engine honours, is refused too): what the server does with a refusal is the same for all."""

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(
            CAPABILITIES, logprobs=cannot("the refusing engine reports no log-probs; leave them out")
        )


def served(engine_class: type[SyntheticEngine] = SyntheticEngine):
    return serve_all_schemas(LmiConfig(max_input_len=128, max_output_len=64), engine_class=engine_class)


def message(raw: bytes) -> str:
    error = orjson.loads(raw)["error"]
    return error if isinstance(error, str) else error["message"]


def test_the_core_checks_exactly_the_features_engines_declare():
    declared = set(CAPABILITIES.features())
    assert set(REQUESTED_FEATURES) == declared
    assert {f for _, _, asks in SCHEMAS.values() for f in asks} == declared  # every feature is tried below


@pytest.mark.parametrize("engine_class", [SyntheticEngine, RefusesEverything])
async def test_the_route_shows_what_the_400s_refuse_and_the_fields_they_name(engine_class):
    async with served(engine_class) as (s, _):
        async with s.get("/v1/capabilities") as r:
            assert r.status == 200
            doc = await r.json()
        assert doc["engine"] == "synthetic" and doc["limits"]["max_input_len"] == 128
        tried = 0
        for feature, entry in doc["features"].items():
            assert entry["fields"] and entry["description"]
            for schema, field in entry["fields"].items():
                path, body = asking(schema, feature)
                async with s.post(path, json=body) as r:
                    raw = await r.read()
                    status = r.status
                if entry["honoured"]:
                    assert status == 200, (schema, feature, raw)
                else:
                    text = message(raw)
                    # "parameters.guided_json/guided_regex/guided_grammar": the 400 names the one sent
                    head, _, tail = field.rpartition(".")
                    sent = tuple(f"{head}.{name}" if head else name for name in tail.split("/"))
                    assert status == 400 and text.startswith(sent) and entry["reason"] in text, (schema, raw)
                    tried += 1
        assert tried >= 10


async def test_best_of_says_it_needs_log_probs_when_the_engine_refuses_them():
    async with served(RefusesEverything) as (s, _):
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "best_of": 2, "n": 1, "temperature": 1}
        async with s.post("/v1/completions", json=body) as r:
            assert r.status == 400
            assert message(await r.read()).startswith("best_of ranks the sequences by log-prob: the refusing engine")
        body = {"inputs": "Hi", "parameters": {"best_of": 2, "do_sample": True, "max_new_tokens": 2}}
        async with s.post("/generate", json=body) as r:
            assert r.status == 400
            assert message(await r.read()).startswith("parameters.best_of picks the best by log-prob: the refusing")


def test_every_table_gives_a_reason_for_each_refusal():
    tables = [
        CAPABILITIES,
        executor_capabilities("TensorRT-LLM 1.2.1", True, can()),
        executor_capabilities("TensorRT-LLM 0.12.0", False, cannot("no guided decoding here")),
        *(llmapi(v, 32000) for v in ("1.0.0", "1.1.0", "1.3.0rc4")),
        llmapi("1.2.1", None),
        release_capabilities("1.2.1", TRTLLM, 32000, [2, 3]),  # beams on 1.2: the TRTLLMSampler
    ]
    for caps in tables:
        for name, c in caps.features().items():
            assert c.honoured or c.reason.strip(), (caps.release, name)
    assert llmapi("1.0.0", 32000).top_logprobs.reason.count("PR 7756") == 1
    assert not llmapi("1.1.0", 32000).top_logprobs.honoured  # PR 7756 was reverted before the 1.1 cut
    assert llmapi("1.2.1", 32000).top_logprobs == can(most=20)
    assert not llmapi("1.2.1", None).logit_bias.honoured  # no vocab_size: no embedding bias


def llmapi(version: str, vocab_size: int | None) -> Capabilities:
    """The LLM API engine's capabilities as it builds the LLM for ``version`` (beam width 1)."""
    return release_capabilities(version, llm_sampler(llm_api_release(version), 1), vocab_size, [2])


def test_several_copies_honour_what_every_copy_honours():
    a = dataclasses.replace(CAPABILITIES, top_logprobs=can(most=20), guided=can())
    b = dataclasses.replace(CAPABILITIES, top_logprobs=can(most=5), guided=cannot("copy b has no xgrammar"))
    both = common_capabilities([a, b])
    assert both.top_logprobs == Capability(True, "", 5) and both.guided == cannot("copy b has no xgrammar")
    assert common_capabilities([a]) == a
