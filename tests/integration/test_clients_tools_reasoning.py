"""Tool calls and reasoning with real clients (openai, LangChain's ChatOpenAI, huggingface_hub's InferenceClient)
against ``lmi-trt serve`` as a process on the torch engine with the tiny random Llama.

A random model writes no tool call and no reasoning of its own, so each output here is made by constrained
decoding: a tool's schema (a named or required ``tool_choice``, LangChain's structured output), or the test's
own regex (vLLM's ``structured_outputs``) that spells a call or a reasoning block in the model's format; the
parsers then read it as they read a real model's. Two chat templates that do not render tools:

- ``PLAIN``, ChatML that leaves the reasoning to the model (Qwen3's first template does): the server tells the
  model about the tools in a system message, and reads reasoning with the ``qwen3`` parser;
- ``R1``, DeepSeek-R1's turn markers with its generation prompt that opens ``<think>``: recognised as the
  ``deepseek_r1`` family, and a constraint then starts after the reasoning. The model here has ``</think>`` as a
  token of its own (a copy of the tiny model with it added), so a ``logit_bias`` on it ends the reasoning.
"""

from __future__ import annotations

import json
import shutil

import jsonschema
import pytest
from cliserver import serve
from tinymodels import tiny_model

pytestmark = pytest.mark.slow

PLAIN = """\
{%- for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
R1 = """\
{%- for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}{% else %}{% set content = m.content %}\
{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}\
<｜Assistant｜>{{ content }}{% endif %}{% endfor %}
{%- if add_generation_prompt %}<｜Assistant｜><think>
{% endif %}"""
PARAMS = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# For tool_choice auto, whose description also shows the format to write: a smaller tool, so that the tiny
# model's 512 positions hold the prompt and the answer.
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SMALL = {"type": "function", "function": {"name": "get_weather", "parameters": CITY}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
# A hermes call, as the model is told to write one (the described format), and a reasoning block before it.
HERMES_CALL = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Oslo)"\}\}</tool_call>'
THOUGHT = r"<think>[a-z]{2,4}( [a-z]{2,4}){2}</think>"


def _serve(tmp, model, template: str, *extra: str):
    return serve(
        [
            "--engine",
            "torch",
            "--model-id",
            str(model),
            "--model-name",
            "tiny",
            "-o",
            "option.max_input_len=410",
            "-o",
            "option.max_output_len=100",
            "-o",
            f"option.chat_template={template}",
            *extra,
        ],
        tmp,
    )


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plain")
    extra = ("-o", "option.enable_auto_tool_choice=true", "-o", "option.reasoning_parser=qwen3")
    with _serve(tmp, tiny_model("llama"), PLAIN, *extra) as server:
        yield server


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    """The tiny model with ``<think>`` and ``</think>`` added to its tokenizer and embeddings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("r1") / "model"
    shutil.copytree(tiny_model("llama"), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens(["<think>", "</think>"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    model.resize_token_embeddings(len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with _serve(folder.parent, folder, R1) as server:
        server.end_think = tokenizer.convert_tokens_to_ids("</think>")
        yield server


def _openai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _streamed(chunks) -> tuple[str, str, list[dict], str]:
    """(reasoning, content, calls, finish_reason) of a stream, its deltas joined as a client joins them."""
    reasoning = content = ""
    calls: dict[int, dict] = {}
    finish = ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
            entry["name"] += (call.function.name or "") if call.function else ""
            entry["arguments"] += (call.function.arguments or "") if call.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


def test_a_named_tool_on_a_template_without_tools_plain_and_streamed(plain):
    client = _openai(plain)
    kw = dict(model="tiny", messages=ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=64, temperature=0)
    choice = client.chat.completions.create(**kw).choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and choice.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)
    _, content, calls, finish = _streamed(client.chat.completions.create(**kw, stream=True))
    assert calls == [{"name": "get_weather", "arguments": call.function.arguments}] and finish == "tool_calls"
    assert not content
    # the model was told about the tool (the template left it out): the prompt holds its definition
    usage = client.chat.completions.create(**{**kw, "tool_choice": "none", "max_tokens": 1}).usage
    assert usage.prompt_tokens < client.chat.completions.create(**{**kw, "max_tokens": 1}).usage.prompt_tokens


def test_required_tool_calls_on_a_template_without_tools(plain):
    out = _openai(plain).chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0
    )
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), PARAMS)


