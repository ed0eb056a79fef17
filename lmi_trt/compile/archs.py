"""HF ``architectures[0]`` → how TensorRT-LLM converts it, and what each family allows.

One ``ArchSpec`` per model family: the ``tensorrt_llm.models.MODEL_MAP`` class, the oldest
TensorRT-LLM release whose unified ``from_hugging_face`` converter handles it, the quantizations
LMI supports for it (deepjavalibrary/djl-serving serving/docs/lmi/user_guides/trt_llm_user_guide.md, plus weight-only
where the converter does it),
and the per-family DJL keys (``option.chatglm_model_version``, ``rotary_dim``, ...). Everything here
is pure: it reads a config dict and options and returns values or raises ``PlanError``.

``read_dims`` reads the shapes the planner needs from config.json, tolerating the spellings of
each family and transformers 5 (``dtype`` not ``torch_dtype``; ``rope_parameters`` instead of
``rope_theta``/``rope_scaling``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from lmi_trt.vocabulary import BAICHUAN_VERSIONS, CHATGLM_VERSIONS, GPT_VARIANTS, Quantization

from .errors import PlanError
from .options import CompileOptions

# Oldest TensorRT-LLM the compile path supports: BuildConfig.max_seq_len (0.11) and
# from_hugging_face(..., quant_config=) on every family used here.
MIN_TRTLLM_VERSION = "0.11.0"

Q = Quantization
_WEIGHT_ONLY = frozenset({None, Q.WEIGHTS_INT8, Q.WEIGHTS_INT4})  # None: not quantized
_WEIGHT_KV = frozenset({Q.WEIGHTS_INT8_KV_INT8, Q.WEIGHTS_INT4_KV_INT8})
_FP8 = frozenset({Q.FP8, Q.FP8_KV})

PRECOMPILED_ROUTE = (
    "To serve another architecture, compile it elsewhere with TensorRT-LLM's own tools "
    "(trtllm-build, or `lmi-trt compile` on a host where it is supported) and point option.model_id "
    "at the engine folder (config.json with build_config + rank*.engine, or a Triton tensorrt_llm/ repo)"
)


@dataclass(frozen=True)
class VersionKey:
    """A DJL key that picks a sub-variant the converter would otherwise guess from the folder name."""

    key: str  # DJL key, e.g. option.chatglm_model_version
    kwarg: str  # from_hugging_face keyword it becomes
    choices: dict[str, str]  # accepted DJL value → converter value


@dataclass(frozen=True)
class ArchSpec:
    family: str
    hf_architectures: tuple[str, ...]
    trtllm_class: str  # name in tensorrt_llm.models.MODEL_MAP's values
    min_trtllm_version: str
    quantizations: frozenset[Quantization | None]
    modelopt_decoder: str | None  # modelopt export decoder_type; None: no calibrated path
    gated_mlp: bool  # SwiGLU/GeGLU MLP (3 matrices) vs 2-matrix MLP
    trust_remote_code: bool = False  # modeling code lives in the model repo, not transformers
    fused_mlp: bool = False  # option.use_fused_mlp (LLaMA GatedMLP fusion)
    multi_block_mode: bool = True  # DJL: not for Qwen
    rotary_base: bool = False  # option.rotary_base applies (DJL: Llama, InternLM, Qwen)
    rotary_scaling: bool = False  # option.rotary_scaling_type/factor apply
    rotary_dim: bool = False  # option.rotary_dim applies (GPT-J)
    passes_trust_remote_code: bool = False  # its from_hugging_face pops trust_remote_code
    version_key: VersionKey | None = None
    # modelopt decoder_type per HF architecture where it differs from modelopt_decoder
    modelopt_decoder_by_arch: tuple[tuple[str, str], ...] = ()

    def modelopt_decoder_for(self, hf_architecture: str) -> str | None:
        return dict(self.modelopt_decoder_by_arch).get(hf_architecture, self.modelopt_decoder)


_CHATGLM_VERSIONS = VersionKey("option.chatglm_model_version", "chatglm_version", CHATGLM_VERSIONS)
_BAICHUAN_VERSIONS = VersionKey("option.baichuan_model_version", "model_version", BAICHUAN_VERSIONS)
_GPT_VERSIONS = VersionKey("option.gpt_model_version", "gpt_variant", GPT_VARIANTS)

_LLAMA_QUANT = _WEIGHT_ONLY | _WEIGHT_KV | _FP8 | {Q.SMOOTHQUANT, Q.AWQ}

ARCHS: tuple[ArchSpec, ...] = (
    ArchSpec(
        "llama",
        ("LlamaForCausalLM",),
        "LLaMAForCausalLM",
        "0.11.0",
        _LLAMA_QUANT,
        "llama",
        gated_mlp=True,
        fused_mlp=True,
        rotary_base=True,
        rotary_scaling=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "mistral",
        ("MistralForCausalLM",),
        "LLaMAForCausalLM",
        "0.11.0",
        _LLAMA_QUANT,
        "llama",
        gated_mlp=True,
        fused_mlp=True,
        rotary_base=True,
        rotary_scaling=True,
        passes_trust_remote_code=True,
    ),
    # AWQ on Mixtral crashes the JIT compile (djl#3343, djl#3445; LMI 0.28 known issue).
    ArchSpec(
        "mixtral",
        ("MixtralForCausalLM",),
        "LLaMAForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | _FP8,
        "llama",
        gated_mlp=True,
        fused_mlp=True,
        rotary_base=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "internlm",
        ("InternLMForCausalLM",),
        "LLaMAForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | {Q.SMOOTHQUANT},
        "internlm",
        gated_mlp=True,
        fused_mlp=True,
        rotary_base=True,
        rotary_scaling=True,
        trust_remote_code=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "internlm2",
        ("InternLM2ForCausalLM",),
        "LLaMAForCausalLM",
        "0.13.0",
        _WEIGHT_ONLY | {Q.SMOOTHQUANT},
        "internlm",
        gated_mlp=True,
        fused_mlp=True,
        rotary_base=True,
        rotary_scaling=True,
        trust_remote_code=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "falcon",
        ("FalconForCausalLM", "RWForCausalLM"),
        "FalconForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY,
        "falcon",
        gated_mlp=False,
    ),
    ArchSpec(
        "qwen",
        ("QWenLMHeadModel", "QWenForCausalLM"),
        "QWenForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY,
        "qwen",
        gated_mlp=True,
        multi_block_mode=False,
        rotary_base=True,
        rotary_scaling=True,
        trust_remote_code=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "qwen2",
        ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3ForCausalLM"),
        "QWenForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | _WEIGHT_KV | _FP8 | {Q.AWQ},
        "qwen",
        gated_mlp=True,
        multi_block_mode=False,
        rotary_base=True,
        rotary_scaling=True,
        passes_trust_remote_code=True,
    ),
    ArchSpec(
        "chatglm",
        ("ChatGLMModel", "ChatGLMForCausalLM", "ChatGLMForConditionalGeneration", "GLMModel"),
        "ChatGLMForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY,
        "chatglm",
        gated_mlp=True,
        trust_remote_code=True,
        version_key=_CHATGLM_VERSIONS,
    ),
    ArchSpec(
        "gptj",
        ("GPTJForCausalLM",),
        "GPTJForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY,
        "gptj",
        gated_mlp=False,
        rotary_dim=True,
    ),
    ArchSpec(
        "gpt",
        ("GPT2LMHeadModel", "GPT2LMHeadCustomModel", "GPTBigCodeForCausalLM", "Starcoder2ForCausalLM"),
        "GPTForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | _WEIGHT_KV | _FP8,
        "gpt",
        gated_mlp=False,
        passes_trust_remote_code=True,
        version_key=_GPT_VERSIONS,
    ),
    ArchSpec(
        "baichuan",
        ("BaichuanForCausalLM", "BaiChuanForCausalLM"),
        "BaichuanForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | _WEIGHT_KV | _FP8 | {Q.SMOOTHQUANT},
        "baichuan",
        gated_mlp=True,
        trust_remote_code=True,
        passes_trust_remote_code=True,
        version_key=_BAICHUAN_VERSIONS,
    ),
    ArchSpec(
        "deepseek",
        ("DeepseekForCausalLM",),
        "DeepseekForCausalLM",
        "0.12.0",
        _WEIGHT_ONLY,
        None,
        gated_mlp=True,
        trust_remote_code=True,
    ),
    ArchSpec(
        "deepseek_v2",
        ("DeepseekV2ForCausalLM",),
        "DeepseekV2ForCausalLM",
        "0.14.0",
        _WEIGHT_ONLY,
        None,
        gated_mlp=True,
        trust_remote_code=True,
    ),
    # modelopt names Gemma 2/3 "gemma2"/"gemma3" (MODEL_NAME_TO_TYPE in modelopt/torch/export/model_utils.py,
    # nvidia-modelopt 0.47.0; its export special-cases both, e.g. layer_utils.py's gemma2/gemma3 norms).
    ArchSpec(
        "gemma",
        ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM"),
        "GemmaForCausalLM",
        "0.11.0",
        _WEIGHT_ONLY | _FP8,
        "gemma",
        gated_mlp=True,
        modelopt_decoder_by_arch=(("Gemma2ForCausalLM", "gemma2"), ("Gemma3ForCausalLM", "gemma3")),
    ),
    ArchSpec("phi", ("PhiForCausalLM",), "PhiForCausalLM", "0.11.0", _WEIGHT_ONLY, "phi", gated_mlp=False),
    ArchSpec("phi3", ("Phi3ForCausalLM",), "Phi3ForCausalLM", "0.11.0", _WEIGHT_ONLY, "phi3", gated_mlp=True),
)

# Architectures a family's class learned later than the family itself (release notes; approximate
# for 0.x where the per-release history is not in the reference).
ARCH_MIN_VERSION: dict[str, str] = {
    "Qwen2MoeForCausalLM": "0.12.0",
    "Qwen3ForCausalLM": "0.20.0",
    "Gemma2ForCausalLM": "0.13.0",
    "Gemma3ForCausalLM": "0.19.0",
    "Starcoder2ForCausalLM": "0.11.0",
}
# Llama 3.1's rope_scaling {"rope_type": "llama3"} broke convert_checkpoint before 0.12 (TRT-LLM#2105).
LLAMA3_ROPE_MIN_VERSION = "0.12.0"

_BY_ARCH: dict[str, ArchSpec] = {a: spec for spec in ARCHS for a in spec.hf_architectures}


def supported_architectures() -> list[str]:
    return sorted(_BY_ARCH)


def hf_architecture(hf_config: dict[str, Any]) -> str:
    archs = hf_config.get("architectures") or []
    if not archs:
        raise PlanError(
            "architectures",
            None,
            "config.json names no architecture, so no converter can be chosen",
            'Add "architectures": ["<ClassName>"] to config.json. ' + PRECOMPILED_ROUTE,
        )
    return str(archs[0])


def lookup_arch(hf_config: dict[str, Any]) -> ArchSpec:
    """The spec for ``architectures[0]``, or a ``PlanError`` listing what is supported."""
    arch = hf_architecture(hf_config)
    spec = _BY_ARCH.get(arch)
    if spec is None:
        raise PlanError(
            "architectures[0]",
            arch,
            "TensorRT-LLM JIT compilation does not support this architecture",
            "Supported: " + ", ".join(supported_architectures()) + ". " + PRECOMPILED_ROUTE,
        )
    return spec


def min_version_for(spec: ArchSpec, hf_config: dict[str, Any]) -> str:
    arch = hf_architecture(hf_config)
    versions = [MIN_TRTLLM_VERSION, spec.min_trtllm_version, ARCH_MIN_VERSION.get(arch, "0")]
    if (rope_scaling(hf_config) or {}).get("rope_type") == "llama3":
        versions.append(LLAMA3_ROPE_MIN_VERSION)
    return str(max(Version(v) for v in versions))


# ---------------------------------------------------------------------------------------------
# config.json readers
# ---------------------------------------------------------------------------------------------


def _first(hf: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    return default


def checkpoint_dtype(hf: dict[str, Any]) -> str | None:
    """The checkpoint's dtype: transformers 5 writes ``dtype``, 4.x ``torch_dtype``."""
    value = _first(hf, "dtype", "torch_dtype")
    return str(value).removeprefix("torch.") if value is not None else None


