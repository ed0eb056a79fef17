"""Medusa on the Executor over TensorRT engines (issue 29), through the fake TensorRT-LLM: the compile stage converts
the
Hugging Face checkpoint plus FasterDecoding-format heads into a MedusaForCausalLM checkpoint and builds the engine for
it, the Executor gets DecodingMode.Medusa() and the tree, greedy outputs equal transformers' greedy ones (the fake
verifies every path of the tree against its tiny model), and what a release would ignore or fail on is refused."""

from __future__ import annotations

import json
import shutil

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
    outputs = await outputs_accepting_every_draft(engine, monkeypatch, PROMPTS)
    assert outputs != [reference(p, 24) for p in PROMPTS]


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
    # speculativeChoicesUtils.cpp: numChoices <= the engine's draft tokens; paths no deeper than its heads
    with pytest.raises(TrtllmConfigError, match=r"the tree has 7 paths, .* pretrained_config.max_draft_len=6"):
        TrtllmEngine(engine_dir, medusa_settings(heads, [*TREE, [3]]), eos_token_ids=[2])
    # fewer paths than the engine's draft tokens: how the Executor runs that was not read through, so refused
    with pytest.raises(TrtllmConfigError, match=r"medusa_choices: the tree has 3 paths, .*max_draft_len=6"):
        TrtllmEngine(engine_dir, medusa_settings(heads, [[0], [0, 0], [1]]), eos_token_ids=[2])
    deep = [[0], [0, 0], [0, 0, 0], [1], [2], [3]]
    with pytest.raises(TrtllmConfigError, match=r"paths 3 deep and the heads checkpoint .* has 2 heads .*maxPathLen"):
        TrtllmEngine(engine_dir, medusa_settings(heads, deep), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match="built with --speculative_decoding_mode medusa and no"):
        TrtllmEngine(engine_dir, TrtllmSettings(), eos_token_ids=[2])


def precompiled_settings(choices, draft_len=6, num_heads=None):
    """Settings for a precompiled engine: Medusa's keys and no heads (the engine carries its own)."""
    key = "option.speculative_config.decoding_type"
    return TrtllmSettings(medusa=Medusa(None, tuple(map(tuple, choices)), num_heads, draft_len, key))


