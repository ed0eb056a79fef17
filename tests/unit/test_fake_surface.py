"""The fake ``tensorrt_llm`` and lmi_trt's use of TensorRT-LLM, checked against the API listing, per release.

``tests/fakes/trtllm_api_surface.py`` is data (the project's source of truth for the real API, every
per-release entry naming the real file it was read from): it is parsed with ``ast.literal_eval``,
never imported. Every check below runs once per supported release (the fake impersonating it), with
the entry's ``per_release`` overrides applied. Two directions are checked:
* every public name the fake defines exists in the listing, with the listed constructor keywords in
  the listed order (positional/keyword-only, required/optional, literal defaults), enum members, and
  no attribute or method the listing lacks; listed properties exist (read-only ones refuse writes);
* every ``tensorrt_llm`` import, attribute and constructor keyword in ``lmi_trt/`` exists in the listing.
"""

from __future__ import annotations
import __future__

import ast
import enum
import inspect
import re
from pathlib import Path

import pytest
from trtllm_testing import FAKES, fake_tensorrt_llm

REPO = Path(__file__).resolve().parents[2]
SURFACE_FILE = FAKES / "trtllm_api_surface.py"
FAKE_MODULES = [
    "tensorrt_llm",
    "tensorrt_llm.bindings",
    "tensorrt_llm.bindings.executor",
    "tensorrt_llm.builder",
    "tensorrt_llm.mapping",
    "tensorrt_llm.models",
    "tensorrt_llm.models.modeling_utils",
    "tensorrt_llm.plugin",
    "tensorrt_llm.plugin.plugin",
    "tensorrt_llm.quantization",
    "tensorrt_llm.quantization.mode",
    "tensorrt_llm.quantization.quantize_by_modelopt",
]
# Objects needing constructor arguments, for the property checks.
FACTORY_ARGS = {
    "Request": dict(input_token_ids=[1, 2], max_tokens=4),
    "DynamicBatchConfig": dict(
        enable_batch_size_tuning=True, enable_max_num_tokens_tuning=False, dynamic_batch_moving_average_window=8
    ),
    "Response": dict(request_id=1, result="boom"),
    "GuidedDecodingConfig": dict(backend=0),
    "LookaheadDecodingConfig": dict(max_window_size=4, max_ngram_size=3, max_verification_set_size=4),
    "ExternalDraftTokensConfig": dict(tokens=[5, 6]),
    "GuidedDecodingParams": dict(guide_type=0, guide="a+"),
    # by (section, name) where two sections list a class of that name (the Executor's LoraConfig and lora_manager's)
    ("tensorrt_llm.bindings.executor", "LoraConfig"): dict(task_id=1),
    "PretrainedConfig": dict(
        architecture="LlamaForCausalLM", dtype="float16", hidden_size=8, num_hidden_layers=1, num_attention_heads=2
    ),
}
# DecodingMode: made by its static factories (DecodingMode.Lookahead(), ...), the listing has no constructor.
NOT_INSTANTIATED = {"Executor", "EngineConfig", "Engine", "PretrainedModel", "DecodingMode"}
# Their 0.12 shapes are the listing's "only_in" notes, checked by test_012_shapes_follow_the_listing_notes.
SHAPES_IN_012_NOTES = {"Request", "SamplingConfig", "KvCacheConfig", "ExecutorConfig", "ParallelConfig"}


def load_assignments(path: Path) -> dict:
    """Top-level ``NAME = literal`` assignments; ``SEMANTICS`` may refer to ``RELEASES``."""
    found: dict = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            text = ast.unparse(node.value).replace("RELEASES", repr(found.get("RELEASES")))
            found[node.targets[0].id] = ast.literal_eval(text)
    return found


_LISTING = load_assignments(SURFACE_FILE)
SURFACE, RELEASES, SEMANTICS = _LISTING["SURFACE"], _LISTING["RELEASES"], _LISTING["SEMANTICS"]