def rope_theta(hf: dict[str, Any]) -> float | None:
    params = hf.get("rope_parameters") or {}
    value = _first(hf, "rope_theta", "rotary_emb_base", default=params.get("rope_theta"))
    return float(value) if value is not None else None


def rope_scaling(hf: dict[str, Any]) -> dict[str, Any] | None:
    """``{"rope_type": ..., "factor": ..., ...}`` or None for plain RoPE (4.x and 5.x spellings)."""
    scaling = hf.get("rope_scaling")
    if not scaling:
        params = hf.get("rope_parameters") or {}
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return None
    return {**scaling, "rope_type": kind}


@dataclass(frozen=True)
class ModelDims:
    """The shapes that decide validation and memory; ``kv_width`` = KV elements per token per layer."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    num_experts: int = 0
    moe_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP in MoE models (DeepSeek)
    gated_mlp: bool = True
    kv_width: int = 0
    kv_split_by_tp: bool = True  # False for compressed (MLA) caches, replicated on every rank


def _kv_heads(spec: ArchSpec, hf: dict[str, Any], heads: int) -> int:
    if hf.get("num_key_value_heads") is not None:
        return int(hf["num_key_value_heads"])
    if spec.family == "falcon":
        if hf.get("new_decoder_architecture"):
            return int(_first(hf, "num_kv_heads", "n_head_kv", default=heads))
        return 1 if hf.get("multi_query", True) else heads
    if spec.family == "gpt" and hf.get("model_type") == "gpt_bigcode":
        return 1 if hf.get("multi_query", True) else heads
    if spec.family == "chatglm":
        return int(hf["multi_query_group_num"]) if hf.get("multi_query_attention") else heads
    return int(_first(hf, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads))


def max_positions(spec: ArchSpec, hf: dict[str, Any]) -> int | None:
    if spec.family == "baichuan" and hf.get("model_max_length") and hf.get("max_position_embeddings") is None:
        return int(hf["model_max_length"])
    value = _first(
        hf, "max_position_embeddings", "n_positions", "seq_length", "max_sequence_length", "model_max_length"
    )
    return int(value) if value is not None else None


def read_dims(spec: ArchSpec, hf: dict[str, Any]) -> ModelDims:
    """Shapes from config.json; a missing essential key is a ``PlanError`` naming it."""

    def need(*keys: str) -> int:
        value = _first(hf, *keys)
        if value is None:
            raise PlanError(
                f"config.json:{keys[0]}",
                None,
                f"the {spec.family} config has none of {', '.join(keys)}",
                "Check that model_id points at the model's own config.json",
            )
        return int(value)

    hidden = need("hidden_size", "n_embd", "d_model")
    layers = need("num_hidden_layers", "n_layer", "num_layers")
    heads = need("num_attention_heads", "n_head")
    kv_heads = _kv_heads(spec, hf, heads)
    head_dim = int(_first(hf, "head_dim", "kv_channels", default=hidden // heads))
    intermediate = int(
        _first(hf, "intermediate_size", "ffn_hidden_size", "n_inner", "inner_hidden_size", default=4 * hidden)
    )
    if spec.family == "qwen":
        intermediate //= 2  # Qwen-1 states the two gated halves together (w1 and w2 are each half)
    experts = int(_first(hf, "num_local_experts", "n_routed_experts", "num_experts", default=0) or 0)
    moe_inter = int(_first(hf, "moe_intermediate_size", default=intermediate)) if experts else 0
    shared = 0
    if experts:
        shared = int(hf.get("shared_expert_intermediate_size") or 0) or moe_inter * int(hf.get("n_shared_experts") or 0)
    kv_width = 2 * kv_heads * head_dim
    split = True
    if spec.family == "deepseek_v2" and hf.get("kv_lora_rank"):
        # MLA caches the compressed latent plus the shared RoPE key, not per-head K and V.
        kv_width = int(hf["kv_lora_rank"]) + int(hf.get("qk_rope_head_dim") or 0)
        split = False
    return ModelDims(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=need("vocab_size", "padded_vocab_size")
        if spec.family != "chatglm"
        else need("padded_vocab_size", "vocab_size"),
        max_position_embeddings=max_positions(spec, hf),
        num_experts=experts,
        moe_intermediate_size=moe_inter,
        shared_intermediate_size=shared,
        dense_layers=int(hf.get("first_k_dense_replace") or 0) if experts else 0,
        gated_mlp=spec.gated_mlp,
        kv_width=kv_width,
        kv_split_by_tp=split,
    )


# ---------------------------------------------------------------------------------------------
# per-family options
# ---------------------------------------------------------------------------------------------


def _infer_chatglm_version(hf: dict[str, Any]) -> str | None:
    """TensorRT-LLM guesses from the folder *name* (a cache path here), so read the config instead."""
    if hf_architecture(hf) == "GLMModel" or hf.get("model_type") == "glm":
        return "glm"
    if "multi_query_group_num" not in hf:
        return "chatglm"
    if hf.get("padded_vocab_size") == 151552:
        return "glm4"
    name = str(hf.get("_name_or_path", "")).lower().replace("-", "_")
    for version in ("glm_4", "chatglm3", "chatglm2"):
        if version in name:
            return "glm4" if version == "glm_4" else version
    return None  # chatglm2 and chatglm3 share one config shape


def _infer_gpt_variant(hf: dict[str, Any]) -> str | None:
    arch, model_type = hf_architecture(hf), hf.get("model_type")
    if arch == "GPT2LMHeadCustomModel":
        return "santacoder"
    return {
        "gpt2": "gpt2",
        "gpt_bigcode": "starcoder",
        "starcoder2": "starcoder2",
        "nemotron": "nemotron",
        "jais": "jais",
    }.get(str(model_type))


def _infer_baichuan_version(hf: dict[str, Any]) -> str:
    # TensorRT-LLM's own guess (BaichuanConfig.guess_model_version), made visible in the plan.
    size = "7" if hf.get("num_attention_heads") == 32 else "13"
    return f"v{'1' if hf.get('vocab_size') == 64000 else '2'}_{size}b"


def _version_value(spec: ArchSpec, opts: CompileOptions) -> str | None:
    return {
        "chatglm": opts.chatglm_model_version,
        "baichuan": opts.baichuan_model_version,
        "gpt": opts.gpt_model_version,
    }.get(spec.family)


def converter_kwargs(spec: ArchSpec, opts: CompileOptions, hf: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for ``MODEL_MAP[arch].from_hugging_face`` beyond dtype/mapping/quant_config."""
    kwargs: dict[str, Any] = {}
    if spec.passes_trust_remote_code:
        kwargs["trust_remote_code"] = opts.trust_remote_code
    key = spec.version_key
    if key is None:
        return kwargs
    given = _version_value(spec, opts)
    if given is not None:  # one of key.choices: the options take the key's values only
        value = key.choices[given]
    else:
        value = {"chatglm": _infer_chatglm_version, "gpt": _infer_gpt_variant, "baichuan": _infer_baichuan_version}[
            spec.family
        ](hf)
        if value is None:
            raise PlanError(
                key.key,
                None,
                "cannot tell the model version from config.json",
                "Set it to one of: " + ", ".join(sorted(set(key.choices.values()))),
            )
    kwargs[key.kwarg] = value
    return kwargs


