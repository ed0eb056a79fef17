"""Lookahead decoding on the Executor over TensorRT engines (issue 29), through the fake TensorRT-LLM per release: the
compile stage builds the engine for it, the Executor gets its (W, N, G), greedy outputs equal decoding without it
(the fake verifies drafts against its tiny model), and what a release would ignore or fail on is refused."""

from __future__ import annotations

import json

import pytest
from tinymodels import tiny_model
from trtllm_spec_testing import (
    compiled,
    generate,
    greedy_reference,
    greedy_text_tokens,
    jit_config,
    jit_server,
    spec_engine,
    started,
    tokens_of,
)
from trtllm_testing import fake_tensorrt_llm, make_engine_dir

from lmi_trt.engines.trtllm import TrtllmConfigError, TrtllmEngine, TrtllmSettings
from lmi_trt.engines.trtllm_speculation import Lookahead

RELEASES = ("1.1.0", "1.2.1")  # 1.0.0: test_a_release_whose_result_lacks_decoding_iter...
LOOKAHEAD = Lookahead(2, 3, 2, "option.speculative_config.decoding_type")  # 7 draft tokens a step
BUILD = dict(max_batch_size=4, max_input_len=64, max_seq_len=160)
# A prompt that repeats itself (drafts from its own n-grams get accepted) and two ordinary ones.
PROMPTS = [[1, 45, 67, 89, 100, 45, 67, 89, 100, 45, 67], [1, 300, 22, 7], [1, 5, 6, 7, 5, 8, 9, 5]]


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


def lookahead_engine(trt, out, **build):
    return spec_engine(out, "LOOKAHEAD_DECODING", **{**BUILD, "max_draft_len": LOOKAHEAD.draft_len, **build})


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()


@pytest.mark.parametrize("release", RELEASES)
async def test_greedy_outputs_equal_decoding_without_lookahead(trt, tmp_path, reference, release, caplog):
    trt.__version__ = release
    engine_dir = lookahead_engine(trt, tmp_path / "engine")
    built = json.loads((engine_dir / "config.json").read_text())["build_config"]
    # builder.py: the mode's integer (LOOKAHEAD_DECODING = 8) and max_seq_len raised by max_draft_len
    assert (built["speculative_decoding_mode"], built["max_draft_len"], built["max_seq_len"]) == (8, 7, 167)
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(engine_dir, TrtllmSettings(lookahead=LOOKAHEAD))
    try:
        assert "speculative decoding: lookahead decoding (max_window_size=2, max_ngram_size=3" in caplog.text
        assert engine.limits.max_seq_len == 160  # the draft slack is not the user's
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(await generate(engine, f"g{i}", prompt)) == reference(prompt, 24), prompt
        accepted = engine.stats().extra["spec_decode_num_accepted_tokens"]
        assert accepted > 0  # more than one token a step somewhere: the drafts were used
    finally:
        await engine.close()


async def test_a_release_whose_result_lacks_decoding_iter_serves_without_the_accepted_draft_metric(
    trt, tmp_path, reference, caplog
):
    """1.0 is not shown to bind Result.decoding_iter (the fake's _Result10): requests still finish with the greedy
    output, and the accepted-draft count is left out, said once at start-up."""
    trt.__version__ = "1.0.0"
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(lookahead_engine(trt, tmp_path / "engine"), TrtllmSettings(lookahead=LOOKAHEAD))
    try:
        assert "spec_decode_num_accepted_tokens is not reported: TensorRT-LLM 1.0.0's Result has no" in caplog.text
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(await generate(engine, f"o{i}", prompt)) == reference(prompt, 24), prompt
        assert "spec_decode_num_accepted_tokens" not in engine.stats().extra
    finally:
        await engine.close()


