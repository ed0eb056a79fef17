"""A serving.properties written as DJL documents for its TensorRT-LLM container today starts lmi-trt with its
meaning (issue 22, item 4): through the fake LLM API, the LLM receives DJL's values in the fields DJL gives them
(djl-serving djl_python/properties_manager/trt_properties.py; tests/unit/test_djl_keys.py lists every key), and a
key the chosen engine or the installed release cannot honour stops startup with exit 2 naming it."""

from __future__ import annotations

import os

import pytest
from cliserver import serve
from tinymodels import tiny_model
from trtllm_testing import fake_server_env, fake_tensorrt_llm

from lmi_trt.config import load_config
from lmi_trt.engines import choose_engine, probe_host
from lmi_trt.launch import plan_for
from lmi_trt.loader import load_model, preflight

pytestmark = pytest.mark.slow

# DJL's quick start for the TensorRT-LLM container (serving/docs/lmi/user_guides/trt_llm_user_guide.md) plus the
# LLM-API handler's keys (trt_properties.py: TensorRtLlmProperties fields, get_kv_cache_config, get_pytorch_config).
DJL_PROPERTIES = """\
engine=Python
option.mpi_mode=true
option.tensor_parallel_degree=max
option.model_id={model}
option.rolling_batch=trtllm
option.backend=pytorch
option.dtype=float32
option.max_rolling_batch_size=4
option.max_input_len=64
option.max_output_len=32
option.max_num_tokens=256
option.enable_chunked_prefill=true
option.enable_block_reuse=true
option.free_gpu_memory_fraction=0.5
option.max_tokens=512
option.host_cache_size=1048576
option.max_attention_window=[256]
option.sink_token_length=0
option.onboard_blocks=true
option.kv_cache_dtype=auto
option.moe_expert_parallel_size=1
option.enable_attention_dp=false
option.context_parallel_size=1
option.use_cuda_graph=true
option.enable_overlap_scheduler=false
option.attn_backend=TRTLLM
option.moe_backend=CUTLASS
option.load_format=auto
option.iter_stats_max_iterations=100
option.tokenizer_mode=auto
option.skip_tokenizer_init=false
option.guided_decoding_backend=xgrammar
option.enable_build_cache=true
option.pipeline_parallel_size=1
"""


@pytest.fixture(scope="module")
def hf_dir():
    return tiny_model("llama")


def _properties(tmp_path, hf_dir, text: str = DJL_PROPERTIES, **changes: str):
    lines = [line for line in text.format(model=hf_dir).splitlines() if line.split("=")[0] not in changes]
    path = tmp_path / "serving.properties"
    path.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in changes.items())]) + "\n")
    return path


async def test_the_llm_receives_djls_values(hf_dir, tmp_path, monkeypatch):
    """In-process, the load path as `lmi-trt serve` runs it: the fake LLM's arguments are TorchLlmArgs, validated as
    the real ones are (pydantic, unknown keys refused), so what it holds is what the release would get."""
    with fake_tensorrt_llm() as trt:
        import lmi_trt.engines.trtllm as trtllm_engine

        monkeypatch.setattr(trtllm_engine, "cuda_available", lambda: True)
        config = load_config(
            properties_file=_properties(tmp_path, hf_dir), env={}, overrides={"download_dir": str(tmp_path / "dl")}
        )
        kind, _ = choose_engine(config.rolling_batch, probe_host())
        config = preflight(config, kind)
        loaded = await load_model(config, kind, plan_for(config, kind, gpu_count=1))
        try:
            args = loaded.engine._llm.args
            kv = args.kv_cache_config
            assert (kv.enable_block_reuse, kv.free_gpu_memory_fraction, kv.max_tokens) == (True, 0.5, 512)
            assert (kv.host_cache_size, kv.max_attention_window, kv.sink_token_length) == (1048576, [256], 0)
            assert (kv.onboard_blocks, kv.dtype) == (True, "auto")
            assert (args.tensor_parallel_size, args.pipeline_parallel_size) == (1, 1)  # max: this host's GPU
            assert (args.moe_expert_parallel_size, args.enable_attention_dp, args.context_parallel_size) == (
                1,
                False,
                1,
            )
            assert args.enable_chunked_prefill is True and args.max_num_tokens == 256 and args.max_batch_size == 4
            assert args.cuda_graph_config is not None and args.disable_overlap_scheduler is True
            assert (args.attn_backend, args.moe_config.backend, args.load_format.name) == ("TRTLLM", "CUTLASS", "AUTO")
            assert args.iter_stats_max_iterations == 100 and args.dtype == "float32"
            assert args.tokenizer is loaded.tokenizer  # ours: the LLM loads no tokenizer files itself
            assert trt.__version__ == loaded.engine.tensorrt_llm_version
        finally:
            await loaded.engine.close()


def test_lmi_trt_serve_starts_from_djls_properties_and_answers(hf_dir, tmp_path):
    props = _properties(tmp_path, hf_dir)
    with serve(
        ["--properties", str(props), "-o", f"download_dir={tmp_path / 'dl'}"],
        tmp_path,
        env=fake_server_env(tmp_path, os.environ.get("LMI_TRT_FAKE_RELEASE") or "1.2.1"),
    ) as server:
        log = server.log()
        assert "unknown key" not in log and "ignored" not in log, log[-4000:]
        assert "TensorRT-LLM backend: pytorch (option.backend=pytorch)" in log, log[-4000:]
        body = {"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 4, "details": True}}
        r = server.post("/invocations", body)
        assert r.status_code == 200 and len(r.json()["details"]["tokens"]) == 4, r.text


@pytest.mark.parametrize(
    ("changes", "release", "named"),
    [
        # the torch engine has no host offload for its KV cache (a file with the DJL key alone on it)
        (
            {"text": "option.model_id={model}\noption.rolling_batch=torch\noption.host_cache_size=1048576"},
            None,
            "option.host_cache_size",
        ),
        # the Executor (tensorrt) backend: a pytorch-backend-only key
        ({"option.backend": "tensorrt"}, "1.2.1", "option.max_attention_window"),
        # MoeConfig's TRITON backend comes with 1.1 (tensorrt_llm/llmapi/llm_args.py)
        ({"option.moe_backend": "TRITON"}, "1.0.0", "option.moe_backend"),
        # a value lmi-trt cannot honour
        ({"option.context_parallel_size": "2"}, "1.2.1", "option.context_parallel_size"),
    ],
)
def test_a_key_the_engine_cannot_honour_exits_2_naming_it(hf_dir, tmp_path, changes, release, named):
    props = _properties(tmp_path, hf_dir, **changes)
    env = fake_server_env(tmp_path, release) if release else {}
    with serve(["--properties", str(props)], tmp_path, env=env, ready=False) as server:
        assert server.proc.wait(timeout=120) == 2, server.log()[-4000:]
        errors = [line for line in server.log().splitlines() if "ERROR" in line]
        assert errors and named in errors[-1], server.log()[-4000:]