def _rope_theta_key(spec: ArchSpec) -> str:
    return "rotary_emb_base" if spec.family == "qwen" else "rope_theta"


def hf_config_overrides(spec: ArchSpec, opts: CompileOptions, hf: dict[str, Any]) -> dict[str, Any]:
    """config.json keys to rewrite before conversion, for the rotary options.

    TensorRT-LLM's converters read RoPE settings from the HF config (passing ``rotary_base`` as a
    keyword collides with the value they read), so the build converts from a copy of the
    checkpoint folder whose config.json carries these values; both transformers spellings are set.
    """
    out: dict[str, Any] = {}
    params = dict(hf.get("rope_parameters") or {})
    if opts.rotary_base is not None:
        out[_rope_theta_key(spec)] = opts.rotary_base
        params["rope_theta"] = opts.rotary_base
    if opts.rotary_scaling_type is not None:
        scaling = {
            "type": opts.rotary_scaling_type,
            "rope_type": opts.rotary_scaling_type,
            "factor": opts.rotary_scaling_factor,
        }
        out["rope_scaling"] = scaling
        params.update(rope_type=opts.rotary_scaling_type, factor=opts.rotary_scaling_factor)
    if opts.rotary_dim is not None:
        out["rotary_dim"] = opts.rotary_dim
    if out and "rope_parameters" in hf and (opts.rotary_base is not None or opts.rotary_scaling_type is not None):
        out["rope_parameters"] = params
    return out


