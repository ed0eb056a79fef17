"""Medusa on the Executor over TensorRT engines (issue 29), through the fake TensorRT-LLM: the compile stage converts
the
Hugging Face checkpoint plus FasterDecoding-format heads into a MedusaForCausalLM checkpoint and builds the engine for
it, the Executor gets DecodingMode.Medusa() and the tree, greedy outputs equal transformers' greedy ones (the fake
verifies every path of the tree against its tiny model), and what a release would ignore or fail on is refused."""

from __future__ import annotations

import json

import pytest
from speculative_heads import medusa_heads
from tinymodels import tiny_model
from trtllm_spec_testing import (
    compiled,
    generate,
    greedy_reference,
    greedy_text_and_sampled_refusal,
    greedy_text_tokens,
    jit_config,
    jit_server,
    outputs_accepting_every_draft,
    started,
    tokens_of,
)
from trtllm_testing import fake_tensorrt_llm

from lmi_trt.compile.errors import PlanError
from lmi_trt.engines.trtllm import TrtllmConfigError, TrtllmEngine, TrtllmSettings
from lmi_trt.engines.trtllm_medusa import Medusa, default_choices

# Prompts whose greedy continuations the heads are fitted to (so drafts get accepted), and one they are not.
PROMPTS = [[1, 45, 67, 89, 100, 45, 67], [1, 300, 22, 7], [1, 5, 6, 7, 5, 8, 9, 5]]
TREE = [[0], [0, 0], [1], [0, 1], [2], [1, 0]]  # mc_sim_7b_63's first six paths
TEXT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def trt():
    with fake_tensorrt_llm() as module:
        yield module


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    return medusa_heads(tiny_model("llama"), tmp_path_factory.mktemp("heads"), PROMPTS[:2])


def spec(heads, **more):
    return {"decoding_type": "Medusa", "max_draft_len": 6, "speculative_model": str(heads), **more}


@pytest.fixture(scope="module")
def built(trt, heads, tmp_path_factory):
    """The engine the compile stage builds for a release (an engine loads only in the release that built it)."""
    engines = {}

    def build(release):
        if release not in engines:
            with pytest.MonkeyPatch.context() as monkeypatch:
                folder = tmp_path_factory.mktemp("jit")
                engines[release] = compiled(folder, monkeypatch, trt, release, speculative_config=spec(heads)).path
        return engines[release]

    return build


@pytest.fixture
def engine_dir(built):
    return built("1.2.1")


def medusa_settings(heads, choices=TREE):
    key = "option.speculative_config.decoding_type"
    return TrtllmSettings(medusa=Medusa(str(heads), tuple(map(tuple, choices)), None, 6, key))


@pytest.fixture(scope="module")
def reference():
    return greedy_reference()


def test_the_compile_stage_builds_the_medusa_checkpoint_and_keys_the_cache_by_the_heads(engine_dir, heads):
    config = json.loads((engine_dir / "config.json").read_text())
    pretrained, build = config["pretrained_config"], config["build_config"]
    # convert_checkpoint.py's MedusaForCausalLM config; builder.py: MEDUSA (4) and max_seq_len raised by the draft len
    assert (pretrained["architecture"], pretrained["num_medusa_heads"], pretrained["num_medusa_layers"]) == (
        "MedusaForCausalLM",
        2,
        1,
    )
    assert (pretrained["max_draft_len"], build["speculative_decoding_mode"], build["max_draft_len"]) == (6, 4, 6)
    plan = json.loads((engine_dir / "build_plan.json").read_text())
    assert plan["speculative_decoding_mode"] == "medusa" and plan["medusa"]["num_heads"] == 2


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0", "1.2.1"])
async def test_greedy_outputs_equal_decoding_without_medusa(trt, built, heads, reference, release, caplog):
    engine_dir = built(release)
    trt.__version__ = release
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(engine_dir, medusa_settings(heads))
    try:
        assert "speculative decoding: Medusa (6 draft paths up to 2 deep; 6 draft tokens a step)" in caplog.text
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(await generate(engine, f"g{i}", prompt)) == reference(prompt, 24), prompt
        if release != "1.0.0":  # 1.0's Result is not shown to bind decoding_iter (test_trtllm_lookahead.py)
            assert engine.stats().extra["spec_decode_num_accepted_tokens"] > 0  # the heads' drafts were used
    finally:
        await engine.close()


