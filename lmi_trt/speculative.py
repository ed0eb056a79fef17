"""Speculative decoding as configured: DJL LMI's keys, TensorRT-LLM's ``speculative_config`` and vLLM's
``--speculative-config``, normalised into one ``Speculation`` that every engine reads.

Three vocabularies say the same things, and a deployment may bring any of them:

* **TensorRT-LLM** (``LLM(speculative_config=...)``, trtllm-serve's ``--extra_llm_api_options`` YAML;
  NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, ``DecodingBaseConfig`` and its subclasses):
  ``decoding_type`` (``NGram``, ``Draft_Target``, ``Eagle3``, ``Eagle``, ``MTP``, ``Medusa``,
  ``Lookahead``), ``max_draft_len``, ``speculative_model`` (``speculative_model_dir`` in older
  releases, still accepted as an alias there), ``max_matching_ngram_size``, ``is_use_oldest``,
  ``max_concurrency``; trtllm-build's ``--speculative_decoding_mode`` (``draft_tokens_external``,
  ``medusa``, ``lookahead_decoding``, ``explicit_draft_tokens``, ``eagle``, ``ngram``;
  tensorrt_llm/models/modeling_utils.py ``SpeculativeDecodingMode.from_arguments``);
* **vLLM** (vllm/config/speculative.py ``SpeculativeConfig``, which DJL's vLLM container takes as
  ``option.speculative_config``): ``method`` (``ngram``, ``draft_model``, ``eagle``, ``eagle3``,
  ``medusa``, ``mtp``), ``num_speculative_tokens``, ``model``, ``prompt_lookup_max``,
  ``prompt_lookup_min``; 0.x's flat engine arguments ``speculative_model``,
  ``num_speculative_tokens``, ``ngram_prompt_lookup_max/min``, ``speculative_disable_by_batch_size``;
* **DJL LMI** (lmi-dist and transformers-neuronx, deepjavalibrary/djl-serving
  engines/python/setup/djl_python/properties_manager/lmi_dist_rb_properties.py, tnx_properties.py;
  properties.py ``draft_model_id``/``spec_length``): ``option.speculative_draft_model`` (an
  ``s3://`` one is downloaded first, wlm/ModelInfo.java ``downloadDraftModel``) and
  ``option.speculative_length`` (default 5: ``speculative_length: int = 5`` in lmi_dist_rb_properties.py and
  tnx_properties.py).

The configuration declares the flat keys (``lmi_trt.config``); ``resolve`` merges them with the JSON
object into a ``Speculation`` or refuses, naming the key or member, what is wrong and what would work.
Which engine runs which method is the engines' business (``RUNS_ON`` states where TensorRT-LLM runs
each, for the messages of engines that do not).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from lmi_trt.errors import LmiError

JSON_KEY = "option.speculative_config"

# Canonical method names (vLLM's, plus TensorRT-LLM's engine-only modes) and what each is.
METHODS = {
    "ngram": "n-gram (prompt lookup): drafts copied from the sequence's own earlier tokens",
    "draft_model": "a smaller draft model with the same tokenizer",
    "eagle3": "EAGLE-3 draft heads",
    "eagle": "EAGLE (1/2) draft heads",
    "mtp": "the model's own multi-token-prediction heads (DeepSeek V3/R1)",
    "medusa": "Medusa heads",
    "lookahead": "lookahead decoding (Jacobi iterations, no draft model)",
    "explicit_draft_tokens": "ReDrafter (explicit draft tokens)",
}
# Every spelling, lower-cased → canonical: TensorRT-LLM's decoding_type (llm_args.py) and
# trtllm-build's --speculative_decoding_mode, vLLM's method.
SPELLINGS = {
    **{name: name for name in METHODS},
    "draft_target": "draft_model",
    "drafttarget": "draft_model",
    "draft_tokens_external": "draft_model",
    "lookahead_decoding": "lookahead",
}
# Where TensorRT-LLM runs each (llm_args.py: ``supports_backend`` of NGram, Draft_Target, Eagle3 and MTP
# is the PyTorch backend; Medusa, EAGLE-1/2, Lookahead and ReDrafter are TensorRT-engine modes built by
# trtllm-build --speculative_decoding_mode, and DraftTarget's engine form is draft_tokens_external).
RUNS_ON = {
    "ngram": "TensorRT-LLM's pytorch backend, and lmi-trt's tensorrt backend (option.rolling_batch=trtllm, "
    "option.backend=tensorrt: TensorRT-LLM's Executor, 1.0-1.2) on an engine built with --speculative_decoding_mode "
    "draft_tokens_external, which its compile stage builds",
    "draft_model": "TensorRT-LLM's pytorch backend (Draft_Target) and TensorRT engines (draft_tokens_external: "
    "lmi-trt's tensorrt backend, 1.0-1.2, its compile stage building both engines)",
    "eagle3": "TensorRT-LLM's pytorch backend (option.rolling_batch=trtllm, option.backend=pytorch)",
    "mtp": "TensorRT-LLM's pytorch backend, for models with MTP heads (option.rolling_batch=trtllm, "
    "option.backend=pytorch)",
    "lookahead": "lmi-trt's tensorrt backend (option.rolling_batch=trtllm, option.backend=tensorrt: TensorRT-LLM's "
    "Executor, 0.12-1.2) on an engine built with --speculative_decoding_mode lookahead_decoding, which its compile "
    "stage builds",
    "medusa": "lmi-trt's tensorrt backend (option.rolling_batch=trtllm, option.backend=tensorrt: TensorRT-LLM's "
    "Executor, 1.0-1.2) on an engine built with --speculative_decoding_mode medusa and the heads, which its compile "
    "stage builds from the Hugging Face checkpoint and FasterDecoding-format heads (TensorRT-LLM's "
    "MedusaDecodingConfig is not for its pytorch backend: llm_args.py supports_backend)",
    **dict.fromkeys(
        ("eagle", "explicit_draft_tokens"),
        "TensorRT-LLM's TensorRT engines built for it, which lmi-trt does not build or drive (their head checkpoints "
        "need TensorRT-LLM's own converters)",
    ),
}
# trtllm-build's --speculative_decoding_mode for the methods TensorRT engines are built for
# (tensorrt_llm/commands/build.py choices; models/modeling_utils.py SpeculativeDecodingMode.from_arguments): the
# draft-token methods' engine form is draft_tokens_external; EAGLE-3 and MTP have none (the compile stage refuses them
# by that name).
BUILD_MODES = {
    "ngram": "draft_tokens_external",
    "draft_model": "draft_tokens_external",
    "lookahead": "lookahead_decoding",
    "medusa": "medusa",
    "eagle": "eagle",
    "explicit_draft_tokens": "explicit_draft_tokens",
    "eagle3": "eagle3",
    "mtp": "mtp",
}
# DJL's option.speculative_length default (deepjavalibrary/djl-serving properties_manager lmi_dist_rb_properties.py
# and tnx_properties.py: ``speculative_length: int = 5``), for the flat keys; the JSON forms require a length, as
# TensorRT-LLM ("max_draft_len must be > 0") and vLLM do.
DEFAULT_DRAFT_LEN = 5
# The flat keys' and TensorRT-LLM's form: NGramDecodingConfig.max_matching_ngram_size's default, matching down to
# one token (TensorRT-LLM has no shortest n-gram).
DEFAULT_NGRAM_MAX = 2
DEFAULT_NGRAM_MIN = 1
# vLLM's form (vllm/config/speculative.py SpeculativeConfig.__post_init__): neither prompt_lookup bound given, both 5;
# one given, the other copies it; ``model: "ngram"`` (or "[ngram]") without a method is the n-gram method.
VLLM_NGRAM_DEFAULT = 5
VLLM_MEMBERS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size")
VLLM_NGRAM_MODELS = ("ngram", "[ngram]")

# speculative_config members → the Speculation field each sets (TensorRT-LLM's names, then vLLM's).
MEMBERS = {
    "decoding_type": "method",
    "method": "method",
    "max_draft_len": "max_draft_len",
    "num_speculative_tokens": "max_draft_len",
    # MTPDecodingConfig's draft length on 1.0-1.2 (1.0 validate_speculative_config, 1.1 __init__/from_dict:
    # max_draft_len = num_nextn_predict_layers; llm_args.py)
    "num_nextn_predict_layers": "max_draft_len",
    "speculative_model": "draft_model",
    "speculative_model_dir": "draft_model",
    "model": "draft_model",
    "max_matching_ngram_size": "max_matching_ngram_size",
    "prompt_lookup_max": "max_matching_ngram_size",
    "prompt_lookup_min": "min_matching_ngram_size",
    "is_use_oldest": "use_oldest",
    "max_concurrency": "max_concurrency",
    "disable_by_batch_size": "max_concurrency",
}
# The configuration's flat keys (LmiConfig fields) → the field each sets.
FLAT_FIELDS = {
    "speculative_decoding_mode": "method",
    "max_draft_len": "max_draft_len",
    "speculative_draft_model": "draft_model",
    "max_matching_ngram_size": "max_matching_ngram_size",
    "prompt_lookup_min": "min_matching_ngram_size",
    "speculative_disable_by_batch_size": "max_concurrency",
}
_NGRAM_ONLY = ("max_matching_ngram_size", "min_matching_ngram_size", "use_oldest")
# Lookahead's (W, N, G), as trtllm-serve's LookaheadDecodingConfig names them (tensorrt_llm/llmapi/llm_args.py, every
# copy read: max_window_size, max_ngram_size, max_verification_set_size, each "Value must be positive"), with the
# Executor's defaults (cpp/include/tensorrt_llm/executor/executor.h LookaheadDecodingConfig's
# kDefaultLookaheadDecodingWindow = 4, kDefaultLookaheadDecodingNgram = 3,
# kDefaultLookaheadDecodingVerificationSet = 4).
LOOKAHEAD_MEMBERS = {"max_window_size": 4, "max_ngram_size": 3, "max_verification_set_size": 4}


def lookahead_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """The draft tokens a lookahead step verifies, which the engine's --max_draft_len must equal
    (cpp/tensorrt_llm/executor/decodingConfig.cpp LookaheadDecodingConfig::calculateSpeculativeResourceTuple's
    maxDraftTokens; examples/lookahead/README.md: "Ensure the max_draft_len derived from executor_lookahead_config
    equals to the max_draft_len specified in the engine-building phase")."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


class SpeculationError(LmiError, ValueError):
    """A speculative-decoding setting that cannot work: the key (or ``option.speculative_config.<member>``),
    its value, the problem and the fix."""

    def __init__(self, key: str, value: Any, problem: str, fix: str) -> None:
        self.key, self.value, self.problem, self.fix = key, value, problem, fix
        super().__init__(f"{key}={value!r}: {problem}; {fix}")


class Speculation(BaseModel):
    """Speculative decoding as every engine reads it. ``keys`` names where each field was set (for
    messages); ``options`` keeps the speculative_config members not listed here, as written, for an
    engine that passes them on (an engine that does not use one refuses it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    max_draft_len: int
    draft_model: str | None = None
    max_matching_ngram_size: int = DEFAULT_NGRAM_MAX
    min_matching_ngram_size: int = DEFAULT_NGRAM_MIN
    use_oldest: bool | None = None  # n-gram: the oldest match's continuation rather than the latest's (None: unset)
    max_concurrency: int | None = None  # no speculation in steps with more running requests
    options: dict[str, Any] = {}
    keys: dict[str, str] = {}

    def key(self, field: str) -> str:
        return self.keys.get(field, JSON_KEY)


def parse_json_object(raw: str) -> dict[str, Any]:
    """``option.speculative_config``'s value: a JSON object (ValueError with the reason otherwise)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"is not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, dict):
        raise ValueError("is not a JSON object")
    return value


def _member_fields(raw: Mapping[str, Any]) -> tuple[dict[str, tuple[str, Any]], dict[str, Any]]:
    """speculative_config → {field: (its key, value)} and the other members; two members that set one
    field (a TensorRT-LLM and a vLLM name) are refused."""
    fields: dict[str, tuple[str, Any]] = {}
    options: dict[str, Any] = {}
    for member, value in raw.items():
        field = MEMBERS.get(member)
        if field is None:
            options[member] = value
            continue
        key = f"{JSON_KEY}.{member}"
        if field in fields:
            other = fields[field][0]
            raise SpeculationError(
                key, value, f"sets the same thing as {other}", f"keep one of {other.rsplit('.', 1)[1]} and {member}"
            )
        fields[field] = (key, value)
    return fields, options


def _checked(field: str, key: str, value: Any) -> Any:
    """A member's value of the type its field takes (JSON gives ints, strings, booleans)."""
    if field == "method":
        if not isinstance(value, str) or value.lower() not in SPELLINGS:
            raise SpeculationError(
                key,
                value,
                "is not a speculative-decoding method lmi-trt knows",
                "use one of " + ", ".join(METHODS) + " (TensorRT-LLM's NGram, Draft_Target, Eagle3, Eagle, MTP, "
                "Medusa and Lookahead spellings work too)",
            )
        if key == f"{JSON_KEY}.decoding_type" and value.lower() == "eagle":
            # TensorRT-LLM's own spelling: on the PyTorch backend EagleDecodingConfig is EAGLE-3 (spec_dec_mode gives
            # EAGLE3_ONE_MODEL or EAGLE3; llm_args.py of 1.0, 1.1 and main), and 1.0/1.1's from_dict knows "Eagle"
            # but not "Eagle3"; vLLM's method "eagle" and trtllm-build's mode "eagle" stay EAGLE-1/2
            return "eagle3"
        return SPELLINGS[value.lower()]
    if field == "draft_model":
        if not isinstance(value, str) or not value.strip():
            raise SpeculationError(key, value, "is not a model id", "name a Hugging Face id, an s3:// URI or a folder")
        return value.strip()
    if field == "use_oldest":
        if not isinstance(value, bool):
            raise SpeculationError(key, value, "is not a boolean", "set true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpeculationError(key, value, "is not a positive integer", "set an integer ≥ 1")
    return value


def resolve(raw: Mapping[str, Any] | None, flat: Mapping[str, tuple[str, Any]]) -> Speculation | None:
    """Pure: the speculation ``option.speculative_config`` (``raw``) and the flat keys (``flat``: field →
    (the key as written, its value), only those set) describe, or None when nothing asks for it. A field
    set both ways must agree; a method needs what it uses and takes nothing it does not."""
    fields, options = _member_fields(raw or {})
    fields = {field: (key, _checked(field, key, value)) for field, (key, value) in fields.items()}
    model = fields.get("draft_model")
    if model is not None and model[0] == f"{JSON_KEY}.model" and model[1] in VLLM_NGRAM_MODELS:
        del fields["draft_model"]  # vLLM: the n-gram method's name, not a draft model id
        if fields.setdefault("method", (model[0], "ngram"))[1] != "ngram":
            raise SpeculationError(model[0], model[1], f"names n-gram, beside method {fields['method'][1]}", "keep one")
    for field, (key, value) in flat.items():
        if field in fields and fields[field][1] != value:
            other_key, other = fields[field]
            raise SpeculationError(
                key, value, f"disagrees with {other_key}={other!r}", "set it in one place, or to the same value"
            )
        fields.setdefault(field, (key, value))
    if not fields and not options:
        return None
    if "method" not in fields:
        if "draft_model" not in fields:
            key, value = next(iter(fields.values()), (JSON_KEY, dict(raw or {})))
            raise SpeculationError(
                key,
                value,
                "sets up speculative decoding without saying how to draft",
                f"set option.speculative_decoding_mode (ngram or draft_model), {JSON_KEY}'s decoding_type or "
                "method, or option.speculative_draft_model",
            )
        fields["method"] = (fields["draft_model"][0], "draft_model")  # DJL: a draft model alone turns it on
    method_key, method = fields["method"]
    if method == "lookahead":
        options = _lookahead_members(options)
        if "max_draft_len" not in fields:  # trtllm-serve's LookaheadDecodingConfig derives it (module docstring)
            fields["max_draft_len"] = (
                method_key,
                lookahead_draft_len(*(options[m] for m in LOOKAHEAD_MEMBERS)),
            )
    else:
        for member in LOOKAHEAD_MEMBERS:
            if member in options:
                raise SpeculationError(
                    f"{JSON_KEY}.{member}",
                    options[member],
                    f"configures lookahead decoding, not {method}",
                    "leave it out",
                )
    if "max_draft_len" not in fields:
        if method_key.startswith(JSON_KEY):
            raise SpeculationError(
                method_key,
                (raw or {}).get(method_key.rsplit(".", 1)[1]),
                "needs a draft length",
                f"add max_draft_len (TensorRT-LLM) or num_speculative_tokens (vLLM) to {JSON_KEY}",
            )
        fields["max_draft_len"] = ("option.max_draft_len", DEFAULT_DRAFT_LEN)
    length_key = fields["max_draft_len"][0]
    if length_key.endswith(".num_nextn_predict_layers") and method != "mtp":
        raise SpeculationError(
            length_key, fields["max_draft_len"][1], f"is MTP's draft length, not {method}'s", "leave it out"
        )
    if method == "draft_model" and "draft_model" not in fields:
        raise SpeculationError(
            method_key,
            method,
            "needs the draft model",
            f"set option.speculative_draft_model (or {JSON_KEY}'s speculative_model / model)",
        )
    if method == "ngram" and "draft_model" in fields:
        key, value = fields["draft_model"]
        raise SpeculationError(key, value, "names a draft model, which n-gram speculation does not use", "leave it out")
    if method != "ngram":
        for field in _NGRAM_ONLY:
            if field in fields:
                key, value = fields[field]
                raise SpeculationError(key, value, f"configures n-gram drafting, not {method}", "leave it out")
    if (
        method == "ngram"
        and any(member in (raw or {}) for member in VLLM_MEMBERS)
        or model is not None
        and model[1] in VLLM_NGRAM_MODELS
    ):
        _vllm_ngram_bounds(fields)
    values = {field: value for field, (_, value) in fields.items()}
    if "min_matching_ngram_size" in values and "max_matching_ngram_size" not in values:
        values["max_matching_ngram_size"] = max(DEFAULT_NGRAM_MAX, values["min_matching_ngram_size"])
    spec = Speculation(**values, options=options, keys={field: key for field, (key, _) in fields.items()})
    if spec.min_matching_ngram_size > spec.max_matching_ngram_size:
        raise SpeculationError(
            spec.key("min_matching_ngram_size"),
            spec.min_matching_ngram_size,
            f"is above the largest n-gram, {spec.key('max_matching_ngram_size')}={spec.max_matching_ngram_size}",
            "lower it or raise the other",
        )
    return spec


def _lookahead_members(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with lookahead's (W, N, G) checked and filled in with the Executor's defaults: positive integers
    (llm_args.py), and an n-gram of 1 only with a window of 1 and no verification set (executor.h
    LookaheadDecodingConfig::isLegal), which positive values never are."""
    out = {**LOOKAHEAD_MEMBERS, **options}
    for member in LOOKAHEAD_MEMBERS:
        value = out[member]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpeculationError(f"{JSON_KEY}.{member}", value, "is not a positive integer", "set an integer ≥ 1")
    if out["max_ngram_size"] == 1:
        raise SpeculationError(
            f"{JSON_KEY}.max_ngram_size",
            1,
            "is legal only with max_window_size 1 and max_verification_set_size 0 (TensorRT-LLM's "
            "LookaheadDecodingConfig::isLegal), and the verification set must be positive (llm_args.py)",
            "set 2 or more",
        )
    return out


def _vllm_ngram_bounds(fields: dict[str, tuple[str, Any]]) -> None:
    """vLLM's n-gram bounds where its form is used (``VLLM_NGRAM_DEFAULT``): the missing bound copies the given
    one, or both are 5; the key named for a copied bound is the member vLLM would have set."""
    low, high = fields.get("min_matching_ngram_size"), fields.get("max_matching_ngram_size")
    if low is None and high is None:
        low = high = (f"{JSON_KEY}.prompt_lookup_min", VLLM_NGRAM_DEFAULT)
        high = (f"{JSON_KEY}.prompt_lookup_max", VLLM_NGRAM_DEFAULT)
    elif low is None:
        low = (f"{JSON_KEY}.prompt_lookup_min", high[1])
    elif high is None:
        high = (f"{JSON_KEY}.prompt_lookup_max", low[1])
    fields["min_matching_ngram_size"], fields["max_matching_ngram_size"] = low, high


def refuse_other_members(spec: Speculation, members: Iterable[str], configuration: str) -> None:
    """Refuses a speculative_config member outside ``members``, the ones ``configuration`` has."""
    allowed = tuple(members)
    for member, value in spec.options.items():
        if member not in allowed:
            raise SpeculationError(
                f"{JSON_KEY}.{member}",
                value,
                f"is not a member of {configuration}",
                f"use {', '.join(allowed)}, or leave it out",
            )


def not_here(spec: Speculation, engine: str, runs: tuple[str, ...]) -> SpeculationError:
    """The refusal of a method ``engine`` does not run, saying where it runs."""
    return SpeculationError(
        spec.key("method"),
        spec.method,
        f"the {engine} engine does not run {spec.method} ({METHODS[spec.method]}); it runs {', '.join(runs)}",
        f"{spec.method} runs on {RUNS_ON[spec.method]}; or use {' or '.join(runs)} here",
    )
