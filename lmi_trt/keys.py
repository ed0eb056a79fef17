"""Every configuration key, declared once: ``LmiConfig``'s fields, each annotated with its ``KeySpec``.

A key's declaration is its field: the value type (how serving.properties and the environment write it, and the
bounds it takes), its default, its description, aliases, whether it is compile-time, the note or "ignored
because". ``REGISTRY`` is derived from those fields plus ``IGNORED_KEYS`` (DJL keys with no field); the README
table, the parser (``lmi_trt.config``) and the validation read it.

Each stage's settings are a view of these declarations (``reads``): a settings class names the keys it reads,
under its own name where it has one, and takes their types, bounds and defaults from here; the wiring
(``lmi_trt.stages``) fills it from a configuration. A new option is one field here, and its name in the
``reads`` of the stages that take it (vLLM's per-subsystem configs are the model: ``EngineArgs`` takes each
field's default from ``CacheConfig``, ``ModelConfig``, ..., and ``get_kwargs`` derives the flag's type and help
from the same declaration; vllm-project/vllm vllm/engine/arg_utils.py, vllm/config/).

A leaf below the stages: it reads nothing (the loading, and the one read of the environment, are
``lmi_trt.config``'s) and imports only the engine registry's names and the vocabularies.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, create_model

from lmi_trt import reasoning_parsers, tool_parsers
from lmi_trt.engines.registry import BACKEND_NAMES, ENGINE_NAMES, entry
from lmi_trt.log_redaction import MASK
from lmi_trt.speculative import METHODS as SPECULATIVE_METHODS
from lmi_trt.speculative import SPELLINGS as SPECULATIVE_SPELLINGS
from lmi_trt.speculative import parse_json_object
from lmi_trt.vocabulary import (
    AWQ_BLOCK_SIZES,
    BAICHUAN_VERSIONS,
    CHATGLM_VERSIONS,
    FREE_FRACTION_BELOW,
    GPT_VARIANTS,
    KV_CACHE_FREE_GPU_MEM_FRACTION,
    QUANTIZE_NAMES,
    TOKENS_PER_BLOCK,
    Quantization,
)

if TYPE_CHECKING:
    from typing_extensions import Self  # typing's from Python 3.11; the 0.12 image runs 3.10

# --------------------------------------------------------------------------------------------
# Value types: each parses a stripped, non-empty string or raises _BadValue with the hint.


class _BadValue(Exception):
    """Carries the second half of a ConfigError message: 'is not ...; set ...'."""


@dataclass(frozen=True)
class ValueType:
    summary: str  # for the options table, e.g. "integer ≥ 1"
    parse: Callable[[str], Any]
    # The range ``parse`` enforces, as pydantic's field constraints (``("ge", 1)``): what a stage's settings view
    # of the key checks (``reads``), so a value built in code meets the same bounds as one written in a file.
    bounds: tuple[tuple[str, Any], ...] = ()


def _integer(minimum: int = 1, example: int = 2048) -> ValueType:
    what = {0: "a non-negative integer", 1: "a positive integer"}.get(minimum, f"an integer ≥ {minimum}")

    def parse(raw: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", raw):
            raise _BadValue(f"is not an integer; set {what} such as {example}")
        value = int(raw)
        if value < minimum:
            raise _BadValue(f"is out of range; set {what} such as {example}")
        return value

    return ValueType(f"integer ≥ {minimum}", parse, (("ge", minimum),))


def _number(
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
    example: float,
) -> ValueType:
    low = f"> {above:g}" if above is not None else f"≥ {at_least:g}"
    high = f" and ≤ {at_most:g}" if at_most is not None else f" and < {below:g}" if below is not None else ""
    what = f"a number {low}{high}"

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise _BadValue(f"is not a number; set {what} such as {example:g}") from None
        in_low = value > above if above is not None else value >= at_least
        in_high = (at_most is None or value <= at_most) and (below is None or value < below)
        if not (math.isfinite(value) and in_low and in_high):
            raise _BadValue(f"is out of range; set {what} such as {example:g}")
        return value

    low_bound = ("gt", above) if above is not None else ("ge", at_least)
    high_bound = (("le", at_most),) if at_most is not None else (("lt", below),) if below is not None else ()
    return ValueType(what.removeprefix("a "), parse, (low_bound, ("allow_inf_nan", False), *high_bound))


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def parse_bool(raw: str) -> bool:
    """true/false/1/0/yes/no, case-insensitive; raises _BadValue otherwise."""
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise _BadValue("is not a boolean; set true or false (1/0 and yes/no work too)")


_BOOL = ValueType("boolean", parse_bool)


def _choice(
    names: Mapping[str, Any], *, shown: Iterable[str] | None = None, rejected: Mapping[str, str] | None = None
) -> ValueType:
    """Case-insensitive choice; ``names`` maps each accepted spelling to its value."""
    lookup = {k.lower(): v for k, v in names.items()}
    listed = tuple(shown if shown is not None else names)
    refused = {k.lower(): v for k, v in (rejected or {}).items()}

    def parse(raw: str) -> Any:
        lowered = raw.lower()
        if lowered in lookup:
            return lookup[lowered]
        if lowered in refused:
            raise _BadValue(f"{refused[lowered]}; use one of: {', '.join(listed)}")
        raise _BadValue(f"is not one of: {', '.join(listed)}")

    return ValueType("one of " + ", ".join(f"`{name}`" for name in listed), parse)


def _same(*values: Any) -> dict[str, Any]:
    return {str(v): v for v in values}


def _text_parse(raw: str) -> str:
    return raw


def _path_parse(raw: str) -> Path:
    return Path(raw).expanduser()


def _secret_parse(raw: str) -> SecretStr:
    return SecretStr(raw)


def _parallel_degree(raw: str) -> int | str:
    if raw.lower() == "max":
        return "max"  # the launcher resolves it to the visible GPU count (÷ PP)
    try:
        return _integer(1, 2).parse(raw)
    except _BadValue:
        raise _BadValue("is not a positive integer or 'max'; set e.g. 4, or max for all GPUs") from None


def _cache_uri(raw: str) -> str:
    if "://" in raw:
        if not re.fullmatch(r"s3://[^/]+(/.*)?", raw):
            raise _BadValue("is not an s3://bucket/prefix URI or a local path; set e.g. s3://my-bucket/engines")
        return raw.rstrip("/")
    return str(Path(raw).expanduser())


def _json_object(raw: str) -> dict[str, Any]:
    try:
        return parse_json_object(raw)
    except ValueError as e:
        raise _BadValue(f'{e}; write one object, e.g. {{"decoding_type": "NGram", "max_draft_len": 4}}') from None


def _only_true(raw: str) -> bool:
    if not parse_bool(raw):
        raise _BadValue("cannot be false: in-flight batching needs a paged KV cache; remove the key")
    return True


def _only(value: str, why: str) -> ValueType:
    """A DJL key whose one accepted value is what lmi-trt always does; any other is refused with ``why``
    (``why`` reads after the value: "is ...")."""

    def parse(raw: str) -> str:
        same = raw.lower() == value
        if not same and value in ("true", "false"):
            try:
                same = parse_bool(raw) == (value == "true")
            except _BadValue:
                pass
        if not same and value.isdigit() and re.fullmatch(r"[+-]?\d+", raw):
            same = int(raw) == int(value)
        if not same:
            raise _BadValue(f"{why}; set {value} or remove the key")
        return value

    return ValueType(f"`{value}` only", parse)


def _positive_ints(raw: str) -> tuple[int, ...]:
    """A JSON list of positive integers, read with ``json.loads`` as DJL reads option.max_attention_window."""
    what = "a non-empty JSON list of positive integers such as [4096] or [4096, 32768]"
    try:
        value = json.loads(raw)
    except ValueError:
        raise _BadValue(f"is not JSON; set {what}") from None
    if not (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise _BadValue(f"is not {what}")
    return tuple(value)


def _name_upper(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", raw):
        raise _BadValue("is not a backend name; set e.g. CUTLASS")
    return raw.upper()


def _api_keys(raw: str) -> SecretStr:
    """One key, or several separated by commas (vLLM takes several --api-key values: any of them is
    accepted, for rotation); each as clients send it after ``Bearer ``: printable ASCII, no spaces."""
    keys = [k.strip() for k in raw.split(",")]
    if any(not k for k in keys):
        raise _BadValue("has an empty key; set one key, or several separated by commas")
    if any(not re.fullmatch(r"[\x21-\x7e]+", k) for k in keys):
        raise _BadValue("has a key with a space or a character outside printable ASCII, which no HTTP header carries")
    return SecretStr(",".join(keys))


_TEXT = ValueType("string", _text_parse)
_PATH = ValueType("path", _path_parse)
_SECRET = ValueType("secret string", _secret_parse)
_TP = ValueType("integer ≥ 1 or max", _parallel_degree)
_CACHE_URI = ValueType("path or s3:// URI", _cache_uri)
_TRUE_ONLY = ValueType("`true`", _only_true)
_INT_LIST = ValueType("JSON list of positive integers", _positive_ints)
_BACKEND_NAME = ValueType("name (upper case)", _name_upper)
_API_KEYS = ValueType("secret string(s), comma-separated", _api_keys)

# DJL's other LMI backends: a clear refusal instead of "not one of".
_OTHER_BACKENDS = {
    name: "is served by other LMI containers; this container serves TensorRT-LLM (trtllm) or torch"
    for name in (
        "vllm",
        "lmi-dist",
        "lmi_dist",
        "deepspeed",
        "scheduler",
        "neuronx",
        "tnx",
        "hf-accelerate",
        "lmi-dist-v2",
    )
}
# DJL's request-at-a-time mode (LmiConfigRecommender sets it for dynamic batching): refused at
# startup rather than accepted and not honoured.
_NO_DISABLE = (
    "is DJL's request-at-a-time mode, which no engine here has: every engine batches in flight "
    "(size it with option.max_rolling_batch_size)"
)
_DJL_ENGINES = {
    **{
        name: "is another DJL engine; this container runs engine=Python (or MPI) and picks the model "
        "backend with option.rolling_batch"
        for name in ("deepspeed", "pytorch", "onnxruntime", "tensorflow", "mxnet", "fastertransformer", "onnx")
    },
    **{
        name: f"is a model backend, not a DJL engine; set option.rolling_batch={name} instead"
        for name in ("auto", *ENGINE_NAMES)
    },
}


# --------------------------------------------------------------------------------------------
# The key registry.


@dataclass(frozen=True)
class KeySpec:
    """One configuration key, named as written in serving.properties."""

    key: str
    type: ValueType
    description: str
    attr: str | None = None  # LmiConfig field; set by REGISTRY from the field it annotates, None = ignored
    compile_time: bool = False  # changing it changes the TensorRT-LLM engine (engine-cache key)
    aliases: tuple[str, ...] = ()  # other names as written (Truss keys, older DJL names)
    ignored: str | None = None  # why a DJL key has no effect here; logged whenever it is set
    refused: str | None = None  # why a DJL key cannot be served here and what to set instead; stops startup
    note: str | None = None  # logged (info) whenever it is set
    secret: bool = False

    def env_names(self) -> tuple[str, ...]:
        """The generic environment variable for this key (OPTION_X / SERVING_X), then the named ones."""
        if self.key == "engine":
            generic: tuple[str, ...] = ("OPTION_ENGINE",)
        elif self.key.startswith("option."):
            generic = ("OPTION_" + self.key.removeprefix("option.").upper(),)
        elif "." not in self.key:
            generic = ("SERVING_" + self.key.upper(),)
        else:
            generic = ()  # gpu.minWorkers has no environment form
        return generic + tuple(a.var for a in ENV_ALIASES if _canonical_key(a.key) == self.key)


def _both(name: str) -> tuple[str, str]:
    """A Truss-style alias is accepted with and without the ``option.`` prefix."""
    return (f"option.{name}", name)


_IGNORED_WORKERS = "lmi-trt runs one model copy per GPUs ÷ (TP×PP) and sizes its own workers"
_IGNORED_BATCHING = (
    "lmi-trt always batches in flight (size it with option.max_rolling_batch_size); "
    "DJL's dynamic batching does not apply"
)
_IGNORED_METRICS = "lmi-trt always exports Prometheus metrics on /metrics"

# DJL keys accepted and ignored: no field, so they live here.
IGNORED_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "option.enforce_eager",
        _BOOL,
        "disable CUDA graphs (vLLM/lmi-dist knob; ENABLE_CUDA_GRAPHS)",
        ignored="the torch engine's transformers paths run eager (their per-request sampler runs between "
        "steps), its built-in decode loop always captures CUDA graphs on CUDA, and TensorRT-LLM "
        "engines keep the executor's default",
    ),
    KeySpec(
        "option.num_checkpoint_workers",
        _integer(1, 4),
        "DJL's parallel checkpoint conversions",
        ignored="each rank is converted and built in one worker process; option.num_engine_workers sets "
        "how many run at once",
    ),
    KeySpec(
        "option.paged_kv_cache",
        _TRUE_ONLY,
        "Truss plugin flag; the KV cache is always paged",
        aliases=("plugin_configuration.paged_kv_cache",),
        ignored="in-flight batching always uses a paged KV cache",
    ),
    KeySpec(
        "option.entryPoint",
        _TEXT,
        "DJL handler module",
        aliases=("option.entrypoint",),
        ignored="lmi-trt's handler is built in; a custom entry point or model.py is not loaded",
    ),
    KeySpec("batch_size", _integer(1, 1), "DJL dynamic batch size", ignored=_IGNORED_BATCHING),
    KeySpec("max_batch_delay", _integer(0, 100), "DJL dynamic batching delay (ms)", ignored=_IGNORED_BATCHING),
    KeySpec("minWorkers", _integer(0, 1), "DJL worker count", aliases=("minworkers",), ignored=_IGNORED_WORKERS),
    KeySpec("maxWorkers", _integer(0, 1), "DJL worker count", aliases=("maxworkers",), ignored=_IGNORED_WORKERS),
    KeySpec("gpu.minWorkers", _integer(0, 1), "DJL worker count", ignored=_IGNORED_WORKERS),
    KeySpec("gpu.maxWorkers", _integer(0, 1), "DJL worker count", ignored=_IGNORED_WORKERS),
    KeySpec(
        "option.bedrock_compat",
        _BOOL,
        "DJL Bedrock '3p' schema",
        ignored="the Bedrock '3p' schema is not served; use /v1/chat/completions or option.tgi_compat",
    ),
    KeySpec("log_request_metric", _BOOL, "DJL per-request metrics", ignored=_IGNORED_METRICS),
    KeySpec("metrics_aggregation", _integer(1, 1000), "DJL metrics aggregation", ignored=_IGNORED_METRICS),
    KeySpec(
        "chunked_read_timeout",
        _integer(1, 120),
        "DJL front-end stream chunk timeout",
        ignored="tokens stream straight from the engine; option.predict_timeout bounds a request",
    ),
    KeySpec(
        "features",
        _TEXT,
        "DJL container feature list (SERVING_FEATURES)",
        ignored="lmi-trt picks its engine with option.rolling_batch",
    ),
    # DJL's own meaning: djl_python/properties_manager/properties.py validate_enable_streaming only warns that
    # "streaming is deprecated. rolling batch supports streaming by default and you can use stream input parameter".
    KeySpec(
        "option.enable_streaming",
        _choice(_same("true", "false", "huggingface")),
        "DJL's deprecated streaming switch",
        ignored="as in DJL, streaming is chosen per request (the stream parameter); the key is deprecated there too",
    ),
)

# DJL keys lmi-trt accepts with the one value that is what it always does, and refuses with any other (no field).
# DJL's LLM-API handler reads them (djl-serving engines/python/setup/djl_python/properties_manager/
# trt_properties.py TensorRtLlmProperties and properties.py Properties, read at master d21927c4, 2026-06-24, the
# same on the latest release branch 0.36.0-lmi27-dlc; the file last changed in db778683, 2025-11-10).
FIXED_KEYS: tuple[KeySpec, ...] = (
    KeySpec(
        "option.skip_tokenizer_init",
        _only("false", "is not possible here: lmi-trt tokenizes prompts and detokenizes output itself"),
        "DJL's LLM(skip_tokenizer_init=); lmi-trt always loads the tokenizer",
    ),
    KeySpec(
        "option.context_parallel_size",
        _only("1", "is not supported: lmi-trt places TP×PP ranks per model copy, without context parallelism"),
        "DJL's LLM(context_parallel_size=); lmi-trt runs without context parallelism",
    ),
    KeySpec(
        "option.cluster_size",
        _only("1", "is not supported: lmi-trt serves a model copy on one host"),
        "DJL's multi-node cluster size; lmi-trt runs on one host",
    ),
    KeySpec(
        "option.guided_decoding_backend",
        _only("xgrammar", "is not supported: lmi-trt compiles guides (response_format, grammars) for xgrammar"),
        "DJL's LLM(guided_decoding_backend=); lmi-trt always guides through xgrammar",
    ),
    KeySpec(
        "option.auto_parallel",
        _only("false", "is not supported: TensorRT-LLM's auto parallelism is gone since 1.0; set the degrees"),
        "DJL's LLM(auto_parallel=); lmi-trt takes option.tensor_parallel_degree and pipeline_parallel_degree",
    ),
    KeySpec(
        "option.fast_build",
        _only("false", "is not supported: lmi-trt builds TensorRT engines with trtllm-build's defaults"),
        "DJL's LLM(fast_build=) (a TensorRT-engine build option)",
    ),
    KeySpec(
        "option.enable_build_cache",
        _only("true", "cannot be turned off: lmi-trt always keeps what it builds in its engine cache"),
        "DJL's LLM(enable_build_cache=); lmi-trt always caches builds (option.engine_cache_uri)",
    ),
    KeySpec(
        "option.batching_type",
        _only("inflight", "is not supported: every engine here batches in flight"),
        "DJL's LLM(batching_type=); lmi-trt always batches in flight",
    ),
    KeySpec(
        "option.normalize_log_probs",
        _only("false", "is not supported: log probs are the model's own, unnormalized"),
        "DJL's LLM(normalize_log_probs=)",
    ),
    KeySpec(
        "option.gather_generation_logits",
        _only("false", "is not supported: no protocol here returns generation logits"),
        "DJL's LLM(gather_generation_logits=)",
    ),
)


# DJL keys lmi-trt cannot honour, whose effect matters: setting one stops startup with what to do instead.
_NO_KEYSTORE = (
    "lmi-trt does not read Java keystores; export the key and certificate as PEM (openssl pkcs12 -in "
    "keystore.p12 -nodes -nocerts -out key.pem, and -nokeys -out cert.pem) and set private_key_file and "
    "certificate_file"
)
REFUSED_KEYS: tuple[KeySpec, ...] = (
    KeySpec("keystore", _PATH, "DJL's TLS keystore file", refused=_NO_KEYSTORE),
    KeySpec("keystore_pass", _SECRET, "DJL's TLS keystore password", refused=_NO_KEYSTORE, secret=True),
    KeySpec("keystore_type", _TEXT, "DJL's TLS keystore type", refused=_NO_KEYSTORE),
    # DJL's LLM-API handler passes these to LLM(...) (trt_properties.py get_llm_kwargs; see FIXED_KEYS).
    KeySpec(
        "option.auto_parallel_world_size",
        _TEXT,
        "DJL's LLM(auto_parallel_world_size=)",
        refused="TensorRT-LLM's auto parallelism is gone since 1.0; set option.tensor_parallel_degree",
    ),
    KeySpec(
        "option.embedding_parallel_mode",
        _TEXT,
        "DJL's LLM(embedding_parallel_mode=)",
        refused="a TensorRT-engine build option of DJL's handler, which neither lmi-trt's engine build nor the "
        "pytorch backend's LLM takes; remove the key",
    ),
    KeySpec(
        "option.extended_runtime_perf_knob_config",
        _TEXT,
        "DJL's LLM(extended_runtime_perf_knob_config=)",
        refused="DJL takes no value for it either (its type is None); set option.multi_block_mode for that knob",
    ),
)


class LmiConfig(BaseModel):
    """The effective configuration. Attribute = registry key without ``option.``."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    # --- model & sources ---
    model_id: Annotated[
        str | None,
        KeySpec(
            "option.model_id",
            _TEXT,
            "Hugging Face id, s3:// URI or local folder; unset: the model dir is the model",
            aliases=_both("engine_repository") + _both("huggingface_ckpt_repository"),
        ),
    ] = None
    model_dir: Path | None = None  # folder holding serving.properties (/opt/ml/model)
    revision: Annotated[
        str | None, KeySpec("option.revision", _TEXT, "Hugging Face revision (branch, tag or commit)")
    ] = None
    trust_remote_code: Annotated[
        bool, KeySpec("option.trust_remote_code", _BOOL, "allow the model's own Python code (auto_map)")
    ] = False
    hf_token: Annotated[
        SecretStr | None,
        KeySpec(
            "option.hf_token", _SECRET, "Hugging Face token for gated/private models (masked in logs)", secret=True
        ),
    ] = None
    tokenizer_id: Annotated[
        str | None,
        KeySpec(
            "option.tokenizer_id",
            _TEXT,
            "tokenizer source when it differs from the model (id, s3:// or path)",
            aliases=_both("tokenizer_repository") + ("option.tokenizer",),  # DJL: LLM(tokenizer=)
        ),
    ] = None
    tokenizer_revision: Annotated[
        str | None,
        KeySpec(
            "option.tokenizer_revision",
            _TEXT,
            "Hugging Face revision of option.tokenizer_id (DJL's LLM(tokenizer_revision=))",
        ),
    ] = None
    tokenizer_mode: Annotated[
        Literal["auto", "slow"],
        KeySpec(
            "option.tokenizer_mode",
            _choice(_same("auto", "slow")),
            "auto: the fast tokenizer where the model has one; slow: the Python one (DJL's LLM(tokenizer_mode=))",
        ),
    ] = "auto"
    download_dir: Annotated[Path, KeySpec("download_dir", _PATH, "where downloads and local engine builds go")] = Path(
        "/tmp/.lmi-trt"
    )
    engine_cache_uri: Annotated[
        str | None,
        KeySpec(
            "option.engine_cache_uri",
            _CACHE_URI,
            "shared engine cache (s3://bucket/prefix or a folder); unset: a local cache under download_dir",
        ),
    ] = None  # s3://bucket/prefix or a local folder
    compile_timeout: Annotated[
        int, KeySpec("option.compile_timeout", _integer(1, 3600), "seconds one engine build may take")
    ] = 3600
    # --- engine choice & runtime ---
    engine: Annotated[
        Literal["Python", "MPI"],
        KeySpec(
            "engine",
            _choice({"python": "Python", "mpi": "MPI"}, shown=("Python", "MPI"), rejected=_DJL_ENGINES),
            "DJL worker engine; MPI implies option.mpi_mode=true",
            aliases=("option.engine",),
            note="lmi-trt starts TP×PP MPI ranks itself; engine only sets option.mpi_mode",
        ),
    ] = "Python"
    mpi_mode: Annotated[
        bool,
        KeySpec(
            "option.mpi_mode",
            _BOOL,
            "DJL's MPI worker flag, accepted for compatibility",
            note="lmi-trt launches MPI ranks from tensor_parallel_degree × pipeline_parallel_degree, "
            "so option.mpi_mode changes nothing",
        ),
    ] = False
    rolling_batch: Annotated[
        Literal[("auto", *ENGINE_NAMES)],
        KeySpec(
            "option.rolling_batch",
            _choice(_same("auto", *ENGINE_NAMES), rejected={**_OTHER_BACKENDS, "disable": _NO_DISABLE}),
            "engine; auto: trtllm when TensorRT-LLM imports and a GPU is visible, else torch; "
            "synthetic: benchmark engine",
        ),
    ] = "auto"
    # DJL's spelling (djl_python/properties_manager/trt_properties.py ``backend``; trtllm-serve's --backend).
    backend: Annotated[
        Literal[("auto", *BACKEND_NAMES)],
        KeySpec(
            "option.backend",
            _choice(_same("auto", *BACKEND_NAMES)),
            "TensorRT-LLM backend; auto: tensorrt for engine folders and 0.x, pytorch for Hugging Face checkpoints "
            "on 1.0+ and wherever the Executor binding is gone",
        ),
    ] = "auto"  # lmi_trt.engines.registry.choose_backend
    dtype: Annotated[
        Literal["auto", "fp16", "bf16", "fp32"],
        KeySpec(
            "option.dtype",
            _choice(
                {
                    "auto": "auto",
                    "fp16": "fp16",
                    "float16": "fp16",
                    "half": "fp16",
                    "bf16": "bf16",
                    "bfloat16": "bf16",
                    "fp32": "fp32",
                    "float32": "fp32",
                    "float": "fp32",
                },
                shown=("auto", "fp16", "bf16", "fp32"),
            ),
            "weights/activation precision; auto: the checkpoint's",
            compile_time=True,
        ),
    ] = "auto"
    device: Annotated[
        Literal["auto", "cpu", "cuda"],
        KeySpec("option.device", _choice(_same("auto", "cpu", "cuda")), "device of the torch engine"),
    ] = "auto"
    tensor_parallel_degree: Annotated[
        int | Literal["max"],
        KeySpec(
            "option.tensor_parallel_degree",
            _TP,
            "tensor-parallel ranks; max: all visible GPUs (÷ PP)",
            compile_time=True,
            aliases=_both("tensor_parallel_count"),
        ),
    ] = 1  # 'max' is resolved by the launcher
    pipeline_parallel_degree: Annotated[
        int,
        KeySpec(
            "option.pipeline_parallel_degree",
            _integer(1, 2),
            "pipeline-parallel ranks",
            compile_time=True,
            aliases=_both("pipeline_parallel_count")
            + ("option.pipeline_parallel_size",),  # DJL: LLM(pipeline_parallel_size=)
        ),
    ] = 1
    synthetic_tokens_per_second: Annotated[
        float,
        KeySpec(
            "option.synthetic_tokens_per_second",
            _number(at_least=0, example=100),
            "decode rate per sequence of the synthetic benchmark engine; 0 = as fast as possible",
        ),
    ] = 0.0  # 0 = as fast as possible
    # --- engine build shape (compile-time) ---
    max_rolling_batch_size: Annotated[
        int | None,
        KeySpec(
            "option.max_rolling_batch_size",
            _integer(1, 64),
            "most sequences in flight; also the engine's max batch size; unset: "
            + ", ".join(f"{name} {entry(name).default_batch}" for name in ENGINE_NAMES if entry(name).uses_model)
            + " (trtllm's pytorch backend: TensorRT-LLM's own, 2048)",
            compile_time=True,
            aliases=_both("max_batch_size"),
        ),
    ] = None  # None → the engine's default (lmi_trt.stages.settle)
    max_input_len: Annotated[
        int,
        KeySpec(
            "option.max_input_len",
            _integer(1, 2048),
            "longest prompt in tokens; unset: 1024, or what the model's positions leave after max_output_len",
            compile_time=True,
        ),
    ] = 1024
    max_output_len: Annotated[
        int,
        KeySpec(
            "option.max_output_len",
            _integer(1, 512),
            "most new tokens per request; unset: 512, or a quarter of the model's positions when fewer",
            compile_time=True,
        ),
    ] = 512  # new tokens; max_seq_len defaults to input + output
    max_seq_len: Annotated[
        int | None,
        KeySpec(
            "option.max_seq_len",
            _integer(2, 4096),
            "prompt + output tokens; unset: max_input_len + max_output_len for a TensorRT engine, TensorRT-LLM's "
            "from the checkpoint on the pytorch backend",
            compile_time=True,
        ),
    ] = None
    max_num_tokens: Annotated[
        int | None,
        KeySpec(
            "option.max_num_tokens",
            _integer(1, 8192),
            "tokens per engine step (packed batch); unset: TensorRT-LLM's default, "
            "torch: max(max_input_len + batch, 2048)",
            compile_time=True,
            aliases=_both("max_rolling_batch_prefill_tokens"),
        ),
    ] = None
    max_beam_width: Annotated[
        int,
        KeySpec(
            "option.max_beam_width", _integer(1, 1), "beam-search width the engine is built for", compile_time=True
        ),
    ] = 1
    max_draft_len: Annotated[
        int,
        KeySpec(
            "option.max_draft_len",
            _integer(0, 4),
            "speculative decoding: most draft tokens per step (TensorRT-LLM's name; DJL lmi-dist's "
            "speculative_length, vLLM's num_speculative_tokens); unset with a method: 5 (DJL's default)",
            compile_time=True,
            aliases=("option.speculative_length", "option.spec_length", "option.num_speculative_tokens"),
        ),
    ] = 0
    tokens_per_block: Annotated[
        Literal[TOKENS_PER_BLOCK] | None,
        KeySpec(
            "option.tokens_per_block",
            _choice({str(size): size for size in TOKENS_PER_BLOCK}),
            "paged KV-cache block size in tokens; unset: TensorRT-LLM's default (the torch engine's "
            "built-in decode loop: 16)",
            compile_time=True,
        ),
    ] = None  # None → TensorRT-LLM's default
    use_paged_context_fmha: Annotated[
        bool | None,
        KeySpec(
            "option.use_paged_context_fmha",
            _BOOL,
            "paged context attention (needed for KV reuse and chunked context); unset: TensorRT-LLM's default",
            compile_time=True,
            aliases=("plugin_configuration.use_paged_context_fmha",),
        ),
    ] = None  # None → TensorRT-LLM's default
    use_fp8_context_fmha: Annotated[
        bool,
        KeySpec(
            "option.use_fp8_context_fmha",
            _BOOL,
            "fp8 context attention (Hopper, fp8 quantization)",
            compile_time=True,
            aliases=("plugin_configuration.use_fp8_context_fmha",),
        ),
    ] = False
    use_fused_mlp: Annotated[
        bool, KeySpec("option.use_fused_mlp", _BOOL, "fuse the gated MLP (Llama family)", compile_time=True)
    ] = False
    use_custom_all_reduce: Annotated[
        bool,
        KeySpec(
            "option.use_custom_all_reduce",
            _BOOL,
            "NVLink all-reduce for TensorRT-LLM 0.x; newer versions choose it themselves",
            compile_time=True,
        ),
    ] = False
    logits_dtype: Annotated[
        Literal["fp32", "fp16"],
        KeySpec(
            "option.logits_dtype",
            _choice({"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16"}, shown=("fp32", "fp16")),
            "logits precision (T5)",
            compile_time=True,
        ),
    ] = "fp32"
    # --- per-architecture (compile-time) ---
    # The variant vocabularies are the compile stage's (lmi_trt.vocabulary), so config accepts what it converts.
    baichuan_model_version: Annotated[
        Literal[tuple(BAICHUAN_VERSIONS)] | None,
        KeySpec(
            "option.baichuan_model_version",
            _choice(_same(*BAICHUAN_VERSIONS)),
            "Baichuan variant; unset: inferred from config.json",
            compile_time=True,
        ),
    ] = None
    chatglm_model_version: Annotated[
        Literal[tuple(CHATGLM_VERSIONS)] | None,
        KeySpec(
            "option.chatglm_model_version",
            _choice(_same(*CHATGLM_VERSIONS)),
            "ChatGLM variant; unset: inferred from config.json",
            compile_time=True,
        ),
    ] = None
    gpt_model_version: Annotated[
        Literal[tuple(GPT_VARIANTS)] | None,
        KeySpec(
            "option.gpt_model_version",
            _choice(_same(*GPT_VARIANTS)),
            "GPT-2 family variant; unset: inferred from config.json",
            compile_time=True,
        ),
    ] = None
    rotary_base: Annotated[
        float | None,
        KeySpec(
            "option.rotary_base",
            _number(above=0, example=10000),
            "RoPE base; unset: config.json's rope_theta",
            compile_time=True,
        ),
    ] = None
    rotary_dim: Annotated[
        int | None,
        KeySpec(
            "option.rotary_dim", _integer(1, 64), "rotary dimensions (GPT-J); unset: config.json's", compile_time=True
        ),
    ] = None
    rotary_scaling_type: Annotated[
        Literal["linear", "dynamic"] | None,
        KeySpec(
            "option.rotary_scaling_type",
            _choice(_same("linear", "dynamic")),
            "RoPE scaling; set together with option.rotary_scaling_factor",
            compile_time=True,
        ),
    ] = None
    rotary_scaling_factor: Annotated[
        float | None,
        KeySpec(
            "option.rotary_scaling_factor",
            _number(above=1, example=2),
            "RoPE scaling factor; set together with option.rotary_scaling_type",
            compile_time=True,
        ),
    ] = None
    # --- quantization (compile-time) ---
    quantize: Annotated[
        Quantization | None,
        KeySpec(
            "option.quantize",
            _choice(QUANTIZE_NAMES, shown=tuple(QUANTIZE_NAMES)),
            "quantization (DJL and Truss names; no_quant/none: off)",
            compile_time=True,
            aliases=_both("quantization_type"),
        ),
    ] = None
    smoothquant_alpha: Annotated[
        float,
        KeySpec(
            "option.smoothquant_alpha",
            _number(above=0, at_most=1, example=0.8),
            "SmoothQuant migration strength",
            compile_time=True,
        ),
    ] = 0.8
    smoothquant_per_token: Annotated[
        bool,
        KeySpec("option.smoothquant_per_token", _BOOL, "SmoothQuant per-token activation scales", compile_time=True),
    ] = False
    smoothquant_per_channel: Annotated[
        bool,
        KeySpec("option.smoothquant_per_channel", _BOOL, "SmoothQuant per-channel weight scales", compile_time=True),
    ] = False
    multi_query_mode: Annotated[
        bool,
        KeySpec(
            "option.multi_query_mode", _BOOL, "SmoothQuant for multi-/grouped-query attention models", compile_time=True
        ),
    ] = False
    q_format: Annotated[
        Literal["int4_awq", "w4a8_awq"],
        KeySpec(
            "option.q_format",
            _choice(_same("int4_awq", "w4a8_awq")),
            "AWQ format",
            compile_time=True,
            aliases=_both("awq_format"),
        ),
    ] = "int4_awq"
    calib_size: Annotated[
        int,
        KeySpec(
            "option.calib_size",
            _integer(1, 512),
            "calibration samples",
            compile_time=True,
            aliases=_both("awq_calib_size") + ("quantization_config.calib_size",),
        ),
    ] = 512
    calib_batch_size: Annotated[
        int, KeySpec("option.calib_batch_size", _integer(1, 32), "calibration batch size", compile_time=True)
    ] = 32
    calib_max_seq_length: Annotated[
        int,
        KeySpec(
            "option.calib_max_seq_length",
            _integer(1, 512),
            "tokens per calibration sample",
            compile_time=True,
            aliases=("quantization_config.calib_max_seq_length",),
        ),
    ] = 512
    awq_block_size: Annotated[
        Literal[AWQ_BLOCK_SIZES],
        KeySpec(
            "option.awq_block_size",
            _choice({str(size): size for size in AWQ_BLOCK_SIZES}),
            "AWQ group size",
            compile_time=True,
        ),
    ] = 128
    calib_dataset: Annotated[
        Path | None,
        KeySpec(
            "option.calib_dataset",
            _PATH,
            "local calibration dataset (file or folder)",
            compile_time=True,
            aliases=("quantization_config.calib_dataset",),
        ),
    ] = None
    # --- build process (does not change the engine) ---
    trtllm_checkpoint_path: Annotated[
        Path | None,
        KeySpec("option.trtllm_checkpoint_path", _PATH, "where the converted TensorRT-LLM checkpoint is written"),
    ] = None
    num_engine_workers: Annotated[
        int | None, KeySpec("option.num_engine_workers", _integer(1, 4), "parallel engine builds (GPUs)")
    ] = None
    load_by_shard: Annotated[
        bool, KeySpec("option.load_by_shard", _BOOL, "convert shard by shard to save host memory (Falcon)")
    ] = False
    # --- TensorRT-LLM executor (runtime) ---
    kv_cache_free_gpu_mem_fraction: Annotated[
        float,
        KeySpec(
            "option.kv_cache_free_gpu_mem_fraction",
            # below 1: TensorRT-LLM's KvCacheConfig checks freeGpuMemoryFraction < 1.F (FREE_FRACTION_BELOW)
            _number(above=0, below=FREE_FRACTION_BELOW, example=0.9),
            "share of free GPU memory given to the KV cache (pytorch backend, unset: TensorRT-LLM's 0.9)",
            aliases=("option.free_gpu_memory_fraction",),  # DJL: KvCacheConfig(free_gpu_memory_fraction=)
        ),
    ] = KV_CACHE_FREE_GPU_MEM_FRACTION
    draft_kv_cache_free_gpu_mem_fraction: Annotated[
        float | None,
        KeySpec(
            "option.draft_kv_cache_free_gpu_mem_fraction",
            _number(above=0, below=FREE_FRACTION_BELOW, example=0.2),
            "trtllm tensorrt backend with option.speculative_draft_model (required there): share of free GPU memory "
            "given to the draft engine's KV cache; the draft's Executor starts first, then the model's takes "
            "option.kv_cache_free_gpu_mem_fraction of what is left",
        ),
    ] = None
    max_tokens_in_paged_kv_cache: Annotated[
        int | None,
        KeySpec(
            "option.max_tokens_in_paged_kv_cache",
            _integer(1, 65536),
            "KV-cache size cap in tokens (the smaller of this and the fraction wins; the torch engine's "
            "built-in decode loop: its size on CPU, its cap on a GPU)",
            aliases=("option.max_tokens",),  # DJL: KvCacheConfig(max_tokens=)
        ),
    ] = None
    kv_cache_host_memory_bytes: Annotated[
        int | None,
        KeySpec(
            "option.kv_cache_host_memory_bytes",
            _integer(1, 2**30),
            "host memory for KV-cache offload",
            aliases=("option.host_cache_size",),  # DJL: KvCacheConfig(host_cache_size=)
        ),
    ] = None
    enable_kv_cache_reuse: Annotated[
        bool,
        KeySpec(
            "option.enable_kv_cache_reuse",
            _BOOL,
            "prefix caching (TensorRT-LLM: needs paged context attention, pytorch backend unset: TensorRT-LLM's, "
            "on; torch: the built-in decode loop)",
            compile_time=True,
            aliases=("option.enable_block_reuse",),  # DJL: KvCacheConfig(enable_block_reuse=)
        ),
    ] = False
    # LoRA adapters, DJL LMI's keys (djl-serving serving/docs/adapters.md and lmi/user_guides/vllm_user_guide.md:
    # option.enable_lora, option.max_loras (default 4), option.max_lora_rank (default 16), option.max_cpu_loras).
    enable_lora: Annotated[
        bool,
        KeySpec(
            "option.enable_lora",
            _BOOL,
            "serve LoRA adapters (the model folder's adapters/ at start-up, more through the adapter routes), "
            "chosen per request",
        ),
    ] = False
    max_loras: Annotated[
        int,
        KeySpec(
            "option.max_loras",
            _integer(1, 4),
            "LoRA: adapters resident on the device at once (the torch engine's stacked slots; the pytorch "
            "backend's LoraConfig.max_loras; the tensorrt backend's device PEFT cache); a request for another waits "
            "until one is free",
        ),
    ] = 4
    max_lora_rank: Annotated[
        int,
        KeySpec(
            "option.max_lora_rank", _integer(1, 16), "LoRA: the largest adapter rank (an adapter above it is refused)"
        ),
    ] = 16
    max_cpu_loras: Annotated[
        int | None,
        KeySpec(
            "option.max_cpu_loras",
            _integer(1, 8),
            "LoRA: adapters registered at most (vLLM's meaning, as DJL's; at least option.max_loras), and the host "
            "cache: the pytorch backend's LoraConfig.max_cpu_loras (from TensorRT-LLM 1.1 an evicting cache that "
            "reloads an evicted adapter, PR 6510), the tensorrt backend's host PEFT cache; unset: no registration "
            "limit, the pytorch backend's host cache the release's default, the tensorrt backend's option.max_loras",
        ),
    ] = None
    batch_scheduler_policy: Annotated[
        Literal["max_utilization", "guaranteed_no_evict"],
        KeySpec(
            "option.batch_scheduler_policy",
            _choice(_same("max_utilization", "guaranteed_no_evict")),
            "in-flight batch scheduling (pytorch backend, unset: TensorRT-LLM's guaranteed_no_evict)",
        ),
    ] = "max_utilization"
    torch_batching: Annotated[
        Literal["auto", "continuous", "static"],
        KeySpec(
            "option.torch_batching",
            _choice(_same("auto", "continuous", "static")),
            "torch engine: continuous batching (requests join every step) or static batches (higher "
            "throughput, later arrivals wait for the next batch); auto: continuous where the architecture "
            "supports it",
        ),
    ] = "auto"
    torch_decode_loop: Annotated[
        Literal["auto", "builtin", "transformers"],
        KeySpec(
            "option.torch_decode_loop",
            _choice(_same("auto", "builtin", "transformers")),
            "torch engine: builtin = lmi-trt's own decode loop (Llama, Mistral, Qwen2, Qwen3: CUDA graphs, "
            "sampling on the GPU); transformers = transformers' batching paths (option.torch_batching); "
            "auto: builtin where the model is Llama-shaped and option.torch_batching is auto",
        ),
    ] = "auto"
    grammar_compile_timeout: Annotated[
        float,
        KeySpec(
            "option.grammar_compile_timeout",
            _number(above=0, at_most=600, example=10),
            "torch engine: seconds a constrained request's grammar (JSON schema, regex, EBNF, tool schema) may "
            "take to compile, in a process killed past it; the request then gets a 400 naming its field",
        ),
    ] = 10.0
    enable_chunked_context: Annotated[
        bool,
        KeySpec(
            "option.enable_chunked_context",
            _BOOL,
            "split long prompts over several steps (TensorRT-LLM; the torch engine's built-in decode loop)",
            aliases=_both("enable_chunked_prefill"),
        ),
    ] = False
    # --- speculative decoding (lmi_trt.speculative: the three vocabularies, merged and checked) ---
    speculative_config: Annotated[
        dict[str, Any] | None,
        KeySpec(
            "option.speculative_config",
            ValueType("JSON object", _json_object),
            "speculative decoding as one JSON object: TensorRT-LLM's speculative_config (decoding_type, "
            "max_draft_len, speculative_model, max_matching_ngram_size, Medusa's medusa_choices and "
            "num_medusa_heads, ...) or vLLM's (method, num_speculative_tokens, model, prompt_lookup_max, ...)",
        ),
    ] = None
    speculative_decoding_mode: Annotated[
        Literal[tuple(SPECULATIVE_METHODS)] | None,
        KeySpec(
            "option.speculative_decoding_mode",
            _choice(SPECULATIVE_SPELLINGS, shown=tuple(SPECULATIVE_METHODS)),
            "speculative decoding's drafter (trtllm-build's flag; TensorRT-LLM's and vLLM's spellings work "
            "too); the torch engine runs ngram and draft_model, the trtllm pytorch backend also eagle3 and mtp, "
            "the trtllm tensorrt backend lookahead (lookahead_decoding), medusa, ngram and draft_model",
        ),
    ] = None
    speculative_draft_model: Annotated[
        str | None,
        KeySpec(
            "option.speculative_draft_model",
            _TEXT,
            "draft model for speculative decoding: Hugging Face id, s3:// URI or folder, with the model's "
            "tokenizer (DJL's key; turns on draft-model speculation); with medusa, the folder of Medusa heads",
            aliases=("option.draft_model_id", "option.speculative_model", "option.speculative_model_dir"),
        ),
    ] = None
    max_matching_ngram_size: Annotated[
        int | None,
        KeySpec(
            "option.max_matching_ngram_size",
            _integer(1, 2),
            "n-gram speculation: the longest n-gram looked up (TensorRT-LLM's name, vLLM's prompt_lookup_max); "
            "unset: 2",
            aliases=("option.prompt_lookup_max", "option.ngram_prompt_lookup_max"),
        ),
    ] = None
    prompt_lookup_min: Annotated[
        int | None,
        KeySpec(
            "option.prompt_lookup_min",
            _integer(1, 1),
            "n-gram speculation: the shortest n-gram looked up (vLLM's name); unset: 1",
            aliases=("option.ngram_prompt_lookup_min",),
        ),
    ] = None
    speculative_disable_by_batch_size: Annotated[
        int | None,
        KeySpec(
            "option.speculative_disable_by_batch_size",
            _integer(1, 32),
            "no speculation in steps with more running requests than this (vLLM's name, TensorRT-LLM's "
            "max_concurrency, from 1.1); unset: the engine's default (torch: 32; TensorRT-LLM: no limit)",
        ),
    ] = None
    multi_block_mode: Annotated[
        bool | None,
        KeySpec(
            "option.multi_block_mode",
            _BOOL,
            "multi-block attention for long sequences; unset: TensorRT-LLM's default (where it is a build option, "
            "a value other than the engine's is a startup error)",
        ),
    ] = None  # None → TensorRT-LLM's default
    enable_trt_overlap: Annotated[
        bool,
        KeySpec(
            "option.enable_trt_overlap",
            _BOOL,
            "overlap consecutive batches (true: a startup error on an Executor without the knob)",
        ),
    ] = False
    max_num_sequences: Annotated[
        int | None,
        KeySpec(
            "option.max_num_sequences",
            _integer(1, 64),
            "runtime cap on sequences in flight (≤ max_rolling_batch_size); unset: max_rolling_batch_size",
        ),
    ] = None  # None → max_rolling_batch_size
    parallel_loading: Annotated[
        bool,
        KeySpec(
            "option.parallel_loading",
            _BOOL,
            "load several model copies at once (DJL's key); false: one after another, for less host memory",
        ),
    ] = True
    # --- TensorRT-LLM's LLM API (the pytorch backend), under the LLM's own names as DJL LMI's handler reads them
    # (djl-serving djl_python/properties_manager/trt_properties.py get_kv_cache_config / get_pytorch_config /
    # get_llm_kwargs); unset: TensorRT-LLM's default. Fields of tensorrt_llm/llmapi/llm_args.py (KvCacheConfig,
    # BaseLlmArgs, TorchLlmArgs, MoeConfig) in every copy read, 1.0 to main; the release's own classes check the
    # values at startup (lmi_trt.engines.llmapi.check_release). ---
    max_attention_window: Annotated[
        tuple[int, ...] | None,
        KeySpec(
            "option.max_attention_window",
            _INT_LIST,
            "KV tokens kept per sequence, per layer (repeated over the layers): sliding-window attention "
            "(KvCacheConfig.max_attention_window)",
        ),
    ] = None
    sink_token_length: Annotated[
        int | None,
        KeySpec(
            "option.sink_token_length",
            _integer(0, 4),
            "tokens always kept in the attention window (KvCacheConfig.sink_token_length)",
        ),
    ] = None
    onboard_blocks: Annotated[
        bool | None,
        KeySpec(
            "option.onboard_blocks",
            _BOOL,
            "bring offloaded KV blocks back to the GPU for reuse (KvCacheConfig.onboard_blocks)",
        ),
    ] = None
    cross_kv_cache_fraction: Annotated[
        float | None,
        KeySpec(
            "option.cross_kv_cache_fraction",
            _number(above=0, at_most=1, example=0.5),
            "share of the KV cache for cross attention, encoder-decoder models (KvCacheConfig.cross_kv_cache_fraction)",
        ),
    ] = None
    secondary_offload_min_priority: Annotated[
        int | None,
        KeySpec(
            "option.secondary_offload_min_priority",
            _integer(0, 35),
            "only KV blocks above this priority are offloaded to host memory "
            "(KvCacheConfig.secondary_offload_min_priority)",
        ),
    ] = None
    event_buffer_max_size: Annotated[
        int | None,
        KeySpec(
            "option.event_buffer_max_size",
            _integer(0, 1024),
            "KV-cache event buffer size; 0: no events (KvCacheConfig.event_buffer_max_size)",
        ),
    ] = None
    kv_cache_dtype: Annotated[
        Literal["auto", "fp8"] | None,
        KeySpec(
            "option.kv_cache_dtype",
            _choice(_same("auto", "fp8")),
            "KV-cache precision; auto: the model's (KvCacheConfig.dtype; TorchLlmArgs maps fp8 to the FP8 KV cache)",
        ),
    ] = None
    moe_tensor_parallel_size: Annotated[
        int | None,
        KeySpec(
            "option.moe_tensor_parallel_size",
            _integer(1, 1),
            "tensor-parallel ranks of the MoE experts; with option.moe_expert_parallel_size their product is "
            "option.tensor_parallel_degree",
        ),
    ] = None
    moe_expert_parallel_size: Annotated[
        int | None,
        KeySpec(
            "option.moe_expert_parallel_size",
            _integer(1, 8),
            "expert-parallel ranks of the MoE experts; with option.moe_tensor_parallel_size their product is "
            "option.tensor_parallel_degree",
        ),
    ] = None
    enable_attention_dp: Annotated[
        bool | None,
        KeySpec("option.enable_attention_dp", _BOOL, "data-parallel attention across the tensor-parallel ranks"),
    ] = None
    load_format: Annotated[
        Literal["auto", "dummy"] | None,
        KeySpec(
            "option.load_format",
            _choice(_same("auto", "dummy")),
            "auto: the checkpoint's weights; dummy: random weights (benchmarks)",
        ),
    ] = None
    iter_stats_max_iterations: Annotated[
        int | None,
        KeySpec(
            "option.iter_stats_max_iterations",
            _integer(0, 1000),
            "iteration statistics TensorRT-LLM keeps (they feed /metrics; 0: none)",
        ),
    ] = None
    request_stats_max_iterations: Annotated[
        int | None,
        KeySpec("option.request_stats_max_iterations", _integer(0, 1000), "per-request statistics TensorRT-LLM keeps"),
    ] = None
    enable_overlap_scheduler: Annotated[
        bool | None,
        KeySpec(
            "option.enable_overlap_scheduler",
            _BOOL,
            "overlap the next step's scheduling with this step's compute (TorchLlmArgs.disable_overlap_scheduler, "
            "inverted)",
        ),
    ] = None
    use_cuda_graph: Annotated[
        bool | None,
        KeySpec(
            "option.use_cuda_graph",
            _BOOL,
            "CUDA graphs for decoding steps; unset or true: graphs up to the batch size, false: none "
            "(TorchLlmArgs.cuda_graph_config)",
        ),
    ] = None
    attn_backend: Annotated[
        Literal["TRTLLM", "VANILLA", "FLASHINFER", "FLASHINFER_STAR_ATTENTION"] | None,
        KeySpec(
            "option.attn_backend",
            _choice(
                {name.lower(): name for name in ("TRTLLM", "VANILLA", "FLASHINFER", "FLASHINFER_STAR_ATTENTION")},
                shown=("TRTLLM", "VANILLA", "FLASHINFER", "FLASHINFER_STAR_ATTENTION"),
            ),
            "attention kernels (TorchLlmArgs.attn_backend)",
        ),
    ] = None
    moe_backend: Annotated[
        str | None,
        KeySpec(
            "option.moe_backend",
            _BACKEND_NAME,
            "MoE kernels, e.g. CUTLASS, TRTLLM, DEEPGEMM (MoeConfig.backend: the release's own list)",
        ),
    ] = None
    # --- serving ---
    job_queue_size: Annotated[
        int, KeySpec("job_queue_size", _integer(1, 1000), "queued requests beyond which the server answers 503")
    ] = 1000
    api_server_count: Annotated[
        int | None,
        KeySpec(
            "option.api_server_count",
            _integer(1, 2),
            "HTTP front-end processes sharing the port (vLLM's --api-server-count); above 1 the engine runs in a "
            "process of its own and the front ends tokenize, detokenize and render; unset: from the CPU cores "
            "this process may use (1 below 8, else a quarter of them, at most 8)",
        ),
    ] = None
    output_formatter: Annotated[
        str | None,
        KeySpec(
            "option.output_formatter",
            _choice(_same("json", "jsonlines", "sse", "json_chat", "jsonlines_chat")),
            "response format of /invocations; unset: by request",
        ),
    ] = None  # json | jsonlines | sse | json_chat | jsonlines_chat
    tgi_compat: Annotated[bool, KeySpec("option.tgi_compat", _BOOL, "TGI-shaped /invocations responses")] = False
    chat_template: Annotated[
        str | None, KeySpec("option.chat_template", _TEXT, "Jinja chat template overriding the tokenizer's")
    ] = None
    enable_auto_tool_choice: Annotated[
        bool,
        KeySpec(
            "option.enable_auto_tool_choice",
            _BOOL,
            "OpenAI chat tool_choice 'auto' (the default with tools): the model's own tool calls are parsed from "
            "its output (DJL LMI's and vLLM's key); 'required' and named functions work without it",
        ),
    ] = False
    tool_call_parser: Annotated[
        str | None,
        KeySpec(
            "option.tool_call_parser",
            _choice(_same(*tool_parsers.names())),
            "the tool-call format the model writes (vLLM's parser names, and trtllm-serve's --tool_parser "
            "spellings); unset: recognised from the chat template",
        ),
    ] = None
    reasoning_parser: Annotated[
        str | None,
        KeySpec(
            "option.reasoning_parser",
            _choice(_same(*reasoning_parsers.names())),
            "OpenAI chat: the model's thinking is returned as reasoning_content (and reasoning), apart from "
            "content (vLLM's --reasoning-parser names, and trtllm-serve's --reasoning_parser spellings); unset: "
            "recognised from the chat template",
        ),
    ] = None
    enable_reasoning: Annotated[
        bool | None,
        KeySpec(
            "option.enable_reasoning",
            _BOOL,
            "false: the reasoning stays in content, even where the chat template is recognised; true (DJL LMI's "
            "vLLM key): a reasoning parser must apply (option.reasoning_parser, or a recognised template), else "
            "the server does not start",
        ),
    ] = None
    model_loading_timeout: Annotated[
        int, KeySpec("option.model_loading_timeout", _integer(1, 1800), "seconds to load the model (not the compile)")
    ] = 1800
    predict_timeout: Annotated[
        int, KeySpec("option.predict_timeout", _integer(1, 240), "seconds one request may take")
    ] = 240
    max_request_size: Annotated[
        int, KeySpec("max_request_size", _integer(1, 64 * 1024 * 1024), "largest request body in bytes")
    ] = 64 * 1024 * 1024
    # --- serving: what one client may cost (README "Reliability and limits") ---
    header_read_timeout: Annotated[
        int,
        KeySpec(
            "header_read_timeout",
            _integer(1, 30),
            "seconds a client has to send a request's line and headers; then 408 and the connection closes",
        ),
    ] = 30
    body_read_timeout: Annotated[
        int, KeySpec("body_read_timeout", _integer(1, 120), "seconds a client has to send a request body; then 408")
    ] = 120
    max_connections: Annotated[
        int,
        KeySpec(
            "max_connections",
            _integer(1, 1000),
            "open client connections; past it idle keep-alive ones are closed, then new ones get 503 "
            "(capped below the process's open-files limit)",
        ),
    ] = 1000
    max_upload_bytes: Annotated[
        int,
        KeySpec(
            "max_upload_bytes",
            _integer(1, 256 * 1024 * 1024),
            "request-body bytes being received at once, all clients together; past it new bodies get 503",
        ),
    ] = 256 * 1024 * 1024
    max_prompts_per_request: Annotated[
        int,
        KeySpec(
            "option.max_prompts_per_request",
            _integer(1, 64),
            "prompts in one batch request (LMI inputs list, OpenAI prompt list); each counts against job_queue_size",
        ),
    ] = 64
    # --- serving: access (README "Deployment") ---
    api_key: Annotated[
        SecretStr | None,
        KeySpec(
            "option.api_key",
            _API_KEYS,
            "API key(s) every request must send as Authorization: Bearer KEY (vLLM's --api-key); several, "
            "comma-separated, for rotation; the health routes and /metrics stay open; masked in logs",
            secret=True,
        ),
    ] = None
    certificate_file: Annotated[
        Path | None,
        KeySpec(
            "certificate_file",
            _PATH,
            "serve HTTPS with this PEM certificate chain (DJL's key; vLLM's --ssl-certfile); with private_key_file",
            aliases=_both("ssl_certfile"),
        ),
    ] = None
    private_key_file: Annotated[
        Path | None,
        KeySpec(
            "private_key_file",
            _PATH,
            "the PEM private key of certificate_file (DJL's key; vLLM's --ssl-keyfile)",
            aliases=_both("ssl_keyfile"),
        ),
    ] = None
    ssl_ca_certs: Annotated[
        Path | None,
        KeySpec(
            "option.ssl_ca_certs",
            _PATH,
            "PEM CA certificates that client certificates are verified against (vLLM's --ssl-ca-certs); "
            "with option.ssl_cert_reqs",
            aliases=("ssl_ca_certs",),
        ),
    ] = None
    ssl_cert_reqs: Annotated[
        Literal["none", "optional", "required"] | None,
        KeySpec(
            "option.ssl_cert_reqs",
            _choice(
                {"0": "none", "1": "optional", "2": "required", **_same("none", "optional", "required")},
                shown=("none", "optional", "required"),
            ),
            "client certificates (vLLM's --ssl-cert-reqs; 0/1/2 work too): required or optional verifies "
            "them against option.ssl_ca_certs; unset: required when option.ssl_ca_certs is set",
            aliases=("ssl_cert_reqs",),
        ),
    ] = None
    # --- serving: health ---
    watchdog_timeout: Annotated[
        int,
        KeySpec(
            "option.watchdog_timeout",
            _integer(0, 300),
            "seconds requests may wait on the engine with no token coming out before /ping answers 503 "
            "FAILED (SGLang's --watchdog-timeout); it answers 200 again once tokens flow; 0: off",
        ),
    ] = 300
    parse_special_tokens: Annotated[
        bool,
        KeySpec(
            "option.parse_special_tokens",
            _BOOL,
            "parse special-token text (e.g. <|im_end|>) in prompts and chat content as control tokens; "
            "default: tokenized as plain text",
        ),
    ] = False

    # Provenance for the startup log only. Private attributes take part in ==, so two configs
    # with equal values from different sources compare unequal; compare compile_time_values().
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _env_echo: dict[str, str] = PrivateAttr(default_factory=dict)
    _derived: frozenset[str] = PrivateAttr(default_factory=frozenset)  # attributes a later stage filled in
    _labels: dict[str, str] = PrivateAttr(default_factory=dict)  # key → as written, when an alias or variable

    def compile_time_values(self) -> dict[str, Any]:
        """Every compile-time key's effective value (registry key → JSON-friendly value).

        ``option.tensor_parallel_degree`` may still be ``'max'``: the cache key must use the resolved count.
        """
        return {s.key: jsonable(getattr(self, s.attr)) for s in REGISTRY if s.compile_time and s.attr}

    def derived(self, origin: str, **values: Any) -> LmiConfig:
        """A copy with ``values`` a later stage filled in (``origin`` names it in the startup log);
        they count as set from then on (``model_fields_set``)."""
        copy = self.model_copy(update=values)
        copy._origins = {**self._origins, **{_BY_ATTR[attr].key: origin for attr in values}}
        copy._derived = self._derived | set(values)
        return copy

    def is_given(self, attr: str) -> bool:
        """Whether the user set ``attr`` (a file, the environment, an override or a constructor
        argument), as opposed to a default or a value a later stage derived."""
        return attr in self.model_fields_set and attr not in self._derived

    def label(self, attr: str) -> str:
        """``attr``'s key as the user wrote it (``option.enable_block_reuse (option.enable_kv_cache_reuse)``), for
        errors: a DJL user finds the line they wrote."""
        key = _BY_ATTR[attr].key
        return self._labels.get(key, key)

    def api_keys(self) -> tuple[str, ...]:
        """The keys of option.api_key (none: the server asks for no key)."""
        return tuple(self.api_key.get_secret_value().split(",")) if self.api_key is not None else ()

    def redacted(self) -> dict[str, Any]:
        """All attributes as JSON-friendly values, secrets masked."""
        return {name: jsonable(getattr(self, name)) for name in type(self).model_fields}