async def test_the_default_tree_is_cut_to_the_engine_s_heads(trt, engine_dir, heads, reference, caplog):
    """No medusa_choices nor num_medusa_heads: mc_sim_7b_63's first paths within the draft length and the engine's
    two heads (its sixth path, [0, 0, 0], is three deep)."""
    trt.__version__ = "1.2.1"
    settings = TrtllmSettings(medusa=Medusa(str(heads), default_choices(6, None), None, 6, "k", chosen=False))
    with caplog.at_level("INFO", logger="lmi_trt"):
        engine = await started(engine_dir, settings)
    try:
        assert "Medusa (6 draft paths up to 2 deep" in caplog.text
        assert engine.settings.medusa.choices == default_choices(6, 2)
        assert tokens_of(await generate(engine, "d", PROMPTS[0])) == reference(PROMPTS[0], 24)
    finally:
        await engine.close()


async def test_a_verifier_that_accepts_every_draft_changes_the_output(trt, engine_dir, heads, reference, monkeypatch):
    """The equality above can fail: with the fake's verification patched to keep every draft, the output changes."""
    trt.__version__ = "1.2.1"
    engine = await started(engine_dir, medusa_settings(heads))
    try:
        outputs = await outputs_accepting_every_draft(engine, monkeypatch, PROMPTS)
        assert outputs != [reference(p, 24) for p in PROMPTS]
    finally:
        await engine.close()


async def test_what_the_executor_does_not_do_beside_medusa_is_refused(trt, engine_dir, heads):
    trt.__version__ = "1.2.1"
    engine = await started(engine_dir, medusa_settings(heads))
    try:
        sampled = await generate(engine, "s", PROMPTS[1], do_sample=True, temperature=0.8)
        assert sampled[-1].error_code == 400 and sampled[-1].error_field == "temperature"
        assert "greedy requests only" in sampled[-1].error
        caps = engine.capabilities
        assert not caps.logprobs.honoured and "outputLogProbs are not supported" in caps.logprobs.reason
        assert not caps.beam_search.honoured and not caps.guided.honoured
        stopped = await generate(engine, "t", PROMPTS[1], stop_token_ids=[[5]])
        assert stopped[-1].error_code == 400 and stopped[-1].error_field == "stop_token_ids"
    finally:
        await engine.close()


def test_engine_and_tree_mismatches_are_start_up_errors(trt, engine_dir, heads, tmp_path):
    trt.__version__ = "1.2.1"
    from trtllm_testing import make_engine_dir

    plain = make_engine_dir(tiny_model("llama"), tmp_path / "plain", max_batch_size=4, max_input_len=64, max_seq_len=96)
    with pytest.raises(TrtllmConfigError, match=r"decoding_type=medusa needs an engine built with"):
        TrtllmEngine(plain, medusa_settings(heads), eos_token_ids=[2])
    # medusaModule.cpp: numChoices <= the engine's draft tokens; paths no deeper than its heads
    with pytest.raises(TrtllmConfigError, match=r"7 paths, and the engine was built with max_draft_len=6"):
        TrtllmEngine(engine_dir, medusa_settings(heads, [*TREE, [3]]), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match=r"3 deep and the heads checkpoint .* has 2 heads .*require more"):
        TrtllmEngine(engine_dir, medusa_settings(heads, [[0], [0, 0], [0, 0, 0]]), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match="built with --speculative_decoding_mode medusa and no"):
        TrtllmEngine(engine_dir, TrtllmSettings(), eos_token_ids=[2])


async def test_012_is_refused(trt, engine_dir, heads):
    trt.__version__ = "0.12.0"
    engine = TrtllmEngine(engine_dir, medusa_settings(heads), eos_token_ids=[2], gpu_available=lambda: True)
    with pytest.raises(TrtllmConfigError, match=r"Medusa on TensorRT-LLM 0.12.0's Executor is not verified"):
        await engine.start()


def test_the_fake_executor_checks_what_medusa_module_checks(trt, engine_dir):
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = "1.2.1"

    def config(choices):
        decoding = tle.DecodingConfig(decoding_mode=tle.DecodingMode.Medusa(), medusa_choices=choices)
        return tle.ExecutorConfig(max_beam_width=1, decoding_config=decoding)

    with pytest.raises(RuntimeError, match=r"numChoices <= getMaxDecodingDraftTokens\(\) \(7 > 6\)"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config([*TREE, [3]]))
    with pytest.raises(RuntimeError, match="require more Medusa heads than the engine was built with"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config([[0], [0, 0], [0, 0, 0]]))
    with pytest.raises(RuntimeError, match="not set to Medusa"):
        tle.DecodingConfig(decoding_mode=tle.DecodingMode.TopK(), medusa_choices=TREE)


