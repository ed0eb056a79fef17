"""build + jit + commands through the fake tensorrt_llm (tests/fakes): layout, ranks, failures, CLI."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pytest
from s3server import s3_env, s3_server  # noqa: F401  (fixtures)

from lmi_trt.compile.build import BuildSettings, build_engine
from lmi_trt.compile.cache import EngineCache, read_manifest, verify_entry
from lmi_trt.compile.errors import BuildError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import GpuFacts, make_plan
from lmi_trt.properties import parse_properties
from lmi_trt.sources import detect_artifact

FAKES = Path(__file__).resolve().parents[1] / "fakes"
H100x2 = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=2)
SMALL = dict(max_input_len=128, max_output_len=64, max_batch_size=4)


def job(config):
    """The compile stage's input as serving builds it: settled for trtllm, viewed by the wiring."""
    from lmi_trt.stages import compile_job, settle

    return compile_job(settle(config, "trtllm"))


@pytest.fixture(autouse=True)
def fake_trtllm(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))  # spawned build workers inherit sys.path
    import tensorrt_llm

    return tensorrt_llm


@pytest.fixture(scope="module")
def tiny():
    import tinymodels

    return tinymodels.tiny_model("llama")


def installed() -> str:
    """The release the fake impersonates (LMI_TRT_FAKE_RELEASE; spawned build workers inherit it)."""
    import tensorrt_llm

    return tensorrt_llm.__version__


def plan_for(model: Path, version: str | None = None, gpu: GpuFacts = H100x2, **opts):
    hf = json.loads((model / "config.json").read_text())
    return make_plan(CompileOptions(**{**SMALL, **opts}), hf, gpu, version or installed())


def test_build_writes_the_precompiled_layout(tiny, tmp_path):
    plan = plan_for(tiny)
    out = tmp_path / "engine"
    seen: list[str] = []
    build_engine(
        plan,
        tiny,
        out,
        tokenizer_dir=tiny,
        progress=seen.append,
        properties={"option.max_input_len": 128, "option.model_id": "should-not-be-written", "option.quantize": None},
    )
    config = json.loads((out / "config.json").read_text())
    assert config["version"] == installed()
    assert config["pretrained_config"]["architecture"] == "LlamaForCausalLM"
    assert config["pretrained_config"]["dtype"] == "float16"
    built = config["build_config"]
    assert (built["max_input_len"], built["max_seq_len"], built["max_batch_size"], built["max_num_tokens"]) == (
        128,
        192,
        4,
        4 * 192,
    )
    # The plan's plugin settings (the release's own defaults differ: 64 blocks, no paged context FMHA in 0.12)
    assert built["plugin_config"]["tokens_per_block"] == plan.plugins.tokens_per_block
    assert built["plugin_config"]["use_paged_context_fmha"] is plan.plugins.use_paged_context_fmha
    assert (out / "rank0.engine").is_file()
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "hf_config.json",
        "build_plan.json",
        "serving.properties",
    ):
        assert (out / name).is_file(), name
    props = parse_properties((out / "serving.properties").read_text())
    assert "option.model_id" not in props and "option.quantize" not in props
    assert props["option.max_input_len"] == "128" and props["option.rolling_batch"] == "trtllm"
    assert props["option.tensor_parallel_degree"] == "1"
    assert seen[:3] == ["convert: rank 0", "build: rank 0", "save: rank 0"]
    artifact = detect_artifact(out, model_id="x")
    assert (artifact.kind, artifact.engine_layout, artifact.tokenizer_dir) == ("trtllm_engine", "llmapi", out.resolve())
    assert not list(tmp_path.glob(".lmi-trt-build-*"))


def test_tp2_builds_every_rank_in_parallel(tiny, tmp_path):
    plan = plan_for(tiny, tensor_parallel_degree=2)
    out = tmp_path / "engine"
    build_engine(plan, tiny, out, settings=BuildSettings(gpu_count=2))
    mapping = json.loads((out / "config.json").read_text())["pretrained_config"]["mapping"]
    assert (mapping["world_size"], mapping["tp_size"], mapping["pp_size"]) == (2, 2, 1)
    assert sorted(p.name for p in out.glob("rank*.engine")) == ["rank0.engine", "rank1.engine"]
    assert [json.loads((out / f"rank{r}.engine").read_bytes())["rank"] for r in (0, 1)] == [0, 1]