@pytest.fixture(scope="module", params=RELEASES)
def trt(request):
    with fake_tensorrt_llm(request.param) as module:
        yield module


def entry_for(entry: dict, release: str) -> dict:
    """The listing entry as it is in ``release``: ``per_release`` overrides applied (``props_removed``: read-write
    properties it lacks); a dataclass-shaped entry (keywords refused) lists its fields under ``fields``."""
    overrides = entry.get("per_release", {}).get(release, {})
    merged = {**entry, **{k: v for k, v in overrides.items() if k not in ("source", "ctor_added", "props_removed")}}
    if "props_removed" in overrides:  # properties a release does not bind yet
        merged["props_rw"] = [p for p in merged["props_rw"] if p not in overrides["props_removed"]]
    for after, param in overrides.get("ctor_added", []):
        ctor = list(merged["ctor"][0])
        ctor.insert(next(i for i, p in enumerate(ctor) if p.split("=")[0] == after) + 1, param)
        merged["ctor"] = [ctor]
    if overrides.get("shape") == "dataclass":
        names = [p.name for p in listed_params(entry["ctor"][0])]
        merged["fields"] = [n for n in names if n not in overrides.get("fields_removed", [])]
        merged["ctor"], merged["methods"] = [[]], entry["dataclass_methods"]
    return merged


# ------------------------------------------------------------------------------ parsing the listing


class Param:
    """One listed parameter: ``name``, ``name=DEFAULT``, ``*``, ``**kwargs``; ``# ...only`` marks optional presence."""

    def __init__(self, text: str, keyword_only: bool):
        body, _, comment = text.partition("#")
        body = body.strip()
        self.optional_presence = "only" in comment
        self.var_keyword = body.startswith("**")
        name, eq, default = body.lstrip("*").partition("=")
        self.name, self.required, self.default_text = name.strip(), not eq, default.strip()
        self.keyword_only = keyword_only

    def literal_default(self):
        try:
            return True, ast.literal_eval(self.default_text)
        except (ValueError, SyntaxError):
            return False, None


def listed_params(overload: list[str]) -> list[Param]:
    params, kw_only = [], False
    for text in overload:
        if text.strip() == "*":
            kw_only = True
            continue
        params.append(Param(text, kw_only))
    return params


def fake_params(obj) -> list[inspect.Parameter]:
    if inspect.isclass(obj) and hasattr(obj, "model_fields"):  # pydantic: keyword-only fields in order
        return [
            inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=f.default) for n, f in obj.model_fields.items()
        ]
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = list(inspect.signature(target).parameters.values())
    return params[1:] if inspect.isclass(obj) or params[:1] and params[0].name in ("self", "cls") else params


def signature_mismatch(obj, overload: list[str], keyword_only: bool = False) -> str | None:
    """None when ``obj``'s signature is ``overload`` (entries marked "only" may be absent);
    ``keyword_only`` for classes the listing notes as keyword-only construction (pydantic)."""
    listed = listed_params(overload)
    if keyword_only:
        for p in listed:
            p.keyword_only = True
    actual = fake_params(obj)
    names = [p.name for p in actual]
    expected = [p for p in listed if not p.optional_presence or p.name in names]
    if [p.name for p in expected] != names:
        return f"names {names} != listed {[p.name for p in expected]}"
    for want, have in zip(expected, actual):
        if want.var_keyword != (have.kind == inspect.Parameter.VAR_KEYWORD):
            return f"{want.name}: **kwargs mismatch"
        if want.var_keyword:
            continue
        if want.keyword_only != (have.kind == inspect.Parameter.KEYWORD_ONLY):
            kw_only = have.kind == inspect.Parameter.KEYWORD_ONLY
            return f"{want.name}: keyword-only is {kw_only}, listed {want.keyword_only}"
        if want.required != (have.default is inspect.Parameter.empty):
            return f"{want.name}: required is {have.default is inspect.Parameter.empty}, listed {want.required}"
        is_literal, value = want.literal_default()
        if is_literal and have.default != value:
            return f"{want.name}: default {have.default!r} != listed {value!r}"
    return None