def effective_rope_scaling(opts: CompileOptions, hf: dict[str, Any]) -> dict[str, Any] | None:
    if opts.rotary_scaling_type is not None:
        return {"rope_type": opts.rotary_scaling_type, "factor": opts.rotary_scaling_factor}
    return rope_scaling(hf)


def checkpoint_as_hf_config(ckpt: dict[str, Any]) -> dict[str, Any]:
    """A TensorRT-LLM checkpoint's config.json (``PretrainedConfig``) in the HF spelling ``read_dims`` reads."""
    moe = ckpt.get("moe") or {}
    intermediate = ckpt.get("intermediate_size")
    if (
        intermediate
        and ckpt.get("architecture") in ("QWenLMHeadModel", "QWenForCausalLM")
        and ckpt.get("qwen_type", "qwen") == "qwen"
    ):
        intermediate *= 2  # read_dims halves Qwen-1's HF figure; the checkpoint stores the half already
    out = {
        "architectures": [ckpt.get("architecture")],
        "hidden_size": ckpt.get("hidden_size"),
        "num_hidden_layers": ckpt.get("num_hidden_layers"),
        "num_attention_heads": ckpt.get("num_attention_heads"),
        "num_key_value_heads": ckpt.get("num_key_value_heads"),
        "head_dim": ckpt.get("head_size"),
        "intermediate_size": intermediate,
        "vocab_size": ckpt.get("vocab_size"),
        "max_position_embeddings": ckpt.get("max_position_embeddings"),
        "dtype": ckpt.get("dtype"),
        "rope_theta": ckpt.get("rotary_base"),
        "rope_scaling": ckpt.get("rotary_scaling"),
        "num_local_experts": moe.get("num_experts") or None,
        "num_experts_per_tok": moe.get("top_k") or None,
    }
    return {k: v for k, v in out.items() if v is not None}


