"""Tool calls with the real ``openai`` client against the server as a process (torch engine, tiny Llama).

The tiny model's own chat template is a Hermes-style one (``tinymodels.CHAT_TEMPLATE``: tools listed in the
system turn, calls as ``<tool_call>{"name", "arguments"}</tool_call>``, results in ``<tool_response>``).
The model is random: only constrained decoding makes a named or required call's arguments valid for the
function's schema, so every call here must validate.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

PARAMS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": PARAMS}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    with serve(
        [
            "--engine",
            "torch",
            "--model-id",
            str(tiny_model("llama")),
            "--model-name",
            "tiny-llama",
            "-o",
            "option.max_input_len=448",
            "-o",
            "option.max_output_len=64",
            "-o",
            "option.enable_auto_tool_choice=true",
        ],
        tmp,
    ) as server:
        yield server


@pytest.fixture
def client(srv):
    from openai import OpenAI

    return OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def test_named_tool_call_round_trip_plain_and_streamed(client):
    out = client.chat.completions.create(
        model="tiny-llama", messages=ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=48, temperature=0
    )
    choice = out.choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and choice.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    assert choice.finish_reason == "tool_calls"

    chunks = list(
        client.chat.completions.create(
            model="tiny-llama",
            messages=ASK,
            tools=[WEATHER],
            tool_choice=NAMED,
            max_tokens=48,
            temperature=0,
            stream=True,
        )
    )
    fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert fragments[0].id.startswith("call_") and fragments[0].function.name == "get_weather"
    assert "".join(f.function.arguments or "" for f in fragments) == call.function.arguments  # greedy: the same
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # the call and its result go back; the model answers in text
    answer = client.chat.completions.create(
        model="tiny-llama",
        max_tokens=8,
        temperature=0,
        tools=[WEATHER],
        messages=[
            *ASK,
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
        ],
    )
    assert answer.choices[0].message.tool_calls is None and isinstance(answer.choices[0].message.content, str)
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_required_tool_calls_validate_streamed_and_not(client):
    for stream in (False, True):
        kw = dict(
            model="tiny-llama",
            messages=ASK,
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=64,
            temperature=0,
            parallel_tool_calls=False,
        )
        if stream:  # the call's name first, then its arguments as they are generated
            chunks = list(client.chat.completions.create(**kw, stream=True))
            fragments = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
            assert {f.index for f in fragments} == {0} and len(fragments) > 2, fragments
            calls = [(fragments[0].function.name, "".join(f.function.arguments or "" for f in fragments))]
            finish = chunks[-1].choices[0].finish_reason
        else:
            out = client.chat.completions.create(**kw)
            calls = [(c.function.name, c.function.arguments) for c in out.choices[0].message.tool_calls]
            finish = out.choices[0].finish_reason
        assert finish == "tool_calls" and len(calls) == 1, (stream, calls)
        assert calls[0][0] == "get_weather"
        jsonschema.validate(json.loads(calls[0][1]), PARAMS)


def test_auto_on_a_random_model_answers_in_text(client, srv):
    """The template is recognised as Hermes; a random model writes no call, so its text is the content."""
    out = client.chat.completions.create(model="tiny-llama", messages=ASK, tools=[WEATHER], max_tokens=8, temperature=0)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")
    assert "the hermes format" in srv.log()
