"""Speculative decoding on the LLM API's PyTorch backend through the fake LLM API, per release: the release's
speculative config reaches the LLM, the fake's draft-and-verify loop really runs (n-gram drafts from the sequence,
or a draft model), greedy outputs equal decoding without speculation, the iteration stats' draft figures reach
the engine's counters, and what a release does not do beside speculation is refused naming the key or field."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path

import pytest
from cliserver import serve
from test_llmapi_engine import PROMPTS, collect, req, settings, tokens_of
from test_serve_llmapi import SITECUSTOMIZE
from tinymodels import tiny_model
from trtllm_testing import FAKES, fake_tensorrt_llm

from lmi_trt.engines.base import EngineError
from lmi_trt.engines.llmapi import LlmApiEngine, LlmApiSettings
from lmi_trt.engines.trtllm import TrtllmConfigError
from lmi_trt.speculative import Speculation

RELEASES = ("1.0.0", "1.1.0", "1.2.1", "1.3.0")
# Prompts that repeat themselves (n-gram drafts find matches) and ones that do not.
SPEC_PROMPTS = [[1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 20, 21, 22, 20, 21, 22, 20, 21], *PROMPTS[:3]]


@pytest.fixture
def trt(request):
    with fake_tensorrt_llm() as module:
        yield module


@pytest.fixture(scope="module")
def draft_dir(model_dir, tmp_path_factory) -> Path:
    """The target's first layer alone: a draft that agrees with it often, not always."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("draft")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model("llama")


def spec_settings(spec: Speculation | None, **runtime) -> LlmApiSettings:
    return settings(**runtime).model_copy(update={"speculative": spec})


async def start(model_dir, spec: Speculation | None, **runtime) -> LlmApiEngine:
    engine = LlmApiEngine(
        model_dir, spec_settings(spec, **runtime), eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True
    )
    await asyncio.wait_for(engine.start(), 120)
    return engine


async def greedy_outputs(engine: LlmApiEngine, tag: str) -> list[list[int]]:
    requests = [req(f"{tag}{i}", p, max_new_tokens=24, ignore_eos=True) for i, p in enumerate(SPEC_PROMPTS)]
    return [tokens_of(o) for o in await asyncio.gather(*(collect(engine, r) for r in requests))]


async def counters(engine: LlmApiEngine) -> dict[str, float]:
    """The engine's speculation counters once it has read the fake's stats for every step (called once the outputs
    are all in): the newest stats it read are the fake's last iteration's, which left no request active or queued.
    (An iteration's stats are recorded after its outputs are sent, so the outputs alone do not say that.)"""
    fake = engine._llm._executor
    for _ in range(600):  # a bound that holds on a loaded machine, not a speed
        last = engine._last_iteration
        if last and last["iter"] == fake._iter - 1 and not last["numActiveRequests"] + last["numQueuedRequests"]:
            return engine.stats().extra
        await asyncio.sleep(0.05)
    raise AssertionError(f"the engine did not read the fake's last iteration ({fake._iter - 1}): {last}")


def ngram(k: int = 4, **kw) -> Speculation:
    return Speculation(method="ngram", max_draft_len=k, **kw)


def drafted(path: Path, k: int = 3) -> Speculation:
    keys = {"method": "option.speculative_draft_model", "draft_model": "option.speculative_draft_model"}
    return Speculation(method="draft_model", max_draft_len=k, draft_model=str(path), keys=keys)


_PLAIN: dict[str, list[list[int]]] = {}


async def without_speculation(model_dir) -> list[list[int]]:
    """The greedy outputs without speculation (the same argmax on every release), decoded once per model."""
    if str(model_dir) not in _PLAIN:
        plain = await start(model_dir, None)
        try:
            _PLAIN[str(model_dir)] = await greedy_outputs(plain, "p")
        finally:
            await plain.close()
    return _PLAIN[str(model_dir)]


