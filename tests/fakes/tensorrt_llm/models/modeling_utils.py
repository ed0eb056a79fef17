"""Fake ``tensorrt_llm.models.modeling_utils``: ``QuantConfig``, ``PretrainedConfig``, ``PretrainedModel``.

A fake "model" carries its ``PretrainedConfig`` and the Hugging Face folder it came from; the
weights stay in that folder. Checkpoints (``save_checkpoint``) are real ``config.json`` +
``rank{r}.safetensors`` files whose metadata name that folder, so ``from_checkpoint`` and the
executor can find the weights again.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import fnmatch
import json
import os
from pathlib import Path

from tensorrt_llm.mapping import Mapping
from tensorrt_llm.quantization.mode import QuantAlgo, QuantMode

_CHECKPOINT_FORMAT = "fake-tensorrt-llm-checkpoint"

# Algorithms that need calibration data / the modelopt flow (NVIDIA/TensorRT-LLM tensorrt_llm/quantization/mode.py,
# quantize_by_modelopt.py).
_NO_CALIBRATION = {QuantAlgo.W8A16, QuantAlgo.W4A16, QuantAlgo.FP8_PER_CHANNEL_PER_TOKEN}
_MODELOPT = {
    QuantAlgo.NVFP4,
    QuantAlgo.FP8,
    QuantAlgo.W4A16_AWQ,
    QuantAlgo.W4A8_AWQ,
    QuantAlgo.W8A8_SQ_PER_CHANNEL,
    QuantAlgo.MIXED_PRECISION,
}


@dataclasses.dataclass
class QuantConfig:
    quant_algo: QuantAlgo | None = None
    kv_cache_quant_algo: QuantAlgo | None = None
    group_size: int = 128
    smoothquant_val: float = 0.5
    clamp_val: list | None = None
    use_meta_recipe: bool = False
    has_zero_point: bool = False
    pre_quant_scale: bool = False
    exclude_modules: list | None = None

    def __post_init__(self):
        # QuantAlgo is a str enum: accept its names, as from_dict does.
        self.quant_algo = None if self.quant_algo is None else QuantAlgo(self.quant_algo)
        self.kv_cache_quant_algo = None if self.kv_cache_quant_algo is None else QuantAlgo(self.kv_cache_quant_algo)
        if self.kv_cache_quant_algo not in (None, QuantAlgo.FP8, QuantAlgo.INT8, QuantAlgo.NVFP4):
            raise ValueError(f"Invalid kv_cache_quant_algo {self.kv_cache_quant_algo}; allowed: FP8, INT8, NVFP4")

    @property
    def quant_mode(self):
        return QuantMode.from_quant_algo(self.quant_algo, self.kv_cache_quant_algo)

    @property
    def layer_quant_mode(self):
        return self.quant_mode

    @property
    def _requires_calibration(self):
        return (self.quant_algo not in _NO_CALIBRATION | {None}) or self.kv_cache_quant_algo is not None

    @property
    def _requires_modelopt_quantization(self):
        return self.quant_algo in _MODELOPT or (self.quant_algo is None and self.kv_cache_quant_algo == QuantAlgo.FP8)

    def is_module_excluded_from_quantization(self, name):
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.exclude_modules or [])

    @classmethod
    def from_dict(cls, config):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in known})

    def to_dict(self):
        out = dataclasses.asdict(self)
        out["quant_algo"] = None if self.quant_algo is None else self.quant_algo.value
        out["kv_cache_quant_algo"] = None if self.kv_cache_quant_algo is None else self.kv_cache_quant_algo.value
        return out


class SpeculativeDecodingMode(enum.IntFlag):
    """tensorrt_llm/models/modeling_utils.py ``SpeculativeDecodingMode``: auto() members in this order (1, 2, 4, ...),
    and ``from_arguments`` mapping trtllm-build's --speculative_decoding_mode."""

    NONE = enum.auto()
    DRAFT_TOKENS_EXTERNAL = enum.auto()
    MEDUSA = enum.auto()
    LOOKAHEAD_DECODING = enum.auto()
    EXPLICIT_DRAFT_TOKENS = enum.auto()
    EAGLE = enum.auto()
    NGRAM = enum.auto()
    USER_PROVIDED = enum.auto()
    SAVE_HIDDEN_STATES = enum.auto()
    AUTO = enum.auto()

    @staticmethod
    def from_arguments(args):
        mode = args.speculative_decoding_mode
        return SpeculativeDecodingMode.NONE if mode is None else SpeculativeDecodingMode[mode.upper()]


