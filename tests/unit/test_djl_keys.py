"""DJL LMI's current TensorRT-LLM keys (issue 22, item 4): every key its LLM-API handler reads is accepted with DJL's
meaning, onto the same TensorRT-LLM ``LLM`` / ``KvCacheConfig`` / ``MoeConfig`` fields, or refused at startup naming
the key; none is "unknown, ignored".

The keys are DJL's, read from deepjavalibrary/djl-serving at master d21927c4 (2026-06-24; the same on the latest
release branch 0.36.0-lmi27-dlc, whose image runs TensorRT-LLM 1.0.0): engines/python/setup/djl_python/
properties_manager/trt_properties.py (last changed in db778683, 2025-11-10) ``TensorRtLlmProperties`` fields,
``get_kv_cache_config`` and ``get_pytorch_config``, and properties.py ``Properties`` (the base the handler reads);
serving/docs/lmi/deployment_guide/configurations.md for option.parallel_loading. DJL strips ``option.``.
"""

from __future__ import annotations

import logging

import pytest
from packaging.version import Version
from trtllm_testing import fake_tensorrt_llm

from lmi_trt import stages
from lmi_trt.config import REGISTRY, ConfigError, LmiConfig, StartupError, load_config
from lmi_trt.engines.llmapi import llm_configs, llm_plan
from lmi_trt.engines.registry import entry
from lmi_trt.engines.trtllm import TrtllmConfigError
from lmi_trt.keys import FIXED_KEYS

# TensorRtLlmProperties' own fields (get_llm_kwargs passes them to LLM(...)), with a value DJL would take.
DJL_FIELDS = {
    "tokenizer": "/models/tok",
    "tokenizer_mode": "auto",
    "skip_tokenizer_init": "false",
    "dtype": "auto",
    "revision": "main",
    "tokenizer_revision": "main",
    "pipeline_parallel_size": "1",
    "context_parallel_size": "1",
    "moe_tensor_parallel_size": "1",
    "moe_expert_parallel_size": "1",
    "enable_attention_dp": "false",
    "auto_parallel": "false",
    "load_format": "auto",
    "enable_chunked_prefill": "true",
    "guided_decoding_backend": "xgrammar",
    "iter_stats_max_iterations": "100",
    "request_stats_max_iterations": "10",
    "embedding_parallel_mode": None,  # refused whatever the value: see FIXED_KEYS
    "fast_build": "false",
    "enable_build_cache": "true",
    "batching_type": "inflight",
    "normalize_log_probs": "false",
    "gather_generation_logits": "false",
    "extended_runtime_perf_knob_config": None,
    "max_batch_size": "8",
    "max_input_len": "64",
    "max_seq_len": "2048",
    "max_beam_width": "1",
    "max_num_tokens": "8192",
    "backend": "pytorch",
    "auto_parallel_world_size": None,
}
# get_kv_cache_config: extra keys → KvCacheConfig(...).
DJL_KV_CACHE = {
    "enable_block_reuse": "true",
    "max_tokens": "4096",
    "max_attention_window": "[2048]",
    "sink_token_length": "4",
    "free_gpu_memory_fraction": "0.8",
    "host_cache_size": "1073741824",
    "onboard_blocks": "false",
    "cross_kv_cache_fraction": "0.5",
    "secondary_offload_min_priority": "30",
    "event_buffer_max_size": "16",
}
# get_pytorch_config (option.backend=pytorch): extra keys → PyTorchConfig, TorchLlmArgs fields since 1.0.
DJL_PYTORCH = {
    "enable_overlap_scheduler": "false",
    "kv_cache_dtype": "fp8",
    "attn_backend": "TRTLLM",
    "use_cuda_graph": "false",
    "moe_backend": "CUTLASS",
}
# Properties (djl_python/properties_manager/properties.py), the keys the TensorRT-LLM handler inherits.
DJL_BASE = {
    "model_id": "/models/m",
    "rolling_batch": "trtllm",
    "tensor_parallel_degree": "1",
    "cluster_size": "1",
    "trust_remote_code": "false",
    "enable_streaming": "false",
    "batch_size": "1",
    "max_rolling_batch_size": "8",
    "output_formatter": "json",
    "mpi_mode": "true",
    "tgi_compat": "false",
    "bedrock_compat": "false",
}
DJL_DOCS = {"parallel_loading": "false"}  # configurations.md
# Properties' speculative-decoding fields (draft_model_id, spec_length: 0 is its default, off).
DJL_SPECULATION = {"draft_model_id": "/models/draft", "spec_length": "0"}
EVERY_KEY = {**DJL_FIELDS, **DJL_KV_CACHE, **DJL_PYTORCH, **DJL_BASE, **DJL_DOCS, **DJL_SPECULATION}
# Left to their issue (LoRA: 27): Properties' enable_lora; and waiting_steps / lmcache_auto_config, which DJL's
# other handlers read.


def _key(name: str) -> str:
    return name if name in ("batch_size",) else f"option.{name}"