@pytest.mark.parametrize(
    ("release", "method"), [(r, "ngram") for r in RELEASES] + [(r, "draft_model") for r in ("1.0.0", "1.2.1")]
)
async def test_greedy_outputs_equal_decoding_without_speculation(trt, model_dir, draft_dir, release, method, caplog):
    trt.__version__ = release
    want = await without_speculation(model_dir)
    spec = ngram() if method == "ngram" else drafted(draft_dir)
    caplog.set_level(logging.INFO, logger="lmi_trt.engines.llmapi")
    engine = await start(model_dir, spec)
    try:
        got = await greedy_outputs(engine, "s")
        figures = await counters(engine)
        config = engine._llm.args.speculative_config
    finally:
        await engine.close()
    assert got == want
    assert type(config).__name__ == ("NGramDecodingConfig" if method == "ngram" else "DraftTargetDecodingConfig")
    assert config.max_draft_len == spec.max_draft_len
    if method == "ngram":  # the drafts ran: proposed, and some (not necessarily all) accepted
        assert figures["spec_decode_num_draft_tokens"] > 0 and figures["spec_decode_num_drafts"] > 0
        assert 0 < figures["spec_decode_num_accepted_tokens"] <= figures["spec_decode_num_draft_tokens"]
    else:  # draft-target has no spec resource manager, so no specDecodingStats: no figures rather than zeros
        assert not any(name.startswith("spec_decode") for name in figures), figures
    assert any(
        "speculative decoding: " + ("n-gram" if method == "ngram" else "a draft model") in r.getMessage()
        for r in caplog.records
    )


def keep_all(self, seq, drafts):
    """A verifier that keeps every draft (what a broken acceptance rule would do)."""
    for token in drafts:
        if self._advance(seq, token) is not None:
            return "LENGTH"
    self._forward(seq, drafts)
    return None


async def test_a_wrong_verification_would_show(trt, model_dir, monkeypatch):
    """The comparison above can fail: a verifier that keeps every draft changes the output."""
    from tensorrt_llm import _llm_runtime

    want = await without_speculation(model_dir)
    monkeypatch.setattr(_llm_runtime.LlmRuntime, "_verify", keep_all)
    engine = await start(model_dir, ngram())
    try:
        got = await greedy_outputs(engine, "s")
    finally:
        await engine.close()
    assert got != want


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0"])
async def test_sampling_beside_speculation_is_refused_before_12(trt, model_dir, release):
    """1.0's TorchSampler takes the argmax beside drafts (no enable_mixed_sampler); 1.1's beside drafts was not read
    (the sampler.py copy read is the 1.2 line's): sampling and log probs refused."""
    trt.__version__ = release
    engine = await start(model_dir, ngram())
    try:
        outs = await collect(engine, req("r", [1, 5, 6], do_sample=True, temperature=0.8, max_new_tokens=4))
        assert outs[-1].error_field == "sampling" and release in outs[-1].error and "1.2+" in outs[-1].error
        outs = await collect(engine, req("l", [1, 5, 6], logprobs=True, max_new_tokens=4))
        assert outs[-1].error_field == "logprobs"
        assert not engine.capabilities.logprobs.honoured
        assert "speculative decoding" in engine.capabilities.release
    finally:
        await engine.close()


@pytest.mark.parametrize("release", ["1.2.1", "1.3.0"])
async def test_sampling_and_log_probs_beside_ngram_from_12(trt, model_dir, release):
    """The 1.2 line's TorchSampler draws each verified position with the request's strategy and gives every kept
    token its log prob (sampler.py _process_draft_tokens_greedy, handle_logprobs with 1 + num_accepted)."""
    trt.__version__ = release
    engine = await start(model_dir, ngram())
    try:
        prompt = [1, 5, 6, 7, 5, 6]
        outs = await collect(engine, req("r", prompt, do_sample=True, temperature=0.9, max_new_tokens=8))
        assert outs[-1].finished and outs[-1].error is None and len(tokens_of(outs)) == 8
        outs = await collect(engine, req("l", prompt, logprobs=True, max_new_tokens=8, ignore_eos=True))
        assert outs[-1].error is None and engine.capabilities.logprobs.honoured
        assert len([lp for o in outs for lp in (o.logprobs or [])]) == 8  # one per token, drafted ones too
    finally:
        await engine.close()