async def test_an_engine_built_with_more_draft_tokens_serves_a_smaller_lookahead(trt, tmp_path, reference):
    """trtGptModelInflightBatching.cpp: maxDraftTokens <= the engine's, then the decoder is resized to (W, N, G)."""
    trt.__version__ = "1.2.1"
    engine_dir = lookahead_engine(trt, tmp_path / "engine", max_draft_len=15)
    engine = await started(engine_dir, TrtllmSettings(lookahead=LOOKAHEAD))
    try:
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(await generate(engine, f"m{i}", prompt)) == reference(prompt, 24), prompt
    finally:
        await engine.close()


async def test_a_verifier_that_accepts_every_draft_changes_the_output(trt, tmp_path, reference, monkeypatch):
    """The equality above can fail: with the fake's verification patched to keep every draft token, the output
    is no longer the greedy one."""
    import tensorrt_llm._runtime as runtime

    trt.__version__ = "1.2.1"
    engine = await started(lookahead_engine(trt, tmp_path / "engine"), TrtllmSettings(lookahead=LOOKAHEAD))
    try:
        monkeypatch.setattr(runtime, "accepts", lambda target, draft: True)
        outputs = [tokens_of(await generate(engine, f"a{i}", p)) for i, p in enumerate(PROMPTS)]
        assert outputs != [reference(p, 24) for p in PROMPTS]
    finally:
        await engine.close()


async def test_what_the_executor_does_not_do_beside_lookahead_is_refused(trt, tmp_path):
    trt.__version__ = "1.1.0"
    engine = await started(lookahead_engine(trt, tmp_path / "engine"), TrtllmSettings(lookahead=LOOKAHEAD))
    try:
        sampled = await generate(engine, "s", PROMPTS[1], do_sample=True, temperature=0.8)
        assert sampled[-1].error_code == 400 and sampled[-1].error_field == "temperature"
        assert "greedily" in sampled[-1].error
        caps = engine.capabilities
        assert not caps.logprobs.honoured and "outputLogProbs are not supported" in caps.logprobs.reason
        assert not caps.beam_search.honoured and not caps.guided.honoured and not caps.repetition_penalty.honoured
        assert "lookahead" in caps.guided.reason
        stopped = await generate(engine, "t", PROMPTS[1], stop_token_ids=[[5]])
        assert stopped[-1].error_code == 400 and stopped[-1].error_field == "stop_token_ids"
    finally:
        await engine.close()


def test_an_engine_built_otherwise_is_a_start_up_error_naming_the_key(trt, tmp_path):
    trt.__version__ = "1.2.1"
    plain = make_engine_dir(tiny_model("llama"), tmp_path / "plain", **BUILD)
    with pytest.raises(TrtllmConfigError, match=r"option.speculative_config.decoding_type=lookahead needs an engine "):
        TrtllmEngine(plain, TrtllmSettings(lookahead=LOOKAHEAD), eos_token_ids=[2])
    built = lookahead_engine(trt, tmp_path / "la")
    other = Lookahead(4, 3, 4, "option.speculative_decoding_mode")  # 15 draft tokens
    with pytest.raises(TrtllmConfigError, match=r"built with max_draft_len=7 .* needs at least 15"):
        TrtllmEngine(built, TrtllmSettings(lookahead=other), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match="built with --speculative_decoding_mode lookahead_decoding and no"):
        TrtllmEngine(built, TrtllmSettings(), eos_token_ids=[2])
    # a model's further EOS ids go to the Executor as stop words, not pinned beside lookahead
    with pytest.raises(TrtllmConfigError, match=r"also ends on \[7\].*stop words"):
        TrtllmEngine(built, TrtllmSettings(lookahead=LOOKAHEAD), eos_token_ids=[2, 7])


async def test_012_predates_lookahead_on_the_executor(trt, tmp_path):
    trt.__version__ = "0.12.0"
    engine = TrtllmEngine(
        lookahead_engine(trt, tmp_path / "engine"),
        TrtllmSettings(lookahead=LOOKAHEAD),
        eos_token_ids=[2],
        gpu_available=lambda: True,
    )
    with pytest.raises(TrtllmConfigError, match=r"TensorRT-LLM 0.12.0 predates lookahead .*PR 2269"):
        await engine.start()


