"""The OpenAI adapter and chat rendering, in-process on the synthetic engine (which echoes the prompt)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer
from serverproc import SyntheticApp, post, tiny_tokenizer
from serverproc import serve_all_schemas as serve

from lmi_trt.config import LmiConfig
from lmi_trt.serving import chat
from lmi_trt.serving.protocols import DEFAULT_ADAPTERS

MULTI = "Grüße aus München! 日本語のテキスト 🚀🔥✨ "
USER = [{"role": "user", "content": "Hi there"}]


def sse_events(raw: bytes) -> list[Any]:
    events = [e for e in raw.split(b"\n\n") if e.strip()]
    assert all(e.startswith(b"data: ") for e in events), events[:3]
    assert events[-1] == b"data: [DONE]"
    return [orjson.loads(e[6:]) for e in events[:-1]]


def n_tokens(text: str) -> int:
    return len(tiny_tokenizer().encode(text))


def rendered(messages) -> str:
    return tiny_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


# --- chat rendering ---
def test_render_uses_the_tokenizer_template_and_flattens_text_parts():
    msgs = chat.normalize_messages(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]
    )
    out = chat.render(tiny_tokenizer(), msgs)
    assert out == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"


def test_option_chat_template_overrides_text_or_file(tmp_path):
    tpl = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}[bot]{% endif %}"
    )
    assert chat.render(tiny_tokenizer(), USER, template_option=tpl) == "[user]Hi there[bot]"
    f = tmp_path / "t.jinja"
    f.write_text(tpl)
    assert chat.render(tiny_tokenizer(), USER, template_option=str(f)) == "[user]Hi there[bot]"
    with pytest.raises(chat.ChatError, match="neither a Jinja template nor a readable file"):
        chat.render(tiny_tokenizer(), USER, template_option=str(tmp_path / "missing.jinja"))


def test_no_template_is_a_clear_400():
    class NoTemplate:
        chat_template = None

    with pytest.raises(chat.ChatError) as e:
        chat.render(NoTemplate(), USER)
    assert e.value.status == 400 and "option.chat_template" in e.value.message


@pytest.mark.parametrize(
    "messages, where",
    [
        ([], "messages"),
        ("hi", "messages"),
        ([{"content": "x"}], "messages[0].role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0].type",
        ),
        ([{"role": "user", "content": 5}], "messages[0].content"),
    ],
)
def test_bad_messages_name_the_place(messages, where):
    with pytest.raises(chat.ChatError) as e:
        chat.normalize_messages(messages)
    assert e.value.param == where


def test_template_errors_are_400():
    tpl = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(chat.ChatError, match="roles must alternate"):
        chat.render(tiny_tokenizer(), USER, template_option=tpl)


# --- /v1/chat/completions ---
async def test_chat_json_is_the_echoed_template_with_usage():
    async with serve() as (s, _):
        prompt = rendered(USER)
        n = len(tiny_tokenizer().encode(prompt, add_special_tokens=False))
        status, ctype, raw = await post(s, "/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": n})
        out = orjson.loads(raw)
        assert (status, ctype) == (200, "application/json")
        assert out["object"] == "chat.completion" and out["model"] == "tiny" and out["id"].startswith("chatcmpl-")
        choice = out["choices"][0]
        assert choice["message"] == {
            "role": "assistant",
            "content": prompt.replace("<|im_start|>", "").replace("<|im_end|>", ""),
        }
        assert choice["finish_reason"] == "length" and choice["logprobs"] is None
        assert out["usage"] == {"prompt_tokens": n, "completion_tokens": n, "total_tokens": 2 * n}


async def test_chat_stream_sse_usage_and_logprobs():
    async with serve() as (s, _):
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": MULTI}],
            "max_completion_tokens": 40,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
        }
        status, ctype, raw = await post(s, "/v1/chat/completions", body)
        assert (status, ctype) == (200, "text/event-stream")
        events = sse_events(raw)
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(e["object"] == "chat.completion.chunk" for e in events)
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 40
        assert all(e["usage"] is None for e in events[:-1])
        finish = events[-2]["choices"][0]
        assert finish["finish_reason"] == "length" and finish["delta"] == {}
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        non_stream = orjson.loads(
            (await post(s, "/v1/chat/completions", {**body, "stream": False, "stream_options": None}))[2]
        )
        assert text == non_stream["choices"][0]["message"]["content"]
        lps = [lp for e in events[:-2] if e["choices"][0]["logprobs"] for lp in e["choices"][0]["logprobs"]["content"]]
        assert len(lps) == 40 and all(isinstance(lp["logprob"], float) for lp in lps)
        assert len(non_stream["choices"][0]["logprobs"]["content"]) == 40


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs", "top_logprobs=3"),
        ({"logit_bias": {"5": 1.0}}, "logit_bias", "logit_bias"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice", "option.enable_auto_tool_choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            "tool_choice",
            "not among tools",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "two words"}}], "tool_choice": "required"},
            "tools",
            "function.name",
        ),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"functions": [{"name": "f"}]}, "functions", "deprecated"),
        ({"response_format": {"type": "json_object"}}, "response_format", "json_object"),
        # vLLM's constraints, named by the field they came in (the synthetic engine has no model to constrain)
        ({"structured_outputs": {"regex": "yes|no"}}, "structured_outputs.regex", "synthetic engine"),
        ({"guided_choice": ["yes", "no"]}, "guided_choice", "synthetic engine"),
        ({"guided_json": {"type": "object"}}, "guided_json", "synthetic engine"),
        ({"structured_outputs": {"json_object": True}}, "structured_outputs.json_object", "synthetic engine"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice", "exclude each other"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not served here"),
        ({"guided_choice": []}, "guided_choice", "non-empty list"),
        (
            {"response_format": {"type": "json_object"}, "guided_regex": "a"},
            "guided_regex",
            "cannot be combined with response_format",
        ),
        ({"temperature": 2.5}, "temperature", "temperature"),
        ({"presence_penalty": -3}, "presence_penalty", "presence_penalty"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream=true"),
        ({"stop": [""]}, "stop", "non-empty"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0].type",
            "only text",
        ),
    ],
)
async def test_chat_refusals_in_openai_shape(body, param, words):
    async with serve() as (s, _):
        status, _, raw = await post(s, "/v1/chat/completions", {"model": "tiny", "messages": USER, **body})
        err = orjson.loads(raw)["error"]
        assert status == 400, raw
        assert err["param"] == param and words in err["message"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400


async def test_tools_with_a_template_that_leaves_them_out_render_without_them_for_tool_choice_none():
    """(The other choices describe them to the model: tests/unit/test_tool_calls.py.)"""
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    async with serve(LmiConfig(chat_template=plain)) as (s, _):
        body = {"model": "tiny", "messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}
        status, _, raw = await post(s, "/v1/chat/completions", {**body, "tool_choice": "none", "max_tokens": 4})
        assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"].startswith("Hi"), raw


async def test_chat_without_a_template_is_400_and_option_chat_template_fixes_it():
    async with serve() as (s, sa):
        sa.tokenizer.chat_template, saved = None, sa.tokenizer.chat_template
        try:
            status, _, raw = await post(s, "/v1/chat/completions", {"model": "tiny", "messages": USER})
            assert status == 400 and "option.chat_template" in orjson.loads(raw)["error"]["message"]
        finally:
            sa.tokenizer.chat_template = saved
    tpl = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    async with serve(LmiConfig(chat_template=tpl)) as (s, _):
        status, _, raw = await post(
            s, "/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": n_tokens("Hi there")}
        )
        assert status == 200 and orjson.loads(raw)["choices"][0]["message"]["content"] == "Hi there"


async def test_chat_stop_and_bad_json():
    async with serve() as (s, _):
        status, _, raw = await post(
            s,
            "/v1/chat/completions",
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": "one two three"}],
                "stop": "three",
                "max_tokens": 50,
            },
        )
        out = orjson.loads(raw)
        assert out["choices"][0]["finish_reason"] == "stop"
        assert out["choices"][0]["message"]["content"] == "user\none two "
        async with s.post("/v1/chat/completions", data=b"{nope", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and "not valid JSON" in (await r.json())["error"]["message"]


# --- /v1/completions ---
async def test_completions_take_vllms_constraints_by_their_field():
    async with serve() as (s, _):
        for body, param in (
            ({"guided_regex": "a|b"}, "guided_regex"),
            ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "structured_outputs.grammar"),
        ):
            status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": "Hi", **body})
            err = orjson.loads(raw)["error"]
            assert status == 400 and err["param"] == param and "synthetic engine" in err["message"], raw


async def test_completions_json_stream_echo_and_logprobs():
    async with serve() as (s, _):
        n = n_tokens(MULTI)
        body = {"model": "tiny", "prompt": MULTI, "max_tokens": 2 * n}
        status, _, raw = await post(s, "/v1/completions", body)
        out = orjson.loads(raw)
        assert status == 200 and out["object"] == "text_completion"
        assert out["choices"][0]["text"] == MULTI * 2 and out["choices"][0]["finish_reason"] == "length"
        assert out["usage"] == {"prompt_tokens": n, "completion_tokens": 2 * n, "total_tokens": 3 * n}
        status, _, raw = await post(
            s, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
        )
        events = sse_events(raw)
        assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == MULTI * 2
        assert not any("\ufffd" in e["choices"][0]["text"] for e in events if e["choices"])
        assert events[-1]["usage"]["completion_tokens"] == 2 * n
        status, _, raw = await post(s, "/v1/completions", {**body, "logprobs": 0, "max_tokens": 3})
        choice = orjson.loads(raw)["choices"][0]
        assert len(choice["logprobs"]["token_logprobs"]) == 3 and choice["logprobs"]["text_offset"][0] == 0
        # echo with logprobs means the prompt's log-probs too (OpenAI), which this engine does not compute
        status, _, raw = await post(s, "/v1/completions", {**body, "echo": True, "logprobs": 0, "max_tokens": 3})
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "echo", raw
        status, _, raw = await post(s, "/v1/completions", {**body, "echo": True, "max_tokens": 3})
        assert status == 200 and orjson.loads(raw)["choices"][0]["text"].startswith(MULTI)


async def test_completions_token_ids_and_batch():
    async with serve() as (s, _):
        ids = tiny_tokenizer().encode("ab cd", add_special_tokens=False)
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": ids, "max_tokens": len(ids)})
        assert status == 200 and orjson.loads(raw)["choices"][0]["text"] == "ab cd"
        status, _, raw = await post(
            s, "/v1/completions", {"model": "tiny", "prompt": ["x y", "日本"], "max_tokens": 2 * n_tokens("日本")}
        )
        out = orjson.loads(raw)
        assert [c["index"] for c in out["choices"]] == [0, 1] and out["choices"][1]["text"] == "日本日本"
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": ["a", "b"], "stream": True})
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "prompt"
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": "x", "logprobs": 2})
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "logprobs"
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": [[1.5]]})
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "prompt"


async def test_limits_in_openai_shape_and_models_route():
    async with serve(LmiConfig(max_input_len=16, max_output_len=32)) as (s, _):
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": "word " * 40})
        err = orjson.loads(raw)["error"]
        assert status == 400 and "option.max_input_len=16" in err["message"] and "prompt has" in err["message"]
        status, _, raw = await post(s, "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 33})
        assert status == 400 and "option.max_output_len=32" in orjson.loads(raw)["error"]["message"]
        async with s.get("/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "tiny"
        async with s.get("/v1/models/tiny") as r:
            assert r.status == 200
        async with s.get("/v1/models/other") as r:
            assert r.status == 404 and (await r.json())["error"]["param"] == "model"
        # A model that is not a string is a 400 naming the field (the fuzzer's {"model": []} was a 500).
        for path, extra in [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": USER})]:
            status, _, raw = await post(s, path, {"model": [], **extra})
            assert status == 400 and orjson.loads(raw)["error"]["param"] == "model", raw


async def test_503_while_loading():
    sa = SyntheticApp(LmiConfig(), adapters=DEFAULT_ADAPTERS, gate_open=False)
    async with TestServer(sa.app) as server, aiohttp.ClientSession(str(server.make_url(""))) as s:
        status, _, raw = await post(s, "/v1/chat/completions", {"model": "tiny", "messages": USER})
        assert status == 503 and orjson.loads(raw)["error"]["type"] == "service_unavailable_error"
        sa.gate.set()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_n_streamed_chunks_name_their_choice_and_reassemble_to_the_plain_answer(path):
    """n > 1 streamed (refused before): every chunk names its choice's index, each choice ends once with its
    finish_reason, one usage record for the request after all of them, one [DONE]; each choice's text is the
    non-streamed answer's choice of the same index."""
    chat = path.endswith("chat/completions")
    prompt = {"messages": [{"role": "user", "content": MULTI}]} if chat else {"prompt": MULTI}
    body = {
        "model": "tiny",
        **prompt,
        "max_tokens": 12,
        "n": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with serve() as (s, _):
        status, ctype, raw = await post(s, path, body)
        assert (status, ctype) == (200, "text/event-stream"), raw
        assert raw.count(b"data: [DONE]") == 1
        events = sse_events(raw)
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 36
        texts, finishes = {0: "", 1: "", 2: ""}, {0: [], 1: [], 2: []}
        for event in events[:-1]:
            (choice,) = event["choices"]
            texts[choice["index"]] += choice["delta"].get("content", "") if chat else choice["text"]
            if choice["finish_reason"]:
                finishes[choice["index"]].append(choice["finish_reason"])
        assert finishes == {0: ["length"], 1: ["length"], 2: ["length"]}
        plain = orjson.loads((await post(s, path, {**body, "stream": False, "stream_options": None}))[2])
        assert texts == {c["index"]: c["message"]["content"] if chat else c["text"] for c in plain["choices"]}
        assert plain["usage"] == events[-1]["usage"]


def test_best_n_ranks_by_log_prob_per_token():
    from lmi_trt.engines.base import FinishReason
    from lmi_trt.serving.core import Completion, TokenOut
    from lmi_trt.serving.protocols.openai import best_n

    def seq(name: str, lps: list[float]) -> Completion:
        return Completion(name, FinishReason.LENGTH, len(lps), 3, [TokenOut(1, "x", lp, False) for lp in lps])

    # by log-prob per token: b (-0.5) beats c (-0.75) though its sum (-2.0) is lower; a (-1.0) is last
    a, b, c = seq("a", [-1.0, -1.0]), seq("b", [-0.5, -0.5, -0.5, -0.5]), seq("c", [-0.75, -0.75])
    assert [x.text for x in best_n([a, b, c], 2)] == ["b", "c"]
    assert [x.text for x in best_n([a, b, c], 1)] == ["b"]


async def test_completions_best_of_returns_n_and_counts_every_sequence():
    async with serve() as (s, _):
        body = {"model": "tiny", "prompt": MULTI, "max_tokens": 6, "n": 2, "best_of": 4, "seed": 7, "temperature": 0.9}
        status, _, raw = await post(s, "/v1/completions", body)
        out = orjson.loads(raw)
        assert status == 200 and [c["index"] for c in out["choices"]] == [0, 1], raw
        assert out["usage"]["completion_tokens"] == 4 * 6  # the two left out were generated too
        assert all(c["logprobs"] is None for c in out["choices"])  # ranked by log-probs, not asked for
        for bad, words in [
            ({"best_of": 1, "n": 2}, "at least n=2"),
            ({"best_of": 2, "stream": True}, "cannot be streamed"),
        ]:
            status, _, raw = await post(s, "/v1/completions", {**body, **bad})
            err = orjson.loads(raw)["error"]
            assert status == 400 and err["param"] == "best_of" and words in err["message"], raw
        status, _, raw = await post(s, "/v1/chat/completions", {"model": "tiny", "messages": USER, "best_of": 2})
        assert status == 400 and orjson.loads(raw)["error"]["param"] == "best_of"


# --- chat at /invocations (DJL) ---
async def test_messages_at_invocations_json_and_jsonlines():
    async with serve() as (s, _):
        status, ctype, raw = await post(s, "/invocations", {"messages": USER, "max_tokens": 4})
        assert (status, ctype) == (200, "application/json") and orjson.loads(raw)["object"] == "chat.completion"
        status, ctype, raw = await post(s, "/invocations", {"messages": USER, "max_tokens": 4, "stream": True})
        lines = [orjson.loads(x) for x in raw.splitlines() if x.strip()]
        assert ctype == "application/jsonlines" and all(x["object"] == "chat.completion.chunk" for x in lines)
        assert lines[-1]["choices"][0]["finish_reason"] == "length"
        # errors at /invocations keep the LMI shape
        status, _, raw = await post(s, "/invocations", {"messages": USER, "temperature": 3})
        assert status == 400 and orjson.loads(raw)["code"] == 400 and "temperature" in orjson.loads(raw)["error"]


async def test_messages_at_invocations_with_sse_formatter():
    async with serve(LmiConfig(output_formatter="sse")) as (s, _):
        status, ctype, raw = await post(s, "/invocations", {"messages": USER, "max_tokens": 4, "stream": True})
        assert ctype == "text/event-stream" and sse_events(raw)[0]["object"] == "chat.completion.chunk"