@pytest.mark.parametrize(
    ("spec", "runtime", "named"),
    [
        (Speculation(method="medusa", max_draft_len=3), {}, "option.speculative_config"),
        (Speculation(method="lookahead", max_draft_len=3), {}, "option.speculative_config"),
        (ngram(), {"max_beam_width": 2}, "option.max_beam_width"),
        (ngram(max_concurrency=4, keys={"max_concurrency": "option.speculative_disable_by_batch_size"}), {}, "1.0.0"),
        (ngram(min_matching_ngram_size=2, keys={"min_matching_ngram_size": "option.prompt_lookup_min"}), {}, "min"),
        (Speculation(method="mtp", max_draft_len=2), {}, "num_nextn_predict_layers"),
        (ngram(options={"max_total_draft_tokens": 9}), {}, "max_total_draft_tokens"),
    ],
)
async def test_what_the_release_cannot_run_is_refused_at_start(trt, model_dir, spec, runtime, named):
    trt.__version__ = "1.0.0"
    with pytest.raises(EngineError) as info:
        await start(model_dir, spec, **runtime)
    assert isinstance(info.value, TrtllmConfigError) and named in str(info.value)


async def test_the_overlap_scheduler_switched_off_by_the_release_is_refused(trt, model_dir):
    settings_ = spec_settings(ngram()).model_copy(update={"enable_overlap_scheduler": True})
    engine = LlmApiEngine(model_dir, settings_, eos_token_ids=[2], pad_token_id=0, gpu_available=lambda: True)
    with pytest.raises(TrtllmConfigError, match="option.enable_overlap_scheduler"):
        await engine.start()