@pytest.mark.parametrize("name", sorted(EVERY_KEY))
def test_every_key_djl_reads_is_known(name, caplog):
    key = _key(name)
    assert key in {n for spec in REGISTRY for n in (spec.key, *spec.aliases)}, f"{key} is not a key lmi-trt knows"
    value = EVERY_KEY[name]
    given = {"option.model_id": "/models/m", key: value or "x"}
    if name == "tokenizer_revision":  # a revision of option.tokenizer_id's repo (DJL: LLM(tokenizer_revision=))
        given["option.tokenizer"] = "org/tokenizer"
    with caplog.at_level(logging.WARNING, logger="lmi_trt.config"):
        if value is None:  # a key lmi-trt refuses whatever the value: an error naming it, never "unknown"
            with pytest.raises(ConfigError, match=key):
                load_config(overrides=given)
        else:
            load_config(overrides=given)
    assert not [r for r in caplog.records if "unknown key" in r.getMessage()]


def _djl_config(**extra: str) -> LmiConfig:
    keys = {**DJL_KV_CACHE, **DJL_PYTORCH, "backend": "pytorch", "max_rolling_batch_size": "8", **extra}
    return stages.settle(load_config(overrides={"option.model_id": "/models/m", **keys}), "trtllm")


def test_djl_keys_reach_the_llm_fields_djl_gives_them():
    plan = llm_plan(
        stages.llmapi_settings(
            _djl_config(
                **{
                    k: DJL_FIELDS[k]
                    for k in (
                        "moe_tensor_parallel_size",
                        "moe_expert_parallel_size",
                        "enable_attention_dp",
                        "load_format",
                        "iter_stats_max_iterations",
                        "request_stats_max_iterations",
                        "enable_chunked_prefill",
                    )
                }
            )
        ),
        Version("1.2.1"),
    )
    assert plan.kv_cache_config == {
        "enable_block_reuse": True,
        "free_gpu_memory_fraction": 0.8,
        "max_tokens": 4096,
        "host_cache_size": 1073741824,
        "max_attention_window": [2048],
        "sink_token_length": 4,
        "onboard_blocks": False,
        "cross_kv_cache_fraction": 0.5,
        "secondary_offload_min_priority": 30,
        "event_buffer_max_size": 16,
        "dtype": "fp8",
    }
    assert plan.moe_config == {"backend": "CUTLASS"}
    assert plan.cuda_graph_config is None  # use_cuda_graph=false: TorchLlmArgs.cuda_graph_config=None
    kw = plan.keywords
    assert kw["disable_overlap_scheduler"] is True and kw["attn_backend"] == "TRTLLM"
    assert (kw["moe_tensor_parallel_size"], kw["moe_expert_parallel_size"], kw["enable_attention_dp"]) == (1, 1, False)
    assert (kw["load_format"], kw["iter_stats_max_iterations"], kw["request_stats_max_iterations"]) == ("auto", 100, 10)
    assert kw["enable_chunked_prefill"] is True and kw["max_batch_size"] == 8
    assert plan.options["kv_cache_config.dtype"] == "option.kv_cache_dtype"


def test_unset_keys_leave_tensorrt_llms_defaults():
    plan = llm_plan(
        stages.llmapi_settings(stages.settle(LmiConfig(model_id="m", backend="pytorch"), "trtllm")), Version("1.2.1")
    )
    assert not set(plan.keywords) & {"disable_overlap_scheduler", "attn_backend", "load_format", "enable_attention_dp"}
    assert plan.moe_config == {} and plan.cuda_graph_config is not None
    assert not set(plan.kv_cache_config) & {"dtype", "max_attention_window", "sink_token_length", "onboard_blocks"}


def test_aliases_are_the_keys_lmi_trt_already_has():
    config = load_config(
        overrides={
            "option.model_id": "m",
            "option.enable_block_reuse": "true",
            "option.free_gpu_memory_fraction": "0.7",
            "option.max_tokens": "1000",
            "option.host_cache_size": "2048",
            "option.pipeline_parallel_size": "2",
            "option.tokenizer": "/t",
        }
    )
    assert (config.enable_kv_cache_reuse, config.kv_cache_free_gpu_mem_fraction) == (True, 0.7)
    assert (config.max_tokens_in_paged_kv_cache, config.kv_cache_host_memory_bytes) == (1000, 2048)
    assert (config.pipeline_parallel_degree, config.tokenizer_id) == (2, "/t")
    assert config.label("enable_kv_cache_reuse") == "option.enable_block_reuse (option.enable_kv_cache_reuse)"
    with pytest.raises(ConfigError, match="sets option.enable_kv_cache_reuse twice"):
        load_config(
            overrides={
                "option.model_id": "m",
                "option.enable_block_reuse": "true",
                "option.enable_kv_cache_reuse": "false",
            }
        )