class PretrainedConfig:
    def __init__(
        self,
        *,
        architecture,
        dtype,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        vocab_size=None,
        hidden_act="gelu",
        logits_dtype="float32",
        norm_epsilon=1e-5,
        position_embedding_type="learned_absolute",
        max_position_embeddings=None,
        rotary_embedding_dim=None,
        num_key_value_heads=None,
        intermediate_size=None,
        mapping=None,
        quantization=None,
        use_parallel_embedding=False,
        embedding_sharding_dim=0,
        head_size=None,
        qk_layernorm=False,
        runtime_defaults=None,
        **kwargs,
    ):
        self.architecture = architecture
        self.dtype = dtype
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.vocab_size = vocab_size
        self.hidden_act = hidden_act
        self.logits_dtype = logits_dtype
        self.norm_epsilon = norm_epsilon
        self.position_embedding_type = position_embedding_type
        self.max_position_embeddings = max_position_embeddings
        self.rotary_embedding_dim = rotary_embedding_dim
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.intermediate_size = intermediate_size
        self.mapping = mapping if isinstance(mapping, Mapping) else Mapping.from_dict(mapping or {})
        self.quantization = (
            quantization if isinstance(quantization, QuantConfig) else QuantConfig.from_dict(quantization or {})
        )
        self.use_parallel_embedding = use_parallel_embedding
        self.embedding_sharding_dim = embedding_sharding_dim
        self.head_size = head_size or hidden_size // num_attention_heads
        self.qk_layernorm = qk_layernorm
        self.runtime_defaults = runtime_defaults
        for key, value in kwargs.items():
            setattr(self, key, value)

    @property
    def quant_mode(self):
        return self.quantization.quant_mode

    @property
    def quant_algo(self):
        return self.quantization.quant_algo

    @property
    def kv_dtype(self):
        kv = self.quantization.kv_cache_quant_algo
        return {QuantAlgo.INT8: "int8", QuantAlgo.FP8: "fp8", QuantAlgo.NVFP4: "fp4"}.get(kv, self.dtype)

    def set_rank(self, rank):
        m = self.mapping
        self.mapping = Mapping(
            m.world_size, rank, m.gpus_per_node, cp_size=m.cp_size, tp_size=m.tp_size, pp_size=m.pp_size
        )

    def for_each_rank(self):
        for rank in range(self.mapping.world_size):
            config = copy.deepcopy(self)
            config.set_rank(rank)
            yield config

    def set_if_not_exist(self, key, value):
        if getattr(self, key, None) is None:
            setattr(self, key, value)

    def to_dict(self):
        out = {k: copy.deepcopy(v) for k, v in self.__dict__.items()}
        # config.json carries the world, not this rank's place in it (NVIDIA/TensorRT-LLM
        # tensorrt_llm/models/modeling_utils.py, PretrainedConfig.to_dict).
        mapping = self.mapping.to_dict()
        del mapping["rank"]
        out["mapping"] = mapping
        out["quantization"] = self.quantization.to_dict()
        return out

    @classmethod
    def from_dict(cls, config):
        return cls(**copy.deepcopy(config))

    def to_json_file(self, config_file):
        Path(config_file).write_text(json.dumps(self.to_dict(), indent=4))

    @classmethod
    def from_json_file(cls, config_file):
        return cls.from_dict(json.loads(Path(config_file).read_text()))

    @classmethod
    def from_checkpoint(cls, ckpt_dir):
        return cls.from_json_file(Path(ckpt_dir) / "config.json")