def test_rotary_override_reaches_the_converter_through_a_staged_config(tiny, tmp_path):
    plan = plan_for(tiny, rotary_base=500000.0)
    out = tmp_path / "engine"
    build_engine(plan, tiny, out)
    assert json.loads((out / "config.json").read_text())["pretrained_config"]["rotary_base"] == 500000.0
    assert _rope_theta(out / "hf_config.json") == 500000.0
    assert _rope_theta(tiny / "config.json") == 10000.0


def _rope_theta(config_file: Path) -> float:
    """transformers 5 keeps it in rope_parameters; the images' 4.x at the top level."""
    config = json.loads(config_file.read_text())
    return (config.get("rope_parameters") or config)["rope_theta"]


def test_weight_only_quantization_converts_directly(tiny, tmp_path):
    plan = plan_for(tiny, quantize="weights_int8")
    out = tmp_path / "engine"
    build_engine(plan, tiny, out)
    pretrained = json.loads((out / "config.json").read_text())["pretrained_config"]
    assert pretrained["quantization"]["quant_algo"] == "W8A16"
    plugins = json.loads((out / "config.json").read_text())["build_config"]["plugin_config"]
    assert plugins["weight_only_quant_matmul_plugin"] == "auto"


def test_native_smoothquant_calibrates_then_builds_from_the_checkpoint(tiny, tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("some calibration text\nmore text\n")
    plan = plan_for(
        tiny,
        quantize="smoothquant",
        smoothquant_per_token=True,
        smoothquant_per_channel=True,
        calib_dataset=str(calib),
        tensor_parallel_degree=2,
    )
    assert plan.quant.method == "trtllm_native"
    out = tmp_path / "engine"
    seen: list[str] = []
    build_engine(plan, tiny, out, settings=BuildSettings(gpu_count=2), progress=seen.append)
    assert seen[0] == "quantize: calibrating"
    quant = json.loads((out / "config.json").read_text())["pretrained_config"]["quantization"]
    assert (quant["quant_algo"], quant["smoothquant_val"]) == ("W8A8_SQ_PER_CHANNEL_PER_TOKEN_PLUGIN", 0.8)
    assert sorted(p.name for p in out.glob("rank*.engine")) == ["rank0.engine", "rank1.engine"]


def test_quantize_failure_names_the_stage(tiny, tmp_path):
    plan = plan_for(tiny, quantize="smoothquant", smoothquant_per_token=True, calib_dataset=str(tmp_path / "gone"))
    with pytest.raises(BuildError) as e:
        build_engine(plan, tiny, tmp_path / "engine")
    assert e.value.stage == "quantize" and e.value.rank is None and "gone" in str(e.value)


def test_convert_failure_names_stage_and_rank(tiny, tmp_path):
    plan = plan_for(tiny)
    wrong = plan.model_copy(update={"converter": plan.converter.model_copy(update={"trtllm_class": "GPTForCausalLM"})})
    with pytest.raises(BuildError) as e:
        build_engine(wrong, tiny, tmp_path / "engine")
    assert (e.value.stage, e.value.rank) == ("convert", 0)
    assert "maps LlamaForCausalLM to LLaMAForCausalLM" in str(e.value) and "convert (rank 0)" in str(e.value)


def test_build_failure_names_stage_and_rank(tiny, tmp_path):
    plan = plan_for(tiny, tensor_parallel_degree=2)
    # Paged context FMHA without context FMHA: set both, as 0.12's plan leaves paged context FMHA off.
    broken_plugins = plan.plugins.model_copy(update={"context_fmha": False, "use_paged_context_fmha": True})
    broken = plan.model_copy(update={"plugins": broken_plugins})
    with pytest.raises(BuildError) as e:
        build_engine(broken, tiny, tmp_path / "engine", settings=BuildSettings(workers=1))
    assert (e.value.stage, e.value.rank) == ("build", 0) and "use_paged_context_fmha" in str(e.value)
    assert multiprocessing.active_children() == []


def test_save_failure_names_stage_and_rank(tiny, tmp_path):
    out = tmp_path / "engine"
    (out / "rank0.engine").mkdir(parents=True)
    with pytest.raises(BuildError) as e:
        build_engine(plan_for(tiny), tiny, out)
    assert (e.value.stage, e.value.rank) == ("save", 0)


def test_limits_lowered_by_trtllm_are_an_error(tiny, tmp_path):
    plan = plan_for(tiny)
    unbuildable = plan.model_copy(update={"max_num_tokens": 10_000})  # above batch × seq: TRT-LLM lowers it
    with pytest.raises(BuildError, match="max_num_tokens 10000 → 768"):
        build_engine(unbuildable, tiny, tmp_path / "engine")


def test_timeout_kills_the_workers_and_names_the_stage(tiny, tmp_path):
    with pytest.raises(BuildError) as e:
        build_engine(plan_for(tiny), tiny, tmp_path / "engine", settings=BuildSettings(timeout_s=0.05))
    assert "timed out" in str(e.value) and e.value.stage == "convert" and e.value.rank == 0
    assert multiprocessing.active_children() == []


def test_failed_build_in_the_cache_leaves_nothing(tiny, tmp_path):
    plan = plan_for(tiny)
    cache = EngineCache(tmp_path / "cache")
    from lmi_trt.compile.cache import CacheKeyInputs

    inputs = CacheKeyInputs.from_plan("fp", plan, H100x2)
    # Paged context FMHA without context FMHA: set both, as 0.12's plan leaves paged context FMHA off.
    broken_plugins = plan.plugins.model_copy(update={"context_fmha": False, "use_paged_context_fmha": True})
    broken = plan.model_copy(update={"plugins": broken_plugins})
    with pytest.raises(BuildError):
        cache.get_or_build(inputs, lambda out: build_engine(broken, tiny, out), model_id="m")
    assert list((tmp_path / "cache" / "entries").iterdir()) == []
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []


# ------------------------------------------------------------------------------------------- JIT


def test_ensure_engine_builds_once_and_returns_an_engine_artifact(tiny, tmp_path, caplog):
    from lmi_trt.compile.jit import ensure_engine
    from lmi_trt.config import LmiConfig
    from lmi_trt.sources import resolve_model

    config = LmiConfig(
        model_id=str(tiny), max_input_len=128, max_output_len=64, max_rolling_batch_size=4, download_dir=tmp_path / "dl"
    )
    artifact = resolve_model(config)
    first = ensure_engine(job(config), artifact, gpu=H100x2, trtllm_version=installed())
    assert first.kind == "trtllm_engine" and first.tokenizer_dir is not None
    assert first.path.parent == tmp_path / "dl" / "trtllm-engines" / "entries"
    assert verify_entry(first.path, first.path.name) is None
    with caplog.at_level("INFO", logger="lmi_trt.compile"):
        second = ensure_engine(job(config), artifact, gpu=H100x2, trtllm_version=installed())
    assert second.path == first.path and "engine cache hit" in caplog.text
    changed = config.model_copy(update={"max_input_len": 256})
    with caplog.at_level("INFO", logger="lmi_trt.compile"):
        third = ensure_engine(job(changed), artifact, gpu=H100x2, trtllm_version=installed())
    assert third.path != first.path and "plan.max_input_len: 128 → 256" in caplog.text


def test_ensure_engine_plan_errors_come_before_any_build(tiny, tmp_path):
    from lmi_trt.compile.errors import PlanError
    from lmi_trt.compile.jit import ensure_engine
    from lmi_trt.config import LmiConfig
    from lmi_trt.sources import resolve_model

    config = LmiConfig(model_id=str(tiny), max_input_len=500, max_output_len=64, download_dir=tmp_path / "dl")
    with pytest.raises(PlanError, match="512 positions"):
        ensure_engine(job(config), resolve_model(config), gpu=H100x2, trtllm_version=installed())
    assert not (tmp_path / "dl" / "trtllm-engines").exists()


# ---------------------------------------------------------------------------------------- commands


def _cli(*argv: str) -> int:
    from lmi_trt.cli import main

    return main(list(argv))


def test_plan_command_json_and_text(tiny, capsys):
    rc = _cli(
        "plan",
        "--model-id",
        str(tiny),
        "--json",
        "--gpu",
        "l4",
        "-o",
        "option.max_input_len=256",
        "-o",
        "option.max_output_len=128",
    )
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["plan"]["max_input_len"] == 256 and report["plan"]["max_seq_len"] == 256 + 128
    assert report["gpu"]["sm"] == 89 and report["memory"]["kv_bytes_per_token"] == 256
    assert report["plan"]["trtllm_version"] == installed()  # the (fake) installed one
    assert (
        _cli(
            "plan",
            "--model-id",
            str(tiny),
            "--gpu",
            "h100",
            "--gpu-count",
            "2",
            "-o",
            "option.max_input_len=300",
            "-o",
            "option.max_output_len=100",
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "2× NVIDIA H100" in text and "max_seq_len 400" in text and "bytes/token" in text
    assert "--gpu h100" in text  # the assumption is stated


def test_plan_fits_unset_lengths_to_the_model_as_serve_does(tiny, capsys):
    """The tiny model has 512 positions, fewer than the 1024 + 512 defaults: plan follows the model with serve's own
    function (stages.fit_lengths), as serve does (test_first_run: 384 + 128), where it failed on the defaults."""
    from lmi_trt.config import LmiConfig
    from lmi_trt.loader import preflight

    assert _cli("plan", "--model-id", str(tiny), "--json", "--gpu", "h100") == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    served = preflight(LmiConfig(model_id=str(tiny), rolling_batch="torch"), "torch")
    assert (
        (plan["max_input_len"], plan["max_output_len"]) == (served.max_input_len, served.max_output_len) == (384, 128)
    )


def test_plan_command_needs_only_config_json_and_reports_what_does_not_fit(tmp_path, capsys):
    model = tmp_path / "mixtral"  # config.json only: no weights, no tokenizer
    model.mkdir()
    model.joinpath("config.json").write_text(
        json.dumps(
            {
                "architectures": ["MixtralForCausalLM"],
                "model_type": "mixtral",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
                "vocab_size": 32000,
                "max_position_embeddings": 32768,
                "torch_dtype": "bfloat16",
            }
        )
    )
    assert _cli("plan", "--model-id", str(model), "--gpu", "h100") == 2
    captured = capsys.readouterr()
    assert "LLaMAForCausalLM" in captured.out and re.search(r"weights +86\.99 GiB", captured.out)
    assert "exceed" in captured.err and "option.tensor_parallel_degree" in captured.err
    # TP 2 on an assumed host: the preset comes with the GPUs the configuration asks for
    assert _cli("plan", "--model-id", str(model), "--gpu", "h100", "-o", "option.tensor_parallel_degree=2") == 0
    assert "TP 2 × PP 1" in capsys.readouterr().out


def test_plan_command_error_names_the_key(tiny, capsys):
    assert (
        _cli(
            "plan",
            "--model-id",
            str(tiny),
            "--gpu",
            "a100-80gb",
            "-o",
            "option.quantize=fp8",
            "-o",
            "option.max_input_len=128",
            "-o",
            "option.max_output_len=64",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "option.quantize='fp8'" in err and "8.9" in err


def test_compile_command_to_a_folder(tiny, tmp_path, capsys):
    out = tmp_path / "compiled"
    rc = _cli(
        "compile",
        "--model-id",
        str(tiny),
        "--output",
        str(out),
        "--gpu",
        "h100",
        "--gpu-count",
        "2",
        "-o",
        "option.max_input_len=128",
        "-o",
        "option.max_output_len=64",
        "-o",
        "option.tensor_parallel_degree=2",
    )
    assert rc == 0, capsys.readouterr().err
    assert "option.model_id=" in capsys.readouterr().out
    manifest = read_manifest(out)
    assert manifest is not None and verify_entry(out) is None
    assert manifest.inputs.tp_size == 2 and {"rank0.engine", "rank1.engine"} <= set(manifest.files)
    props = parse_properties((out / "serving.properties").read_text())
    assert "option.model_id" not in props and props["option.tensor_parallel_degree"] == "2"
    assert detect_artifact(out, model_id=str(out)).kind == "trtllm_engine"
    assert not list(tmp_path.glob(".compiled.partial-*"))
    assert _cli("compile", "--model-id", str(tiny), "--output", str(out), "--gpu", "h100") == 2  # not empty
    assert "not an empty folder" in capsys.readouterr().err


def test_compile_command_to_s3_then_serve_resolves_it(tiny, tmp_path, s3_env, capsys):  # noqa: F811
    from lmi_trt.config import LmiConfig
    from lmi_trt.sources import resolve_model

    bucket = s3_env.new_bucket("aot")
    uri = f"s3://{bucket}/llama-tp1"
    rc = _cli(
        "compile",
        "--model-id",
        str(tiny),
        "--output",
        uri,
        "--gpu",
        "h100",
        "-o",
        "option.max_input_len=128",
        "-o",
        "option.max_output_len=64",
    )
    assert rc == 0, capsys.readouterr().err
    keys = {o["Key"] for o in s3_env.client().list_objects_v2(Bucket=bucket)["Contents"]}
    assert {
        "llama-tp1/config.json",
        "llama-tp1/rank0.engine",
        "llama-tp1/lmi_trt_manifest.json",
        "llama-tp1/tokenizer.json",
        "llama-tp1/serving.properties",
    } <= keys
    artifact = resolve_model(LmiConfig(model_id=uri, download_dir=tmp_path / "dl"))
    assert artifact.kind == "trtllm_engine" and artifact.engine_layout == "llmapi"


def test_compile_on_the_pytorch_backend_writes_the_calibrated_checkpoint(tiny, tmp_path, capsys):
    """No engine on the pytorch backend: the AOT artifact is option.quantize's modelopt HF checkpoint."""
    calib = tmp_path / "calib.txt"
    calib.write_text("The quick brown fox\nServing engines batch\n")
    out = tmp_path / "fp8"
    rc = _cli(
        "compile",
        "--model-id",
        str(tiny),
        "--output",
        str(out),
        "-o",
        "option.backend=pytorch",
        "-o",
        "option.quantize=fp8_kv",
        "-o",
        f"option.calib_dataset={calib}",
        "-o",
        "option.calib_size=2",
    )
    assert rc == 0, capsys.readouterr().err
    assert "without option.quantize" in capsys.readouterr().out
    quant = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert (quant["quant_algo"], quant["kv_cache_quant_algo"]) == ("FP8", "FP8")
    assert verify_entry(out) is None and read_manifest(out).inputs.gpu_name == "any"
    artifact = detect_artifact(out, model_id=str(out))
    assert artifact.kind == "hf_checkpoint" and artifact.tokenizer_dir == out
    rc = _cli("compile", "--model-id", str(tiny), "--output", str(tmp_path / "plain"), "-o", "option.backend=pytorch")
    assert rc == 2 and "no engine to compile" in capsys.readouterr().err


def test_compile_command_refuses_an_engine_as_input(tiny, tmp_path, capsys):
    engine = tmp_path / "engine"
    build_engine(plan_for(tiny), tiny, engine, tokenizer_dir=tiny)
    rc = _cli("compile", "--model-id", str(engine), "--output", str(tmp_path / "again"), "--gpu", "h100")
    assert rc == 2 and "is a trtllm engine, not a Hugging Face" in capsys.readouterr().err


def test_a_trtllm_checkpoint_is_built_without_conversion(tiny, tmp_path):
    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import LLaMAForCausalLM

    from lmi_trt.compile.jit import ensure_engine
    from lmi_trt.config import LmiConfig

    ckpt = tmp_path / "ckpt"
    for rank in range(2):  # what convert_checkpoint.py --tp_size 2 writes
        model = LLaMAForCausalLM.from_hugging_face(str(tiny), mapping=Mapping(world_size=2, rank=rank, tp_size=2))
        model.save_checkpoint(str(ckpt), save_config=rank == 0)
    artifact = detect_artifact(ckpt, model_id=str(ckpt))
    assert artifact.kind == "trtllm_checkpoint"
    config = LmiConfig(
        model_id=str(ckpt),
        max_input_len=128,
        max_output_len=64,
        max_rolling_batch_size=4,
        tensor_parallel_degree=2,
        download_dir=tmp_path / "dl",
    )
    engine = ensure_engine(job(config), artifact, gpu=H100x2, trtllm_version=installed())
    assert engine.kind == "trtllm_engine"
    assert sorted(p.name for p in engine.path.glob("rank*.engine")) == ["rank0.engine", "rank1.engine"]
    plan = json.loads((engine.path / "build_plan.json").read_text())
    assert plan["converter"]["source"] == "trtllm_checkpoint" and not (engine.path / "hf_config.json").exists()


def test_compile_on_a_release_without_the_executor(tiny, tmp_path, capsys, monkeypatch):
    """After 1.2 there is no TensorRT engine to build: auto calibrates (with option.quantize), tensorrt is refused."""
    import tensorrt_llm

    monkeypatch.setattr(tensorrt_llm, "__version__", "1.3.0")
    monkeypatch.setattr("lmi_trt.cli.compile.detect_trtllm_version", lambda: "1.3.0")
    rc = _cli(
        "compile",
        "--model-id",
        str(tiny),
        "--output",
        str(tmp_path / "x"),
        "-o",
        "option.backend=tensorrt",
        "-o",
        "option.quantize=fp8",
    )
    assert rc == 2 and "option.backend" in capsys.readouterr().err
    rc = _cli("compile", "--model-id", str(tiny), "--output", str(tmp_path / "y"))
    assert rc == 2 and "no engine to compile" in capsys.readouterr().err