def sig_names(sig: str) -> list[str]:
    """Parameter names of a listed call signature text like ``(id: int, timeout=None) -> X``."""
    inner = sig[sig.index("(") + 1 : sig.rindex(")")]
    out = []
    for part in re.split(r",(?![^\[]*\])", inner):
        name = re.split(r"[:=]", part.strip())[0].strip().lstrip("*")
        if name:
            out.append(name)
    return out


def section_of(module: str) -> str:
    for prefix, section in (
        ("tensorrt_llm.bindings.executor", "tensorrt_llm.bindings.executor"),
        ("tensorrt_llm.builder", "tensorrt_llm.builder"),
        ("tensorrt_llm.plugin", "tensorrt_llm.plugin"),
        ("tensorrt_llm.quantization", "tensorrt_llm.quantization"),
        ("tensorrt_llm.models.modeling_utils", "tensorrt_llm.models.modeling_utils"),
        ("tensorrt_llm.models", "tensorrt_llm.models.MODEL_MAP"),
        ("tensorrt_llm.mapping", "tensorrt_llm.mapping"),
    ):
        if module == prefix or module.startswith(prefix + "."):
            return section
    raise AssertionError(f"no listing section for module {module}")


# ------------------------------------------------------------------------------ the fake ⊆ the listing


def public_objects(trt):
    """(module name, attribute name, object) for every public class/function/value the fake defines."""
    import importlib

    for modname in FAKE_MODULES:
        module = importlib.import_module(modname)
        for name, obj in vars(module).items():
            if name.startswith("_") or inspect.ismodule(obj) or isinstance(obj, __future__._Feature):
                continue
            defined_in = getattr(obj, "__module__", modname) if (inspect.isclass(obj) or callable(obj)) else modname
            if not str(defined_in).startswith("tensorrt_llm"):
                continue  # imported from elsewhere (typing, pydantic, pathlib, ...)
            yield modname, name, obj


def own_public_attrs(cls) -> set[str]:
    """Public names the fake defines on ``cls`` (not those inherited from int, enum, pydantic, ...)."""
    from pydantic import BaseModel

    names = set()
    for klass in cls.__mro__:
        if klass.__module__.startswith("tensorrt_llm"):
            names |= {n for n in vars(klass) if not n.startswith("_")}
    return names - set(dir(BaseModel))


def has_attr(instance, name: str) -> bool:
    """Without reading it: a listed property may raise by design (``Response.result`` on an error)."""
    return any(name in vars(k) for k in type(instance).__mro__) or name in getattr(instance, "__dict__", {})


def allowed_attrs(entry: dict) -> set[str]:
    allowed = set()
    for key in ("props_rw", "props_ro", "methods", "static_methods", "classmethods", "class_attrs", "members"):
        allowed |= set(entry.get(key, []))
    for overload in entry.get("ctor", []):
        allowed |= {p.name for p in listed_params(overload)}
    allowed |= set(entry.get("nested_enum", {}))
    allowed |= set(entry.get("fields", []))
    return allowed


def test_every_per_release_entry_names_its_source():
    for section in SURFACE.values():
        for name, entry in section.items() if isinstance(section, dict) else ():
            for release, overrides in (entry.get("per_release", {}) if isinstance(entry, dict) else {}).items():
                assert release in RELEASES, (name, release)
                assert overrides.get("source"), f"{name} @ {release}: no source"
    for fact in SEMANTICS.values():
        assert set(fact["releases"]) <= set(RELEASES) and fact["source"]


def test_every_public_fake_name_is_listed(trt):
    problems = []
    for modname, name, obj in public_objects(trt):
        if name in ("MODEL_MAP",):
            continue
        obj_module = getattr(obj, "__module__", modname)
        section = SURFACE[section_of(obj_module)]
        if section_of(obj_module) == "tensorrt_llm.models.MODEL_MAP":
            if name not in section.values():
                problems.append(f"{modname}.{name} is not a MODEL_MAP class")
            continue
        if name not in section:
            problems.append(f"{modname}.{name}: not in the listing's {section_of(obj_module)}")
    assert not problems, "\n".join(problems)


