"""OpenAI tool calls: each registered parser on its format as recorded in vLLM's parsers and the models' chat
templates, read whole and in any split; the request's plan; and the whole path in-process on the synthetic
engine, which echoes its prompt, so a tool call written into the chat comes back as the model's output and must
be parsed as one."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import orjson
import pytest
from serverproc import post
from serverproc import serve_all_schemas as serve

from lmi_trt import tool_parsers
from lmi_trt.config import REGISTRY as KEYS
from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import FinishReason
from lmi_trt.serving.chat_answer import Answer, AnswerReader
from lmi_trt.serving.errors import FieldError
from lmi_trt.serving.tool_calls import ToolPlan, plan_tools
from lmi_trt.tool_parsers.base import CallArgs, CallStart, Content

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
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"], "get_time": {}}

# Each format as the sources show it (a model's output: content, calls), with the content and calls it holds.
RECORDED = {
    # Qwen 2.5's / Hermes 2 Pro's chat templates; vllm hermes_tool_parser.py
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        "Let me check.\n\n",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    # Meta's Llama 3.1 JSON tool calling; vllm llama_tool_parser.py
    "llama3_json": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_time", "parameters": {}}',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    # Mistral's tokenizers before v11; vllm mistral_tool_parser.py
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    # the instruction in Qwen3-Coder's chat template (vllm examples/tool_chat_template_qwen3coder.jinja)
    "qwen3_coder": (
        "I will call it.\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
        "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\n"
        "multiple lines\n</parameter>\n</function>\n</tool_call>",
        "I will call it.\n",
        [
            (
                "example_function_name",
                {
                    "example_parameter_1": "value_1",
                    "example_parameter_2": "This is the value for the second parameter\nthat can span\nmultiple lines",
                },
            )
        ],
    ),
    # DeepSeek-V3's chat template (vllm examples/tool_chat_template_deepseekv3.jinja) as it renders two calls
    "deepseek_v3": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n'
        "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    # DeepSeek-V3.1's chat template (vllm examples/tool_chat_template_deepseekv31.jinja)
    "deepseek_v31": (
        'Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Checking.",
        [("get_weather", {"city": "Paris"}), ("get_time", {})],
    ),
    # the CORRECT example in Llama 4's pythonic template (vllm examples/tool_chat_template_llama4_pythonic.jinja)
    "llama4_pythonic": (
        '[get_weather(location="Vancouver"), calculate_route(start="Boston", end="New York")]',
        "",
        [("get_weather", {"location": "Vancouver"}), ("calculate_route", {"start": "Boston", "end": "New York"})],
    ),
}
PARSERS = sorted({p.name for p in tool_parsers.REGISTRY.values()})


def read(name: str, text: str, cuts: list[int] = (), schemas: Any = SCHEMAS) -> tuple[str, list[tuple[str, str]]]:
    """The content and calls a parser reads from ``text`` fed in pieces cut at ``cuts``."""
    reader = tool_parsers.REGISTRY[name].reader(schemas)
    events = []
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        events += reader.feed(text[start:end])
    events += reader.finish()
    content, calls = [], []
    for e in events:
        if isinstance(e, Content):
            content.append(e.text)
        elif isinstance(e, CallStart):
            assert e.index == len(calls)
            calls.append([e.name, ""])
        else:
            assert isinstance(e, CallArgs)
            calls[e.index][1] += e.text
    return "".join(content), [(n, a) for n, a in calls]


def decoded(calls: list[tuple[str, str]]) -> list[tuple[str, Any]]:
    return [(name, json.loads(args)) for name, args in calls]


def test_every_format_is_registered_and_is_the_option_vocabulary():
    assert PARSERS == sorted(RECORDED)
    allowed = KEYS_BY_NAME["option.tool_call_parser"].type.summary
    for name in tool_parsers.REGISTRY:  # trtllm-serve's spellings too
        assert f"`{name}`" in allowed
    assert tool_parsers.REGISTRY["qwen3"].name == "hermes" and tool_parsers.REGISTRY["deepseekv3.1"].name == (
        "deepseek_v31"
    )


KEYS_BY_NAME = {k.key: k for k in KEYS}


@pytest.mark.parametrize("name", PARSERS)
def test_each_format_reads_its_recorded_output(name):
    text, content, calls = RECORDED[name]
    got_content, got_calls = read(name, text)
    assert got_content == content and decoded(got_calls) == calls


@pytest.mark.parametrize("name", PARSERS)
def test_any_split_of_an_output_reads_the_same(name):
    """What a stream sends is what the unstreamed answer holds, whatever the pieces the engine gives."""
    text = RECORDED[name][0]
    whole = read(name, text)
    rng = random.Random(name)
    for size in (1, 2, 3, 7):
        assert read(name, text, list(range(size, len(text), size))) == whole, size
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 20)))
        assert read(name, text, cuts) == whole, cuts


@pytest.mark.parametrize("name", PARSERS)
def test_each_format_reads_back_what_it_writes(name):
    """``write`` is what the description of a template without tools shows the model; values of every JSON type."""
    calls = [("get_weather", {"city": 'Paris "centre" é', "days": 3, "when": None, "ok": True}), ("get_time", {})]
    schemas = {
        "get_weather": {
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "when": {"type": "string"},
                "ok": {"type": "boolean"},
            }
        }
    }
    content, got = read(name, tool_parsers.REGISTRY[name].write(calls), schemas=schemas)
    assert decoded(got) == calls and not content.strip()


@pytest.mark.parametrize("name", PARSERS)
def test_text_that_is_no_call_is_content_and_a_marker_is_held_only_while_it_may_be_one(name):
    for text in ("no call here", "The answer is {42} [1, 2]", "<tool_call>{not json</tool_call>", "[TOOL_CALLS] oops"):
        assert read(name, text) == (text, []), text
        assert read(name, text, list(range(1, len(text)))) == (text, []), text
    reader = tool_parsers.REGISTRY[name].reader(SCHEMAS)
    marker = tool_parsers.REGISTRY[name].markers[0]
    first = reader.feed("Hi " + marker[:3])
    if name not in ("llama3_json", "llama4_pythonic"):  # these read calls only at the output's start
        assert first == [Content("Hi ")]  # the marker's start is held
    rest = reader.feed("x") + reader.finish()
    assert "".join(e.text for e in [*first, *rest] if isinstance(e, Content)) == "Hi " + marker[:3] + "x"


def test_arguments_stream_as_written_where_the_format_writes_json():
    """A call's name goes out as soon as it is read, and its JSON arguments piece by piece as they come."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    reader = tool_parsers.REGISTRY["hermes"].reader(SCHEMAS)
    cut = text.index("Paris")
    early = reader.feed(text[:cut])
    assert early[0] == CallStart(0, "get_weather") and "".join(e.text for e in early[1:]) == '{"city": "'
    reader = tool_parsers.REGISTRY["deepseek_v31"].reader(SCHEMAS)
    early = reader.feed('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": [1, 2')
    assert early == [CallStart(0, "f"), CallArgs(0, '{"a": [1, 2')]