def rebuilt_with_max_draft_len(engine_dir, out, build_draft_len):
    """A copy of ``engine_dir`` as `trtllm-build --max_draft_len K` writes it from a Medusa checkpoint converted with
    another draft length: builder.py's build (the 1.x copy, id 205252225) copies the checkpoint's max_draft_len into
    build_config only when the build's is 0, and raises max_seq_len by the build's; pretrained_config keeps the
    checkpoint's (the fake's plan does not depend on either)."""
    shutil.copytree(engine_dir, out)
    config = json.loads((out / "config.json").read_text())
    build = config["build_config"]
    build["max_seq_len"] += build_draft_len - build["max_draft_len"]
    build["max_draft_len"] = build_draft_len
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("release", ["1.0.0", "1.1.0", "1.2.1"])
async def test_a_precompiled_engine_s_medusa_draft_length_is_its_pretrained_config_s(
    trt, built, reference, release, tmp_path
):
    """gptJsonConfig.cpp (id 809211714) builds a Medusa engine's MedusaModule from pretrained_config's max_draft_len
    and num_medusa_heads, not build_config's max_draft_len (which the other modes read), and model.py sizes the
    network from the same field: an engine whose build_config says 4 and pretrained_config 6 runs a 6-path tree."""
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = release
    engine_dir = rebuilt_with_max_draft_len(built(release), tmp_path / "engine", 4)
    engine = await started(engine_dir, precompiled_settings(TREE))
    try:
        for i, prompt in enumerate(PROMPTS):
            assert tokens_of(await generate(engine, f"p{i}", prompt)) == reference(prompt, 24), prompt
    finally:
        await engine.close()
    with pytest.raises(TrtllmConfigError, match=r"the tree has 4 paths, .*max_draft_len=6"):
        TrtllmEngine(engine_dir, precompiled_settings(TREE[:4]), eos_token_ids=[2])
    # what TensorRT-LLM reads only when it builds an engine, set to another value than this one's: refused
    with pytest.raises(TrtllmConfigError, match=r"speculative_config.max_draft_len=8: .* set it to 6"):
        TrtllmEngine(engine_dir, precompiled_settings(TREE, draft_len=8), eos_token_ids=[2])
    with pytest.raises(TrtllmConfigError, match=r"num_medusa_heads=3: .*num_medusa_heads=2; leave it out, or set it"):
        TrtllmEngine(engine_dir, precompiled_settings(TREE, num_heads=3), eos_token_ids=[2])
    TrtllmEngine(engine_dir, precompiled_settings(TREE, num_heads=2), eos_token_ids=[2])  # the engine's own: taken
    decoding = tle.DecodingConfig(decoding_mode=tle.DecodingMode.Medusa(), medusa_choices=[*TREE, [3]])
    with pytest.raises(RuntimeError, match=r"numChoices <= getMaxDecodingDraftTokens\(\) \(7 > 6\)"):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig(decoding_config=decoding))
    config = json.loads((engine_dir / "config.json").read_text())
    del config["pretrained_config"]["max_draft_len"]
    (engine_dir / "config.json").write_text(json.dumps(config))
    both = "Both num_medusa_heads and max_draft_len have to be provided for Medusa model"
    with pytest.raises(TrtllmConfigError, match=both):
        TrtllmEngine(engine_dir, precompiled_settings(TREE), eos_token_ids=[2])
    with pytest.raises(RuntimeError, match=both):
        tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, tle.ExecutorConfig(decoding_config=decoding))


async def test_012_is_refused(trt, engine_dir, heads):
    trt.__version__ = "0.12.0"
    engine = TrtllmEngine(engine_dir, medusa_settings(heads), eos_token_ids=[2], gpu_available=lambda: True)
    with pytest.raises(TrtllmConfigError, match=r"lmi-trt has not checked TensorRT-LLM 0.12.0's Medusa path"):
        await engine.start()


def test_the_fake_executor_checks_what_medusa_module_checks(trt, engine_dir, tmp_path):
    from tensorrt_llm.bindings import executor as tle

    trt.__version__ = "1.2.1"

    def config(choices):
        decoding = tle.DecodingConfig(decoding_mode=tle.DecodingMode.Medusa(), medusa_choices=choices)
        return tle.ExecutorConfig(max_beam_width=1, decoding_config=decoding)

    def start(choices):
        return tle.Executor(str(engine_dir), tle.ModelType.DECODER_ONLY, config(choices))

    with pytest.raises(RuntimeError, match=r"numChoices <= getMaxDecodingDraftTokens\(\) \(7 > 6\)"):
        start([*TREE, [3]])
    with pytest.raises(RuntimeError, match=r"Choices require larger maxPathLen than the engine was built with"):
        start([[0], [0, 0], [0, 0, 0]])
    # computePrefix: a rank above PREFIX_MAX_VALUE (16)
    with pytest.raises(RuntimeError, match=r"too large node degree \(17\)"):
        start([[0], [17]])
    # a skipped depth fails; a missing parent at an existing depth is hung under the root (not modelled)
    with pytest.raises(RuntimeError, match=r"depth \+ 1 == curDepth"):
        start([[0], [0, 0, 0]])
    with pytest.raises(NotImplementedError, match="missing parent"):
        start([[0], [1, 0]])
    with pytest.raises(RuntimeError, match="not set to Medusa"):
        tle.DecodingConfig(decoding_mode=tle.DecodingMode.TopK(), medusa_choices=TREE)
    # model.py: the heads' activation is the base model's hidden_act; only LLaMA's silu is modelled
    gelu = tmp_path / "gelu"
    shutil.copytree(engine_dir, gelu)
    written = json.loads((gelu / "config.json").read_text())
    written["pretrained_config"]["hidden_act"] = "gelu"
    (gelu / "config.json").write_text(json.dumps(written))
    with pytest.raises(NotImplementedError, match="Medusa heads with gelu"):
        tle.Executor(str(gelu), tle.ModelType.DECODER_ONLY, config(TREE))