def test_constructors_match_listed_keywords_and_order(trt):
    problems, checked = [], 0
    for _modname, name, obj in public_objects(trt):
        if not inspect.isclass(obj) or section_of(obj.__module__) == "tensorrt_llm.models.MODEL_MAP":
            continue
        entry = entry_for(SURFACE[section_of(obj.__module__)][name], trt.__version__)
        if "ctor" not in entry or (name in SHAPES_IN_012_NOTES and trt.__version__.startswith("0.")):
            continue
        kw_only = "keyword-only" in entry.get("notes", "") and "fields" not in entry
        mismatches = [signature_mismatch(obj, overload, kw_only) for overload in entry["ctor"]]
        if all(mismatches):
            problems.append(f"{name}: " + " | ".join(mismatches))
        checked += 1
    assert checked >= 25
    assert not problems, "\n".join(problems)


def test_functions_match_listed_signatures(trt):
    from tensorrt_llm import builder, quantization
    from tensorrt_llm.models.modeling_utils import PretrainedModel

    b = SURFACE["tensorrt_llm.builder"]
    assert [p.name for p in fake_params(builder.build)] == sig_names(b["build"]["sig"])
    assert [p.name for p in fake_params(builder.get_engine_version)] == sig_names(b["get_engine_version"]["sig"])
    export = fake_params(quantization.quantize_and_export)
    assert [p.name for p in export] == SURFACE["tensorrt_llm.quantization"]["quantize_and_export"]["kwargs"]
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in export)
    sigs = SURFACE["tensorrt_llm.models.modeling_utils"]["PretrainedModel"]["sigs"]
    for method, sig in sigs.items():
        assert [p.name for p in fake_params(getattr(PretrainedModel, method))] == sig_names(sig), method


def test_method_signatures_match_listed_sigs(trt):
    problems = []
    for section in ("tensorrt_llm.bindings.executor", "tensorrt_llm.builder"):
        for name, entry in SURFACE[section].items():
            if not isinstance(entry, dict) or "sigs" not in entry or not hasattr(trt, "bindings"):
                continue
            module = trt.bindings.executor if section.endswith("executor") else trt.builder
            cls = getattr(module, name, None)
            for method, sig in entry["sigs"].items():
                if cls is None or isinstance(sig, list):  # overloads: checked by behaviour below
                    continue
                names = [p.name for p in fake_params(getattr(cls, method))]
                if names != sig_names(sig):
                    problems.append(f"{name}.{method}{names} != {sig}")
    assert not problems, "\n".join(problems)


def test_enum_members_are_exactly_the_listed_ones(trt):
    problems = []
    for _modname, name, obj in public_objects(trt):
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            entry = SURFACE[section_of(obj.__module__)][name]
            if name in ("FinishReason", "CapacitySchedulerPolicy") and trt.__version__.startswith("0."):
                continue  # their 1.x-only members: test_012_shapes_follow_the_listing_notes
            if list(obj.__members__) != entry["members"]:
                problems.append(f"{name}: {list(obj.__members__)} != {entry['members']}")
    assert not problems, "\n".join(problems)


