"""Reasoning parsers: each family's output as its chat template leaves the prompt (opened, closed, or left to the
model), read whole and in any split; recognised from the template; and the whole path in-process on the
synthetic engine, which echoes its prompt, so what the chat says the model thought comes back as its output:
``reasoning_content`` in answers and streamed deltas, a tool call after the thinking, the template keyword
arguments that reach the template (and those a template does not read, refused)."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from serverproc import post
from serverproc import serve_all_schemas as serve

from lmi_trt import reasoning_parsers
from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import GuidedDecoding
from lmi_trt.serving.protocols.openai import _for_parsers

R1, QWEN3, V3 = (reasoning_parsers.REGISTRY[n] for n in ("deepseek_r1", "qwen3", "deepseek_v3"))

# (parser, the rendered prompt's end, the output) → (reasoning, content)
CASES = [
    # DeepSeek-R1's template opens <think> in the prompt: only the closing tag is generated
    (R1, "<｜User｜>Hi<｜Assistant｜><think>\n", "Let me see.\n</think>\n\nHello!", ("Let me see.\n", "\n\nHello!")),
    # its older template did not: the model opens it, or leaves the opening out
    (R1, "<｜User｜>Hi<｜Assistant｜>", "<think>\nhm\n</think>Hello!", ("\nhm\n", "Hello!")),
    (R1, "<｜User｜>Hi<｜Assistant｜>", "hm</think>Hello!", ("hm", "Hello!")),
    (R1, "<｜User｜>Hi<｜Assistant｜><think>\n", "cut short by max_tokens", ("cut short by max_tokens", "")),
    # Qwen3's first template: the model opens <think> itself
    (QWEN3, "<|im_start|>assistant\n", "<think>\nPlan.\n</think>\n\nDone.", ("\nPlan.\n", "\n\nDone.")),
    (QWEN3, "<|im_start|>assistant\n", "Done, no thinking.", ("", "Done, no thinking.")),
    # ... with enable_thinking false it closes an empty one in the prompt
    (QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Done.</think>", ("", "Done.</think>")),
    # Qwen3.5 opens it in the prompt
    (QWEN3, "<|im_start|>assistant\n<think>\n", "Plan.</think>Done.", ("Plan.", "Done.")),
    # DeepSeek-V3.1: thinking true opens it, false closes it
    (V3, "<｜User｜>Hi<｜Assistant｜><think>", "Plan.</think>Done.", ("Plan.", "Done.")),
    (V3, "<｜User｜>Hi<｜Assistant｜></think>", "Done.", ("", "Done.")),
]


def split(parser, prompt: str, text: str, cuts: list[int] = ()) -> tuple[str, str]:
    reader = parser.reader(prompt)
    reasoning = content = ""
    for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
        r, c = reader.feed(text[start:end])
        reasoning, content = reasoning + r, content + c
    r, c = reader.finish()
    return reasoning + r, content + c


@pytest.mark.parametrize(("parser", "prompt", "text", "want"), CASES)
def test_each_family_splits_its_output_as_its_template_left_the_prompt(parser, prompt, text, want):
    assert split(parser, prompt, text) == want
    rng = random.Random(text)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        assert split(parser, prompt, text, cuts) == want, cuts


def test_a_marker_is_held_only_while_it_may_be_one():
    reader = QWEN3.reader("<|im_start|>assistant\n<think>\n")
    assert reader.feed("a </th") == ("a ", "")
    assert reader.feed("ought") == ("</thought", "")
    assert reader.feed("</think>b") == ("", "b")


@pytest.mark.parametrize(
    ("template", "name"),
    [
        # DeepSeek-R1's tokenizer_config chat template: content split at </think>, the generation prompt opens it
        (
            "{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
            "{{'<｜Assistant｜><think>\\n'}}",
            "deepseek_r1",
        ),
        # Qwen3's: reasoning_content between <think> tags, enable_thinking closes an empty one
        (
            "{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
            "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}",
            "qwen3",
        ),
        # DeepSeek-V3.1's: the thinking switch
        (
            "{% if not thinking is defined %}{% set thinking = false %}{% endif %}{{'<｜Assistant｜>'}}"
            "{%- if not thinking %}{{'</think>'}}{%- else %}{{'<think>'}}{%- endif %}",
            "deepseek_v3",
        ),
        ("{{ messages }}", None),
    ],
)
def test_the_family_is_recognised_from_the_chat_template(template, name):
    found = reasoning_parsers.recognise(template)
    assert (found.name if found else None) == name


def test_option_and_enable_reasoning_choose_the_parser():
    qwen = "<think></think> {{ enable_thinking }}"
    assert reasoning_parsers.chosen(None, None, qwen) is QWEN3
    assert reasoning_parsers.chosen("deepseek-r1", None, qwen) is R1  # trtllm-serve's spelling
    assert reasoning_parsers.chosen(None, False, qwen) is None
    assert reasoning_parsers.chosen(None, None, "{{ messages }}") is None


def test_a_constraint_starts_after_the_reasoning_where_the_prompt_left_it_open():
    class Service:
        special_text = None

    from lmi_trt.serving.core import GenerateParams

    params = GenerateParams(guided=GuidedDecoding("regex", "yes|no"))
    opened = _for_parsers(Service(), params, "<|im_start|>assistant\n<think>\n", QWEN3, None)
    assert opened.guided == GuidedDecoding("regex", "yes|no", after="</think>")
    for prompt, parser in (("<|im_start|>assistant\n", QWEN3), ("x<think>\n", None)):
        assert _for_parsers(Service(), params, prompt, parser, None).guided == params.guided


# --- in-process, on the synthetic engine: it echoes the rendered prompt up to its </s> ---
# The prompt ends after the </s>, so its end (what the template left open) is not echoed.
OPENED = "{% for m in messages %}{{ m.content }}{% endfor %}</s><think>\n"
LEFT = "{% for m in messages %}{{ m.content }}{% endfor %}</s>"
CLOSED = "{% for m in messages %}{{ m.content }}{% endfor %}</s>{% if not enable_thinking %}<think></think>{% endif %}"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def _config(template: str, parser: str = "qwen3", **kw: Any) -> LmiConfig:
    return LmiConfig(max_input_len=256, max_output_len=256, chat_template=template, reasoning_parser=parser, **kw)


def _chat(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 200, **kw}


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.strip() and e != b"data: [DONE]"]


async def test_reasoning_content_in_the_answer_and_in_streamed_deltas():
    async with serve(_config(OPENED, "deepseek_r1")) as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", _chat("First, think.</think>Paris."))
        message = orjson.loads(raw)["choices"][0]["message"]
        assert status == 200 and message["content"] == "Paris.", raw
        assert message["reasoning_content"] == message["reasoning"] == "First, think."

        status, _, raw = await post(s, "/v1/chat/completions", _chat("First, think.</think>Paris.", stream=True))
        deltas = [e["choices"][0]["delta"] for e in _events(raw)]
        thought = [d["reasoning_content"] for d in deltas if "reasoning_content" in d]
        assert len(thought) > 1 and "".join(thought) == "First, think."  # token by token
        assert all(d.get("reasoning") == d["reasoning_content"] for d in deltas if "reasoning_content" in d)
        assert "".join(d.get("content") or "" for d in deltas) == "Paris."
        first_content = next(i for i, d in enumerate(deltas) if d.get("content"))
        assert all("reasoning_content" not in d for d in deltas[first_content:])

        # vLLM's include_reasoning: false leaves it out
        status, _, raw = await post(s, "/v1/chat/completions", _chat("x</think>y", include_reasoning=False))
        message = orjson.loads(raw)["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "y"}


async def test_a_tool_call_after_the_thinking_is_read_from_what_follows_it():
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    config = _config(LEFT, enable_auto_tool_choice=True)
    async with serve(config) as (s, _):
        body = _chat(f"<think>The user wants weather. <tool_call> is how.</think>{call}", tools=[WEATHER])
        for stream in (False, True):
            status, _, raw = await post(s, "/v1/chat/completions", {**body, "stream": stream})
            assert status == 200, raw
            if stream:
                deltas = [e["choices"][0] for e in _events(raw)]
                reasoning = "".join(d["delta"].get("reasoning_content") or "" for d in deltas)
                calls = [c for d in deltas for c in d["delta"].get("tool_calls") or []]
                name, args = calls[0]["function"]["name"], "".join(c["function"]["arguments"] for c in calls)
                finish = deltas[-1]["finish_reason"]
            else:
                choice = orjson.loads(raw)["choices"][0]
                reasoning, (called,) = choice["message"]["reasoning_content"], choice["message"]["tool_calls"]
                name, args, finish = (
                    called["function"]["name"],
                    called["function"]["arguments"],
                    choice["finish_reason"],
                )
            assert reasoning == "The user wants weather. <tool_call> is how."
            assert (name, json.loads(args), finish) == ("get_weather", {"city": "Oslo"}, "tool_calls")


async def test_a_prompt_that_closed_the_reasoning_makes_all_of_it_content():
    async with serve(_config(CLOSED)) as (s, _):
        body = _chat("<think>not reasoning</think>", chat_template_kwargs={"enable_thinking": False})
        status, _, raw = await post(s, "/v1/chat/completions", body)
        message = orjson.loads(raw)["choices"][0]["message"]
        assert status == 200 and message == {"role": "assistant", "content": "<think>not reasoning</think>"}, raw
        # thinking on: the template leaves it to the model, which opened it
        status, _, raw = await post(
            s, "/v1/chat/completions", {**body, "chat_template_kwargs": {"enable_thinking": True}}
        )
        assert orjson.loads(raw)["choices"][0]["message"]["reasoning_content"] == "not reasoning"


async def test_template_keyword_arguments_reach_a_template_that_reads_them_and_are_refused_elsewhere():
    effort = "{{ reasoning_effort }}:{% for m in messages %}{{ m.content }}{% endfor %}</s>"
    async with serve(_config(effort)) as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", _chat("Hi", reasoning_effort="high"))
        assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"] == "high:Hi", raw
        body = _chat("Hi", reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
        status, _, raw = await post(s, "/v1/chat/completions", body)
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "reasoning_effort", raw
        status, _, raw = await post(s, "/v1/chat/completions", _chat("Hi", chat_template_kwargs={"thinking": True}))
        err = orjson.loads(raw)["error"]
        assert status == 400 and err["param"] == "chat_template_kwargs.thinking" and "does not read" in err["message"]
    async with serve(_config(LEFT)) as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", _chat("Hi", reasoning_effort="low"))
        err = orjson.loads(raw)["error"]
        assert status == 400 and err["param"] == "reasoning_effort" and "does not read" in err["message"], raw


def test_the_constraint_after_the_reasoning_is_one_grammar_every_engine_takes():
    """The grammar TensorRT-LLM's xgrammar gets (``backend_guide``) and the torch engine compiles: any text up to
    the first ``</think>``, then the constraint; the text may hold everything but the closing tag."""
    import re

    import xgrammar as xgr
    from serverproc import tiny_tokenizer

    from lmi_trt.engines.guided import _compile, backend_guide, free_text_until

    pattern = re.compile(free_text_until("</think>"))
    for thought in ("", "plain", "a < b </ c </th <</think", "<think>again"):
        assert pattern.fullmatch(thought + "</think>"), thought
    for bad in ("no end", "x</think>y</think>", "</think></think>"):
        assert not pattern.fullmatch(bad), bad
    kind, grammar = backend_guide(GuidedDecoding("regex", "(yes|no)", after="</think>"))
    tokenizer = tiny_tokenizer()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    for compiled in (compiler.compile_grammar(grammar), _compile(compiler, "regex", "(yes|no)", "</think>")):
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in tokenizer.encode("hm <x</think>no", add_special_tokens=False))
        assert matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()
        matcher = xgr.GrammarMatcher(compiled)
        assert not all(matcher.accept_token(t) for t in tokenizer.encode("</think>maybe", add_special_tokens=False))
    assert kind == "grammar"


def test_enable_reasoning_true_needs_a_parser_and_false_excludes_one():
    from serverproc import tiny_tokenizer

    from lmi_trt.config import ConfigError, StartupError, load_config
    from lmi_trt.loader import check_reasoning

    with pytest.raises(StartupError) as err:  # the tiny model's ChatML template is no reasoning family's
        check_reasoning(LmiConfig(enable_reasoning=True), tiny_tokenizer())
    assert err.value.key == "option.enable_reasoning" and "option.reasoning_parser" in str(err.value)
    check_reasoning(LmiConfig(enable_reasoning=True, reasoning_parser="qwen3"), tiny_tokenizer())
    with pytest.raises(ConfigError, match="option.enable_reasoning=false"):
        load_config(
            overrides={
                "option.model_id": "m",
                "option.enable_reasoning": "false",
                "option.reasoning_parser": "deepseek_r1",
            },
            env={},
        )
