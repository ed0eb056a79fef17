"""The configuration stage: sources and precedence, env rules, validation, registry, logging, README table."""

import logging
import re
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from lmi_trt.config import (
    REGISTRY,
    ConfigError,
    LmiConfig,
    Quantization,
    env_key,
    load_config,
    load_config_from_environment,
    log_effective_config,
    nearest_key,
)
from lmi_trt.keys import FIXED_KEYS
from lmi_trt.log_redaction import MASK
from lmi_trt.options_table import README_END, README_START, render_options_table, replace_options_table

README = Path(__file__).resolve().parents[2] / "README.md"


def load(tmp_path: Path, properties: str | None = None, env=None, overrides=None) -> LmiConfig:
    if properties is not None:
        (tmp_path / "serving.properties").write_text(properties)
    return load_config(model_dir=tmp_path, env=env or {}, overrides=overrides)


@pytest.fixture
def config_log(caplog):
    caplog.set_level(logging.INFO, logger="lmi_trt.config")
    return caplog


# ------------------------------------------------------------------ environment rules


@pytest.mark.parametrize(
    "var, key",
    [
        ("OPTION_MAX_INPUT_LEN", "option.max_input_len"),
        ("OPTION_FOO_BAR_9", "option.foo_bar_9"),
        ("OPTION_entryPoint", "option.entryPoint"),  # mixed case kept as written
        ("OPTION_Max_Input_Len", "option.Max_Input_Len"),
        ("OPTION_ENTRYPOINT", "option.entryPoint"),
        ("OPTION_ENGINE", "engine"),  # plain key, no option. prefix
        ("SERVING_JOB_QUEUE_SIZE", "job_queue_size"),
        ("SERVING_LOAD_MODELS", "load_models"),
        ("OPTION_", None),
        ("HF_MODEL_ID", None),
        ("MY_OPTION_X", None),
    ],
)
def test_env_key(var, key):
    assert env_key(var) == key


def test_option_env_sets_the_key(tmp_path):
    config = load(tmp_path, env={"OPTION_MAX_INPUT_LEN": "2048", "OPTION_ROLLING_BATCH": "torch"})
    assert (config.max_input_len, config.rolling_batch) == (2048, "torch")


def test_mixed_case_option_env_is_not_lowercased(tmp_path):
    """DJL's rule keeps the case (option.Max_Input_Len is not option.max_input_len); being a typo of that key, it
    stops startup naming the variable to set rather than start with the default."""
    with pytest.raises(ConfigError, match=r"OPTION_Max_Input_Len \(option.Max_Input_Len\).*OPTION_MAX_INPUT_LEN"):
        load(tmp_path, env={"OPTION_Max_Input_Len": "2048"})


def test_option_engine_sets_engine_and_mpi_mode(tmp_path):
    config = load(tmp_path, env={"OPTION_ENGINE": "MPI"})
    assert (config.engine, config.mpi_mode) == ("MPI", True)


def test_empty_env_values_are_ignored(tmp_path):
    config = load(
        tmp_path,
        env={
            "OPTION_MAX_INPUT_LEN": "",
            "OPTION_MAX_ROLLING_BATCH_SIZE": "  ",
            "MAX_BATCH_SIZE": "8",
            "HF_REVISION": "",
        },
    )
    assert (config.max_input_len, config.max_rolling_batch_size, config.revision) == (1024, 8, None)


def test_hf_variables(tmp_path):
    config = load(
        tmp_path,
        env={
            "HF_MODEL_ID": "meta-llama/Llama-3.1-8B",
            "HF_REVISION": "v2",
            "HF_TOKEN": "hf_abc",
            "HF_MODEL_TRUST_REMOTE_CODE": "true",
        },
    )
    assert config.model_id == "meta-llama/Llama-3.1-8B"
    assert config.revision == "v2"
    assert isinstance(config.hf_token, SecretStr) and config.hf_token.get_secret_value() == "hf_abc"
    assert config.trust_remote_code is True


@pytest.mark.parametrize("value, expected", [("max", "max"), ("MAX", "max"), ("4", 4)])
def test_tensor_parallel_degree_env(tmp_path, value, expected):
    config = load(tmp_path, env={"TENSOR_PARALLEL_DEGREE": value, "PIPELINE_PARALLEL_DEGREE": "2"})
    assert (config.tensor_parallel_degree, config.pipeline_parallel_degree) == (expected, 2)


@pytest.mark.parametrize(
    "var, value, attr, expected",
    [
        ("SERVING_JOB_QUEUE_SIZE", "7", "job_queue_size", 7),
        ("SERVING_MAX_REQUEST_SIZE", "1000", "max_request_size", 1000),
        ("SERVING_DOWNLOAD_DIR", "/data/dl", "download_dir", Path("/data/dl")),
        ("DJL_CACHE_DIR", "/data/djl", "download_dir", Path("/data/djl")),
        ("HF_MODEL_QUANTIZE", "fp8", "quantize", Quantization.FP8),
        ("SM_NUM_GPUS", "8", "tensor_parallel_degree", 8),
        ("MAX_CONCURRENT_REQUESTS", "50", "job_queue_size", 50),
        ("MAX_BATCH_SIZE", "16", "max_rolling_batch_size", 16),
        ("MAX_BATCH_PREFILL_TOKENS", "4096", "max_num_tokens", 4096),
        ("CUDA_MEMORY_FRACTION", "0.8", "kv_cache_free_gpu_mem_fraction", 0.8),
        ("SAGEMAKER_MAX_REQUEST_SIZE", "2048", "max_request_size", 2048),
        ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6", "max_request_size", 6 * 1024 * 1024),
        ("SAGEMAKER_STARTUP_TIMEOUT", "900", "model_loading_timeout", 900),
        ("MODEL_LOADING_TIMEOUT", "1200", "model_loading_timeout", 1200),
        ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "60", "predict_timeout", 60),
        ("PREDICT_TIMEOUT", "30", "predict_timeout", 30),
    ],
)
def test_named_env_variables(tmp_path, var, value, attr, expected):
    assert getattr(load(tmp_path, env={var: value}), attr) == expected