def test_no_unlisted_attributes_and_listed_properties_exist(trt):
    problems = []
    for _modname, name, obj in public_objects(trt):
        if not inspect.isclass(obj) or issubclass(obj, enum.Enum):
            continue
        if name in SHAPES_IN_012_NOTES and trt.__version__.startswith("0."):
            continue
        section = section_of(obj.__module__)
        model_class = section.endswith("MODEL_MAP")
        entry = (
            SURFACE["tensorrt_llm.models.modeling_utils"]["PretrainedModel"] if model_class else SURFACE[section][name]
        )
        entry = entry_for(entry, trt.__version__)
        allowed = allowed_attrs(entry)
        extra = own_public_attrs(obj) - allowed
        if extra:
            problems.append(f"{name}: unlisted {sorted(extra)}")
        if name in NOT_INSTANTIATED or section.endswith("MODEL_MAP"):
            continue
        instance = obj(**FACTORY_ARGS.get((section, name), FACTORY_ARGS.get(name, {})))
        extra = (
            {n for n in vars(instance) if not n.startswith("_")} - allowed if hasattr(instance, "__dict__") else set()
        )
        if extra:
            problems.append(f"{name} instance: unlisted {sorted(extra)}")
        optional = {p.name for o in entry.get("ctor", []) for p in listed_params(o) if p.optional_presence}
        for prop in set(entry.get("props_rw", [])) | set(entry.get("props_ro", [])):
            if prop not in optional and not prop.startswith("_") and not has_attr(instance, prop):
                problems.append(f"{name}.{prop} is listed but missing")
        for prop in entry.get("props_ro", []):
            if prop.startswith("_") or not has_attr(instance, prop):
                continue
            try:
                setattr(instance, prop, None)
                problems.append(f"{name}.{prop} is listed read-only but accepts writes")
            except (AttributeError, TypeError, ValueError):
                pass
    assert not problems, "\n".join(problems)


def test_model_map_is_the_listed_one(trt):
    from tensorrt_llm.models import MODEL_MAP

    assert {k: v.__name__ for k, v in MODEL_MAP.items()} == SURFACE["tensorrt_llm.models.MODEL_MAP"]


def test_module_attributes(trt):
    from tensorrt_llm.bindings import executor

    for attr in SURFACE["tensorrt_llm.bindings.executor"]["__module_attrs__"]:
        assert hasattr(executor, attr)
    assert executor.__version__ == trt.__version__


def test_await_responses_overloads_resolve_like_pybind(trt):
    import datetime

    from tensorrt_llm.bindings import executor

    calls = []

    class Impl:
        def await_responses(self, target, seconds):
            calls.append((target, seconds))
            return []

    ex = executor.Executor.__new__(executor.Executor)
    ex._impl = Impl()
    td = datetime.timedelta(milliseconds=20)
    ex.await_responses(timeout=td)
    ex.await_responses(7)  # a bare int is a request id, not a timeout
    ex.await_responses(id=7, timeout=td)
    ex.await_responses([1, 2], td)
    assert calls == [(None, 0.02), (7, None), (7, 0.02), (1, 0.02), (2, 0.02)]
    with pytest.raises(TypeError):
        ex.await_responses(timeout="soon")


# ------------------------------------------------------------------------------ 0.12 shapes


def test_012_shapes_follow_the_listing_notes(trt, monkeypatch):
    from tensorrt_llm.bindings import executor as tle

    ex = SURFACE["tensorrt_llm.bindings.executor"]
    monkeypatch.setattr(trt, "__version__", "0.12.0")
    note = ex["Request"]["only_in"]["0.11-0.12"]
    prefix = [p.strip() for p in note[note.index("(") + 1 : note.index("...")].split(",") if p.strip()]
    assert signature_mismatch(tle.Request, prefix + ["*"] * 0) is not None  # the full list is longer ...
    head = fake_params(tle.Request)[: len(listed_params(prefix))]
    assert [p.name for p in head] == [p.name for p in listed_params(prefix)]
    assert [p.kind == inspect.Parameter.KEYWORD_ONLY for p in head] == [p.keyword_only for p in listed_params(prefix)]

    kv_note = ex["KvCacheConfig"]["only_in"]["0.x"].split("=", 1)[1]  # names, and block reuse off by default
    kv_params = fake_params(tle.KvCacheConfig)
    assert [p.name for p in kv_params] == [p.name for p in listed_params([t.strip() for t in kv_note.split(",")])]
    assert kv_params[0].default is False

    sampling = {p.name: p for p in fake_params(tle.SamplingConfig)}
    for name in ("seed", "random_seed", "min_tokens", "min_length"):
        assert sampling[name].kind == inspect.Parameter.KEYWORD_ONLY, name

    for enum_name in ("FinishReason", "CapacitySchedulerPolicy"):
        entry = ex[enum_name]
        expected = [m for m in entry["members"] if entry.get("only_in", {}).get(m) != "1.x"]
        assert list(getattr(tle, enum_name).__members__) == expected

    first_eight = [p.split("=")[0] for p in ex["ExecutorConfig"]["ctor"][0][:8]]
    assert [p.name for p in fake_params(tle.ExecutorConfig)][:8] == first_eight
    monkeypatch.undo()
    if not trt.__version__.startswith("0."):
        assert list(tle.FinishReason.__members__) == ex["FinishReason"]["members"]


