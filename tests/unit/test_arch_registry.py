"""Issue 14, item 1 and 6: one declaration per option, one engine registry, typed stage settings.

Each test fails when the drift it names comes back: a key whose declaration and field disagree, a
stage setting typed or defaulted unlike its key, a default decided in two places, an engine name
compared outside the registry, a configuration read by string with a default.
"""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from lmi_trt.compile.archs import _BAICHUAN_VERSIONS, _CHATGLM_VERSIONS, _GPT_VERSIONS
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import estimate_memory
from lmi_trt.config import REGISTRY, ConfigError, LmiConfig, _BadValue, jsonable, load_config
from lmi_trt.engines import registry
from lmi_trt.engines.registry import ENGINES, SyntheticSettings, TorchSettings, settle
from lmi_trt.vocabulary import Quantization

PACKAGE = Path(__file__).resolve().parents[2] / "lmi_trt"
# Raw values every key is probed with, beyond its own choices.
PROBES = ("-1", "0", "0.5", "1", "1.5", "2", "7", "32", "64", "100", "128", "true", "false", "max", "x")


def _parsed(spec, raw):
    try:
        return True, spec.type.parse(raw)
    except _BadValue:
        return False, None


def _accepts(model, name, value) -> bool:
    try:
        model(**{name: value})
    except ValidationError:
        return False
    return True