@pytest.mark.parametrize(
    "lmi, alias, attr, expected",
    [
        (("OPTION_QUANTIZE", "awq"), ("HF_MODEL_QUANTIZE", "fp8"), "quantize", Quantization.AWQ),
        (("TENSOR_PARALLEL_DEGREE", "2"), ("SM_NUM_GPUS", "8"), "tensor_parallel_degree", 2),
        (("OPTION_TENSOR_PARALLEL_DEGREE", "1"), ("TENSOR_PARALLEL_DEGREE", "2"), "tensor_parallel_degree", 1),
        (("SERVING_JOB_QUEUE_SIZE", "10"), ("MAX_CONCURRENT_REQUESTS", "99"), "job_queue_size", 10),
        (("OPTION_MAX_ROLLING_BATCH_SIZE", "4"), ("MAX_BATCH_SIZE", "16"), "max_rolling_batch_size", 4),
        (
            ("OPTION_MAX_ROLLING_BATCH_PREFILL_TOKENS", "2048"),
            ("MAX_BATCH_PREFILL_TOKENS", "4096"),
            "max_num_tokens",
            2048,
        ),
        (
            ("OPTION_KV_CACHE_FREE_GPU_MEM_FRACTION", "0.5"),
            ("CUDA_MEMORY_FRACTION", "0.8"),
            "kv_cache_free_gpu_mem_fraction",
            0.5,
        ),
        (("OPTION_TRUST_REMOTE_CODE", "false"), ("HF_MODEL_TRUST_REMOTE_CODE", "true"), "trust_remote_code", False),
        (("SERVING_DOWNLOAD_DIR", "/a"), ("DJL_CACHE_DIR", "/b"), "download_dir", Path("/a")),
        (("SAGEMAKER_MAX_REQUEST_SIZE", "100"), ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "1"), "max_request_size", 100),
        (("OPTION_MODEL_LOADING_TIMEOUT", "5"), ("SAGEMAKER_STARTUP_TIMEOUT", "9"), "model_loading_timeout", 5),
        (("OPTION_PREDICT_TIMEOUT", "5"), ("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "9"), "predict_timeout", 5),
        (("OPTION_MODEL_ID", "a/b"), ("HF_MODEL_ID", "c/d"), "model_id", "a/b"),
    ],
)
def test_alias_applies_only_while_the_lmi_variable_is_unset(tmp_path, config_log, lmi, alias, attr, expected):
    assert getattr(load(tmp_path, env=dict([lmi, alias])), attr) == expected
    assert f"{alias[0]} is not applied" in config_log.text
    assert getattr(load(tmp_path, env={alias[0]: alias[1]}), attr) != expected


def test_same_source_aliases_that_disagree_are_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"env sets option\.quantize twice.*OPTION_QUANTIZATION_TYPE='fp8'"):
        load(tmp_path, env={"OPTION_QUANTIZE": "awq", "OPTION_QUANTIZATION_TYPE": "fp8"})
    with pytest.raises(
        ConfigError,
        match=r"serving\.properties sets option\.quantize twice, as "
        r"option\.quantize='fp8' and quantization_type='smooth_quant'",
    ):
        load(tmp_path, "option.model_id=x\noption.quantize=fp8\nquantization_type=smooth_quant\n")


def test_same_source_aliases_that_agree_are_fine(tmp_path):
    config = load(tmp_path, "option.model_id=x\noption.quantize=fp8\noption.quantization_type=fp8\n")
    assert config.quantize is Quantization.FP8


# ------------------------------------------------------------------ precedence


def test_file_wins_over_env(tmp_path):
    config = load(
        tmp_path,
        "option.model_id=file/model\noption.max_input_len=100\n",
        env={"HF_MODEL_ID": "env/model", "OPTION_MAX_INPUT_LEN": "200", "OPTION_MAX_OUTPUT_LEN": "300"},
    )
    assert (config.model_id, config.max_input_len, config.max_output_len) == ("file/model", 100, 300)


def test_file_alias_wins_over_env_canonical(tmp_path):
    config = load(
        tmp_path,
        "option.model_id=x\nmax_batch_size=8\n",
        env={"OPTION_MAX_ROLLING_BATCH_SIZE": "4", "MAX_BATCH_SIZE": "2"},
    )
    assert config.max_rolling_batch_size == 8


def test_overrides_win_over_file_and_env(tmp_path):
    config = load(
        tmp_path,
        "option.model_id=x\noption.max_input_len=100\n",
        env={"OPTION_MAX_INPUT_LEN": "200", "OPTION_MAX_OUTPUT_LEN": "300", "SERVING_JOB_QUEUE_SIZE": "5"},
        overrides={"option.max_input_len": "400", "max_output_len": "500", "job_queue_size": "6"},
    )
    assert (config.max_input_len, config.max_output_len, config.job_queue_size) == (400, 500, 6)