def test_sampling_config_checks_what_the_release_checks(trt):
    """1.x samplingConfig.cpp (the copy with beamWidthArray) asserts these in the constructor; the older 0.1x copy
    stores lengthPenalty and earlyStopping unchecked (tests/fakes/tensorrt_llm/bindings/executor.py)."""
    from tensorrt_llm.bindings import executor as tle

    refused = [
        {"beam_width": 2, "length_penalty": -1.0},
        {"beam_width": 2, "early_stopping": -1},
        {"beam_width": 2, "num_return_sequences": 3},
        {"beam_width": 1025},
        {"top_p": 0.0},
    ]
    if trt.__version__.startswith("0."):
        tle.SamplingConfig(beam_width=2, length_penalty=-1.0, early_stopping=-1)
        return
    for kwargs in refused:
        with pytest.raises(RuntimeError, match="Assertion failed"):
            tle.SamplingConfig(**kwargs)
    from tensorrt_llm import SamplingParams  # the LLM API builds the same SamplingConfig per request

    with pytest.raises(RuntimeError, match="lengthPenalty"):
        SamplingParams(use_beam_search=True, best_of=2, n=2, length_penalty=-1.0)._get_sampling_config()
    assert SamplingParams(use_beam_search=True, best_of=3, n=2)._get_sampling_config().beam_width == 3


# ------------------------------------------------------------------------------ per-release shapes


def test_plugin_config_shape_per_release(trt):
    import dataclasses

    from tensorrt_llm.plugin import PluginConfig

    entry = entry_for(SURFACE["tensorrt_llm.plugin"]["PluginConfig"], trt.__version__)
    if "fields" in entry:  # 0.12–1.1: @dataclass(slots=True), every field init=False
        assert dataclasses.is_dataclass(PluginConfig) and "__slots__" in vars(PluginConfig)
        fields = dataclasses.fields(PluginConfig)
        assert [f.name for f in fields] == entry["fields"] and not any(f.init for f in fields)
        with pytest.raises(TypeError):
            PluginConfig(tokens_per_block=64)
        plugins = PluginConfig.from_dict({"tokens_per_block": 64, "use_paged_context_fmha": "disable"})
        assert plugins.to_dict()["tokens_per_block"] == 64 and plugins.use_paged_context_fmha is False
        with pytest.raises(AttributeError):
            plugins.not_a_field = 1
    else:  # 1.2: pydantic; PR 8277 removed from_dict/update_from_dict/to_dict
        assert list(PluginConfig.model_fields) == [p.name for p in listed_params(entry["ctor"][0])]
        assert PluginConfig(tokens_per_block=64).tokens_per_block == 64
        assert not any(hasattr(PluginConfig, m) for m in ("from_dict", "update_from_dict", "to_dict"))


