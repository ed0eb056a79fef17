"""LMI request validation, parameter semantics, output shapes, and the request core's checks."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from serverproc import synthetic_engine, tiny_tokenizer, wait_until

from lmi_trt.config import LmiConfig
from lmi_trt.engines.base import FinishReason
from lmi_trt.serving.core import (
    Completion,
    Delta,
    GenerateParams,
    GenerationService,
    TokenOut,
    beam_problem,
    sampling_params,
)
from lmi_trt.serving.errors import BadRequest, ModelError, ServiceUnavailable
from lmi_trt.serving.http import parse_custom_attributes, parse_json, validate
from lmi_trt.serving.protocols.lmi import LmiParameters, LmiRequest, _Shape, choose_format


def _lmi(body: dict) -> LmiRequest:
    return validate(LmiRequest, body)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"parameters": {}}, "inputs"),
        ({"inputs": 5}, "inputs"),
        ({"inputs": []}, "inputs"),
        ({"inputs": "x", "stream": "yes"}, "stream"),
        ({"inputs": "x", "parameters": []}, "parameters"),
        ({"inputs": "x", "parameters": {"temperature": -0.1}}, "parameters.temperature"),
        ({"inputs": "x", "parameters": {"temperature": float("nan")}}, "parameters.temperature"),
        ({"inputs": "x", "parameters": {"temperature": float("inf")}}, "parameters.temperature"),
        ({"inputs": "x", "parameters": {"top_p": 0}}, "parameters.top_p"),
        ({"inputs": "x", "parameters": {"top_p": 1.5}}, "parameters.top_p"),
        ({"inputs": "x", "parameters": {"top_k": -2}}, "parameters.top_k"),
        ({"inputs": "x", "parameters": {"repetition_penalty": 0}}, "parameters.repetition_penalty"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 0}}, "parameters.max_new_tokens"),
        ({"inputs": "x", "parameters": {"max_new_tokens": "30"}}, "parameters.max_new_tokens"),
        ({"inputs": "x", "parameters": {"max_new_tokens": 3.5}}, "parameters.max_new_tokens"),
        ({"inputs": "x", "parameters": {"do_sample": "true"}}, "parameters.do_sample"),
        ({"inputs": "x", "parameters": {"seed": -1}}, "parameters.seed"),
        ({"inputs": "x", "parameters": {"stop": [""]}}, "parameters.stop"),
        ({"inputs": "x", "parameters": {"stop_sequences": [1]}}, "parameters.stop_sequences[0]"),
        ({"inputs": "x", "parameters": {"details": 1}}, "parameters.details"),
    ],
)
def test_bad_requests_name_the_field(body, field):
    with pytest.raises(BadRequest) as e:
        _lmi(body)
    assert e.value.status == 400
    assert f"{field}:" in e.value.message


def test_error_message_shows_the_value():
    with pytest.raises(BadRequest, match=r"parameters\.temperature: .*greater than or equal to 0 \(got -2\)"):
        _lmi({"inputs": "x", "parameters": {"temperature": -2}})


def test_nan_in_json_reaches_validation_and_names_the_field():
    body = parse_json(b'{"inputs": "x", "parameters": {"temperature": NaN}}')
    with pytest.raises(BadRequest, match="parameters.temperature"):
        _lmi(body)


@pytest.mark.parametrize(
    "raw, msg",
    [(b"", "empty"), (b"  \n", "empty"), (b'{"inputs": ', "not valid JSON"), (b"{'a': 1}", "not valid JSON")],
)
def test_unparseable_bodies(raw, msg):
    with pytest.raises(BadRequest, match=msg):
        parse_json(raw)


def test_stop_and_stop_sequences_merge_and_details_ask_for_logprobs():
    p = _lmi(
        {
            "inputs": "x",
            "parameters": {"stop": "a", "stop_sequences": ["b", "a"], "details": True, "ignore_eos_token": True},
        }
    ).parameters
    g = p.to_generate()
    assert g.stop == ["a", "b"]
    assert g.logprobs is True
    assert g.ignore_eos is True


def test_multi_sequence_parameters_are_refused_not_ignored():
    for name, value in (("n", 2), ("best_of", 3), ("typical_p", 0.5), ("watermark", True)):
        with pytest.raises(BadRequest, match=rf"parameters\.{name}="):
            _lmi({"inputs": "x", "parameters": {name: value}}).parameters.to_generate()
    with pytest.raises(BadRequest, match=r"parameters\.num_return_sequences=2: this schema returns the best beam"):
        _lmi({"inputs": "x", "parameters": {"num_beams": 2, "num_return_sequences": 2}}).parameters.to_generate()
    # defaults that ask for nothing pass
    assert _lmi({"inputs": "x", "parameters": {"n": 1, "watermark": False}}).parameters.to_generate().stop == []


def test_num_beams_is_beam_search_with_its_length_penalty_and_early_stopping():
    params = {"num_beams": 4, "length_penalty": 0.5, "early_stopping": "never"}
    p = _lmi({"inputs": "x", "parameters": params}).parameters.to_generate()
    assert (p.beam_width, p.num_return_sequences, p.length_penalty, p.early_stopping) == (4, 1, 0.5, "never")
    sp = sampling_params(p, max_new_tokens=3, logprobs=False)
    assert (sp.beam_width, sp.length_penalty, sp.early_stopping) == (4, 0.5, "never")
    assert beam_problem(p) is None
    # without beams they would be ignored: refused instead, as vLLM refuses them
    alone = _lmi({"inputs": "x", "parameters": {"length_penalty": 0.5}}).parameters.to_generate()
    assert beam_problem(alone) == ("length_penalty", "length_penalty=0.5 applies to beam search only; ask for beams")
    sampled = _lmi({"inputs": "x", "parameters": {"num_beams": 2, "do_sample": True}}).parameters.to_generate()
    assert beam_problem(sampled)[0] == "do_sample"


@pytest.mark.parametrize(
    "given, do_sample",
    [
        ({}, False),
        ({"temperature": 1.0}, False),
        ({"temperature": 0.7}, True),
        ({"top_k": 50}, True),
        ({"top_p": 0.9}, True),
        ({"do_sample": True}, True),
        ({"do_sample": False, "temperature": 0.7}, False),
        ({"do_sample": True, "temperature": 0}, False),
    ],
)
def test_do_sample_semantics(given, do_sample):
    s = sampling_params(GenerateParams(**given), max_new_tokens=5, logprobs=False)
    assert s.do_sample is do_sample
    assert s.max_new_tokens == 5


def test_neutral_defaults():
    s = sampling_params(GenerateParams(), max_new_tokens=30, logprobs=False)
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed) == (1.0, 0, 1.0, 1.0, None)


@pytest.mark.parametrize(
    "formatter, stream, tgi, expected",
    [
        (None, False, False, "json"),
        (None, True, False, "jsonlines"),
        (None, True, True, "sse"),
        (None, False, True, "json"),
        ("sse", False, False, "sse"),
        ("jsonlines", False, False, "jsonlines"),
        ("json", True, False, "json"),
        ("json_chat", True, False, "jsonlines"),
    ],
)
def test_output_format_choice(formatter, stream, tgi, expected):
    assert choose_format(formatter, stream, tgi) == expected


def test_custom_attributes_header():
    assert parse_custom_attributes("trace=abc; x-synchronous=false;flag; k = v=w") == {
        "trace": "abc",
        "x-synchronous": "false",
        "flag": "",
        "k": "v=w",
    }


class _Ctx:
    def __init__(self, tgi: bool = False) -> None:
        self.config = LmiConfig(tgi_compat=tgi)


def _shape(params: dict, fmt="jsonlines", tgi=False) -> _Shape:
    return _Shape(_Ctx(tgi), LmiParameters(**params), "Hi", fmt)  # type: ignore[arg-type]


def test_stream_lines_and_final_record():
    shape = _shape({"details": True, "return_full_text": True})
    toks = [TokenOut(7, "a", -0.5, False), TokenOut(2, "", -0.1, True)]
    body = shape.stream_chunk(Delta("a", toks, 2, 1, FinishReason.EOS), ["a"])
    lines = [orjson.loads(x) for x in body.splitlines()]
    assert lines[0] == {"token": {"id": 7, "text": "a", "log_prob": -0.5}}
    assert lines[1]["token"] == {"id": 2, "text": "", "log_prob": -0.1, "special_token": True}
    assert lines[1]["generated_text"] == "Hia"
    assert lines[1]["details"] == {"finish_reason": "eos_token", "generated_tokens": 2, "inputs": "Hi"}


def test_mid_stream_error_record():
    shape = _shape({}, fmt="sse")
    body = shape.stream_chunk(Delta("", [], 3, 1, FinishReason.ERROR, ModelError("GPU fell off")), ["abc"])
    assert body.startswith(b"data: ") and body.endswith(b"\n\n")
    rec = orjson.loads(body[len(b"data: ") :])
    assert rec["token"]["id"] == -1 and rec["token"]["special_token"] is True
    assert rec["details"]["finish_reason"] == "error"
    assert rec["error"] == "GPU fell off" and rec["code"] == 424
    assert rec["generated_text"] == "abc"


def test_tgi_compat_token_names_and_details_on_by_default():
    shape = _shape({}, fmt="json", tgi=True)
    c = Completion("a", FinishReason.LENGTH, 1, 1, [TokenOut(7, "a", -0.5, False)])
    out = shape.json_result(c)
    assert out["details"]["tokens"] == [{"id": 7, "text": "a", "logprob": -0.5}]


# --- the request core against the synthetic engine ---
async def _service(**config) -> GenerationService:
    tok = tiny_tokenizer()
    engine = synthetic_engine(
        tok,
        max_input_len=config.pop("engine_max_input_len", 16),
        max_new_tokens=64,
        tokens_per_second=config.pop("tps", None),
    )
    await engine.start()
    return GenerationService(engine, tok, LmiConfig(**config))


async def test_prompt_over_max_input_len_names_option_and_length():
    svc = await _service()
    prompt = "Grüße aus München! " * 10
    n = len(tiny_tokenizer().encode(prompt))
    with pytest.raises(BadRequest) as e:
        await svc.start(prompt, GenerateParams())
    assert "option.max_input_len=16" in e.value.message and f"{n} tokens" in e.value.message
    assert svc.in_system == 0
    # truncate keeps the last tokens instead
    c = await svc.generate(prompt, GenerateParams(truncate=16, max_new_tokens=3))
    assert c.prompt_tokens == 16 and c.generated_tokens == 3
    await svc.engine.close()


async def test_max_new_tokens_over_limit_is_refused_not_clipped():
    svc = await _service()
    with pytest.raises(BadRequest, match=r"max_new_tokens=65 is more than option.max_output_len=64"):
        await svc.start("hi", GenerateParams(max_new_tokens=65))
    c = await svc.generate("hi", GenerateParams(max_new_tokens=64))
    assert c.generated_tokens == 64 and c.finish_reason is FinishReason.LENGTH
    await svc.engine.close()


async def test_default_max_new_tokens_is_30():
    svc = await _service()
    c = await svc.generate("hello", GenerateParams())
    assert c.generated_tokens == 30 and c.finish_reason is FinishReason.LENGTH
    await svc.engine.close()


async def test_empty_prompt_is_refused():
    svc = await _service()
    with pytest.raises(BadRequest, match="inputs is empty"):
        await svc.start("", GenerateParams())
    await svc.engine.close()


async def test_admission_limit_answers_503_with_retry_after():
    svc = await _service(job_queue_size=2, tps=20)
    a = await svc.start("one", GenerateParams(max_new_tokens=50))
    b = await svc.start("two", GenerateParams(max_new_tokens=50))
    with pytest.raises(ServiceUnavailable) as e:
        await svc.start("three", GenerateParams())
    assert e.value.status == 503 and e.value.headers["Retry-After"]
    assert "job_queue_size=2" in e.value.message and "option.job_queue_size" not in e.value.message
    await a.aclose()
    await svc.drain()
    c = await svc.start("three", GenerateParams(max_new_tokens=1))  # a slot is free again
    await c.collect()
    await b.aclose()
    await svc.drain()
    assert svc.in_system == 0
    assert svc.engine.stats().active_requests == 0
    await svc.engine.close()


async def test_stop_string_cancels_the_engine_request():
    svc = await _service(tps=200)
    c = await svc.generate("alpha beta gamma ", GenerateParams(max_new_tokens=60, stop=["gamma"]))
    assert c.text == "alpha beta " and c.finish_reason is FinishReason.STOP_SEQUENCE
    await svc.drain()
    assert svc.engine.stats().active_requests == 0
    assert svc.engine.stats().total_generated_tokens < 20  # not all 60
    await svc.engine.close()


async def test_predict_timeout_turns_a_stalled_engine_into_an_error():
    svc = await _service(predict_timeout=1, tps=0.2)  # first token after 5 s
    t0 = asyncio.get_running_loop().time()
    c = await svc.generate("hi", GenerateParams(max_new_tokens=5))
    assert c.finish_reason is FinishReason.ERROR and c.error is not None
    assert c.error.status == 424 and "option.predict_timeout=1" in c.error.message
    assert asyncio.get_running_loop().time() - t0 < 3
    await svc.engine.close()


async def test_leaving_a_stream_early_cancels_the_engine_request():
    svc = await _service(tps=50)
    stream = await svc.start("abc", GenerateParams(max_new_tokens=60))
    first = await stream.__anext__()
    assert first.tokens and svc.engine.stats().active_requests == 1
    await stream.aclose()  # the consumer is outside the engine iterator here, as when a write fails
    await svc.drain()
    assert svc.engine.stats().active_requests == 0 and svc.in_system == 0
    await svc.engine.close()


# --- the synthetic engine itself (the serving layer's test and benchmark engine) ---
async def _drain(it) -> tuple[list[int], list]:
    ids, outs = [], []
    async for out in it:
        ids += out.token_ids
        outs.append(out)
    return ids, outs


async def test_synthetic_engine_echoes_the_prompt_and_honours_stops():
    from lmi_trt.engines.base import GenerationRequest, SamplingParams

    engine = synthetic_engine(tiny_tokenizer())
    await engine.start()
    ids, outs = await _drain(engine.submit(GenerationRequest("a", [10, 11, 12], SamplingParams(max_new_tokens=7))))
    assert ids == [10, 11, 12, 10, 11, 12, 10] and outs[-1].finish_reason is FinishReason.LENGTH
    assert all(len(o.logprobs) == len(o.token_ids) for o in outs)
    ids, outs = await _drain(
        engine.submit(GenerationRequest("b", [10, 11, 12], SamplingParams(max_new_tokens=7), stop_token_ids=[[12, 10]]))
    )
    assert ids == [10, 11, 12, 10] and outs[-1].finish_reason is FinishReason.STOP_SEQUENCE
    eos = tiny_tokenizer().eos_token_id
    ids, outs = await _drain(engine.submit(GenerationRequest("c", [10, eos], SamplingParams(max_new_tokens=5))))
    assert ids == [10, eos] and outs[-1].finish_reason is FinishReason.EOS
    ids, outs = await _drain(
        engine.submit(GenerationRequest("d", [10, eos], SamplingParams(max_new_tokens=5, ignore_eos=True)))
    )
    assert len(ids) == 5 and outs[-1].finish_reason is FinishReason.LENGTH
    _, outs = await _drain(engine.submit(GenerationRequest("e", [10], SamplingParams(max_new_tokens=10**6))))
    assert outs[-1].error_code == 400 and "max_new_tokens" in outs[-1].error
    assert engine.stats().total_requests == 5 and engine.stats().active_requests == 0
    await engine.close()
    assert not engine.healthy


async def test_synthetic_engine_batches_queues_and_cancels():
    from lmi_trt.engines.base import GenerationRequest, SamplingParams

    engine = synthetic_engine(tiny_tokenizer(), max_batch_size=2, tokens_per_second=100)
    await engine.start()
    its = [engine.submit(GenerationRequest(f"r{i}", [10], SamplingParams(max_new_tokens=100))) for i in range(3)]
    firsts = [asyncio.ensure_future(it.__anext__()) for it in its[:2]]
    await asyncio.gather(*firsts)
    s = engine.stats()
    assert (s.active_requests, s.queued_requests, s.max_batch_size) == (2, 1, 2)
    await engine.cancel("r0")
    _, outs = await _drain(its[0])
    assert outs[-1].finish_reason is FinishReason.CANCELLED
    assert await wait_until(lambda: engine.stats().queued_requests == 0)  # the queued one took the freed slot
    assert engine.stats().active_requests == 2
    await its[1].aclose()  # a consumer leaving cancels too
    assert engine.stats().active_requests == 1
    await engine.close()
    _, outs = await _drain(its[2])
    assert outs[-1].finish_reason is FinishReason.CANCELLED