@pytest.mark.slow
def test_a_real_server_resolves_the_draft_model_logs_the_method_and_exports_the_figures(tmp_path, model_dir):
    """DJL's keys → sources (the draft model's folder) → the LLM's DraftTargetDecodingConfig → /metrics and
    /v1/capabilities, in a server process on the release the CI leg impersonates (LMI_TRT_FAKE_RELEASE). The model
    is its own draft here, so drafts are kept (the figures cannot be zero by accident)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(tmp_path / "site"), str(FAKES), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    args = ["--model-id", str(model_dir), "--engine", "trtllm", "--model-name", "tiny"]
    for key, value in [
        ("backend", "pytorch"),
        ("max_input_len", 64),
        ("max_output_len", 24),
        ("speculative_draft_model", str(model_dir)),
        ("speculative_length", 3),
    ]:
        args += ["-o", f"option.{key}={value}"]
    with serve(args, tmp_path, env={"PYTHONPATH": path}) as server:
        log = server.log()
        assert "speculative decoding: a draft model" in log and "DraftTargetDecodingConfig" in log, log[-3000:]
        body = {"inputs": "The quick brown fox. The quick brown fox.", "parameters": {"max_new_tokens": 20}}
        response = server.post("/invocations", body)
        assert response.status_code == 200 and response.json()["generated_text"]
        sampled = server.post("/invocations", {"inputs": "Hi", "parameters": {"do_sample": True, "max_new_tokens": 4}})
        capabilities = server.get("/v1/capabilities").json()
        for _ in range(100):  # the stats poller has read iterations (the executor's gauges are there)
            if "lmi_engine_executor_active_requests" in server.get("/metrics").text:
                break
            time.sleep(0.1)
        time.sleep(3)  # one get_stats_async pass (2 s) later every iteration was read
        metrics = server.get("/metrics").text
    release = os.environ.get("LMI_TRT_FAKE_RELEASE", "1.0.0")
    assert sampled.status_code == (200 if release >= "1.2" else 400), sampled.text
    assert "speculative decoding" in json.dumps(capabilities)
    # draft-target iterations carry no specDecodingStats (no spec resource manager): no figures rather than zeros
    assert "lmi_spec_decode_num_drafts_total" not in metrics and "lmi_spec_decode_draft_acceptance_rate" not in metrics


async def test_a_grammar_holds_across_accepted_drafts(trt, model_dir):
    """n-gram drafts beside a grammar (the drafter keeps the guided decoder, interface.py support_guided_decoder):
    the sampler masks each verified position with the grammar's state after the tokens before it, so the output
    is the one decoding without speculation gives, and it matches the grammar."""
    import re

    from lmi_trt.engines.base import GuidedDecoding

    trt.__version__ = "1.2.1"
    guide = GuidedDecoding("regex", "(ab|cd){3}[0-9]{4}")
    prompt = [1, 5, 6, 7, 5, 6, 7, 5, 6]
    outputs = []
    for spec in (None, ngram()):
        engine = await start(model_dir, spec)
        try:
            outputs.append(tokens_of(await collect(engine, req("g", prompt, guided=guide, max_new_tokens=12))))
            text = engine._llm.tokenizer.decode(outputs[-1])
        finally:
            await engine.close()
        assert re.fullmatch("(ab|cd){3}[0-9]{4}", text.replace(" ", "")), text
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_a_grammar_beside_one_model_speculation_is_refused(method):
    from lmi_trt.engines.llmapi import release_capabilities
    from lmi_trt.engines.llmapi_speculation import SpecPlan

    plan = SpecPlan("X", {}, method, "", one_model=True, advanced_sampling="deprecated")
    capabilities = release_capabilities("1.3.0", "TorchSampler", 512, [2], speculation=plan)
    assert not capabilities.guided.honoured and "support_guided_decoder" in capabilities.guided.reason


async def test_on_10_speculation_starts_without_the_guided_backend_and_refuses_grammars(trt, model_dir):
    """1.0's py_executor_creator.py raises "Guided decoding is not supported with speculative decoding." for
    guided_decoding_backend beside any speculative config (lifted by PR 6300, in 1.1): the fake raises as it does,
    the engine leaves the backend out and refuses a grammar per request, naming the field and the release."""
    import importlib

    from lmi_trt.engines.base import GuidedDecoding

    trt.__version__ = "1.0.0"
    llmapi = importlib.import_module("tensorrt_llm.llmapi")
    with pytest.raises(ValueError, match="Guided decoding is not supported with speculative decoding"):
        llmapi.LLM(
            str(model_dir),
            guided_decoding_backend="xgrammar",
            speculative_config=llmapi.NGramDecodingConfig(max_draft_len=2, max_matching_ngram_size=2),
        )
    engine = await start(model_dir, ngram())
    try:
        assert engine._llm.args.guided_decoding_backend is None
        guide = GuidedDecoding("regex", "[0-9]{4}")
        outs = await collect(engine, req("g", [1, 5, 6], guided=guide, max_new_tokens=4))
        assert outs[-1].error_field == "guided" and "1.0.0" in outs[-1].error and "PR 6300" in outs[-1].error
        assert not engine.capabilities.guided.honoured
    finally:
        await engine.close()


async def test_spec_figures_appear_only_once_the_release_reports_them(trt, model_dir):
    """No specDecodingStats yet (no iteration ran): no figures, rather than zeros that read as a 0 % acceptance rate;
    the first iteration that carries them starts the counters."""
    trt.__version__ = "1.2.1"
    engine = await start(model_dir, ngram())
    try:
        assert not any(name.startswith("spec_decode") for name in engine.stats().extra)
        await greedy_outputs(engine, "m")
        assert (await counters(engine))["spec_decode_num_drafts"] > 0
    finally:
        await engine.close()


# ------------------------------------------------------------------ draft heads: EAGLE-3 and MTP (fake: _spec_heads)


@pytest.fixture(scope="module")
def deep_dir() -> Path:
    """A target deep enough for EAGLE-3's default capture (layers 1, 3 and 4 of 8; eagle3.py)."""
    return tiny_model("llama8")