def test_knob_and_build_config_defaults_per_release(trt):
    from tensorrt_llm.bindings import executor as tle
    from tensorrt_llm.builder import BuildConfig

    knob = entry_for(SURFACE["tensorrt_llm.bindings.executor"]["ExtendedRuntimePerfKnobConfig"], trt.__version__)
    assert tle.ExtendedRuntimePerfKnobConfig().multi_block_mode is (knob["ctor"][0][0] == "multi_block_mode=True")
    assert (
        tle.ExecutorConfig().extended_runtime_perf_knob_config.multi_block_mode
        is tle.ExtendedRuntimePerfKnobConfig().multi_block_mode
    )
    build = entry_for(SURFACE["tensorrt_llm.builder"]["BuildConfig"], trt.__version__)
    names = [p.name for p in listed_params(build["ctor"][0])]
    assert ("use_fused_mlp" in names) is trt.__version__.startswith("0.")
    assert [p.name for p in fake_params(BuildConfig)] == names


def test_lmi_trt_build_config_is_accepted_by_every_release(trt):
    """The BuildConfig/PluginConfig lmi_trt.compile.build makes, under each release's API (item 1/2 of
    issue 11: keywords on the 0.12–1.1 dataclass raise TypeError; 0.12 has use_fused_mlp on BuildConfig)."""
    from lmi_trt.compile.build import _build_config
    from lmi_trt.compile.options import CompileOptions
    from lmi_trt.compile.plan import GpuFacts, make_plan

    hf = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 1024,
        "max_position_embeddings": 256,
        "torch_dtype": "float16",
    }
    gpu = GpuFacts(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)
    plan = make_plan(CompileOptions(max_input_len=32, max_output_len=32, use_fused_mlp=True), hf, gpu, trt.__version__)
    config = _build_config(plan)
    plugins = config.plugin_config
    settings = plan.plugin_settings()
    assert settings and all(getattr(plugins, k) == v for k, v in settings.items())
    fused = config.use_fused_mlp if trt.__version__.startswith("0.") else plugins.use_fused_mlp
    assert fused is True


# ------------------------------------------------------------------------------ lmi_trt ⊆ the listing


def _section_names(module: str) -> set[str] | None:
    section = SURFACE.get(module)
    if section is None:
        return None
    return {k for k in section if not k.startswith("__")} | set(section.get("__module_attrs__", []))


def _is_module(path: str) -> bool:
    modules = [key for key in SURFACE if key.startswith("tensorrt_llm") and not key.endswith(".MODEL_MAP")]
    return any(key == path or key.startswith(path + ".") for key in modules)


def _lookup(module: str, chain: list[str]) -> tuple[dict | None, str | None]:
    """Resolve ``module.chain[0].chain[1]...``; returns (listing entry or None, problem or None)."""
    while chain and _is_module(f"{module}.{chain[0]}"):
        module, chain = f"{module}.{chain[0]}", chain[1:]
    if not chain:
        return None, None
    head, rest = chain[0], chain[1:]
    if head == "__version__":
        return None, None if not rest else f"{module}.__version__.{rest[0]}"
    if head == "MODEL_MAP" and module == "tensorrt_llm.models":
        ok = not rest or rest[0] in ("get", "items", "keys", "values")  # it is a dict
        return None, None if ok else f"tensorrt_llm.models.MODEL_MAP.{rest[0]}"
    if module == "tensorrt_llm.models" and head in SURFACE["tensorrt_llm.models.MODEL_MAP"].values():
        entry = SURFACE["tensorrt_llm.models.modeling_utils"]["PretrainedModel"]
    elif module == "tensorrt_llm.models" and head in SURFACE["tensorrt_llm.models.modeling_utils"]:
        entry = SURFACE["tensorrt_llm.models.modeling_utils"][head]
    elif module == "tensorrt_llm":  # top-level re-exports (BuildConfig, Mapping, LLM, ...)
        found = [s[head] for s in SURFACE.values() if isinstance(s, dict) and isinstance(s.get(head), dict)]
        if not found:
            return None, f"tensorrt_llm.{head} is in no listed section"
        entry = found[0]
    else:
        names = _section_names(module)
        if names is None or head not in names:
            return None, f"{module}.{head} is not listed"
        entry = SURFACE[module].get(head)
    if rest and isinstance(entry, dict) and rest[0] not in allowed_attrs(entry):
        return None, f"{module}.{head}.{rest[0]} is not listed"
    return entry if isinstance(entry, dict) else None, None