def test_qwen3_coder_types_values_by_the_tools_schema():
    schema = {
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": "number"},
            "b": {"type": "boolean"},
            "o": {"type": "object"},
            "l": {"type": ["array", "null"]},
            "s": {"type": "string"},
            "bad": {"type": "integer"},
        }
    }
    params = {"n": "3", "x": "2.5", "b": "true", "o": '{"k": 1}', "l": "null", "s": "007", "bad": "many", "extra": "5"}
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    _, calls = read("qwen3_coder", text + "</function>\n</tool_call>", schemas={"f": schema})
    assert decoded(calls) == [
        ("f", {"n": 3, "x": 2.5, "b": True, "o": {"k": 1}, "l": None, "s": "007", "bad": "many", "extra": "5"})
    ]


def test_pythonic_calls_are_literals_with_keywords_only():
    assert decoded(
        read("llama4_pythonic", '<|python_start|>[f(a=[1, (2, 3)], b={"k": None}, c=-1.5)]<|python_end|>')[1]
    ) == [("f", {"a": [1, [2, 3]], "b": {"k": None}, "c": -1.5})]
    for not_calls in ("[f(1)]", "[f(a=g())]", "[f(**kw)]", "[]"):
        assert read("llama4_pythonic", not_calls) == (not_calls, [])
    # a complete call is sent; the text after a list that breaks off is content
    assert read("llama4_pythonic", "[f(a=1), nope]") == (" nope]", [("f", '{"a": 1}')])