def check_arch_options(
    spec: ArchSpec, opts: CompileOptions, hf: dict[str, Any], dims: ModelDims, *, loads_hf_code: bool = True
) -> list[str]:
    """Raise ``PlanError`` for options the family cannot take; return notes for ignored ones.

    ``loads_hf_code`` is False when building from a TensorRT-LLM checkpoint: no modeling code runs.
    """
    notes: list[str] = []
    arch = hf_architecture(hf)
    if loads_hf_code and spec.trust_remote_code and not opts.trust_remote_code:
        raise PlanError(
            "option.trust_remote_code",
            False,
            f"{arch} ships its modeling code in the model repository",
            "Set option.trust_remote_code=true (or HF_MODEL_TRUST_REMOTE_CODE=true) if you trust it",
        )
    if opts.use_fused_mlp and not spec.fused_mlp:
        raise PlanError(
            "option.use_fused_mlp",
            True,
            f"GatedMLP fusion exists only for the LLaMA family, not {arch}",
            "Remove option.use_fused_mlp",
        )
    if opts.multi_block_mode and not spec.multi_block_mode:
        raise PlanError(
            "option.multi_block_mode",
            True,
            f"multi-block mode is not supported for {arch}",
            "Remove option.multi_block_mode",
        )
    if (opts.rotary_scaling_type is None) != (opts.rotary_scaling_factor is None):
        given = (
            ("option.rotary_scaling_type", opts.rotary_scaling_type)
            if opts.rotary_scaling_type is not None
            else ("option.rotary_scaling_factor", opts.rotary_scaling_factor)
        )
        raise PlanError(
            given[0],
            given[1],
            "rotary scaling needs both a type and a factor",
            "Set option.rotary_scaling_type (linear|dynamic) and option.rotary_scaling_factor (>1) "
            "together, or neither",
        )
    if opts.rotary_scaling_factor is not None:  # > 1: CompileOptions' bound, as the configuration's
        if not spec.rotary_scaling:
            raise PlanError(
                "option.rotary_scaling_type",
                opts.rotary_scaling_type,
                f"rotary scaling options apply to Llama, InternLM and Qwen, not {arch}",
                "Remove option.rotary_scaling_type and option.rotary_scaling_factor",
            )
    if opts.rotary_base is not None and not spec.rotary_base:
        raise PlanError(
            "option.rotary_base",
            opts.rotary_base,
            f"option.rotary_base applies to Llama, InternLM and Qwen, not {arch}",
            "Remove option.rotary_base",
        )
    if opts.rotary_dim is not None:
        if not spec.rotary_dim:
            raise PlanError(
                "option.rotary_dim",
                opts.rotary_dim,
                f"option.rotary_dim applies to GPT-J only, not {arch}",
                "Remove option.rotary_dim",
            )
        if opts.rotary_dim > dims.head_dim or opts.rotary_dim % 2:
            raise PlanError(
                "option.rotary_dim",
                opts.rotary_dim,
                f"must be even and at most the head size {dims.head_dim}",
                f"Use an even value ≤ {dims.head_dim} (the checkpoint has {hf.get('rotary_dim')})",
            )
    for family, key, value in (
        ("chatglm", "option.chatglm_model_version", opts.chatglm_model_version),
        ("baichuan", "option.baichuan_model_version", opts.baichuan_model_version),
        ("gpt", "option.gpt_model_version", opts.gpt_model_version),
    ):
        if value is not None and spec.family != family:
            notes.append(f"{key}={value} ignored: it applies to {family} models, this is {arch}")
    return notes
