"""Fake ``tensorrt_llm.builder``: ``BuildConfig``, ``EngineConfig``, ``Engine``, ``build``, ``get_engine_version``.

``build`` does what TensorRT-LLM's does to the settings (NVIDIA/TensorRT-LLM tensorrt_llm/builder.py, build) and
produces an
``Engine`` whose per-rank "plan" is a small JSON naming the Hugging Face folder the model came
from and the release that built it; ``Engine.save`` writes the real layout (§4): ``config.json``
with ``version``/``pretrained_config``/``build_config`` plus ``rank{r}.engine``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

from tensorrt_llm import _state
from tensorrt_llm._runtime import ENGINE_FORMAT as _ENGINE_FORMAT
from tensorrt_llm.lora_manager import LoraConfig as _LoraConfig
from tensorrt_llm.models.modeling_utils import PretrainedConfig
from tensorrt_llm.plugin import plugin as _plugin

_KV_CACHE_TYPES = ("PAGED", "CONTINUOUS", "DISABLED")


@dataclasses.dataclass(frozen=True)
class _Factory:
    make: object


# (name, annotation, default or _Factory), in declaration order: ``BuildConfig`` in
# tensorrt_llm/builder.py (1.x: read at commit 008b2b8 of NVIDIA/TensorRT-LLM, a 1.x release branch
# state, which has ``auto_parallel_config``).
_BUILD_FIELDS_1X: tuple[tuple[str, object, object], ...] = (
    ("max_input_len", int, 1024),
    ("max_seq_len", int | None, None),
    ("opt_batch_size", int, 8),
    ("max_batch_size", int, 2048),
    ("max_beam_width", int, 1),
    ("max_num_tokens", int, 8192),
    ("opt_num_tokens", int | None, None),
    ("max_prompt_embedding_table_size", int, 0),
    ("kv_cache_type", str | None, None),
    ("gather_context_logits", bool, False),
    ("gather_generation_logits", bool, False),
    ("strongly_typed", bool, True),
    ("force_num_profiles", int | None, None),
    ("profiling_verbosity", str, "layer_names_only"),
    ("enable_debug_output", bool, False),
    ("max_draft_len", int, 0),
    ("speculative_decoding_mode", int, 1),  # SpeculativeDecodingMode.NONE, as config.json stores it
    ("use_refit", bool, False),
    ("input_timing_cache", str | None, None),
    ("output_timing_cache", str, "model.cache"),
    ("lora_config", object, _Factory(_LoraConfig)),
    ("auto_parallel_config", dict, _Factory(dict)),
    ("weight_sparsity", bool, False),
    ("weight_streaming", bool, False),
    ("plugin_config", object, _Factory(lambda: _plugin.PluginConfig())),  # the current release's
    ("use_strip_plan", bool, False),
    ("max_encoder_input_len", int, 1024),
    ("dry_run", bool, False),
    ("visualize_network", str | None, None),
    ("monitor_memory", bool, False),
    ("use_mrope", bool, False),
)
# 0.12: ``use_fused_mlp`` is a BuildConfig field (tensorrt_llm/builder.py at v0.12.0), not a plugin
# field. Its default is not relied on: lmi_trt always passes it.
_BUILD_FIELDS_012 = _BUILD_FIELDS_1X[:27] + (("use_fused_mlp", bool, False),) + _BUILD_FIELDS_1X[27:]


class _BuildConfigMethods:
    def __post_init__(self):
        if self.kv_cache_type is not None:
            name = getattr(self.kv_cache_type, "name", str(self.kv_cache_type)).upper()
            if name not in _KV_CACHE_TYPES:
                raise ValueError(f"kv_cache_type={self.kv_cache_type!r}: expected one of {_KV_CACHE_TYPES}")
            self.kv_cache_type = name
        if self.max_beam_width < 1 or self.max_batch_size < 1:
            raise ValueError("max_beam_width and max_batch_size must be >= 1")

    @classmethod
    def from_dict(cls, config, plugin_config=None):
        config = copy.deepcopy(config)
        plugins = config.pop("plugin_config", None)
        config["lora_config"] = _LoraConfig(**(config.get("lora_config") or {}))  # DictConversion.from_dict
        if plugin_config is None:
            plugin_config = _plugin_config_from_dict(plugins or {})
        return cls(**config, plugin_config=plugin_config)

    @classmethod
    def from_json_file(cls, config_file, plugin_config=None):
        return cls.from_dict(json.loads(Path(config_file).read_text()), plugin_config)

    def to_dict(self):
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["plugin_config"] = _plugin_config_to_dict(self.plugin_config)
        # BuildConfig.to_dict (tensorrt_llm/builder.py): lora_config.to_dict() (DictConversion: its fields)
        out["lora_config"] = dataclasses.asdict(self.lora_config)
        # dry_run and visualize_network never reach config.json (tensorrt_llm/builder.py, Engine.save).
        del out["dry_run"], out["visualize_network"]
        return out

    def update_from_dict(self, config):
        for key, value in config.items():
            if not hasattr(self, key):
                raise AttributeError(f"BuildConfig has no field {key!r}")
            setattr(self, key, value)

    def update(self, **kwargs):
        self.update_from_dict(kwargs)

    def update_kv_cache_type(self, model_architecture):
        if self.kv_cache_type is None:
            self.kv_cache_type = "PAGED"


def _plugin_config_from_dict(values: dict):
    """≤ 1.1: ``PluginConfig()`` then ``update_from_dict`` (the real ``BuildConfig.from_dict``); 1.2: keywords."""
    cls = _plugin.PluginConfig
    if hasattr(cls, "update_from_dict"):
        plugins = cls()
        plugins.update_from_dict(values)
        return plugins
    return cls(**values)


def _plugin_config_to_dict(plugins) -> dict:
    return plugins.to_dict() if hasattr(plugins, "to_dict") else plugins.model_dump()


def _build_config_class(fields):
    cls = dataclasses.make_dataclass(
        "BuildConfig",
        [
            (
                name,
                annotation,
                dataclasses.field(default_factory=default.make)
                if isinstance(default, _Factory)
                else dataclasses.field(default=default),
            )
            for name, annotation, default in fields
        ],
        bases=(_BuildConfigMethods,),
    )
    cls.__module__ = __name__
    return cls


_BuildConfig012 = _build_config_class(_BUILD_FIELDS_012)
_BuildConfig1x = _build_config_class(_BUILD_FIELDS_1X)
BuildConfig = _BuildConfig1x


def _select(version: str) -> None:
    cls = _BuildConfig012 if _state.series(version)[0] == 0 else _BuildConfig1x
    sys.modules[__name__].BuildConfig = cls
    package = sys.modules.get("tensorrt_llm")
    if package is not None and hasattr(package, "BuildConfig"):
        package.BuildConfig = cls


_state.on_change(_select)


class EngineConfig:
    def __init__(self, pretrained_config, build_config, version):
        self.pretrained_config = pretrained_config
        self.build_config = build_config
        self.version = version

    def to_dict(self):
        return {
            "version": self.version,
            "pretrained_config": self.pretrained_config.to_dict(),
            "build_config": self.build_config.to_dict(),
        }

    @classmethod
    def from_json_str(cls, config_str):
        config = json.loads(config_str)
        return cls(
            PretrainedConfig.from_dict(config["pretrained_config"]),
            BuildConfig.from_dict(config["build_config"]),
            config["version"],
        )

    @classmethod
    def from_json_file(cls, config_file):
        return cls.from_json_str(Path(config_file).read_text())


class Engine:
    def __init__(self, config, engine, managed_weights={}):  # noqa: B006 — the real default, never mutated
        self.config = config
        self.engine = engine
        self.managed_weights = dict(managed_weights)

    def save(self, engine_dir):
        engine_dir = Path(engine_dir)
        engine_dir.mkdir(parents=True, exist_ok=True)
        rank = self.config.pretrained_config.mapping.rank
        if rank == 0:
            (engine_dir / "config.json").write_text(json.dumps(self.config.to_dict(), indent=4))
        (engine_dir / f"rank{rank}.engine").write_bytes(self.engine)

    @classmethod
    def from_dir(cls, engine_dir, rank=0):
        engine_dir = Path(engine_dir)
        config = EngineConfig.from_json_file(engine_dir / "config.json")
        config.pretrained_config.set_rank(rank)
        return cls(config, (engine_dir / f"rank{rank}.engine").read_bytes())

    @classmethod
    def from_buffer(cls, engine_buffer, json_config_str, rank=0):
        config = EngineConfig.from_json_str(json_config_str)
        config.pretrained_config.set_rank(rank)
        return cls(config, bytes(engine_buffer))


def _use_lora(lora_config) -> None:
    """``model.use_lora(build_config.lora_config)`` in ``build`` (tensorrt_llm/builder.py, 0.12-era and 1.x copies):
    lora_manager.py ``load_hf_lora`` takes the target modules from ``lora_dir`` when none are given (not modelled: a
    ``lora_dir`` is refused), raises "lora_target_modules is empty" when there are neither, and adds the missing
    ones of q/k/v (``get_missing_qkv_modules``)."""
    if lora_config.lora_dir:
        raise NotImplementedError("fake tensorrt_llm: building with lora_dir is not modelled")
    if not lora_config.lora_target_modules:
        raise ValueError(
            "lora_target_modules is empty. "
            "Please specify lora_target_modules or provide lora_dir to infer lora_target_modules."
        )
    lora_config.lora_target_modules.extend(lora_config.missing_qkv_modules)


def build(model, build_config):
    """Settle the build settings the way TensorRT-LLM does, and "compile" one rank."""
    config = copy.deepcopy(build_config)
    pretrained = copy.deepcopy(model.config)
    config.plugin_config.dtype = pretrained.dtype
    config.update_kv_cache_type(pretrained.architecture)
    if config.plugin_config.lora_plugin is not None:  # build(): model.use_lora(build_config.lora_config)
        _use_lora(config.lora_config)
    if config.plugin_config.paged_kv_cache is None:
        config.plugin_config.paged_kv_cache = config.kv_cache_type == "PAGED"
    if config.max_seq_len is None:
        config.max_seq_len = pretrained.max_position_embeddings or 2048
    config.max_input_len = min(config.max_input_len, config.max_seq_len)
    config.max_num_tokens = min(config.max_num_tokens, config.max_batch_size * config.max_seq_len)
    if hasattr(pretrained, "max_draft_len") and config.max_draft_len == 0:
        # builder.py build, the 1.x copy (id 205252225): a model config's max_draft_len is taken only where the build
        # config's is 0, and the mode is left as asked (--speculative_decoding_mode). An older 0.x copy (id
        # 3063623504) forced SpeculativeDecodingMode.MEDUSA and the model's draft length; lmi-trt builds Medusa on
        # 1.x only, so the fake models 1.x.
        config.max_draft_len = pretrained.max_draft_len
    if int(config.speculative_decoding_mode) != 1:  # not SpeculativeDecodingMode.NONE
        # builder.py build (crawl copy of the 1.x line): "Increasing max_seq_len ... by max_draft_len ... Maximum
        # number of generated tokens remains the same", and max_num_tokens raised to max_batch_size *
        # (max_draft_len + 1) where it is smaller. config.json keeps the mode's integer.
        config.speculative_decoding_mode = int(config.speculative_decoding_mode)
        config.max_seq_len += config.max_draft_len
        config.max_num_tokens = max(config.max_num_tokens, config.max_batch_size * (config.max_draft_len + 1))
    if config.opt_num_tokens is None:
        config.opt_num_tokens = min(config.max_num_tokens, config.max_batch_size * config.max_beam_width)
    if config.plugin_config.use_paged_context_fmha and not (
        config.plugin_config.context_fmha and config.plugin_config.paged_kv_cache
    ):
        raise ValueError("use_paged_context_fmha needs context_fmha and a paged KV cache")
    plan = {
        "format": _ENGINE_FORMAT,
        "tensorrt_llm_version": _state.version(),
        "hf_model_dir": model._hf_model_dir,
        "trust_remote_code": model._trust_remote_code,
        "rank": pretrained.mapping.rank,
        "architecture": pretrained.architecture,
        "dtype": pretrained.dtype,
    }
    heads = getattr(model, "_medusa_heads", None)
    if heads is not None:  # the engine holds the heads' weights (the fake: a safetensors blob inside its plan)
        import base64

        from safetensors.torch import save

        plan["medusa_heads"] = base64.b64encode(save(heads)).decode()
    return Engine(EngineConfig(pretrained, config, _state.version()), json.dumps(plan).encode())


def get_engine_version(engine_dir):
    return json.loads((Path(engine_dir) / "config.json").read_text()).get("version")