def test_empty_value_resets_to_default_and_hides_lower_sources(tmp_path):
    config = load(tmp_path, "option.model_id=x\noption.quantize=\n", env={"OPTION_QUANTIZE": "fp8"})
    assert config.quantize is None
    config = load(tmp_path, "option.model_id=x\noption.max_input_len=100\n", overrides={"option.max_input_len": ""})
    assert config.max_input_len == 1024


def test_env_is_only_what_is_passed(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTION_MAX_INPUT_LEN", "777")
    assert load(tmp_path, env={}).max_input_len == 1024
    config = load_config_from_environment(model_dir=tmp_path, overrides={"option.model_id": "x"})
    assert config.max_input_len == 777


# ------------------------------------------------------------------ model dir semantics


def test_model_dir_serving_properties_is_read(tmp_path):
    config = load(tmp_path, "option.model_id=org/m\noption.max_input_len=64\n")
    assert (config.model_id, config.model_dir, config.max_input_len) == ("org/m", tmp_path, 64)


def test_model_dir_without_model_id_is_the_model(tmp_path):
    config = load(tmp_path, "option.max_input_len=64\n")
    assert (config.model_id, config.model_dir) == (None, tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    assert (load(bare).model_id, load(bare).model_dir) == (None, bare)  # no serving.properties needed either


def test_explicit_properties_file(tmp_path):
    (tmp_path / "serving.properties").write_text("option.max_input_len=1\n")
    other = tmp_path / "sub"
    other.mkdir()
    (other / "custom.properties").write_text("option.max_input_len=2\n")
    config = load_config(properties_file=other / "custom.properties", env={})
    assert (config.max_input_len, config.model_dir) == (2, other)
    config = load_config(properties_file=other / "custom.properties", model_dir=tmp_path, env={})
    assert (config.max_input_len, config.model_dir) == (2, tmp_path)


def test_missing_paths_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="properties file .*nope.properties.* does not exist"):
        load_config(properties_file=tmp_path / "nope.properties", env={})
    with pytest.raises(ConfigError, match="model dir .*missing.* is not a directory"):
        load_config(model_dir=tmp_path / "missing", env={})


def test_no_model_at_all_is_an_error_except_for_synthetic():
    with pytest.raises(ConfigError, match="no model: set option.model_id"):
        load_config(env={})
    assert load_config(env={}, overrides={"option.rolling_batch": "synthetic"}).model_id is None


def test_properties_syntax_error_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"serving\.properties: line 2: malformed"):
        load(tmp_path, "option.model_id=x\noption.chat_template=\\u12\n")


def test_latin1_file_falls_back_like_java(tmp_path):
    (tmp_path / "serving.properties").write_bytes(b"option.model_id=x\noption.chat_template=caf\xe9\n")
    assert load_config(model_dir=tmp_path, env={}).chat_template == "café"


def test_duplicate_keys_warn_and_last_wins(tmp_path, config_log):
    config = load(tmp_path, "option.model_id=x\noption.max_input_len=1\n\noption.max_input_len=2\n")
    assert config.max_input_len == 2
    assert "option.max_input_len is set on lines 2 and 4" in config_log.text


# ------------------------------------------------------------------ values and validation


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("true", True),
        ("TRUE", True),
        ("True", True),
        ("1", True),
        ("yes", True),
        ("YES", True),
        ("false", False),
        ("False", False),
        ("0", False),
        ("no", False),
        ("No", False),
        (" true ", True),
    ],
)
def test_booleans(tmp_path, raw, expected):
    assert load(tmp_path, f"option.model_id=x\noption.tgi_compat={raw}\n").tgi_compat is expected


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("smoothquant", Quantization.SMOOTHQUANT),
        ("smooth_quant", Quantization.SMOOTHQUANT),
        ("awq", Quantization.AWQ),
        ("AWQ", Quantization.AWQ),
        ("fp8", Quantization.FP8),
        ("fp8_kv", Quantization.FP8_KV),
        ("weights_int8", Quantization.WEIGHTS_INT8),
        ("weights_kv_int8", Quantization.WEIGHTS_INT8_KV_INT8),
        ("weights_int4", Quantization.WEIGHTS_INT4),
        ("weights_kv_int4", Quantization.WEIGHTS_INT4_KV_INT8),
        ("weights_int4_kv_int8", Quantization.WEIGHTS_INT4_KV_INT8),
        ("no_quant", None),
        ("none", None),
    ],
)
@pytest.mark.parametrize("key", ["option.quantize", "quantization_type", "option.quantization_type"])
def test_quantization_names(tmp_path, key, raw, expected):
    assert load(tmp_path, f"option.model_id=x\n{key}={raw}\n").quantize is expected


@pytest.mark.parametrize(
    "line, attr, expected",
    [
        ("option.dtype=bfloat16", "dtype", "bf16"),
        ("option.dtype=float16", "dtype", "fp16"),
        ("option.dtype=FP32", "dtype", "fp32"),
        ("engine=mpi", "engine", "MPI"),
        ("option.tensor_parallel_degree=max", "tensor_parallel_degree", "max"),
        ("option.engine_cache_uri=s3://bucket/engines/", "engine_cache_uri", "s3://bucket/engines"),
        ("option.engine_cache_uri=/cache/engines", "engine_cache_uri", "/cache/engines"),
        ("option.awq_block_size=64", "awq_block_size", 64),
        ("option.tokens_per_block=64", "tokens_per_block", 64),
        ("option.calib_dataset=/data/calib.jsonl", "calib_dataset", Path("/data/calib.jsonl")),
        ("option.batch_scheduler_policy=GUARANTEED_NO_EVICT", "batch_scheduler_policy", "guaranteed_no_evict"),
    ],
)
def test_value_normalisation(tmp_path, line, attr, expected):
    assert getattr(load(tmp_path, f"option.model_id=x\n{line}\n"), attr) == expected