def test_the_plan_refuses_what_it_cannot_build(trt, heads, tmp_path, monkeypatch):
    from lmi_trt.compile.plan import GpuFacts, make_plan
    from lmi_trt.stages import compile_options, settle

    hf = json.loads((tiny_model("llama") / "config.json").read_text())
    # examples/medusa/README.md's Support Matrix: compute capability 8.0 or newer, FP16 or BF16
    t4 = GpuFacts(name="Tesla T4", sm=75, memory_gib=16, count=1)
    opts = compile_options(settle(jit_config(tmp_path, speculative_config=spec(heads)), "trtllm"))
    with pytest.raises(PlanError, match=r"decoding_type='medusa': Medusa needs compute capability 8.0 .* T4 is 7.5"):
        make_plan(opts, hf, t4, "1.2.1")
    h100 = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
    fp32 = compile_options(settle(jit_config(tmp_path, speculative_config=spec(heads), dtype="fp32"), "trtllm"))
    with pytest.raises(PlanError, match=r"option.dtype='fp32': Medusa engines are built in float16 or bfloat16"):
        make_plan(fp32, hf, h100, "1.2.1")

    with pytest.raises(PlanError, match=r"lmi-trt has not checked TensorRT-LLM 0.12.0's Medusa path"):
        compiled(tmp_path, monkeypatch, trt, "0.12.0", speculative_config=spec(heads))
    with pytest.raises(PlanError, match=r"option.max_beam_width=2: Medusa accepts one draft path"):
        compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(heads), max_beam_width=2)
    two = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=2)
    split = compile_options(
        settle(jit_config(tmp_path, speculative_config=spec(heads), tensor_parallel_degree=2), "trtllm")
    )
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
        ({"medusa_choices": [[0], [17]]}, r"medusa_choices=.*too large node degree"),
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


def test_the_engine_s_draft_tokens_are_the_tree_s_paths(trt, heads, tmp_path, monkeypatch, reference):
    """max_draft_len 63 with two heads: mc_sim_7b_63 cut to the heads holds fewer paths, and the engine is built
    with exactly that many draft tokens, which the tree then fills at start-up."""
    engine = compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config={**spec(heads), "max_draft_len": 63})
    paths = len(default_choices(63, 2))
    assert paths < 63
    config = json.loads((engine.path / "config.json").read_text())
    assert config["build_config"]["max_draft_len"] == config["pretrained_config"]["max_draft_len"] == paths


def test_an_engine_planned_without_the_medusa_mode_is_not_a_medusa_engine(trt, heads, tmp_path, monkeypatch):
    """builder.py 1.x (id 205252225) never sets the mode from a Medusa checkpoint: the plan must ask for it, and an
    engine built without it does not start Medusa."""
    from lmi_trt.compile.build import build_engine
    from lmi_trt.compile.plan import GpuFacts, make_plan
    from lmi_trt.stages import compile_options, settle

    monkeypatch.setenv("LMI_TRT_FAKE_RELEASE", "1.2.1")
    trt.__version__ = "1.2.1"
    hf_dir = tiny_model("llama")
    opts = compile_options(settle(jit_config(tmp_path, speculative_config=spec(heads)), "trtllm"))
    gpu = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
    plan = make_plan(opts, json.loads((hf_dir / "config.json").read_text()), gpu, "1.2.1")
    out = tmp_path / "no-mode"
    build_engine(plan.model_copy(update={"speculative_decoding_mode": None}), hf_dir, out)
    build = json.loads((out / "config.json").read_text())["build_config"]
    assert build["speculative_decoding_mode"] == 1  # NONE: the Medusa checkpoint did not force it
    with pytest.raises(TrtllmConfigError, match=r"needs an engine built with --speculative_decoding_mode medusa"):
        TrtllmEngine(out, medusa_settings(heads), eos_token_ids=[2])