class PretrainedModel:
    def __init__(self, config):
        self.config = config
        self._hf_model_dir: str | None = None
        self._trust_remote_code = False

    @classmethod
    def from_config(cls, config):
        return cls(config)

    @classmethod
    def from_hugging_face(cls, hf_model_or_dir, dtype="auto", mapping=None, quant_config=None, **kwargs):
        hf_dir = _hf_dir(hf_model_or_dir)
        quant_config = quant_config or QuantConfig()
        if quant_config._requires_calibration:
            raise ValueError(
                f"{quant_config.quant_algo} / kv {quant_config.kv_cache_quant_algo} needs calibration: "
                f"use {cls.__name__}.quantize(...) to write a checkpoint, then from_checkpoint"
            )
        model = cls(_pretrained_from_hf(cls, hf_dir, dtype, mapping or Mapping(), quant_config, kwargs))
        model._hf_model_dir = str(hf_dir)
        model._trust_remote_code = "auto_map" in _hf_config(hf_dir)
        return model

    @classmethod
    def from_checkpoint(cls, ckpt_dir, rank=None, config=None, *, preprocess_weights_hook=None):
        ckpt_dir = Path(ckpt_dir)
        config = copy.deepcopy(config) if config is not None else PretrainedConfig.from_checkpoint(ckpt_dir)
        if rank is not None:
            config.set_rank(rank)
        model = cls(config)
        meta = _read_rank_metadata(ckpt_dir / f"rank{config.mapping.rank}.safetensors")
        model._hf_model_dir = meta["hf_model_dir"]
        model._trust_remote_code = meta.get("trust_remote_code") == "true"
        return model

    @classmethod
    def quantize(
        cls,
        hf_model_dir,
        output_dir,
        dtype="auto",
        mapping=None,
        quant_config=None,
        *,
        device="cuda",
        calib_dataset="cnn_dailymail",
        calib_batches=512,
        calib_batch_size=1,
        calib_max_seq_length=512,
        random_seed=1234,
        tokenizer_max_seq_length=2048,
        **kwargs,
    ):
        _require_local_dataset(calib_dataset)
        hf_dir = _hf_dir(hf_model_dir)
        mapping = mapping or Mapping()
        config = _pretrained_from_hf(cls, hf_dir, dtype, mapping, quant_config or QuantConfig(), kwargs)
        _write_checkpoint(Path(output_dir), config, str(hf_dir), "auto_map" in _hf_config(hf_dir))

    def load(self, weights):
        self._weights = weights

    def save_checkpoint(self, output_dir, save_config=True):
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        _write_rank(output_dir, self.config.mapping.rank, self._hf_model_dir, self._trust_remote_code)
        if save_config:
            self.config.to_json_file(output_dir / "config.json")

    def prepare_inputs(self, *args, **kwargs):
        return {}

    def release(self):
        self._hf_model_dir = None


# --------------------------------------------------------------------------- helpers (private)


def _hf_dir(hf_model_or_dir) -> Path:
    if isinstance(hf_model_or_dir, (str, os.PathLike)):
        path = Path(hf_model_or_dir)
    else:  # a loaded transformers model remembers the folder it came from
        path = Path(getattr(getattr(hf_model_or_dir, "config", None), "_name_or_path", "") or "")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}/config.json not found (the fake needs the checkpoint folder on disk)")
    return path.resolve()


def _hf_config(hf_dir: Path) -> dict:
    return json.loads((hf_dir / "config.json").read_text())