def scan_source(source: str, filename: str = "<src>") -> list[str]:
    """Every tensorrt_llm import, attribute chain and constructor keyword in ``source`` not in the listing.

    Names bound to a tensorrt_llm module anywhere in the file (``import tensorrt_llm.bindings.executor as tle``)
    are followed file-wide, so helpers that take that module as a ``tle`` parameter are checked too.
    """
    tree = ast.parse(source, filename)
    aliases: dict[str, tuple[str, list[str]]] = {}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "tensorrt_llm":
                    if not _is_module(a.name):
                        problems.append(f"{filename}:{node.lineno}: import {a.name} (no such listed module)")
                    aliases[a.asname or "tensorrt_llm"] = (a.name if a.asname else "tensorrt_llm", [])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tensorrt_llm":
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    aliases[a.asname or a.name] = (f"{node.module}.{a.name}", [])
                    continue
                _, problem = _lookup(node.module, [a.name])
                if problem:
                    problems.append(f"{filename}:{node.lineno}: from {node.module} import {a.name}: {problem}")
                aliases[a.asname or a.name] = (node.module, [a.name])

    def chain_of(expr) -> tuple[str, list[str]] | None:
        parts = []
        while isinstance(expr, ast.Attribute):
            parts.append(expr.attr)
            expr = expr.value
        if isinstance(expr, ast.Name) and expr.id in aliases:
            module, base = aliases[expr.id]
            return module, base + parts[::-1]
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (found := chain_of(node)):
            _, problem = _lookup(*found)
            if problem:
                problems.append(f"{filename}:{node.lineno}: {problem}")
        if isinstance(node, ast.Call) and (found := chain_of(node.func)):
            entry, _ = _lookup(*found)
            if entry and "ctor" in entry:
                listed = {p.name for o in entry["ctor"] for p in listed_params(o)}
                for kw in node.keywords:
                    if kw.arg is not None and kw.arg not in listed:
                        problems.append(f"{filename}:{node.lineno}: {'.'.join(found[1])}({kw.arg}=...) is not listed")
    return problems


def test_scanner_catches_unlisted_names_and_keywords():
    bad = (
        "import tensorrt_llm.bindings.executor as tle\n"
        "from tensorrt_llm.builder import BuildConfig, build_engine\n"
        "def f(tle):\n"
        "    tle.Requestt([1], 2)\n"
        "    tle.Request(input_token_ids=[1], max_tokens=2, max_new_tokens=2)\n"
        "    tle.FinishReason.FINISHED\n"
        "    BuildConfig(max_output_len=3)\n"
    )
    problems = "\n".join(scan_source(bad))
    for needle in ("build_engine", "Requestt", "max_new_tokens", "FINISHED", "max_output_len"):
        assert needle in problems
    good = (
        "import tensorrt_llm\nimport tensorrt_llm.bindings.executor as tle\n"
        "from tensorrt_llm.models import MODEL_MAP, LLaMAForCausalLM\nfrom tensorrt_llm import BuildConfig, Mapping\n"
        "tle.Request(input_token_ids=[1], max_tokens=2, streaming=True)\n"
        "tle.CapacitySchedulerPolicy.MAX_UTILIZATION\ntensorrt_llm.__version__\n"
        "LLaMAForCausalLM.from_hugging_face\nBuildConfig(max_seq_len=8)\n"
    )
    assert scan_source(good) == []


def test_lmi_trt_uses_only_listed_tensorrt_llm_api():
    problems, files_using = [], 0
    for path in sorted((REPO / "lmi_trt").rglob("*.py")):
        source = path.read_text()
        if "tensorrt_llm" not in source:
            continue
        files_using += 1
        problems += scan_source(source, str(path.relative_to(REPO)))
    assert files_using >= 1
    assert not problems, "\n".join(problems)