def test_the_fake_loader_takes_the_medusa_checkpoint_as_pretrained_model_load_does(trt, heads, tmp_path, caplog):
    """modeling_utils.py PretrainedModel.load (1.x): an extra tensor is a warning, one of another shape an error."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
    from tensorrt_llm.models import MODEL_MAP

    from lmi_trt.compile.medusa import MedusaPlan, write_checkpoint

    base = MODEL_MAP["LlamaForCausalLM"].from_hugging_face(str(tiny_model("llama")), dtype="float16")
    checkpoint = tmp_path / "checkpoint"
    base.save_checkpoint(str(checkpoint))
    write_checkpoint(
        checkpoint, 0, MedusaPlan(heads_dir=str(heads), fingerprint="f", num_heads=2, num_layers=1), 6, "float16", "k"
    )
    shard = checkpoint / "rank0.safetensors"
    tensors = load_file(str(shard))
    with safe_open(str(shard), framework="pt") as f:
        meta = f.metadata()
    save_file({**tensors, "medusa_heads.2.lm_head.weight": torch.zeros(1)}, str(shard), metadata=meta)
    with caplog.at_level("WARNING", logger="tensorrt_llm"):
        MODEL_MAP["MedusaForCausalLM"].from_checkpoint(str(checkpoint), rank=0)
    assert "Provided but not required tensors: {'medusa_heads.2.lm_head.weight'}" in caplog.text
    bias = "medusa_heads.0.medusa_layers.0.linear.bias"
    save_file({**tensors, bias: torch.zeros(3)}, str(shard), metadata=meta)
    with pytest.raises(RuntimeError, match=rf"Encounter error .* for parameter '{bias}'"):
        MODEL_MAP["MedusaForCausalLM"].from_checkpoint(str(checkpoint), rank=0)


async def test_a_precompiled_medusa_engine_decodes_with_its_own_heads_and_refuses_others(trt, tmp_path, monkeypatch):
    """A precompiled Medusa engine carries the heads it was built with: served with Medusa's keys and no heads, its
    greedy text is transformers'; heads named beside it are a start-up error naming the key (fetched, never used)."""
    from transformers import AutoTokenizer

    from lmi_trt.config import LmiConfig
    from lmi_trt.errors import StartupError
    from lmi_trt.loader import load_model

    hf_dir = tiny_model("llama")
    text, _ = greedy_text_tokens(hf_dir, TEXT, 16)
    folder = medusa_heads(hf_dir, tmp_path / "heads", [AutoTokenizer.from_pretrained(hf_dir)(TEXT).input_ids])
    built = compiled(tmp_path, monkeypatch, trt, "1.2.1", speculative_config=spec(folder, medusa_choices=TREE))
    tree = {"decoding_type": "Medusa", "max_draft_len": 6, "medusa_choices": TREE}
    config = LmiConfig(
        model_id=str(built.engine_dir),
        tokenizer_id=str(hf_dir),
        rolling_batch="trtllm",
        backend="tensorrt",
        download_dir=tmp_path / "dl",
        speculative_config=tree,
    )
    async with jit_server(monkeypatch, trt, "1.2.1", config) as (server, s):
        await greedy_text_and_sampled_refusal(server, s, TEXT, text, "greedy")
    with pytest.raises(StartupError, match=r"speculative_model=.*heads built into it \(if it was built with Medusa\)"):
        await load_model(config.model_copy(update={"speculative_config": spec(folder, medusa_choices=TREE)}), "trtllm")