def _infer_dtype(dtype: str, hf: dict) -> str:
    if dtype != "auto":
        return dtype
    source = hf.get("dtype") or hf.get("torch_dtype")
    # 'auto' keeps half-precision checkpoints and builds fp32 ones in float16.
    return source if source in ("float16", "bfloat16") else "float16"


def _pretrained_from_hf(cls, hf_dir: Path, dtype, mapping, quant_config, kwargs) -> PretrainedConfig:
    from tensorrt_llm.models import MODEL_MAP

    hf = _hf_config(hf_dir)
    arch = (hf.get("architectures") or ["?"])[0]
    if MODEL_MAP.get(arch) is not cls:
        expected = MODEL_MAP[arch].__name__ if arch in MODEL_MAP else "none (not in MODEL_MAP)"
        raise ValueError(f"{cls.__name__} cannot load a {arch} checkpoint; MODEL_MAP[{arch!r}] is {expected}")

    def first(*names, default=None):
        return next((hf[n] for n in names if hf.get(n) is not None), default)

    hidden = first("hidden_size", "n_embd", "d_model")
    rope = hf.get("rope_parameters") or {}
    extra = {k: v for k, v in kwargs.items() if k not in ("load_by_shard", "load_model_on_cpu", "trust_remote_code")}
    return PretrainedConfig(
        architecture=arch,
        dtype=_infer_dtype(dtype, hf),
        hidden_size=hidden,
        num_hidden_layers=first("num_hidden_layers", "n_layer", "num_layers"),
        num_attention_heads=first("num_attention_heads", "n_head"),
        vocab_size=hf.get("vocab_size"),
        hidden_act=first("hidden_act", "activation_function", default="gelu"),
        norm_epsilon=first("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", default=1e-5),
        position_embedding_type="learned_absolute" if "n_positions" in hf else "rope_gpt_neox",
        max_position_embeddings=first("max_position_embeddings", "n_positions"),
        rotary_embedding_dim=hf.get("rotary_dim"),
        num_key_value_heads=first("num_key_value_heads", "num_kv_heads"),
        intermediate_size=first("intermediate_size", "n_inner", default=4 * hidden),
        mapping=copy.deepcopy(mapping),
        quantization=copy.deepcopy(quant_config),
        rotary_base=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        **extra,
    )


def _write_rank(output_dir: Path, rank: int, hf_model_dir: str | None, trust_remote_code: bool) -> None:
    import torch
    from safetensors.torch import save_file

    meta = {
        "format": _CHECKPOINT_FORMAT,
        "hf_model_dir": hf_model_dir or "",
        "trust_remote_code": str(trust_remote_code).lower(),
    }
    save_file({"fake.rank": torch.tensor([rank])}, str(output_dir / f"rank{rank}.safetensors"), metadata=meta)


def _read_rank_metadata(path: Path) -> dict:
    from safetensors import safe_open

    if not path.is_file():
        raise FileNotFoundError(f"checkpoint shard {path} not found")
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if meta.get("format") != _CHECKPOINT_FORMAT:
        raise ValueError(f"{path} was not written by the fake tensorrt_llm")
    return {**meta, "hf_model_dir": meta["hf_model_dir"] or None}


def _write_checkpoint(output_dir: Path, config: PretrainedConfig, hf_model_dir: str, trust_remote_code: bool) -> None:
    """Every rank's shard plus config.json, as ``quantize`` and modelopt's export do."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for rank_config in config.for_each_rank():
        _write_rank(output_dir, rank_config.mapping.rank, hf_model_dir, trust_remote_code)
    config.to_json_file(output_dir / "config.json")


def _require_local_dataset(calib_dataset: str) -> None:
    """Calibration datasets default to hub names; with the hub out of reach only a local path works."""
    if not Path(calib_dataset).exists():
        raise ConnectionError(
            f"Couldn't reach '{calib_dataset}' on the Hub (LocalEntryNotFoundError); "
            "pass a local dataset path as calib_dataset"
        )