@pytest.fixture(scope="module")
def eagle3_dir(deep_dir, tmp_path_factory) -> Path:
    from speculative_heads import eagle3_draft

    return eagle3_draft(deep_dir, tmp_path_factory.mktemp("eagle3") / "head")


def eagle3(path: Path, k: int = 3, **options) -> Speculation:
    return Speculation(method="eagle3", max_draft_len=k, draft_model=str(path), options=options)


def mtp(k: int = 2, **options) -> Speculation:
    return Speculation(method="mtp", max_draft_len=k, options=options)


def mtp_dir(layers: int) -> Path:
    pytest.importorskip("transformers.models.deepseek_v3")
    from speculative_heads import mtp_model

    return mtp_model(layers)


async def heads_output(target: Path, spec: Speculation, tag: str = "h") -> tuple[list[list[int]], object]:
    engine = await start(target, spec)
    try:
        return await greedy_outputs(engine, tag), engine._llm.args.speculative_config
    finally:
        await engine.close()


@pytest.mark.parametrize(("release", "one_model"), [("1.0.0", True), ("1.3.0", True), ("1.2.1", False)])
async def test_eagle3_heads_keep_greedy_outputs(trt, deep_dir, eagle3_dir, release, one_model):
    """The EAGLE-3 head drafts from the target's captured hidden states; the target verifies (its worker's argmax on
    the one-model path, the TorchSampler on the two-model one): greedy outputs are the ones without speculation."""
    trt.__version__ = release
    want = await without_speculation(deep_dir)
    options = {} if one_model else {"eagle3_one_model": False}
    got, config = await heads_output(deep_dir, eagle3(eagle3_dir, **options))
    assert got == want
    assert type(config).__name__ == ("Eagle3DecodingConfig" if release >= "1.3" else "EagleDecodingConfig")
    assert (config.max_draft_len, bool(config.eagle3_one_model)) == (3, one_model)


@pytest.mark.parametrize(("layers", "vanilla"), [(1, False), (2, True)])
async def test_mtp_layers_keep_greedy_outputs(trt, layers, vanilla):
    """The checkpoint's MTP layers draft (one layer: MTP-Eagle, run max_draft_len times; several, or use_mtp_vanilla:
    one layer per draft token) and the MTP worker's argmax verifies: greedy outputs unchanged."""
    target = mtp_dir(layers)
    trt.__version__ = "1.2.1"
    want = await without_speculation(target)
    got, config = await heads_output(target, mtp(2, **({"use_mtp_vanilla": True} if vanilla else {})))
    assert got == want
    assert (type(config).__name__, config.max_draft_len) == ("MTPDecodingConfig", 2)


@pytest.mark.parametrize("release", ["1.0.0", "1.3.0rc1", "1.3.0"])
async def test_the_mtp_draft_length_reaches_every_release(trt, release):
    """MTPDecodingConfig copies num_nextn_predict_layers (default 1) into max_draft_len before PR 12341 (1.0, 1.1 and
    the early 1.3.0 candidates): the user's length is passed as num_nextn_predict_layers, so 3 drafts run, not 1."""
    target = mtp_dir(1)
    trt.__version__ = release
    want = await without_speculation(target)
    got, config = await heads_output(target, mtp(3))
    assert got == want
    assert (config.max_draft_len, config.num_nextn_predict_layers) == (3, 3)


@pytest.mark.parametrize(("layers", "options"), [(2, {}), (1, {"use_mtp_vanilla": True})])
async def test_vanilla_mtp_beyond_the_checkpoints_layers_is_refused(trt, layers, options):
    """Vanilla MTP runs one checkpoint layer per draft token; a longer draft was clamped without a word after PR
    12341 until PR 14457, neither pinned: refused at start, naming the key."""
    trt.__version__ = "1.3.0rc1"
    with pytest.raises(TrtllmConfigError, match="max_draft_len") as info:
        await start(mtp_dir(layers), mtp(layers + 1, **options))
    assert f"at most {layers}" in str(info.value) and "PR 14457" in str(info.value)


