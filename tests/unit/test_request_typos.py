"""A request field within a typo of a known one is a 400 naming the known one, in every schema (as OpenAI answers
an unrecognized argument); fields other servers of the schema accept are never taken for typos (in-process, on the
synthetic engine)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from serverproc import post
from serverproc import serve_all_schemas as serve

from lmi_trt.serving.protocols.lmi import PEER_PARAMETERS
from lmi_trt.serving.protocols.openai import PEER_FIELDS
from lmi_trt.spelling import within_a_typo

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_within_a_typo():
    known = ["temperature", "max_tokens", "stop", "top_p", "top_k", "seed"]
    assert within_a_typo("temprature", known) == ["temperature"]
    assert within_a_typo("max_token", known) == ["max_tokens"]
    assert within_a_typo("maxTokens", known) == ["max_tokens"]  # case and separators fold away
    assert within_a_typo("tempreature", known) == ["temperature"]  # two edits in a long name
    assert within_a_typo("top_n", known) == ["top_k", "top_p"]  # the closest, all of them
    assert within_a_typo("store", known) == []  # two edits in a short name: another word
    assert within_a_typo("temperature", known) == []  # a known name is no typo
    assert within_a_typo("metadata", known) == []


@pytest.mark.parametrize(
    "path, body, param, meant",
    [
        ("/v1/chat/completions", {**CHAT, "temprature": 0.5}, "temprature", "temperature"),
        ("/v1/chat/completions", {**CHAT, "max_token": 5}, "max_token", "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "echos": True}, "echos", "echo"),
        ("/invocations", {"inputs": "hi", "parameters": {"max_new_token": 2}}, None, "parameters.max_new_tokens"),
        ("/invocations", {"inputs": "hi", "paramters": {"max_new_tokens": 2}}, None, "parameters"),
        ("/generate", {"inputs": "hi", "parameters": {"max_new_tokens": 2, "temprature": 1.0}}, None,
         "parameters.temperature"),
        ("/generate", {"inputs": "hi", "streem": True}, None, "stream"),
        ("/v2/models/tiny/generate", {"text_input": "hi", "max_token": 2}, None, "max_tokens"),
        ("/invocations", {"prompt": "hi", "max_token": 2}, None, "max_tokens"),  # a Truss body
    ],
)  # fmt: skip
async def test_a_field_within_a_typo_is_a_400_naming_the_known_one(path, body, param, meant):
    async with serve() as (s, _):
        status, _, raw = await post(s, path, body)
    assert status == 400, raw
    err = orjson.loads(raw)
    message = err["error"]["message"] if isinstance(err["error"], dict) else err["error"]
    assert f"did you mean {meant}?" in message, message
    if param is not None:  # OpenAI's shape names it
        assert err["error"]["param"] == param


async def test_fields_other_servers_accept_are_not_typos():
    """OpenAI's user, metadata, store, service_tier..., vLLM's extensions, DJL's and TGI's parameters: accepted (and
    warned about where this server does not use them), even where a field here is within a typo of one."""
    openai_extra: dict[str, Any] = {
        "user": "u",
        "metadata": {"k": "v"},
        "store": False,
        "service_tier": "auto",
        "safety_identifier": "s",
        "prompt_cache_key": "k",
        "include_stop_str_in_output": False,
        "priority": 0,
    }
    assert openai_extra.keys() <= PEER_FIELDS
    lmi_extra = {"num_beams": 1, "min_length": 1, "bad_sequences": [], "include_stop_str_in_output": False}
    assert lmi_extra.keys() <= PEER_PARAMETERS
    async with serve() as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", {**CHAT, **openai_extra})
        assert status == 200, raw
        status, _, raw = await post(
            s, "/invocations", {"inputs": "hi", "parameters": {"max_new_tokens": 2, **lmi_extra}}
        )
        assert status == 200, raw
