"""option.backend: the pure choice per release and artifact, and the launch plan of the pytorch backend."""

from __future__ import annotations

import pytest

from lmi_trt.config import StartupError, load_config
from lmi_trt.engines import TrtllmFacts, choose_backend
from lmi_trt.launch import LaunchError, plan_launch

R012 = TrtllmFacts("0.12.0", has_executor=True)
R12 = TrtllmFacts("1.2.1", has_executor=True)
R13 = TrtllmFacts("1.3.0", has_executor=False)


@pytest.mark.parametrize(
    "backend,facts,artifact,expected",
    [
        ("auto", R012, "hf_checkpoint", "tensorrt"),
        ("auto", R012, "trtllm_engine", "tensorrt"),
        ("auto", R12, "trtllm_engine", "tensorrt"),
        ("auto", R12, "hf_checkpoint", "pytorch"),
        ("auto", R13, "hf_checkpoint", "pytorch"),
        ("tensorrt", R12, "hf_checkpoint", "tensorrt"),
        ("pytorch", R12, "hf_checkpoint", "pytorch"),
        ("pytorch", R13, "hf_checkpoint", "pytorch"),
    ],
)
def test_choice(backend, facts, artifact, expected):
    chosen, why = choose_backend(backend, facts, artifact)
    assert chosen == expected and why


@pytest.mark.parametrize(
    "backend,facts,artifact,problem",
    [
        ("pytorch", R012, "hf_checkpoint", "no PyTorch LLM API"),
        ("pytorch", R12, "trtllm_engine", "precompiled TensorRT engine"),
        ("tensorrt", R13, "hf_checkpoint", "has none"),
        ("auto", R13, "trtllm_engine", "has none"),
    ],
)
def test_what_a_release_cannot_serve_names_the_key(backend, facts, artifact, problem):
    with pytest.raises(StartupError, match=problem) as info:
        choose_backend(backend, facts, artifact)
    assert info.value.key == "option.backend" and info.value.value == backend


def test_quantize_picks_the_backend_that_loads_its_format():
    """FP8, FP8 KV and AWQ are modelopt checkpoints the PyTorch backend loads (auto keeps it); the other formats
    are TensorRT-engine ones (auto picks tensorrt where the release has it, else a StartupError naming the key)."""
    for q in ("fp8", "fp8_kv", "awq"):
        assert choose_backend("auto", R12, "hf_checkpoint", q)[0] == "pytorch"
        assert choose_backend("auto", R13, "hf_checkpoint", q)[0] == "pytorch"
        assert choose_backend("pytorch", R12, "hf_checkpoint", q)[0] == "pytorch"
    assert choose_backend("auto", R12, "hf_checkpoint", "smoothquant") == (
        "tensorrt",
        "auto: option.quantize=smoothquant is a TensorRT-engine format",
    )
    assert choose_backend("tensorrt", R12, "hf_checkpoint", "fp8")[0] == "tensorrt"
    for backend, facts in (("pytorch", R12), ("auto", R13)):
        with pytest.raises(StartupError, match="use fp8, fp8_kv or awq") as info:
            choose_backend(backend, facts, "hf_checkpoint", "weights_int8")
        assert info.value.key == "option.quantize"


def test_key_spelling_and_refusal():
    assert load_config(env={}, overrides={"option.model_id": "x", "option.backend": "pytorch"}).backend == "pytorch"
    with pytest.raises(ValueError, match="option.backend"):
        load_config(env={}, overrides={"option.model_id": "x", "option.backend": "_autodeploy"})


def test_pytorch_backend_runs_tp_in_one_process():
    plan = plan_launch(4, 1, 4, "trtllm", "pytorch")
    assert (plan.mpi_ranks, plan.trtllm_mode, plan.copies) == (0, None, ((0, 1, 2, 3),))
    assert any("starts the 4 TP×PP workers itself" in n for n in plan.notes)
    assert plan_launch(4, 1, 4, "trtllm").mpi_ranks == 4  # TensorRT engines: one MPI rank each
    assert "stay idle" in " ".join(plan_launch(2, 1, 4, "trtllm", "pytorch").notes)
    with pytest.raises(LaunchError, match="needs 4 GPUs"):
        plan_launch(4, 1, 2, "trtllm", "pytorch")


def plan_argv(version: str, *options: str) -> list[str]:
    """`lmi-trt plan` of the tiny Llama on an H100 for ``version``, with ``options`` (KEY=VALUE)."""
    from tinymodels import tiny_model

    argv = ["plan", "--model-id", str(tiny_model("llama")), "--gpu", "h100", "--trtllm-version", version]
    return argv + [arg for option in options for arg in ("-o", option)]


@pytest.mark.parametrize("version,backend", [("0.12.0", "tensorrt"), ("1.2.1", "pytorch"), ("1.3.0", "pytorch")])
def test_plan_command_says_what_the_backend_will_do(version, backend, capsys):
    import json

    from lmi_trt.cli import main

    argv = plan_argv(version, "option.max_input_len=256", "option.max_output_len=128")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"]["name"] == backend and report["memory"]["kv_bytes_per_token"] > 0
    keywords = report["backend"]["llm_keywords"]
    assert (keywords is None) is (backend == "tensorrt")
    if keywords:
        # max_seq_len is TensorRT-LLM's (from the checkpoint) unless option.max_seq_len sets it
        assert keywords["max_input_len"] == 256 and "max_seq_len" not in keywords
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"backend        {backend} (auto:" in text and ("LLM keywords" in text) is (backend == "pytorch")
    assert ("converter" in text) is (backend == "tensorrt")


@pytest.mark.parametrize(("version", "backend"), [("1.2.1", "pytorch"), ("1.1.0", "tensorrt")])
def test_plan_with_lora_plans_each_backends_lora(capsys, version, backend):
    import json

    from lmi_trt.cli import main

    argv = plan_argv(version, "option.enable_lora=true", f"option.backend={backend}", "option.max_loras=2")
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    if backend == "tensorrt":  # the LoRA plugin built in (compile.lora), the Executor's PEFT cache counted
        assert report["plan"]["plugins"]["lora_plugin"] == report["plan"]["dtype"]
        assert report["plan"]["lora"]["max_lora_rank"] == 16 and report["plan"]["lora"]["max_loras"] == 2
        assert any("PEFT cache for option.max_loras=2" in note for note in report["memory"]["notes"])
        return
    keywords = report["backend"]["llm_keywords"]
    assert keywords["lora_config"]["max_loras"] == 2 and keywords["cuda_graph_config"] is None
    assert "max_lora_rank 16 × 2 layers × 7 modules × max_loras 2 = 448 units of" in report["assumption"]
    assert "MiB of device memory" in report["assumption"]


def test_the_llm_peft_cache_note_counts_the_widest_modules_weights():
    from types import SimpleNamespace

    from lmi_trt.cli.plan import lora_cache_note

    llama3_8b = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "intermediate_size": 14336}
    note = lora_cache_note(
        SimpleNamespace(max_lora_rank=16, max_loras=4), llama3_8b | {"torch_dtype": "bfloat16"}, "1.2.1"
    )
    # 16 × 32 × 7 × 4 = 14,336 units of 4,096 + 14,336 values, 2 bytes each: 528,482,304 bytes
    assert "= 14,336 units of 18,432 bfloat16 values" in note and "504.0 MiB" in note