@pytest.mark.parametrize("head", ["eagle3", "mtp"])
async def test_a_wrong_verification_of_head_drafts_would_show(trt, deep_dir, eagle3_dir, head, monkeypatch):
    """The head comparisons can fail: a verifier that keeps every draft the head proposes changes the output."""
    from tensorrt_llm import _llm_runtime

    target = deep_dir if head == "eagle3" else mtp_dir(1)
    want = await without_speculation(target)
    monkeypatch.setattr(_llm_runtime.LlmRuntime, "_verify", keep_all)
    got, _ = await heads_output(target, eagle3(eagle3_dir) if head == "eagle3" else mtp(2))
    assert got != want


@pytest.mark.parametrize("release", ["1.1.0", "1.2.1", "1.3.0"])
async def test_sampling_beside_one_model_eagle3_follows_the_releases_allow_advanced_sampling(
    trt, deep_dir, eagle3_dir, release
):
    """One-model EAGLE-3 decodes greedily unless the release's config has allow_advanced_sampling (1.0, 1.1: absent →
    sampling refused, naming the field); a prototype flag is not set and sampling refused (what its path honours was
    not read); deprecated (1.3.0: per-request auto-detection), sampling served. The fake's 1.2.1 playing the prototype
    field is a guess (PR 9885 is not pinned to release/1.2): the engine probes the field, not the version."""
    trt.__version__ = release
    engine = await start(deep_dir, eagle3(eagle3_dir))
    try:
        config = engine._llm.args.speculative_config
        outs = await collect(engine, req("s", [1, 5, 6], do_sample=True, temperature=1.0, max_new_tokens=6))
        if release == "1.1.0":
            assert "allow_advanced_sampling" not in type(config).model_fields
        else:
            assert config.allow_advanced_sampling is False
        if release == "1.3.0":
            assert outs[-1].error is None and len(tokens_of(outs)) == 6
        else:
            assert outs[-1].error_field == "sampling" and "allow_advanced_sampling" in outs[-1].error
            assert f"field is {'prototype' if release == '1.2.1' else 'absent'}" in outs[-1].error
        guided = await collect(engine, req("g", [1, 5, 6], guided=_regex(), max_new_tokens=4))
        assert guided[-1].error_field == "guided"  # the capturable guided decoder was not read
    finally:
        await engine.close()


def _regex():
    from lmi_trt.engines.base import GuidedDecoding

    return GuidedDecoding("regex", "[0-9]{4}")


async def test_the_fake_one_model_worker_is_greedy_without_the_flag(trt, deep_dir, eagle3_dir):
    """The fake's one-model verification ignores a request's sampling unless allow_advanced_sampling is on (the
    worker's argmax, eagle3.py): the same sampled request with the flag off equals greedy, with it on it samples."""
    import importlib

    trt.__version__ = "1.2.1"
    llmapi = importlib.import_module("tensorrt_llm.llmapi")
    outputs = {}
    for flag in (False, True):
        config = llmapi.EagleDecodingConfig(
            max_draft_len=3, speculative_model_dir=str(eagle3_dir), allow_advanced_sampling=flag
        )
        llm = llmapi.LLM(str(deep_dir), speculative_config=config)
        try:
            sampled = llmapi.SamplingParams(max_tokens=12, temperature=5.0, top_k=0, top_p=1.0, ignore_eos=True)
            greedy = llmapi.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
            outputs[flag] = [(await llm.generate_async([1, 5, 6], p)).outputs[0].token_ids for p in (sampled, greedy)]
        finally:
            llm.shutdown()
    assert outputs[False][0] == outputs[False][1]  # greedy whatever the request asked
    assert outputs[True][0] != outputs[True][1]