def test_a_truncated_call_keeps_what_was_written():
    """The output ended (max_tokens) inside a call: the call stands with the arguments it has."""
    assert read("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1') == ("", [("f", '{"a": 1')])
    assert read("hermes", '<tool_call>{"na') == ('<tool_call>{"na', [])


@pytest.mark.parametrize(
    ("template", "name"),
    [
        ("{% if tools %}<tools></tools> reply <tool_call>{...}</tool_call>{% endif %}", "hermes"),
        ("{{ '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen3_coder"),
        ("[AVAILABLE_TOOLS]...[TOOL_CALLS]", "mistral"),
        ("{%- if message.role == 'ipython' %}<|python_tag|>", "llama3_json"),
        ("Use exact format: [func_name1(param1=value1, param2=value2), func_name2(...)] ipython", "llama4_pythonic"),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name\\n```json\\n", "deepseek_v3"),
        ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments", "deepseek_v31"),
        ("{{ messages }}", None),
    ],
)
def test_the_format_is_recognised_from_the_chat_template(template, name):
    found = tool_parsers.recognise(template)
    assert (found.name if found else None) == name


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
    answer = Answer.of(AnswerReader(None, plan.reader()), '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    assert answer.content is None and [(c.name, json.loads(c.arguments)) for c in answer.calls] == [
        ("get_weather", {"city": "Oslo"})
    ]
    named = plan_tools(
        [WEATHER],
        {"type": "function", "function": {"name": "get_weather"}},
        None,
        auto_enabled=False,
        parser_option=None,
        template=None,
    )
    assert json.loads(named.guided().value) == WEATHER["function"]["parameters"]
    answer = Answer.of(AnswerReader(None, named.reader()), "")  # an empty output still is the named call
    assert [(c.name, c.arguments) for c in answer.calls] == [("get_weather", "")]


def test_plan_refusals_name_the_field():
    cases = [
        (
            ([WEATHER], "auto", None, True, None, "{% for t in tools %}{% endfor %}"),
            "tool_choice",
            "option.tool_call_parser",
        ),
        (([WEATHER], "sometimes", None, True, "hermes", None), "tool_choice", "not one of"),
        (([WEATHER, WEATHER], "required", None, False, None, None), "tools", "unique"),
        (([{"type": "retrieval"}], "required", None, False, None, None), "tools", "type"),
        (([WEATHER], "required", "yes", False, None, None), "parallel_tool_calls", "true or false"),
    ]
    for (tools, choice, parallel, auto, parser, template), param, words in cases:
        with pytest.raises(FieldError) as err:
            plan_tools(tools, choice, parallel, auto_enabled=auto, parser_option=parser, template=template)
        assert err.value.param == param and words in err.value.message, (choice, err.value.message)


def test_auto_on_a_template_without_tools_is_told_the_hermes_format_unless_a_parser_is_named():
    plain = "{% for m in messages %}{{ m.content }}{% endfor %}"
    plan = plan_tools([WEATHER], "auto", None, auto_enabled=True, parser_option=None, template=plain, takes_tools=False)
    assert plan.parser.name == "hermes" and "<tool_call>" in plan.describe(plan.template_tools())
    plan = plan_tools([WEATHER], "auto", None, auto_enabled=True, parser_option="llama4_pythonic", template=plain)
    assert "[function_name(parameter=" in plan.describe(plan.template_tools())


# --- in-process, on the synthetic engine (it echoes the rendered prompt, ended by </s>) ---
ECHO = "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}</s>"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def _config(**kw: Any) -> LmiConfig:
    settings = {"chat_template": ECHO, "tool_call_parser": "hermes", "max_input_len": 256, "max_output_len": 256, **kw}
    return LmiConfig(enable_auto_tool_choice=True, **settings)


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
        assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
            "get_weather",
            {"city": "Paris"},
        )

        status, _, raw = await post(s, "/v1/chat/completions", {**body, "stream": True})
        deltas = [e["choices"][0] for e in _events(raw)]
        content = "".join(d["delta"].get("content") or "" for d in deltas)
        streamed = [c for d in deltas for c in d["delta"].get("tool_calls") or []]
        assert content == "get_weather;get_time;Sure. " and deltas[-1]["finish_reason"] == "tool_calls"
        assert streamed[0]["id"].startswith("call_") and streamed[0]["function"]["name"] == "get_weather"
        assert all(c["index"] == 0 and "id" not in c for c in streamed[1:])
        assert json.loads("".join(c["function"]["arguments"] for c in streamed)) == {"city": "Paris"}

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


async def test_a_template_without_tools_is_told_about_them_in_a_system_message():
    """The echoed prompt shows what the model was told: the tools' definitions and, for auto, the format to write
    (whose example the echo then holds as a call, as a model's answer would)."""
    plain = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}</s>"
    config = _config(tool_call_parser=None, chat_template=plain, max_input_len=1024, max_output_len=1024)
    async with serve(config) as (s, _):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "Hi"}],
            "tools": [WEATHER],
            "max_tokens": 1000,
        }
        status, _, raw = await post(s, "/v1/chat/completions", {**body, "tool_choice": "none"})
        assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"] == "[user]Hi", raw
        status, _, raw = await post(s, "/v1/chat/completions", body)
        message = orjson.loads(raw)["choices"][0]["message"]
        assert status == 200 and message["content"].startswith("[system]You can call these functions"), raw
        assert json.dumps(WEATHER["function"]["parameters"]) in message["content"] and message["content"].endswith(
            "[user]Hi"
        )
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["function_name"]


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

    plan = ToolPlan([], "auto", parser=tool_parsers.REGISTRY["hermes"])
    assert _chat_choice(Answer.of(AnswerReader(None, plan.reader()), CALL), FinishReason.EOS)["finish_reason"] == (
        "tool_calls"
    )
    assert _chat_choice(Answer.of(AnswerReader(None, plan.reader()), CALL), FinishReason.LENGTH)["finish_reason"] == (
        "length"
    )
    assert _chat_choice(Answer.of(AnswerReader(None, None), CALL), FinishReason.EOS) == {
        "message": {"role": "assistant", "content": CALL},
        "finish_reason": "stop",
    }