def test_reasoning_deltas_then_the_answer(plain):
    client = _openai(plain)
    kw = dict(
        model="tiny",
        messages=ASK,
        max_tokens=64,
        temperature=0,
        extra_body={"structured_outputs": {"regex": THOUGHT + "(Paris|Oslo)"}},
    )
    message = client.chat.completions.create(**kw).choices[0].message
    thought = message.model_extra["reasoning_content"]
    assert message.content in ("Paris", "Oslo") and len(thought.split()) == 3, message
    assert message.model_extra["reasoning"] == thought
    chunks = list(client.chat.completions.create(**kw, stream=True))
    reasoning, content, _, finish = _streamed(chunks)
    assert (reasoning, content, finish) == (thought, message.content, "stop")  # greedy: the same output
    pieces = [c.choices[0].delta.model_extra.get("reasoning_content") for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1  # the reasoning streams as it comes


def test_a_tool_call_after_the_reasoning(plain):
    out = _openai(plain).chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[SMALL],
        max_tokens=100,
        temperature=0,
        extra_body={"structured_outputs": {"regex": THOUGHT + HERMES_CALL}},
    )
    message = out.choices[0].message
    assert message.model_extra["reasoning_content"] and out.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")


def test_langchain_structured_output_and_bound_tools(plain):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """Forecast for a city."""

        city: str = Field(json_schema_extra={"enum": ["Paris", "Oslo"]})
        days: int = Field(ge=1, le=7)

    llm = ChatOpenAI(model="tiny", base_url=plain.url + "/v1", api_key="unused", temperature=0, max_tokens=64)
    for method in ("function_calling", "json_schema"):  # a named tool choice; OpenAI's response_format
        got = llm.with_structured_output(Weather, method=method).invoke("Weather in Paris?")
        assert isinstance(got, Weather) and got.city in ("Paris", "Oslo"), method

    # bind_tools sends tool_choice auto; the model writes the call in the format it was told (hermes)
    bound = ChatOpenAI(
        model="tiny",
        base_url=plain.url + "/v1",
        api_key="unused",
        temperature=0,
        max_tokens=100,
        extra_body={"structured_outputs": {"regex": HERMES_CALL}},
    ).bind_tools([SMALL])
    message = bound.invoke("Weather in Paris?")
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and call["args"]["city"] in ("Paris", "Oslo"), message
    streamed = None
    for chunk in bound.stream("Weather in Paris?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.tool_calls == [{**call, "id": streamed.tool_calls[0]["id"]}]


def test_huggingface_hub_inference_client(plain, hf_online):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=plain.url + "/v1")
    out = client.chat_completion(ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=64, temperature=0)
    call = out.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = call.function.arguments
    jsonschema.validate(arguments if isinstance(arguments, dict) else json.loads(arguments), PARAMS)
    out = client.chat_completion(
        ASK, max_tokens=64, temperature=0, extra_body={"structured_outputs": {"regex": THOUGHT + "(Paris|Oslo)"}}
    )
    assert out.choices[0].message.reasoning and out.choices[0].message.content in ("Paris", "Oslo")


def test_a_constraint_starts_after_the_reasoning_the_prompt_opened(r1):
    """R1's prompt opens <think>: the answer's schema applies after </think> (vLLM's order). Without that, the
    constrained JSON would sit inside the reasoning and the answer would have no content and no call."""
    client = _openai(r1)
    bias = {str(r1.end_think): 100}  # the model closes its reasoning at once
    schema = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}
    out = client.chat.completions.create(
        model="tiny",
        messages=ASK,
        max_tokens=32,
        temperature=0,
        logit_bias=bias,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    assert out.choices[0].finish_reason == "stop"
    named = client.chat.completions.create(
        model="tiny", messages=ASK, tools=[WEATHER], tool_choice=NAMED, max_tokens=48, temperature=0, logit_bias=bias
    )
    jsonschema.validate(json.loads(named.choices[0].message.tool_calls[0].function.arguments), PARAMS)
    assert "the deepseek_r1 family's" in r1.log()