@pytest.mark.parametrize(
    "alias, attr, value, expected",
    [
        ("option.awq_format", "q_format", "w4a8_awq", "w4a8_awq"),
        ("awq_calib_size", "calib_size", "64", 64),
        ("tokenizer_repository", "tokenizer_id", "org/tok", "org/tok"),
        ("engine_repository", "model_id", "org/engine", "org/engine"),
        ("tensor_parallel_count", "tensor_parallel_degree", "2", 2),
        ("pipeline_parallel_count", "pipeline_parallel_degree", "2", 2),
        ("max_batch_size", "max_rolling_batch_size", "32", 32),
        ("option.max_batch_size", "max_rolling_batch_size", "32", 32),
        ("enable_chunked_prefill", "enable_chunked_context", "true", True),
        ("option.engine", "engine", "MPI", "MPI"),
    ],
)
def test_aliases(tmp_path, alias, attr, value, expected):
    assert getattr(load(tmp_path, f"{alias}={value}\n"), attr) == expected


def test_truss_plugin_configuration_json(tmp_path):
    config = load(
        tmp_path,
        'option.model_id=x\nplugin_configuration={"paged_kv_cache": true, '
        '"use_paged_context_fmha": true, "use_fp8_context_fmha": false}\n'
        'option.quantize=fp8\nquantization_config={"calib_size": 256}\n',
    )
    assert (config.use_paged_context_fmha, config.use_fp8_context_fmha, config.calib_size) == (True, False, 256)
    with pytest.raises(ConfigError, match="plugin_configuration='paged' .* is not a JSON object"):
        load(tmp_path, "option.model_id=x\nplugin_configuration=paged\n")
    with pytest.raises(ConfigError, match="sets option.use_paged_context_fmha twice"):
        load(
            tmp_path,
            "option.model_id=x\noption.use_paged_context_fmha=false\n"
            'plugin_configuration={"use_paged_context_fmha": true}\n',
        )


def test_truss_groups_from_the_environment(tmp_path, caplog):
    config = load(tmp_path, env={"OPTION_PLUGIN_CONFIGURATION": '{"use_paged_context_fmha": false, "gemm": 1}'})
    assert config.use_paged_context_fmha is False
    assert "unknown key OPTION_PLUGIN_CONFIGURATION.gemm (plugin_configuration.gemm)='1' (env)" in caplog.text


@pytest.mark.parametrize(
    "source, written, value, fragment",
    [
        ("file", "option.max_input_len", "abc", "is not an integer; set a positive integer such as 2048"),
        ("file", "option.max_input_len", "0", "is out of range; set a positive integer"),
        ("file", "option.max_input_len", "1.5", "is not an integer"),
        ("file", "option.trust_remote_code", "maybe", "is not a boolean; set true or false"),
        ("file", "option.kv_cache_free_gpu_mem_fraction", "1.5", "is out of range; set a number > 0 and < 1"),
        # TensorRT-LLM's KvCacheConfig: freeGpuMemoryFraction < 1.F (lmi_trt.vocabulary.FREE_FRACTION_BELOW)
        ("file", "option.kv_cache_free_gpu_mem_fraction", "1", "is out of range; set a number > 0 and < 1"),
        ("file", "option.draft_kv_cache_free_gpu_mem_fraction", "1.0", "is out of range; set a number > 0 and < 1"),
        ("file", "option.kv_cache_free_gpu_mem_fraction", "most", "is not a number"),
        ("file", "option.dtype", "int8", "is not one of: auto, fp16, bf16, fp32"),
        ("file", "option.quantize", "int3", "is not one of: none, no_quant, smoothquant"),
        ("file", "option.rolling_batch", "vllm", "served by other LMI containers; this container serves TensorRT-LLM"),
        ("file", "option.rolling_batch", "lmi-dist", "use one of: auto, trtllm, torch, synthetic"),
        ("file", "engine", "DeepSpeed", "is another DJL engine"),
        ("file", "engine", "trtllm", "set option.rolling_batch=trtllm instead"),
        ("file", "option.tensor_parallel_degree", "two", "is not a positive integer or 'max'"),
        ("file", "option.engine_cache_uri", "gs://bucket/x", "is not an s3://bucket/prefix URI or a local path"),
        ("file", "option.paged_kv_cache", "false", "cannot be false"),
        ("file", "option.tokens_per_block", "100", "is not one of: 8, 16, 32, 64, 128, 256"),
        ("file", "option.batch_scheduler_policy", "fifo", "is not one of: max_utilization, guaranteed_no_evict"),
        ("file", "option.output_formatter", "3p", "is not one of: json, jsonlines, sse"),
        ("file", "option.awq_block_size", "32", "is not one of: 64, 128"),
        ("file", "option.device", "tpu", "is not one of: auto, cpu, cuda"),
        ("file", "option.rotary_scaling_factor", "1", "is out of range; set a number > 1"),
        ("file", "option.synthetic_tokens_per_second", "inf", "is out of range; set a number ≥ 0"),
        ("file", "max_batch_size (option.max_rolling_batch_size)", "x", "is not an integer"),
        ("env", "OPTION_MAX_INPUT_LEN (option.max_input_len)", "abc", "is not an integer"),
        ("env", "HF_MODEL_TRUST_REMOTE_CODE (option.trust_remote_code)", "perhaps", "is not a boolean"),
        ("env", "ENABLE_CUDA_GRAPHS (option.enforce_eager)", "maybe", "is not a boolean"),
        ("env", "SAGEMAKER_MAX_PAYLOAD_IN_MB (max_request_size)", "lots", "is not an integer"),
        ("env", "SM_NUM_GPUS (option.tensor_parallel_degree)", "0", "is not a positive integer or 'max'"),
        ("override", "max_output_len (option.max_output_len)", "-3", "is out of range"),
    ],
)
def test_invalid_values_name_key_value_and_what_works(tmp_path, source, written, value, fragment):
    name = written.split(" ")[0]
    env, text, overrides = {}, "option.model_id=x\n", None
    if source == "file":
        text += f"{name}={value}\n"
    elif source == "env":
        env = {name: value}
    else:
        overrides = {name: value}
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, env=env, overrides=overrides)
    message = str(info.value)
    assert message.startswith(f"{written}={value!r} "), message
    assert fragment in message
    assert isinstance(info.value, ValueError)