def test_the_fake_executor_checks_what_the_lookahead_layer_checks(trt, tmp_path):
    """lookaheadDecodingLayer.cpp: one beam; trtGptModelInflightBatching.cpp: (W, N, G)'s draft tokens within the
    engine's."""
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = "1.2.1"
    engine_dir = lookahead_engine(trt, tmp_path / "engine", max_beam_width=2)

    def config(w, n, g, beams=1):
        la = tle.LookaheadDecodingConfig(w, n, g)
        decoding = tle.DecodingConfig(decoding_mode=tle.DecodingMode.Lookahead(), lookahead_decoding_config=la)
        return tle.ExecutorConfig(max_beam_width=beams, decoding_config=decoding)

    with pytest.raises(RuntimeError, match=r"maxDraftTokens <= .*\(15 > 7\)"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config(4, 3, 4))
    with pytest.raises(RuntimeError, match="Beam width must be 1"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config(2, 3, 2, beams=2))
    with pytest.raises(RuntimeError, match="not set to Lookahead"):
        tle.DecodingConfig(
            decoding_mode=tle.DecodingMode.TopK(), lookahead_decoding_config=tle.LookaheadDecodingConfig(2, 3, 2)
        )
    assert tle.LookaheadDecodingConfig(2, 3, 2).calculate_speculative_resource() == (8, 3, 7, 2)


def test_the_compile_stage_builds_for_lookahead_and_keys_the_cache_by_it(trt, tmp_path, monkeypatch, caplog):
    spec = {"decoding_type": "Lookahead", "max_window_size": 2, "max_ngram_size": 3, "max_verification_set_size": 2}
    built = compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec)
    build = json.loads((built.path / "config.json").read_text())["build_config"]
    assert (build["speculative_decoding_mode"], build["max_draft_len"]) == (8, LOOKAHEAD.draft_len)
    with caplog.at_level("INFO", logger="lmi_trt.compile"):
        other = compiled(tmp_path, monkeypatch, trt, "1.2.1")
    assert other.path != built.path and "plan.speculative_decoding_mode" in caplog.text


async def test_served_over_http_from_the_checkpoint_with_its_log_metrics_and_refusals(
    trt, tmp_path, monkeypatch, caplog
):
    """The real load path: trtllm-serve's speculative_config → the compile stage builds the lookahead engine →
    the Executor decodes greedily as without it; a sampled request is a 400 naming its field; /metrics counts."""
    hf_dir = tiny_model("llama")
    spec = {"decoding_type": "Lookahead", "max_window_size": 2, "max_ngram_size": 3, "max_verification_set_size": 2}
    config = jit_config(tmp_path, speculative_config=spec)
    prompt = "the cat the cat the cat the cat"
    text, want = greedy_text_tokens(hf_dir, prompt, 16)
    assert len(want) >= 4  # something to compare
    with caplog.at_level("INFO"):
        async with jit_server(monkeypatch, trt, "1.1.0", config) as (server, s):
            body = {"inputs": prompt, "parameters": {"max_new_tokens": 16}}  # no details: they carry log-probs
            async with s.post(server.make_url("/invocations"), json=body) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["generated_text"] == text
            async with s.post(server.make_url("/invocations"), json={**body, "parameters": {"details": True}}) as r:
                body_text = await r.text()
                assert r.status == 400 and "outputLogProbs are not supported" in body_text, body_text
            sampled = {"inputs": prompt, "parameters": {"max_new_tokens": 4, "do_sample": True, "temperature": 0.7}}
            async with s.post(server.make_url("/invocations"), json=sampled) as r:
                body_text = await r.text()
                assert r.status == 400 and "temperature" in body_text and "greedily" in body_text, body_text
            async with s.get(server.make_url("/metrics")) as r:
                metrics = await r.text()
            assert "lmi_spec_decode_num_accepted_tokens_total" in metrics
    assert "speculative decoding: lookahead decoding (max_window_size=2, max_ngram_size=3" in caplog.text