@pytest.mark.parametrize("spec", FIXED_KEYS, ids=lambda s: s.key)
def test_fixed_keys_take_lmi_trts_own_value_and_refuse_the_others(spec):
    other = {"`true` only": "false", "`false` only": "true", "`1` only": "2"}.get(spec.type.summary, "something")
    with pytest.raises(ConfigError, match=spec.key.replace(".", r"\.")):
        load_config(overrides={"option.model_id": "m", spec.key: other})
    if spec.type.summary != "refused":
        load_config(overrides={"option.model_id": "m", spec.key: spec.type.summary.split("`")[1].upper()})


@pytest.mark.parametrize(
    ("kind", "backend", "written", "value"),
    [
        ("torch", None, "option.host_cache_size", "1024"),  # enable_block_reuse: the torch decode loop honours it
        ("torch", None, "option.kv_cache_dtype", "fp8"),
        ("trtllm", "tensorrt", "option.use_cuda_graph", "false"),
        ("trtllm", "tensorrt", "option.moe_expert_parallel_size", "2"),
        ("trtllm", "tensorrt", "option.enable_overlap_scheduler", "true"),
    ],
)
def test_a_key_the_engine_cannot_honour_is_refused_naming_it_as_written(kind, backend, written, value):
    config = stages.settle(load_config(overrides={"option.model_id": "m", written: value}), kind)
    if backend:
        config = config.model_copy(update={"backend": backend})
    with pytest.raises(StartupError) as err:
        stages.refuse_ignored(entry(kind, config.backend), config)
    assert str(err.value).startswith(written)


def test_the_moe_split_must_be_the_tensor_parallel_degree():
    with pytest.raises(TrtllmConfigError, match="option.moe_expert_parallel_size=3 does not split"):
        llm_plan(
            stages.llmapi_settings(_djl_config(tensor_parallel_degree="4", moe_expert_parallel_size="3")),
            Version("1.2.1"),
        )
    plan = llm_plan(
        stages.llmapi_settings(_djl_config(tensor_parallel_degree="4", moe_expert_parallel_size="4")), Version("1.2.1")
    )
    assert plan.keywords["moe_expert_parallel_size"] == 4


@pytest.mark.parametrize(
    ("release", "extra", "refused"),
    [
        ("1.0.0", {"moe_backend": "TRITON"}, "option.moe_backend"),  # MoeConfig gains TRITON in 1.1
        ("1.1.0", {"moe_backend": "TRITON"}, None),
        ("1.2.1", {"moe_backend": "NOT_A_BACKEND"}, "option.moe_backend"),
        ("1.3.0", {"moe_backend": "MARLIN"}, None),
        ("1.2.1", {"attn_backend": "FLASHINFER"}, "option.attn_backend"),  # flashinfer is not installed here
    ],
)
def test_the_installed_release_checks_the_values_at_startup(release, extra, refused):
    """The release's own classes (KvCacheConfig, MoeConfig: pydantic, as in TensorRT-LLM) judge the values, before
    anything loads; the error names the option as DJL writes it."""
    with fake_tensorrt_llm(release):
        config = _djl_config(**extra)
        if refused is None:
            stages.check_release(entry("trtllm", config.backend), config)
            return
        with pytest.raises(TrtllmConfigError, match=refused.replace(".", r"\.")) as err:
            stages.check_release(entry("trtllm", config.backend), config)
        assert release in str(err.value) or "flashinfer" in str(err.value)


def test_llm_configs_name_a_field_the_release_lacks():
    with fake_tensorrt_llm("1.2.1"):
        import tensorrt_llm.llmapi

        plan = llm_plan(stages.llmapi_settings(_djl_config()), Version("1.2.1"))
        plan.origins["not_a_field"] = "option.some_key"
        with pytest.raises(TrtllmConfigError, match="option.some_key: TensorRT-LLM 1.2.1's LLM has no not_a_field"):
            llm_configs(tensorrt_llm.llmapi, plan, "1.2.1")


def test_tokenizer_revision_pins_the_tokenizer_repo_only(tmp_path):
    """DJL's LLM(tokenizer_revision=): the revision of option.tokenizer's hub repo; without a separate tokenizer, or
    for a folder or s3:// one, there is no repo to pin, and saying so beats ignoring it."""
    from tinymodels import tiny_model

    from lmi_trt.sources import SourceError, resolve_model, resolve_tokenizer

    with pytest.raises(ConfigError, match="option.tokenizer_revision='v2' pins option.tokenizer_id's hub repo"):
        load_config(overrides={"option.model_id": "m", "option.tokenizer_revision": "v2"})
    folder = str(tiny_model("llama"))
    config = load_config(
        overrides={
            "option.model_id": folder,
            "option.tokenizer": folder,
            "option.tokenizer_revision": "v2",
            "download_dir": str(tmp_path),
        }
    )
    with pytest.raises(SourceError, match="option.tokenizer_revision='v2' pins a Hugging Face repo"):
        resolve_tokenizer(config, resolve_model(config))
