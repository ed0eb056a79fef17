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

from lmi_trt import stages
from lmi_trt.compile.archs import _BAICHUAN_VERSIONS, _CHATGLM_VERSIONS, _GPT_VERSIONS
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import estimate_memory
from lmi_trt.config import REGISTRY, ConfigError, LmiConfig, _BadValue, load_config
from lmi_trt.engines.llmapi import LlmApiSettings
from lmi_trt.engines.registry import BACKEND_NAMES, ENGINE_NAMES, ENTRIES
from lmi_trt.engines.trtllm import TrtllmSettings
from lmi_trt.stages import WIRING, SyntheticSettings, TorchSettings, settle
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


VIEWS = (CompileOptions, TrtllmSettings, LlmApiSettings, TorchSettings, SyntheticSettings)
# Fields a view declares itself although a key has their name: the wiring derives them from the key.
DERIVED = {
    (TrtllmSettings, "tensor_parallel_degree"): "option.tensor_parallel_degree, 'max' as None (the engine's)",
    (LlmApiSettings, "max_seq_len"): "option.max_seq_len, else max_input_len + max_output_len",
    (CompileOptions, "speculative_decoding_mode"): "the speculation the keys settle on, as trtllm-build's flag value",
    (CompileOptions, "max_draft_len"): "the speculation's draft length (lookahead's derived from (W, N, G))",
}


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
def test_stage_settings_take_each_keys_type_and_default_from_its_declaration(view):
    # 71 fields in these five classes restated their keys' types and defaults by hand, held equal by a test, and
    # drifted before it (use_fused_mlp None vs false, awq_block_size any int vs 64/128, smoothquant_alpha 0
    # allowed vs > 0): each is now its key's declaration (lmi_trt.keys.reads).
    assert view.READS, f"{view.__name__} reads no key"
    for name, attr in view.READS.items():
        mine, declared = view.model_fields[name], LmiConfig.model_fields[attr]
        assert (mine.annotation, mine.default) == (declared.annotation, declared.default), f"{view.__name__}.{name}"
    restated = {n for n in set(view.model_fields) - set(view.READS) if n in LmiConfig.model_fields}
    assert restated == {n for v, n in DERIVED if v is view}, f"{view.__name__} declares keys by hand: {restated}"


@pytest.mark.parametrize(
    ("view", "name"), [(v, n) for v in VIEWS for n in v.READS], ids=lambda x: getattr(x, "__name__", x)
)
def test_a_view_takes_what_its_key_takes_and_refuses_what_it_refuses(view, name):
    spec = next(s for s in REGISTRY if s.attr == view.READS[name])
    for raw in _raws(spec, LmiConfig.model_fields[spec.attr]):
        ok, value = _parsed(spec, raw)
        if ok:
            assert _accepts(view, name, value), f"{spec.key}={raw!r} is accepted but {view.__name__} refuses it"
        elif raw.lstrip("-").replace(".", "", 1).isdigit():
            number = float(raw) if "." in raw else int(raw)
            assert not _accepts(view, name, number), f"{spec.key}={raw!r} is refused but {view.__name__} takes it"


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
        opts = stages.compile_options(settle(LmiConfig(quantize=q), "trtllm"))
        assert opts.quantize is q


def test_kv_fraction_of_the_memory_estimate_is_the_configured_one():
    default = LmiConfig.model_fields["kv_cache_free_gpu_mem_fraction"].default
    assert inspect.signature(estimate_memory).parameters["kv_fraction"].default == default
    job = stages.compile_job(settle(LmiConfig(kv_cache_free_gpu_mem_fraction=0.5), "trtllm"))
    assert job.kv_cache_fraction == 0.5


def test_max_rolling_batch_size_is_decided_once_and_flows_forward():
    for entry in ENTRIES:
        settled = settle(LmiConfig(), entry.engine)
        assert settled.max_rolling_batch_size == entry.default_batch
        assert not settled.is_given("max_rolling_batch_size")  # a default: the trtllm engine may lower it
        view = WIRING[entry].settings(settled)
        batch = view.runtime.max_batch_size if hasattr(view, "runtime") else view.max_batch_size
        assert batch == entry.default_batch
    trtllm = settle(LmiConfig(), "trtllm")
    assert stages.compile_job(trtllm).options.max_batch_size == trtllm.max_rolling_batch_size
    given = settle(LmiConfig(max_rolling_batch_size=8), "torch")
    assert given.max_rolling_batch_size == 8 and given.is_given("max_rolling_batch_size")
    # The views refuse an unsettled configuration instead of guessing a default of their own.
    with pytest.raises(Exception, match="settle"):
        stages.torch_settings(LmiConfig())


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

    assert typing.get_args(LmiConfig.model_fields["rolling_batch"].annotation) == ("auto", *ENGINE_NAMES)
    assert typing.get_args(LmiConfig.model_fields["backend"].annotation) == ("auto", *BACKEND_NAMES)
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    engine_flag = next(a for a in serve._actions if a.dest == "engine")
    assert tuple(engine_flag.choices) == ("auto", *ENGINE_NAMES)
    with pytest.raises(ConfigError, match="option.rolling_batch"):
        load_config(overrides={"option.rolling_batch": "vllm"}, env={"HF_MODEL_ID": "m"})


NAMES = {*ENGINE_NAMES, *BACKEND_NAMES}


def _constants(node: ast.AST) -> list[object]:
    """The constants an operand of a comparison names: itself, or the members of a literal tuple, list or set."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [c for e in node.elts for c in _constants(e)]
    return []


def _compares_to_engine_name(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(c in NAMES for operand in (node.left, *node.comparators) for c in _constants(operand))
    ]


def test_the_name_finder_sees_comparisons_and_memberships():
    tree = ast.parse("a == 'torch'\nb in ('auto', 'pytorch')\nc != d\ne == 'cuda'\n")
    assert _compares_to_engine_name(tree) == [1, 2]


@pytest.mark.parametrize(
    "module",
    sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p != PACKAGE / "engines" / "registry.py"),
)
def test_no_module_outside_the_registry_branches_on_an_engine_or_backend_name(module):
    # Engine- and backend-specific rules are facts of the registry's entries (launch rule, builds_engine,
    # calibrates, uses_model, ...): a stage asks the fact, never the name (issue 25: `backend == "pytorch"` was
    # compared in 5 files).
    tree = ast.parse((PACKAGE / module).read_text())
    assert not _compares_to_engine_name(tree), f"lmi_trt/{module} compares with an engine or backend name"


def test_every_registry_entry_is_wired():
    assert set(WIRING) == set(ENTRIES)


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


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.label)
def test_max_num_sequences_is_honoured_by_every_engine(entry):
    # It capped the trtllm Executor and was silently ignored by the torch engine (issue 14, item 2).
    config = settle(LmiConfig(max_rolling_batch_size=16, max_num_sequences=4), entry.engine)
    view = WIRING[entry].settings(config)
    assert (view.runtime if hasattr(view, "runtime") else view).max_batch_size == 4