def test_the_documented_message_exactly(tmp_path):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "option.model_id=x\noption.max_input_len=abc\n")
    assert str(info.value) == "option.max_input_len='abc' is not an integer; set a positive integer such as 2048"


@pytest.mark.parametrize(
    "lines, fragments",
    [
        (
            ["option.rotary_scaling_type=linear"],
            ["option.rotary_scaling_type='linear' needs option.rotary_scaling_factor", "set both"],
        ),
        (["option.rotary_scaling_factor=2.0"], ["option.rotary_scaling_factor='2.0' needs option.rotary_scaling_type"]),
        (
            ["option.max_input_len=2048", "option.max_seq_len=2048"],
            ["option.max_seq_len=2048 leaves no room for output after option.max_input_len=2048"],
        ),
        (
            ["option.max_input_len=4096", "option.max_num_tokens=2048"],
            ["option.max_num_tokens=2048 is below option.max_input_len=4096", "enable_chunked_context=true"],
        ),
        (
            ["max_batch_size=8", "option.max_num_sequences=16"],
            ["option.max_num_sequences=16 exceeds max_batch_size (option.max_rolling_batch_size)=8"],
        ),
        (
            ["option.enable_kv_cache_reuse=true", "option.use_paged_context_fmha=false"],
            ["option.enable_kv_cache_reuse=true needs paged context attention", "option.use_paged_context_fmha=false"],
        ),
    ],
)
def test_cross_field_errors(tmp_path, lines, fragments):
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "\n".join(["option.model_id=x", *lines]))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_cross_field_combinations_that_work(tmp_path):
    config = load(
        tmp_path,
        "option.model_id=x\noption.rotary_scaling_type=dynamic\noption.rotary_scaling_factor=4\n"
        "option.max_input_len=4096\noption.max_num_tokens=2048\noption.enable_chunked_context=true\n"
        "option.max_seq_len=8192\nmax_batch_size=8\noption.max_num_sequences=8\n",
    )
    assert (config.rotary_scaling_type, config.rotary_scaling_factor, config.max_seq_len) == ("dynamic", 4.0, 8192)


# ------------------------------------------------------------------ unknown, ignored and inapplicable keys


@pytest.mark.parametrize(
    "env, text, overrides, expected",
    [
        (
            {},
            "option.max_input_length=5\n",
            None,
            "unknown key option.max_input_length='5' (serving.properties) "
            "is ignored; did you mean option.max_input_len?",
        ),
        ({}, "max_input_len=5\n", None, "did you mean option.max_input_len?"),
        (
            {"OPTION_KV_CACHE_FREE_GPU_MEMORY_FRACTION": "0.5"},
            "",
            None,
            "unknown key OPTION_KV_CACHE_FREE_GPU_MEMORY_FRACTION (option.kv_cache_free_gpu_memory_fraction)='0.5' "
            "(env) is ignored; did you mean option.kv_cache_free_gpu_mem_fraction?",
        ),
        ({"SERVING_JOB_QUEUE": "5"}, "", None, "did you mean job_queue_size?"),
        (
            {},
            "option.zzzz=1\n",
            None,
            "unknown key option.zzzz='1' (serving.properties) is ignored; see the configuration table in README.md",
        ),
    ],
)
def test_unknown_keys_warn_with_the_nearest_key(tmp_path, caplog, env, text, overrides, expected):
    config = load(tmp_path, "option.model_id=x\n" + text, env=env, overrides=overrides)
    assert config.max_input_len == 1024
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert expected in "\n".join(warnings)