def _choices(annotation) -> tuple:
    """The values of the Literal inside an annotation (Literal[...] | None), else ()."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
    return ()


def _raws(spec, field) -> list[str]:
    return [*PROBES, *(str(c) for c in _choices(field.annotation))]


@pytest.mark.parametrize("spec", [s for s in REGISTRY if s.attr], ids=lambda s: s.key)
def test_each_key_declaration_agrees_with_its_field(spec):
    field = LmiConfig.model_fields[spec.attr]
    # Every value the key's parser yields is one the typed field holds...
    for raw in _raws(spec, field):
        ok, value = _parsed(spec, raw)
        if ok:
            assert _accepts(LmiConfig, spec.attr, value), f"{spec.key}={raw!r} parses but the field refuses {value!r}"
    # ...and every value a Literal field allows can be written in serving.properties.
    for choice in _choices(field.annotation):
        ok, value = _parsed(spec, str(choice))
        assert ok and value == choice, f"{spec.key}: the field allows {choice!r}, the key refuses it"
    # The default is a value of the field, and the README describes the key.
    if field.default is not None:
        assert _accepts(LmiConfig, spec.attr, field.default)
    assert spec.description and not spec.ignored


def test_a_field_declared_once_is_in_the_registry_once():
    attrs = [s.attr for s in REGISTRY if s.attr]
    assert len(attrs) == len(set(attrs))
    assert set(attrs) == set(LmiConfig.model_fields) - {"model_dir"}  # model_dir: a CLI argument, not a key


@pytest.mark.parametrize("name", [n for n in CompileOptions.model_fields if n != "max_batch_size"])
def test_compile_options_are_typed_and_defaulted_like_the_configuration(name):
    # Drift that shipped: use_fused_mlp (None vs false), awq_block_size (any int vs 64/128),
    # smoothquant_alpha (0 allowed vs > 0).
    assert name in LmiConfig.model_fields, f"CompileOptions.{name} is no configuration field"
    spec = next(s for s in REGISTRY if s.attr == name)
    assert jsonable(CompileOptions.model_fields[name].default) == jsonable(LmiConfig.model_fields[name].default)
    for raw in _raws(spec, LmiConfig.model_fields[name]):
        ok, value = _parsed(spec, raw)
        value = str(value) if isinstance(value, Path) else value
        if ok:
            assert _accepts(CompileOptions, name, value), f"{spec.key}={raw!r} is accepted but the planner refuses it"
        elif raw.lstrip("-").replace(".", "", 1).isdigit():
            number = float(raw) if "." in raw else int(raw)
            assert not _accepts(CompileOptions, name, number), f"{spec.key}={raw!r} is refused but the planner takes it"


def test_the_planner_takes_every_variant_the_converter_knows():
    # starcoder2/nemotron/jais were converted by compile/archs.py and refused by the configuration.
    for spec_attr, version_key in (
        ("gpt_model_version", _GPT_VERSIONS),
        ("chatglm_model_version", _CHATGLM_VERSIONS),
        ("baichuan_model_version", _BAICHUAN_VERSIONS),
    ):
        for value in version_key.choices:
            config = load_config(overrides={version_key.key: value}, env={"HF_MODEL_ID": "m"})
            assert getattr(config, spec_attr) == value


def test_one_quantization_vocabulary_from_config_to_plan():
    for q in (None, *Quantization):
        opts = registry.compile_options(settle(LmiConfig(quantize=q), "trtllm"))
        assert opts.quantize is q


def test_kv_fraction_of_the_memory_estimate_is_the_configured_one():
    default = LmiConfig.model_fields["kv_cache_free_gpu_mem_fraction"].default
    assert inspect.signature(estimate_memory).parameters["kv_fraction"].default == default
    job = registry.compile_job(settle(LmiConfig(kv_cache_free_gpu_mem_fraction=0.5), "trtllm"))
    assert job.kv_cache_fraction == 0.5


def test_max_rolling_batch_size_is_decided_once_and_flows_forward():
    for name, entry in ENGINES.items():
        settled = settle(LmiConfig(), name)
        assert settled.max_rolling_batch_size == entry.default_batch
        assert not settled.is_given("max_rolling_batch_size")  # a default: the trtllm engine may lower it
        view = entry.settings(settled)
        batch = view.runtime.max_batch_size if hasattr(view, "runtime") else view.max_batch_size
        assert batch == entry.default_batch
    assert registry.compile_job(settle(LmiConfig(), "trtllm")).options.max_batch_size == ENGINES["trtllm"].default_batch
    given = settle(LmiConfig(max_rolling_batch_size=8), "torch")
    assert given.max_rolling_batch_size == 8 and given.is_given("max_rolling_batch_size")
    # The views refuse an unsettled configuration instead of guessing a default of their own.
    with pytest.raises(Exception, match="settle"):
        registry.torch_settings(LmiConfig())


def test_settings_views_are_the_engines_keywords():
    from lmi_trt.engines.synthetic import SyntheticEngine
    from lmi_trt.engines.torch import TorchEngine

    for engine, view, tokenizer_facts in (
        (TorchEngine, TorchSettings, {"eos_token_ids", "pad_token_id"}),
        (SyntheticEngine, SyntheticSettings, {"special_token_ids", "eos_token_id", "max_seq_len"}),
    ):
        keywords = {n for n, p in inspect.signature(engine).parameters.items() if p.kind is p.KEYWORD_ONLY}
        assert set(view.model_fields) == keywords - tokenizer_facts, engine.__name__


def test_engine_names_come_from_the_registry():
    from lmi_trt.cli import build_parser

    assert typing.get_args(LmiConfig.model_fields["rolling_batch"].annotation) == ("auto", *ENGINES)
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    engine_flag = next(a for a in serve._actions if a.dest == "engine")
    assert tuple(engine_flag.choices) == ("auto", *ENGINES)
    with pytest.raises(ConfigError, match="option.rolling_batch"):
        load_config(overrides={"option.rolling_batch": "vllm"}, env={"HF_MODEL_ID": "m"})


def _compares_to_engine_name(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value in ENGINES for c in (node.left, *node.comparators))
    ]


@pytest.mark.parametrize(
    "module",
    ["config.py", "launch.py", "loader.py", "engines/__init__.py"]
    + sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "cli").glob("*.py")),
)
def test_no_stage_branches_on_an_engine_name(module):
    # Engine-specific rules live on the registry's entries (launch rule, compiles, uses_model, ...).
    tree = ast.parse((PACKAGE / module).read_text())
    assert not _compares_to_engine_name(tree), f"lmi_trt/{module} compares with an engine name"


def test_no_configuration_is_read_by_string_with_a_default():
    # getattr(config, "max_input_len", default): a misspelt name silently became the default (20 places).
    # Options are read as typed attributes; getattr of a transformers config (model_type, head_dim) is fine.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "tokenizer")
                and node.args[1].value in LmiConfig.model_fields
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.args[1].value}")
    assert not found


@pytest.mark.parametrize("name", list(ENGINES))
def test_max_num_sequences_is_honoured_by_every_engine(name):
    # It capped the trtllm Executor and was silently ignored by the torch engine (issue 14, item 2).
    view = ENGINES[name].settings(settle(LmiConfig(max_rolling_batch_size=16, max_num_sequences=4), name))
    assert (view.runtime if hasattr(view, "runtime") else view).max_batch_size == 4