def _declared_keys() -> tuple[KeySpec, ...]:
    """Each field's KeySpec (its ``Annotated`` metadata) with ``attr`` set to the field's name."""
    specs = []
    for name, field in LmiConfig.model_fields.items():
        found = [m for m in field.metadata if isinstance(m, KeySpec)]
        specs += [replace(m, attr=name) for m in found]
    return tuple(specs)


# Every key: the fields' declarations, then the DJL keys accepted and ignored, those refused, and those
# with one value.
REGISTRY: tuple[KeySpec, ...] = _declared_keys() + IGNORED_KEYS + REFUSED_KEYS + FIXED_KEYS


@dataclass(frozen=True)
class EnvAlias:
    """A named environment variable that sets a key; in ENV_ALIASES order, the first one set wins,
    and only when no OPTION_/SERVING_ variable sets the key (the entrypoint's "only when unset")."""

    var: str
    key: str
    convert: Callable[[str], str] = _text_parse


def _inverted_bool(raw: str) -> str:
    return "false" if parse_bool(raw) else "true"


def _megabytes_to_bytes(raw: str) -> str:
    return str(_integer(1, 6).parse(raw.strip()) * 1024 * 1024)


ENV_ALIASES: tuple[EnvAlias, ...] = (
    EnvAlias("HF_MODEL_ID", "option.model_id"),
    EnvAlias("HF_REVISION", "option.revision"),
    EnvAlias("HF_TOKEN", "option.hf_token"),
    EnvAlias("HF_MODEL_TRUST_REMOTE_CODE", "option.trust_remote_code"),
    EnvAlias("TENSOR_PARALLEL_DEGREE", "option.tensor_parallel_degree"),
    EnvAlias("SM_NUM_GPUS", "option.tensor_parallel_degree"),
    EnvAlias("PIPELINE_PARALLEL_DEGREE", "option.pipeline_parallel_degree"),
    EnvAlias("HF_MODEL_QUANTIZE", "option.quantize"),
    EnvAlias("MAX_CONCURRENT_REQUESTS", "job_queue_size"),
    EnvAlias("MAX_BATCH_SIZE", "option.max_rolling_batch_size"),
    EnvAlias("MAX_BATCH_PREFILL_TOKENS", "option.max_rolling_batch_prefill_tokens"),
    EnvAlias("CUDA_MEMORY_FRACTION", "option.kv_cache_free_gpu_mem_fraction"),
    EnvAlias("ENABLE_CUDA_GRAPHS", "option.enforce_eager", _inverted_bool),
    EnvAlias("SAGEMAKER_MAX_REQUEST_SIZE", "max_request_size"),
    EnvAlias("SAGEMAKER_MAX_PAYLOAD_IN_MB", "max_request_size", _megabytes_to_bytes),
    EnvAlias("SAGEMAKER_STARTUP_TIMEOUT", "option.model_loading_timeout"),
    EnvAlias("MODEL_LOADING_TIMEOUT", "option.model_loading_timeout"),  # DJL image default variable
    EnvAlias("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "option.predict_timeout"),
    EnvAlias("PREDICT_TIMEOUT", "option.predict_timeout"),  # DJL image default variable
    EnvAlias("DJL_CACHE_DIR", "download_dir"),
    # vLLM's variable for --api-key (vllm/envs.py); TGI's API_KEY is left out: too generic a name.
    EnvAlias("VLLM_API_KEY", "option.api_key"),
)

_BY_NAME: dict[str, KeySpec] = {}
for _spec in REGISTRY:
    for _name in (_spec.key, *_spec.aliases):
        assert _name not in _BY_NAME, f"registry name {_name} defined twice"
        _BY_NAME[_name] = _spec


def _canonical_key(name: str) -> str:
    return _BY_NAME[name].key


def key_of(attr: str) -> str:
    """The key an LmiConfig field is written as (``max_num_tokens`` → ``option.max_num_tokens``)."""
    return _BY_ATTR[attr].key


_BY_ATTR = {s.attr: s for s in REGISTRY if s.attr}


# --------------------------------------------------------------------------------------------
# Stage settings: typed views of the declarations.


class Settings(BaseModel):
    """A stage's settings: what it reads of the configuration, frozen. ``READS`` maps each field that is a key to
    the key's ``LmiConfig`` field; the class's other fields are what the wiring derives (``lmi_trt.stages``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    READS: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def of(cls, config: LmiConfig, *, only: Iterable[str] | None = None, **derived: Any) -> Self:
        """This view of ``config``: every key it reads (or ``only`` these fields of them), and the ``derived``
        fields as given."""
        names = cls.READS if only is None else [n for n in cls.READS if n in set(only)]
        return cls(**{name: getattr(config, cls.READS[name]) for name in names}, **derived)


def reads(*keys: str, **renamed: str) -> type[Settings]:
    """The base of a stage's settings class: one field per configuration key it reads, named as the key's
    ``LmiConfig`` field (``keys``) or as the stage names it (``renamed``: its name → the key's field), each with
    the declaration's type, bounds and default.

    ``class TorchSettings(reads("dtype", max_new_tokens="max_output_len")): ...``"""
    mapping = {**{k: k for k in keys}, **renamed}
    fields: dict[str, Any] = {}
    for name, attr in mapping.items():
        declared = LmiConfig.model_fields[attr]
        fields[name] = (declared.annotation, Field(declared.default, **dict(_BY_ATTR[attr].type.bounds)))
    base = create_model("Reads", __base__=Settings, **fields)
    base.READS = mapping
    return base


def jsonable(value: Any) -> Any:
    """A configuration value as JSON-friendly data (secrets masked, enums and paths as text)."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