@pytest.mark.parametrize(
    "env, text, overrides, expected",
    [
        ({}, "option.max_imput_len=100\n", None, "option.max_imput_len (serving.properties) is within a typo of "
         "option.max_input_len: spell it option.max_input_len"),
        ({}, "", {"option.max_bach_size": "5"}, "within a typo of option.max_batch_size"),
        ({}, "", {"max_ouput_len": "5"}, "unknown key max_ouput_len (override) is within a typo of "
         "option.max_output_len"),
        ({"OPTION_TENSOR_PARALEL_DEGREE": "2"}, "", None, "spell it OPTION_TENSOR_PARALLEL_DEGREE"),
        ({}, "option.rolling_bach=torch\n", None, "option.rolling_batch"),
    ],
)  # fmt: skip
def test_a_key_within_a_typo_of_a_known_key_stops_startup_naming_it(tmp_path, env, text, overrides, expected):
    """Starting with the default instead would hide the mistake (the key looked set, and was not)."""
    with pytest.raises(ConfigError) as err:
        load(tmp_path, "option.model_id=x\n" + text, env=env, overrides=overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


# Keys and variables DJL-Serving's LMI documentation uses (deepjavalibrary/djl-serving serving/docs/lmi/**/*.md and
# serving/docs/*.md, snapshot of 2026-06-24) that lmi-trt does not know: another container's keys, warned about and
# ignored, never taken for typos (SERVING_MIN_WORKERS is DJL's variable for minWorkers, which is accepted).
DJL_KEYS_UNKNOWN_HERE = [
    "option.async_mode", "option.cpu_offload_gb", "option.cpu_offload_gb_per_gpu", "option.enable_lora",
    "option.enable_prefix_caching", "option.enable_streaming", "option.gpu_memory_utilization",
    "option.kv_transfer_config", "option.limit_mm_per_prompt", "option.long_lora_scaling_factors",
    "option.lora_extra_vocab_size", "option.low_cpu_mem_usage", "option.max_cpu_loras", "option.max_lora_rank",
    "option.max_loras", "option.max_model_len", "option.max_num_batched_tokens", "option.normalize",
    "option.parallel_loading", "option.quantization", "option.speculative_config", "option.task",
    "option.tokenizer_mode", "option.save_mp_checkpoint_path", "option.speculative_draft_model",
]  # fmt: skip
DJL_VARIABLES_UNKNOWN_HERE = [
    "OPTION_DEVICE_MAP", "OPTION_ENABLE_EXPERT_PARALLEL", "OPTION_ENABLE_STATEFUL_SESSIONS", "OPTION_ENTRY_POINT",
    "OPTION_FULLY_SHARDED_LORAS", "OPTION_LMCACHE_AUTO_CONFIG", "OPTION_LMCACHE_CONFIG_FILE", "OPTION_LORA_DTYPE",
    "OPTION_MODEL_FORMAT", "OPTION_SESSIONS_EXPIRATION", "OPTION_SESSIONS_PATH", "OPTION_SKOPS_TRUSTED_TYPES",
    "OPTION_TRUST_INSECURE_MODEL_FILES", "OPTION_USE_PASSIVE_WORKERS", "SERVING_CACHE_BATCH",
    "SERVING_CACHE_MULTITENANT", "SERVING_DDB_CACHE", "SERVING_DDB_TABLE_NAME", "SERVING_FAIL_FAST",
    "SERVING_HEALTH_CHECK_OVERRIDE", "SERVING_LOAD_MODEL", "SERVING_MAX_WORKERS", "SERVING_MEMORY_CACHE_CAPACITY",
    "SERVING_MIN_WORKERS", "SERVING_OPTS", "SERVING_PROMETHEUS", "SERVING_RETRY_THRESHOLD", "SERVING_VERSION",
]  # fmt: skip


def test_djl_keys_this_server_does_not_know_are_not_taken_for_typos(tmp_path, caplog):
    known = {name for spec in REGISTRY for name in (spec.key, *spec.aliases)}
    keys = [k for k in DJL_KEYS_UNKNOWN_HERE if k not in known]  # those not declared since
    variables = [v for v in DJL_VARIABLES_UNKNOWN_HERE if env_key(v) not in known]
    assert keys and variables
    text = "".join(f"{key}=1\n" for key in keys)
    load(tmp_path, "option.model_id=x\n" + text, env={var: "1" for var in variables})
    warned = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for name in keys + variables:
        assert f"unknown key {name}" in warned, name


def test_nearest_key():
    assert nearest_key("option.quantise") == "option.quantize"
    assert nearest_key("tensor_parallel_degree") == "option.tensor_parallel_degree"
    assert nearest_key("option.nothing_like_it_at_all") is None


@pytest.mark.parametrize(
    "line",
    [
        "option.entryPoint=djl_python.tensorrt_llm",
        "option.entrypoint=model.py",
        "batch_size=4",
        "max_batch_delay=100",
        "minWorkers=1",
        "maxWorkers=2",
        "gpu.minWorkers=1",
        "log_request_metric=true",
        "chunked_read_timeout=300",
        "option.bedrock_compat=true",
        "option.paged_kv_cache=true",
    ],
)
def test_ignored_djl_keys_are_logged_with_the_reason(tmp_path, caplog, line):
    key = line.split("=")[0]
    load(tmp_path, f"option.model_id=x\n{line}\n")
    warning = next(r.getMessage() for r in caplog.records if key in r.getMessage())
    assert "accepted for compatibility and ignored: " in warning
    assert "unknown" not in warning


def test_ignored_keys_are_still_validated(tmp_path):
    with pytest.raises(ConfigError, match="batch_size='many' is not an integer"):
        load(tmp_path, "option.model_id=x\nbatch_size=many\n")


def test_ignored_env_variables(tmp_path, caplog):
    load(tmp_path, env={"OPTION_ENTRYPOINT": "djl_python.tensorrt_llm", "SERVING_FEATURES": "trtllm"})
    text = caplog.text
    assert "OPTION_ENTRYPOINT (option.entryPoint)='djl_python.tensorrt_llm' is accepted" in text
    assert "SERVING_FEATURES (features)='trtllm' is accepted for compatibility and ignored" in text


def test_mpi_mode_is_accepted_with_a_note(tmp_path, config_log):
    config = load(tmp_path, "option.model_id=x\noption.mpi_mode=true\n")
    assert config.mpi_mode is True
    assert "option.mpi_mode='true': lmi-trt launches MPI ranks" in config_log.text


def test_quantization_knobs_without_their_quantization_warn(tmp_path, caplog):
    load(tmp_path, "option.model_id=x\noption.quantize=fp8\noption.smoothquant_alpha=0.5\noption.q_format=int4_awq\n")
    assert "option.smoothquant_alpha is set but has no effect without option.quantize=smoothquant" in caplog.text
    assert "option.q_format is set but has no effect without option.quantize=awq" in caplog.text
    caplog.clear()
    load(tmp_path, "option.model_id=x\noption.quantize=weights_int4\noption.calib_size=64\n")
    assert "option.calib_size is set but has no effect" in caplog.text
    caplog.clear()
    load(
        tmp_path, "option.model_id=x\noption.quantize=smoothquant\noption.smoothquant_alpha=0.5\noption.calib_size=64\n"
    )
    assert "no effect" not in caplog.text


# ------------------------------------------------------------------ the model, the registry, compile-time values

STUB_FIELDS = {
    "model_id": None,
    "model_dir": None,
    "revision": None,
    "trust_remote_code": False,
    "hf_token": None,
    "tokenizer_id": None,
    "download_dir": Path("/tmp/.lmi-trt"),
    "rolling_batch": "auto",
    "dtype": "auto",
    "device": "auto",
    "tensor_parallel_degree": 1,
    "pipeline_parallel_degree": 1,
    "max_rolling_batch_size": None,
    "max_input_len": 1024,
    "max_output_len": 512,
    "max_num_tokens": None,
    "job_queue_size": 1000,
    "output_formatter": None,
    "tgi_compat": False,
    "chat_template": None,
    "model_loading_timeout": 1800,
    "predict_timeout": 240,
    "max_request_size": 64 * 1024 * 1024,
}


def test_stub_contract_is_kept():
    fields = LmiConfig.model_fields
    assert {name: fields[name].default for name in STUB_FIELDS} == STUB_FIELDS


def test_config_is_frozen_and_strict():
    config = LmiConfig(model_id="x")
    with pytest.raises(ValidationError):
        config.max_input_len = 5
    with pytest.raises(ValidationError):
        LmiConfig(not_a_field=1)


def test_every_field_is_a_registry_key_and_back():
    attrs = [s.attr for s in REGISTRY if s.attr]
    assert len(attrs) == len(set(attrs))
    assert set(attrs) == set(LmiConfig.model_fields) - {"model_dir"}
    for spec in REGISTRY:
        assert spec.description and spec.description[-1] != "."
        # no field: a DJL key accepted and ignored, refused, or one whose only value is what lmi-trt always does
        assert (spec.attr is None) == (spec.ignored is not None or spec.refused is not None or spec in FIXED_KEYS), (
            spec.key
        )
        assert not (spec.compile_time and spec.attr is None), spec.key


REQUIRED_KEYS = """
engine option.model_id option.revision option.trust_remote_code option.tensor_parallel_degree
option.pipeline_parallel_degree option.rolling_batch option.max_rolling_batch_size option.mpi_mode option.dtype
option.entryPoint option.output_formatter option.tgi_compat option.bedrock_compat option.model_loading_timeout
option.predict_timeout job_queue_size batch_size max_batch_delay minWorkers maxWorkers chunked_read_timeout
log_request_metric metrics_aggregation max_request_size download_dir
option.max_input_len option.max_output_len option.max_num_tokens option.tokens_per_block option.batch_scheduler_policy
option.kv_cache_free_gpu_mem_fraction option.max_num_sequences option.enable_trt_overlap option.enable_kv_cache_reuse
option.use_custom_all_reduce option.baichuan_model_version option.chatglm_model_version option.gpt_model_version
option.use_fused_mlp option.rotary_base option.rotary_dim option.rotary_scaling_type option.rotary_scaling_factor
option.logits_dtype option.trtllm_checkpoint_path option.num_checkpoint_workers option.num_engine_workers
option.load_by_shard option.max_draft_len option.quantize option.smoothquant_alpha option.smoothquant_per_token
option.smoothquant_per_channel option.multi_query_mode option.q_format option.calib_size option.calib_batch_size
option.awq_block_size option.use_fp8_context_fmha option.calib_dataset
option.enable_chunked_context option.multi_block_mode option.max_tokens_in_paged_kv_cache option.max_beam_width
option.device option.engine_cache_uri option.compile_timeout option.tokenizer_id option.chat_template
option.synthetic_tokens_per_second option.hf_token
""".split()


def test_registry_covers_the_reference_keys():
    keys = {s.key for s in REGISTRY}
    assert [k for k in REQUIRED_KEYS if k not in keys] == []


def test_compile_time_values():
    base = LmiConfig(model_id="x")
    values = base.compile_time_values()
    assert {
        "option.max_input_len",
        "option.max_output_len",
        "option.dtype",
        "option.quantize",
        "option.tensor_parallel_degree",
        "option.max_rolling_batch_size",
        "option.enable_kv_cache_reuse",
    } <= set(values)
    assert not {
        "option.kv_cache_free_gpu_mem_fraction",
        "job_queue_size",
        "option.model_id",
        "option.hf_token",
        "option.trtllm_checkpoint_path",
        "option.batch_scheduler_policy",
    } & set(values)
    assert values["option.max_input_len"] == 1024
    assert LmiConfig(model_id="x", quantize=Quantization.FP8).compile_time_values()["option.quantize"] == "fp8"
    assert LmiConfig(model_id="x", max_input_len=2048).compile_time_values() != values
    assert LmiConfig(model_id="y", kv_cache_free_gpu_mem_fraction=0.5, job_queue_size=3).compile_time_values() == values


# ------------------------------------------------------------------ secrets and the effective-config log

SECRETS = {
    "HF_TOKEN": "hf_topsecret1",
    "AWS_SECRET_ACCESS_KEY": "awssecret2",
    "AWS_SESSION_TOKEN": "session3",
    "AWS_ACCESS_KEY_ID": "AKIAKEYID4",
    "SERVING_DB_PASSWORD": "hunter5",
    "OPTION_API_KEY": "apikey6",
}


def test_secrets_are_masked_in_the_logged_config(tmp_path, caplog):
    env = {**SECRETS, "OPTION_MAX_NUM_TOKENS": "8192", "AWS_REGION": "us-west-2"}
    config = load(tmp_path, "option.model_id=x\n", env=env)
    assert config.hf_token.get_secret_value() == "hf_topsecret1"
    logger = logging.getLogger("test.effective")
    caplog.set_level(logging.INFO)
    log_effective_config(config, logger)
    records = [r for r in caplog.records if r.name == "test.effective"]
    assert len(records) == 1
    text = caplog.text
    for secret in SECRETS.values():
        assert secret not in text
    for var in SECRETS:
        assert f"{var}={MASK}" in text
    assert "option.hf_token = ****  [env HF_TOKEN]" in text
    assert "option.max_num_tokens = 8192  [env OPTION_MAX_NUM_TOKENS]" in text  # TOKENS is not a secret
    assert "OPTION_MAX_NUM_TOKENS=8192" in text and "AWS_REGION=us-west-2" in text
    assert "option.model_id = x  [serving.properties]" in text
    assert "job_queue_size = 1000  [default]" in text


def test_redacted_masks_the_token():
    redacted = LmiConfig(model_id="x", hf_token=SecretStr("hf_abc")).redacted()
    assert redacted["hf_token"] == MASK and "hf_abc" not in str(redacted)
    assert redacted["download_dir"] == "/tmp/.lmi-trt" and redacted["max_input_len"] == 1024


def test_secret_values_are_masked_in_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"override sets option\.hf_token twice") as info:
        load(tmp_path, overrides={"hf_token": "tok_a", "option.hf_token": "tok_b"})
    assert "tok_a" not in str(info.value) and "tok_b" not in str(info.value)