def test_the_plan_refuses_what_it_cannot_build(trt, heads, tmp_path, monkeypatch):
    from lmi_trt.compile.plan import GpuFacts, make_plan
    from lmi_trt.stages import compile_options, settle

    with pytest.raises(PlanError, match=r"Medusa on TensorRT-LLM 0.12.0's Executor is not verified"):
        compiled(tmp_path, monkeypatch, trt, "0.12.0", speculative_config=spec(heads))
    with pytest.raises(PlanError, match=r"option.max_beam_width=2: Medusa accepts one draft path"):
        compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(heads), max_beam_width=2)
    two = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=2)
    split = compile_options(
        settle(jit_config(tmp_path, speculative_config=spec(heads), tensor_parallel_degree=2), "trtllm")
    )
    hf = json.loads((tiny_model("llama") / "config.json").read_text())
    with pytest.raises(PlanError, match=r"option.tensor_parallel_degree=2: a Medusa engine is built here on one GPU"):
        make_plan(split, hf, two, "1.2.1")
    with pytest.raises(PlanError, match=r"option.enable_lora=True: LoRA adapters beside Medusa heads"):
        compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(heads), enable_lora=True)
    with pytest.raises(PlanError, match=r"option.quantize=.*does not quantize Medusa heads"):
        compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(heads), quantize="fp8")


async def test_served_over_http_from_the_checkpoint_and_heads(trt, tmp_path, monkeypatch, caplog):
    """The real load path: trtllm-serve's speculative_config with the heads folder → the compile stage builds the
    Medusa engine → greedy text equal to transformers'; a sampled request is a 400 naming its field; /metrics counts;
    a bad member value is a start-up error naming it."""
    from transformers import AutoTokenizer

    hf_dir = tiny_model("llama")
    text, want = greedy_text_tokens(hf_dir, TEXT, 16)
    ids = AutoTokenizer.from_pretrained(hf_dir)(TEXT).input_ids
    folder = medusa_heads(hf_dir, tmp_path / "heads", [ids])
    config = jit_config(tmp_path, speculative_config=spec(folder, medusa_choices=TREE))
    with caplog.at_level("INFO"):
        async with jit_server(monkeypatch, trt, "1.1.0", config) as (server, s):
            metrics = await greedy_text_and_sampled_refusal(server, s, TEXT, text, "greedy")
    accepted = [line for line in metrics.splitlines() if line.startswith("lmi_spec_decode_num_accepted_tokens_total")]
    assert accepted and float(accepted[0].split()[-1]) > 0, accepted
    assert "speculative decoding: Medusa (6 draft paths up to 2 deep" in caplog.text
    assert len(want) >= 4


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ({"medusa_choices": [[0, 0]]}, r"medusa_choices=.*lacks its parent \[0\]"),
        ({"num_medusa_heads": 0}, r"num_medusa_heads=0: must be an integer >= 1"),
        ({"max_concurrency": 2}, r"max_concurrency=2: is not a member of MedusaDecodingConfig"),
    ],
)
def test_bad_member_values_are_refused_naming_the_member(heads, tmp_path, members, match):
    from lmi_trt.stages import executor_settings

    with pytest.raises(ValueError, match=match):
        executor_settings(jit_config(tmp_path, speculative_config=spec(heads, **members)))


def test_the_compile_command_fetches_the_heads_and_builds_them_in(trt, heads, tmp_path, monkeypatch, capsys):
    """`lmi-trt compile` shares the JIT path's conversion: the heads folder is resolved first, as serve does."""
    from lmi_trt.cli import main

    monkeypatch.setenv("LMI_TRT_FAKE_RELEASE", "1.2.1")
    trt.__version__ = "1.2.1"
    out = tmp_path / "compiled"
    flags = ["-o", "option.max_input_len=64", "-o", "option.max_output_len=32", "-o", "option.max_draft_len=6"]
    medusa = ["-o", "option.speculative_decoding_mode=medusa", "-o", f"option.speculative_draft_model={heads}"]
    argv = ["compile", "--model-id", str(tiny_model("llama")), "--output", str(out), "--gpu", "h100"]
    assert main([*argv, *flags, *medusa]) == 0, capsys.readouterr().err
    pretrained = json.loads((out / "config.json").read_text())["pretrained_config"]
    assert (pretrained["architecture"], pretrained["num_medusa_heads"]) == ("MedusaForCausalLM", 2)


def test_other_heads_are_another_cached_engine(trt, heads, tmp_path, monkeypatch, caplog):
    """The heads are in the cache key (their folder's fingerprint), not where they are."""
    first = compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(heads))
    other = medusa_heads(tiny_model("llama"), tmp_path / "other", PROMPTS[2:])
    with caplog.at_level("INFO", logger="lmi_trt.compile"):
        second = compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(other))
    assert second.path != first.path and "plan.medusa.fingerprint" in caplog.text
