"""OpenAI tool calls: the families' parsers on their documented output shapes, the stream splitter, the
request's plan; and the whole path in-process on the synthetic engine, which echoes its prompt, so a
tool call written into the chat comes back as the model's output and must be parsed as one."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import orjson
import pytest
from serverproc import post
from serverproc import serve_all_schemas as serve

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import FinishReason
from lmi_trt.serving.errors import FieldError
from lmi_trt.serving.tool_calls import FAMILIES, ToolPlan, family_of, plan_tools
from lmi_trt.vocabulary import TOOL_CALL_PARSERS

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}

# Each family's output as its model cards / prompt-format docs show it, with the calls it holds.
OUTPUTS = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.\n\n",
    ),
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        "",
    ),
}
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {})]


def _calls(calls) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_the_families_are_the_option_vocabulary():
    assert tuple(FAMILIES) == TOOL_CALL_PARSERS


@pytest.mark.parametrize("family", sorted(OUTPUTS))
def test_each_family_parses_its_documented_shape(family):
    text, content = OUTPUTS[family]
    got = FAMILIES[family].parse(text)
    assert got is not None and got[0] == content and _calls(got[1]) == CALLS


def test_newer_mistral_name_args_form_and_text_without_calls():
    got = FAMILIES["mistral"].parse('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}')
    assert got is not None and _calls(got[1]) == CALLS
    for family, text in [
        ("hermes", "no call here"),
        ("hermes", "<tool_call>{not json</tool_call>"),
        ("llama3_json", "The answer is {42}"),
        ("mistral", "[TOOL_CALLS] oops"),
    ]:
        assert FAMILIES[family].parse(text) is None, (family, text)


@pytest.mark.parametrize("family", sorted(OUTPUTS))
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_a_stream_split_into_any_pieces_gives_the_unstreamed_answer(family, piece):
    text, _ = OUTPUTS[family]
    plan = ToolPlan([], "auto", parser=FAMILIES[family])
    stream = plan.stream()
    sent = "".join(stream.feed(text[i : i + piece]) for i in range(0, len(text), piece))
    rest, calls = stream.finish()
    content, want = plan.split(text)
    assert sent + rest == content and _calls(calls) == _calls(want) == CALLS
    assert "<tool" not in sent and "[TOOL" not in sent  # no part of a call leaked out as content


def test_content_without_calls_streams_through_and_a_partial_marker_is_held_only_while_it_may_be_one():
    stream = ToolPlan([], "auto", parser=FAMILIES["hermes"]).stream()
    assert stream.feed("a <to") == "a "
    assert stream.feed("day") == "<today"
    assert stream.finish() == ("", [])
    llama = ToolPlan([], "auto", parser=FAMILIES["llama3_json"]).stream()
    assert llama.feed("  ") == "" and llama.feed("Hi {x}") == "  Hi {x}" and llama.feed("!") == "!"


def test_required_schema_takes_each_tool_and_parallel_false_takes_one():
    plan = plan_tools([WEATHER, TIME], "required", False, auto_enabled=False, parser_option=None, template=None)
    schema = json.loads(plan.guided().value)
    jsonschema.validate([{"name": "get_weather", "parameters": {"city": "Oslo"}}], schema)
    for bad in (
        [],
        [{"name": "nope", "parameters": {}}],
        [{"name": "get_weather", "parameters": {}}],
        [{"name": "get_time", "parameters": {}}] * 2,
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    content, calls = plan.parse('[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    assert content is None and _calls(calls) == [("get_weather", {"city": "Oslo"})]
    named = plan_tools(
        [WEATHER],
        {"type": "function", "function": {"name": "get_weather"}},
        None,
        auto_enabled=False,
        parser_option=None,
        template=None,
    )
    assert json.loads(named.guided().value) == WEATHER["function"]["parameters"]


def test_plan_refusals_name_the_field():
    cases = [
        (([WEATHER], "auto", None, True, None, "{{ messages }}"), "tool_choice", "option.tool_call_parser"),
        (([WEATHER], "sometimes", None, True, "hermes", None), "tool_choice", "not one of"),
        (([WEATHER, WEATHER], "required", None, False, None, None), "tools", "unique"),
        (([{"type": "retrieval"}], "required", None, False, None, None), "tools", "type"),
        (([WEATHER], "required", "yes", False, None, None), "parallel_tool_calls", "true or false"),
    ]
    for (tools, choice, parallel, auto, parser, template), param, words in cases:
        with pytest.raises(FieldError) as err:
            plan_tools(tools, choice, parallel, auto_enabled=auto, parser_option=parser, template=template)
        assert err.value.param == param and words in err.value.message, (choice, err.value.message)


def test_family_recognised_from_the_template_text():
    assert family_of("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert family_of("[AVAILABLE_TOOLS]...[TOOL_CALLS]") == "mistral"
    assert family_of("{%- if message.role == 'ipython' %}<|python_tag|>") == "llama3_json"
    assert family_of("{{ messages }}") is None


# --- in-process, on the synthetic engine (it echoes the rendered prompt, ended by </s>) ---
ECHO = "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}</s>"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _config(**kw: Any) -> LmiConfig:
    return LmiConfig(
        max_input_len=256,
        max_output_len=256,
        chat_template=ECHO,
        enable_auto_tool_choice=True,
        tool_call_parser="hermes",
        **kw,
    )


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.strip() and e != b"data: [DONE]"]


async def test_auto_tool_calls_in_the_answer_and_in_streamed_deltas():
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Sure. " + CALL}],
        "tools": [WEATHER, TIME],
        "max_tokens": 200,
    }
    async with serve(_config()) as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", body)
        assert status == 200, raw
        choice = orjson.loads(raw)["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["content"] == "get_weather;get_time;Sure. "
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == CALLS[0]

        status, _, raw = await post(s, "/v1/chat/completions", {**body, "stream": True})
        deltas = [e["choices"][0] for e in _events(raw)]
        content = "".join(d["delta"].get("content") or "" for d in deltas)
        streamed = [c for d in deltas for c in d["delta"].get("tool_calls") or []]
        assert content == "get_weather;get_time;Sure. " and deltas[-1]["finish_reason"] == "tool_calls"
        assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in streamed] == [
            (0, *CALLS[0])
        ]

        # tool_choice none: the same output is plain content
        status, _, raw = await post(s, "/v1/chat/completions", {**body, "tool_choice": "none"})
        choice = orjson.loads(raw)["choices"][0]
        assert choice["message"]["content"].endswith(CALL) and "tool_calls" not in choice["message"]
        assert choice["finish_reason"] == "stop"


async def test_a_tool_round_trip_renders_the_assistant_call_and_the_tool_answer():
    """The assistant's call comes back with arguments as JSON text (as the openai client sends it)."""
    messages = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    template = (
        "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}"
        "{% for c in m.tool_calls or [] %}[{{ c.function.arguments.city }}]{% endfor %}"
        "{{ m.content or '' }}{% endfor %}</s>"
    )
    async with serve(_config().model_copy(update={"chat_template": template})) as (s, _):
        status, _, raw = await post(
            s, "/v1/chat/completions", {"model": "tiny", "messages": messages, "tools": [WEATHER], "max_tokens": 100}
        )
        choice = orjson.loads(raw)["choices"][0]
        assert status == 200 and choice["message"]["content"] == "get_weather;Weather?[Paris]sunny", raw
        assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]


async def test_constrained_tool_choices_need_an_engine_with_constrained_decoding():
    async with serve(_config()) as (s, _):
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            status, _, raw = await post(
                s,
                "/v1/chat/completions",
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "tools": [WEATHER],
                    "tool_choice": choice,
                },
            )
            err = orjson.loads(raw)["error"]
            assert status == 400 and err["param"] == "tool_choice" and "synthetic engine" in err["message"], raw


def test_finish_reason_is_tool_calls_only_when_the_output_ended_itself():
    from lmi_trt.serving.protocols.openai import _chat_choice

    plan = ToolPlan([], "auto", parser=FAMILIES["hermes"])
    assert _chat_choice(plan, CALL, FinishReason.EOS)["finish_reason"] == "tool_calls"
    assert _chat_choice(plan, CALL, FinishReason.LENGTH)["finish_reason"] == "length"
    assert _chat_choice(None, CALL, FinishReason.EOS) == {
        "message": {"role": "assistant", "content": CALL},
        "finish_reason": "stop",
    }