def test_secret_values_are_masked_in_warnings_and_left_out_of_errors(tmp_path, caplog):
    load(tmp_path, env={"OPTION_HF_TOKEN_EXTRA": "tok_c"})
    assert "OPTION_HF_TOKEN_EXTRA" in caplog.text and "tok_c" not in caplog.text
    with pytest.raises(ConfigError) as err:  # a typo of option.hf_token: refused, and its value never shown
        load(tmp_path, overrides={"option.hf_tokn": "tok_e"})
    assert "option.hf_tokn" in str(err.value) and "tok_e" not in str(err.value) + caplog.text


# ------------------------------------------------------------------ README table


def test_readme_table_matches_the_registry():
    readme = README.read_text()
    assert readme.count(README_START) == 1 and readme.count(README_END) == 1
    table = readme[readme.index(README_START) + len(README_START) : readme.index(README_END)].strip()
    assert table == render_options_table(), "README is stale: run `python -m lmi_trt.options_table` to regenerate it"
    assert replace_options_table(readme) == readme


def test_options_table_shape():
    rows = render_options_table().splitlines()
    assert len(rows) == len(REGISTRY) + 2
    for row in rows:
        assert len(re.findall(r"(?<!\\)\|", row)) == 6, row
    joined = "\n".join(rows)
    assert "| `option.max_input_len` | `OPTION_MAX_INPUT_LEN` | `1024` | yes |" in joined
    assert "| `job_queue_size` | `SERVING_JOB_QUEUE_SIZE`, `MAX_CONCURRENT_REQUESTS` | `1000` | no |" in joined
    assert "`option.quantization_type`" in joined and "Ignored: " in joined


def test_every_key_in_the_example_properties_is_served(tmp_path):
    """serving.properties.example's keys, set or commented out, are declared keys (not ignored ones), and the
    file with every commented key switched on still loads."""
    example = Path(__file__).resolve().parents[2] / "serving.properties.example"
    lines = re.findall(r"^#? ?(option\.\w+=.*)$", example.read_text(), flags=re.M)
    served = {spec.key for spec in REGISTRY if spec.attr is not None}
    assert {line.split("=", 1)[0] for line in lines} <= served
    switched_on = [line for line in lines if not line.startswith("option.engine_cache_uri")]  # s3: no network
    (tmp_path / "serving.properties").write_text("\n".join(switched_on) + "\n")
    config = load_config(properties_file=tmp_path / "serving.properties", env={})
    assert config.enable_auto_tool_choice and config.tool_call_parser == "hermes"
