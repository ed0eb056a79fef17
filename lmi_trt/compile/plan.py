"""The build plan: a pure function of (options, HF config, GPU facts, TensorRT-LLM version).

``make_plan`` validates everything that can be known before a download or a GPU is touched and
returns a frozen, JSON-serialisable ``BuildPlan`` that says what will be built and why (``notes``),
or raises ``PlanError`` naming the key, the value and what would work. ``estimate_memory`` sizes
weights, KV cache and concurrency for a plan on a GPU.

Length semantics: ``option.max_output_len`` is the maximum number of NEW tokens, and the engine is
built with ``max_seq_len = max_input_len + max_output_len`` (stated in the plan). DJL's LMI from
0.30 passed ``max_output_len`` as ``max_seq_len`` and TensorRT-LLM then clipped ``max_input_len``
silently (djl#3489); here nothing is clipped: a limit the model or the engine cannot honour is an error.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field

from lmi_trt.vocabulary import KV_CACHE_FREE_GPU_MEM_FRACTION, TRTLLM_DEFAULT_BATCH, quantization_name

from .archs import (
    ArchSpec,
    ModelDims,
    check_arch_options,
    checkpoint_as_hf_config,
    checkpoint_dtype,
    converter_kwargs,
    effective_rope_scaling,
    hf_architecture,
    hf_config_overrides,
    lookup_arch,
    min_version_for,
    read_dims,
)
from .errors import PlanError
from .lora import LORA_FAMILIES, TARGET_MODULES, peft_cache_sizes, peft_device_bytes
from .medusa import MedusaPlan
from .medusa import plan_errors as medusa_plan_errors
from .options import CompileOptions
from .quant import QuantPlan, plan_quant

PLAN_SCHEMA_VERSION = 1
DEFAULT_MAX_NUM_TOKENS = 8192  # TensorRT-LLM's BuildConfig default
# TensorRT-LLM's builder (``_init_max_seq_len`` in tensorrt_llm/builder.py, 0.12–1.2) multiplies
# max_position_embeddings by the rope factor (rounding up) for every scaling type but these, whose
# config.json already states the extended length.
_NON_STRETCHING_ROPE = ("su", "longrope", "llama3")
GiB = 1024**3

TrtDtype = Literal["float16", "bfloat16", "float32"]
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
_OPTION_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


class GpuFacts(BaseModel):
    """What the planner needs to know about the GPUs: ``sm`` is the compute capability ×10 (H100 = 90)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    sm: int = Field(ge=10)
    memory_gib: float = Field(gt=0)
    count: int = Field(ge=1)


class PluginPlan(BaseModel):
    """``PluginConfig`` fields the plan sets; ``None`` fields are left to TensorRT-LLM (absent in that version)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpt_attention_plugin: str = "auto"
    gemm_plugin: str | None = "auto"
    context_fmha: bool = True
    paged_kv_cache: bool = True
    remove_input_padding: bool = True
    tokens_per_block: int
    use_paged_context_fmha: bool
    use_fp8_context_fmha: bool = False
    use_fused_mlp: bool = False
    weight_only_quant_matmul_plugin: str | None = None
    weight_only_groupwise_quant_matmul_plugin: str | None = None
    use_custom_all_reduce: bool | None = None  # a PluginConfig field before 0.12 only
    multi_block_mode: bool | None = None  # a build flag before 0.12; a runtime knob after
    lora_plugin: str | None = None  # the LoRA plugin's dtype (option.enable_lora); None: no LoRA plugin

    def plugin_config_kwargs(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class LoraPlan(BaseModel):
    """The LoRA plugin's build settings (``compile.lora``), and the adapters the PEFT cache holds on the device."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_lora_rank: int
    target_modules: tuple[str, ...]
    max_loras: int  # a run-time size, not part of the engine: out of the cache key

    def lora_config_kwargs(self) -> dict[str, Any]:
        return {"max_lora_rank": self.max_lora_rank, "lora_target_modules": list(self.target_modules)}


class ConverterPlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["hf", "trtllm_checkpoint"] = "hf"
    trtllm_class: str
    kwargs: dict[str, Any] = {}
    hf_config_overrides: dict[str, Any] = {}
    trust_remote_code: bool = False


class BuildPlan(BaseModel):
    """Everything the build does, decided up front. ``notes`` explain; they are not build inputs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = PLAN_SCHEMA_VERSION
    architecture: str
    family: str
    trtllm_version: str
    dtype: TrtDtype
    max_input_len: int
    max_output_len: int  # new tokens
    max_seq_len: int  # = max_input_len + max_output_len
    max_batch_size: int
    max_beam_width: int
    max_num_tokens: int
    max_draft_len: int = 0  # speculative decoding draft tokens per step
    speculative_decoding_mode: str | None = None  # trtllm-build's --speculative_decoding_mode name
    tp_size: int
    pp_size: int
    plugins: PluginPlan
    quant: QuantPlan
    converter: ConverterPlan
    lora: LoraPlan | None = None
    medusa: MedusaPlan | None = None  # the heads a Medusa engine is built with (compile.medusa)
    notes: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def key_dict(self) -> dict[str, Any]:
        """The plan as cache-key input: every field except the explanatory ``notes``."""
        # no speculative mode or LoRA: left out, so plans (and cached engines) from before those fields keep their keys
        exclude = {"notes"} | ({"speculative_decoding_mode"} if self.speculative_decoding_mode is None else set())
        key = self.model_dump(mode="json", exclude=exclude)
        if self.medusa is None:
            del key["medusa"]
        else:
            del key["medusa"]["heads_dir"]  # where they are is not what they are (their fingerprint)
        if self.lora is None:
            del key["lora"], key["plugins"]["lora_plugin"]
        else:
            del key["lora"]["max_loras"]  # a run-time size
        return key

    @property
    def _fused_mlp_on_build_config(self) -> bool:
        # 0.12: use_fused_mlp is a BuildConfig field; 1.x moved it into PluginConfig
        # (tensorrt_llm/builder.py and tensorrt_llm/plugin/plugin.py at v0.12.0 and v1.0.0).
        return Version(self.trtllm_version) < Version("1.0.0")

    def build_config_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``tensorrt_llm.builder.BuildConfig`` (plugin_config added by the build)."""
        kwargs: dict[str, Any] = {
            "max_input_len": self.max_input_len,
            "max_seq_len": self.max_seq_len,
            "max_batch_size": self.max_batch_size,
            "max_beam_width": self.max_beam_width,
            "max_num_tokens": self.max_num_tokens,
            "max_draft_len": self.max_draft_len,
        }
        if self._fused_mlp_on_build_config:
            kwargs["use_fused_mlp"] = self.plugins.use_fused_mlp
        return kwargs

    def plugin_settings(self) -> dict[str, Any]:
        """``PluginConfig`` attributes to set, for this plan's release."""
        settings = self.plugins.plugin_config_kwargs()
        if self._fused_mlp_on_build_config:
            del settings["use_fused_mlp"]
        return settings


# ---------------------------------------------------------------------------------------------
# pieces of the plan
# ---------------------------------------------------------------------------------------------


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _tp_ok(tp: int, dims: ModelDims) -> bool:
    kv = dims.num_kv_heads
    return dims.num_heads % tp == 0 and (kv % tp == 0 or tp % kv == 0)


def resolve_parallelism(opts: CompileOptions, dims: ModelDims, gpu: GpuFacts) -> tuple[int, int, list[str]]:
    notes: list[str] = []
    pp = opts.pipeline_parallel_degree
    if opts.tensor_parallel_degree == "max":
        tp = gpu.count // pp
        if tp < 1:
            raise PlanError(
                "option.pipeline_parallel_degree",
                pp,
                f"larger than the {gpu.count} visible GPUs",
                f"Use option.pipeline_parallel_degree ≤ {gpu.count}",
            )
        while tp > 1 and not _tp_ok(tp, dims):  # "max" means as many GPUs as the model can be split over
            tp -= 1
        notes.append(f"tensor_parallel_degree=max → {tp} ({gpu.count} GPUs, PP {pp}, {dims.num_heads} heads)")
    else:
        tp = opts.tensor_parallel_degree
    valid_tp = [d for d in _divisors(dims.num_heads, gpu.count // pp or 1) if _tp_ok(d, dims)]
    if dims.num_heads % tp:
        raise PlanError(
            "option.tensor_parallel_degree",
            tp,
            f"{dims.num_heads} attention heads cannot be split evenly over {tp} ranks",
            f"Use one of {valid_tp}",
        )
    kv = dims.num_kv_heads
    if kv % tp and tp % kv:
        raise PlanError(
            "option.tensor_parallel_degree",
            tp,
            f"{kv} KV heads can neither be split over {tp} ranks nor replicated evenly",
            f"Use one of {valid_tp}",
        )
    for name, size in (
        ("intermediate_size", dims.intermediate_size),
        ("moe_intermediate_size", dims.moe_intermediate_size),
    ):
        if size and size % tp:
            raise PlanError(
                "option.tensor_parallel_degree",
                tp,
                f"{name}={size} is not divisible by {tp}",
                f"Use one of {[d for d in valid_tp if size % d == 0]}",
            )
    if dims.num_layers % pp:
        raise PlanError(
            "option.pipeline_parallel_degree",
            pp,
            f"{dims.num_layers} layers cannot be split evenly over {pp} pipeline stages",
            f"Use one of {_divisors(dims.num_layers, gpu.count)}",
        )
    if tp * pp > gpu.count:
        raise PlanError(
            "option.tensor_parallel_degree",
            tp,
            f"TP×PP = {tp}×{pp} = {tp * pp} GPUs, but {gpu.count} are visible",
            f"Lower option.tensor_parallel_degree/option.pipeline_parallel_degree to use at most "
            f"{gpu.count} GPUs (valid TP here: {valid_tp}), or run on a host with {tp * pp} GPUs",
        )
    return tp, pp, notes


def resolve_dtype(opts: CompileOptions, hf: dict[str, Any], gpu: GpuFacts) -> tuple[TrtDtype, list[str]]:
    notes: list[str] = []
    if opts.dtype != "auto":
        dtype: TrtDtype = _OPTION_DTYPE[opts.dtype]  # type: ignore[assignment]
        if dtype == "bfloat16" and gpu.sm < 80:
            raise PlanError(
                "option.dtype",
                opts.dtype,
                f"bfloat16 needs compute capability 8.0+, {gpu.name} is {gpu.sm / 10:.1f}",
                "Use option.dtype=fp16",
            )
        return dtype, notes
    ckpt = checkpoint_dtype(hf)
    if ckpt == "bfloat16" and gpu.sm >= 80:
        dtype = "bfloat16"
    else:
        # TensorRT-LLM's infer_dtype: float32 (or unknown) checkpoints build in float16.
        dtype = "float16"
        if ckpt != "float16":
            why = "no bfloat16 before compute capability 8.0" if ckpt == "bfloat16" else "TensorRT-LLM's auto rule"
            notes.append(
                f"dtype=auto: checkpoint is {ckpt or 'unspecified'}, building float16 ({why}); "
                "set option.dtype to choose"
            )
    return dtype, notes


def resolve_lengths(opts: CompileOptions, spec: ArchSpec, hf: dict[str, Any], dims: ModelDims) -> tuple[int, list[str]]:
    total = opts.max_input_len + opts.max_output_len
    if opts.max_seq_len is None:
        max_seq_len = total
        key, value = (
            "option.max_input_len + option.max_output_len",
            f"{opts.max_input_len} + {opts.max_output_len} = {total}",
        )
        notes = [
            f"max_output_len={opts.max_output_len} is the maximum of NEW tokens; engine max_seq_len = "
            f"max_input_len + max_output_len = {opts.max_input_len} + {opts.max_output_len} = {total}"
        ]
    else:
        max_seq_len, key, value = opts.max_seq_len, "option.max_seq_len", opts.max_seq_len
        if max_seq_len <= opts.max_input_len:
            raise PlanError(
                key,
                value,
                f"must exceed max_input_len={opts.max_input_len}, or a full-length prompt "
                "leaves no room for output (TensorRT-LLM would lower max_input_len silently, djl#3489)",
                f"Set option.max_seq_len > {opts.max_input_len}, or unset it to build "
                f"max_input_len + max_output_len = {total}",
            )
        notes = [f"max_seq_len={max_seq_len} (set); max_output_len={opts.max_output_len} caps the new tokens"]
        if max_seq_len < total:
            notes.append(
                f"max_seq_len < max_input_len + max_output_len = {total}: a prompt of n tokens gets at "
                f"most min({opts.max_output_len}, {max_seq_len} - n) new tokens"
            )
    limit = dims.max_position_embeddings
    if limit is None:
        notes.append("config.json states no maximum position; max_seq_len is not checked against the model")
        return max_seq_len, notes
    scaling = effective_rope_scaling(opts, hf)
    allowed = rope_scaled_positions(limit, scaling)
    if max_seq_len > allowed:
        how = (
            f"max_position_embeddings={limit} × rope factor {scaling['factor']}"
            if allowed != limit
            else f"max_position_embeddings={limit}"
        )
        fix = (
            f"Lower them so that max_input_len + max_output_len ≤ {allowed}"
            if opts.max_seq_len is None
            else f"Set option.max_seq_len ≤ {allowed}"
        )
        if allowed == limit and opts.rotary_scaling_type is None and spec.rotary_scaling:
            fix += " (or stretch RoPE with option.rotary_scaling_type and option.rotary_scaling_factor)"
        raise PlanError(key, value, f"the model supports {allowed} positions ({how})", fix)
    return max_seq_len, notes


def rope_scaled_positions(max_position_embeddings: int, scaling: dict[str, Any] | None) -> int:
    """The positions TensorRT-LLM's builder allows: ``ceil(max_position_embeddings × factor)`` unless the
    type is su/longrope/llama3 (``_init_max_seq_len``, tensorrt_llm/builder.py)."""
    if not scaling:
        return max_position_embeddings
    rope_type = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor") or 1.0) if rope_type not in _NON_STRETCHING_ROPE else 1.0
    return math.ceil(max_position_embeddings * factor) if factor != 1.0 else max_position_embeddings


def resolve_max_num_tokens(
    opts: CompileOptions, max_batch_size: int, max_seq_len: int, max_input_len: int, paged_context_fmha: bool
) -> tuple[int, list[str]]:
    """Pure: the engine's max_num_tokens, against the planned ``max_input_len`` (raised for draft tokens)."""
    notes: list[str] = []
    ceiling = max_batch_size * max_seq_len
    if opts.max_num_tokens is not None:
        value = opts.max_num_tokens
        if value > ceiling:
            raise PlanError(
                "option.max_num_tokens",
                value,
                f"exceeds max_batch_size × max_seq_len = {max_batch_size} × {max_seq_len} = {ceiling}, "
                "the most one step can ever schedule; TensorRT-LLM would lower it silently (djl#3489)",
                f"Set option.max_num_tokens ≤ {ceiling}, or raise option.max_rolling_batch_size or the max lengths",
            )
    else:
        value = min(max(DEFAULT_MAX_NUM_TOKENS, max_input_len), ceiling)
        notes.append(
            f"max_num_tokens={value} (default: max({DEFAULT_MAX_NUM_TOKENS}, max_input_len), at most "
            f"max_batch_size × max_seq_len)"
        )
    if value < max_input_len:
        if not paged_context_fmha:
            raise PlanError(
                "option.max_num_tokens",
                value,
                f"is below max_input_len={max_input_len}; longer prompts need chunked context, "
                "which needs use_paged_context_fmha (not available here)",
                f"Set option.max_num_tokens ≥ {max_input_len}",
            )
        notes.append(
            f"prompts longer than max_num_tokens={value} are processed in chunks: serve with chunked context enabled"
        )
    return value, notes


def resolve_plugins(
    opts: CompileOptions, spec: ArchSpec, gpu: GpuFacts, version: Version, quant: QuantPlan
) -> tuple[PluginPlan, list[str]]:
    notes: list[str] = []
    v1 = version >= Version("1.0.0")
    legacy_flags = version < Version("0.12.0")
    tokens_per_block = opts.tokens_per_block or (32 if v1 else 64)  # a power of two (TOKENS_PER_BLOCK)
    paged_context = (v1 and gpu.sm >= 80) if opts.use_paged_context_fmha is None else opts.use_paged_context_fmha
    if opts.use_paged_context_fmha and gpu.sm < 80:
        raise PlanError(
            "option.use_paged_context_fmha",
            True,
            f"paged context FMHA needs compute capability 8.0+ ({gpu.name} is {gpu.sm / 10:.1f})",
            "Remove option.use_paged_context_fmha",
        )
    # draft tokens: the Executor requires block reuse on a draft_tokens_external engine (lmi_trt.engines.trtllm_drafts)
    drafts = opts.speculative_decoding_mode == "draft_tokens_external"
    if opts.enable_kv_cache_reuse or drafts:
        reuse_key = "option.enable_kv_cache_reuse" if opts.enable_kv_cache_reuse else opts.speculative_key
        reuse_value = True if opts.enable_kv_cache_reuse else opts.speculative_method
        needs_it = (
            f"{reuse_key} needs it"
            if opts.enable_kv_cache_reuse
            else f"{reuse_key}={reuse_value}: draft tokens need KV-cache block reuse, which needs it"
        )
        if opts.use_paged_context_fmha is False:
            raise PlanError(
                "option.use_paged_context_fmha",
                False,
                f"{needs_it} (tensorrtllm_backend#271)",
                f"Remove option.use_paged_context_fmha=false or {reuse_key}",
            )
        if gpu.sm < 80:
            raise PlanError(
                reuse_key,
                reuse_value,
                f"KV-cache reuse needs paged context FMHA, which needs compute capability 8.0+ "
                f"({gpu.name} is {gpu.sm / 10:.1f}; TRT-LLM#1671)",
                f"Remove {reuse_key}",
            )
        if quant.kv_cache_quant_algo == "INT8":
            raise PlanError(
                reuse_key,
                reuse_value,
                "KV-cache reuse does not work with an INT8 KV cache (TRT-LLM#2166)",
                f"Remove {reuse_key} or use a quantization without INT8 KV",
            )
        if not paged_context:
            notes.append(f"use_paged_context_fmha forced on: {needs_it} (tensorrtllm_backend#271)")
        paged_context = True
    fp8 = quant.quant_algo == "FP8" or quant.kv_cache_quant_algo == "FP8"
    if opts.use_fp8_context_fmha:
        if not fp8:
            raise PlanError(
                "option.use_fp8_context_fmha",
                True,
                "FP8 context FMHA needs an FP8 model or KV cache",
                "Set option.quantize=fp8 or fp8_kv, or remove option.use_fp8_context_fmha",
            )
        if gpu.sm < 90:
            raise PlanError(
                "option.use_fp8_context_fmha",
                True,
                f"FP8 context FMHA runs on Hopper (9.0+) only; {gpu.name} is {gpu.sm / 10:.1f} (TRT-LLM#1914)",
                "Remove option.use_fp8_context_fmha",
            )
    fused_mlp = opts.use_fused_mlp
    weight_only = quant.quant_algo in ("W8A16", "W4A16")
    groupwise = quant.quant_algo in ("W4A16_AWQ", "W4A8_AWQ")
    if not legacy_flags:
        if opts.use_custom_all_reduce:
            notes.append("option.use_custom_all_reduce ignored: TensorRT-LLM ≥0.12 chooses the all-reduce at run time")
        if opts.multi_block_mode is not None:
            notes.append("option.multi_block_mode is a runtime setting in TensorRT-LLM ≥0.12, not part of the engine")
    return PluginPlan(
        gemm_plugin=None if quant.quant_algo == "FP8" else "auto",
        tokens_per_block=tokens_per_block,
        use_paged_context_fmha=paged_context,
        use_fp8_context_fmha=opts.use_fp8_context_fmha,
        use_fused_mlp=fused_mlp,
        weight_only_quant_matmul_plugin="auto" if weight_only else None,
        weight_only_groupwise_quant_matmul_plugin="auto" if groupwise else None,
        use_custom_all_reduce=opts.use_custom_all_reduce if legacy_flags else None,
        multi_block_mode=bool(opts.multi_block_mode) if legacy_flags else None,
    ), notes


def plan_lora(opts: CompileOptions, spec: ArchSpec) -> LoraPlan | None:
    """option.enable_lora: the LoRA plugin on every projection of a Llama-shaped decoder (``compile.lora``)."""
    if not opts.enable_lora:
        return None
    if spec.family not in LORA_FAMILIES:
        raise PlanError(
            "option.enable_lora",
            True,
            f"lmi-trt builds the LoRA plugin for Llama-shaped decoders ({', '.join(sorted(LORA_FAMILIES))}), whose "
            f"PEFT adapters it reads; this model is {spec.family}",
            "Leave option.enable_lora out, or build the engine with trtllm-build --lora_plugin and serve that folder",
        )
    return LoraPlan(max_lora_rank=opts.max_lora_rank, target_modules=TARGET_MODULES, max_loras=opts.max_loras)


def _check_version(spec: ArchSpec, hf: dict[str, Any], trtllm_version: str) -> Version:
    try:
        version = Version(trtllm_version)
    except Exception:
        raise PlanError(
            "tensorrt_llm version", trtllm_version, "not a version number", "Pass a version such as 1.0.0"
        ) from None
    needed = min_version_for(spec, hf)
    if version < Version(needed):
        raise PlanError(
            "tensorrt_llm version",
            trtllm_version,
            f"{hf_architecture(hf)} needs TensorRT-LLM {needed} or newer to compile",
            f"Use TensorRT-LLM ≥ {needed}, or a precompiled engine",
        )
    return version


def make_plan(opts: CompileOptions, hf_config: dict[str, Any], gpu: GpuFacts, trtllm_version: str) -> BuildPlan:
    """Validate and decide everything about building an HF checkpoint; see the module docstring."""
    return _make_plan(opts, hf_config, gpu, trtllm_version, None)


def make_checkpoint_plan(
    opts: CompileOptions, ckpt_config: dict[str, Any], gpu: GpuFacts, trtllm_version: str
) -> BuildPlan:
    """The plan for a TensorRT-LLM checkpoint (convert_checkpoint.py / modelopt output).

    Its split (TP/PP), dtype, quantization and RoPE settings were fixed when it was converted, so
    options that would change them are errors rather than silently ignored.
    """
    hf = checkpoint_as_hf_config(ckpt_config)
    mapping = ckpt_config.get("mapping") or {}
    tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    for key, want, have in (
        ("option.tensor_parallel_degree", opts.tensor_parallel_degree, tp),
        ("option.pipeline_parallel_degree", opts.pipeline_parallel_degree, pp),
    ):
        if want not in ("max", have):
            raise PlanError(
                key,
                want,
                f"the TensorRT-LLM checkpoint is split for {have}",
                f"Set {key}={have}, or convert the checkpoint again",
            )
    q = ckpt_config.get("quantization") or {}
    if opts.quantize is not None:
        raise PlanError(
            "option.quantize",
            quantization_name(opts.quantize),
            "a TensorRT-LLM checkpoint is already converted "
            f"(quant_algo={q.get('quant_algo')}, kv_cache_quant_algo={q.get('kv_cache_quant_algo')})",
            "Remove option.quantize, or convert the checkpoint again",
        )
    ckpt_dtype = {v: k for k, v in _OPTION_DTYPE.items()}.get(str(ckpt_config.get("dtype")))
    if opts.dtype not in ("auto", ckpt_dtype):
        raise PlanError(
            "option.dtype",
            opts.dtype,
            f"the checkpoint holds {ckpt_config.get('dtype')} weights",
            "Remove option.dtype",
        )
    for key, value in (
        ("option.rotary_base", opts.rotary_base),
        ("option.rotary_scaling_type", opts.rotary_scaling_type),
        ("option.rotary_dim", opts.rotary_dim),
    ):
        if value is not None:
            raise PlanError(
                key,
                value,
                "RoPE settings are fixed in a TensorRT-LLM checkpoint",
                f"Remove {key}, or convert the checkpoint again",
            )
    algo = q.get("quant_algo")
    quant = QuantPlan(
        quantize=opts.quantize,
        method="checkpoint" if algo or q.get("kv_cache_quant_algo") else "none",
        quant_algo=algo,
        kv_cache_quant_algo=q.get("kv_cache_quant_algo"),
        group_size=q.get("group_size") if algo and ("AWQ" in algo or "GPTQ" in algo) else None,
        smoothquant_val=q.get("smoothquant_val") if algo and algo.startswith("W8A8_SQ") else None,
    )
    fixed = opts.model_copy(
        update={"tensor_parallel_degree": tp, "pipeline_parallel_degree": pp, "dtype": ckpt_dtype or "auto"}
    )
    return _make_plan(fixed, hf, gpu, trtllm_version, quant)


# Lookahead decoding on TensorRT engines: first in TensorRT-LLM 0.13 ("Supported lookahead decoding (experimental)",
# the 0.13.0 release notes, NVIDIA/TensorRT-LLM PR 2269), on compute capability 8.0 or newer
# (examples/lookahead/README.md, "Support Matrix"), with one beam ("Beam width must be 1 in Lookahead decoding.",
# cpp/tensorrt_llm/layers/lookaheadDecodingLayer.cpp).
LOOKAHEAD_SINCE = Version("0.13.0")
# n-gram draft tokens (draft_tokens_external engines): the 1.x releases (lmi_trt.engines.trtllm_drafts).
DRAFTS_SINCE = Version("1.0.0")
LOOKAHEAD_MIN_SM = 80
# examples/draft_target_model/README.md "Support Matrix: GPU Compute Capability >= 8.0 (Ampere or newer)"; the block
# reuse the Executor requires for draft tokens needs paged context FMHA, 8.0+ as well.
DRAFTS_MIN_SM = 80


def check_speculative(opts: CompileOptions, version: Version, gpu: GpuFacts) -> None:
    """Pure: an engine built for speculative decoding is one lmi-trt serves (lookahead decoding), for a release, GPU
    and beam width that run it; anything else is refused, naming the key, rather than built and left unused."""
    mode, key = opts.speculative_decoding_mode, opts.speculative_key
    if mode is None:
        if opts.max_draft_len:
            raise PlanError(
                "option.max_draft_len",
                opts.max_draft_len,
                "draft tokens need a speculative decoding mode to build the engine for",
                "set option.speculative_decoding_mode=lookahead_decoding (the mode lmi-trt's tensorrt backend runs), "
                "or remove option.max_draft_len",
            )
        return
    if mode == "draft_tokens_external" and opts.speculative_method in ("ngram", "draft_model"):
        if version < DRAFTS_SINCE:
            raise PlanError(
                key,
                opts.speculative_method,
                f"draft tokens on TensorRT-LLM {version}'s Executor are not verified here "
                "(lmi_trt.engines.trtllm_drafts)",
                "use a 1.x image",
            )
        if opts.max_beam_width != 1:
            raise PlanError(
                "option.max_beam_width",
                opts.max_beam_width,
                'draft tokens run one beam (TensorRT-LLM: "Can\'t use speculative decoding with beam search.")',
                "set option.max_beam_width=1, or leave speculative decoding out",
            )
        if gpu.sm < DRAFTS_MIN_SM:
            raise PlanError(
                key,
                opts.speculative_method,
                f"draft tokens need compute capability 8.0 or newer (examples/draft_target_model/README.md, Support "
                f"Matrix), and {gpu.name} is {gpu.sm // 10}.{gpu.sm % 10}",
                "leave speculative decoding out on this GPU",
            )
        return
    if mode == "medusa":
        _check_medusa(opts, version, gpu)
        return
    if mode != "lookahead_decoding":
        raise PlanError(
            key,
            mode,
            "lmi-trt's compile stage builds TensorRT engines for lookahead decoding, Medusa and draft tokens (n-gram, "
            f"draft model) only, not {opts.speculative_method or mode}: EAGLE and ReDrafter heads need "
            "TensorRT-LLM's own checkpoint converters",
            "use lookahead decoding or Medusa, or serve the Hugging Face checkpoint with option.backend=pytorch "
            "(n-gram, draft "
            "model, EAGLE-3, MTP)",
        )
    if version < LOOKAHEAD_SINCE:
        raise PlanError(
            key, "lookahead", f"TensorRT-LLM {version} predates lookahead decoding (0.13)", "use a 1.x image"
        )
    if gpu.sm < LOOKAHEAD_MIN_SM:
        raise PlanError(
            key,
            "lookahead",
            f"lookahead decoding needs compute capability 8.0 or newer, and {gpu.name} is {gpu.sm // 10}.{gpu.sm % 10}",
            "leave speculative decoding out on this GPU",
        )
    if opts.max_beam_width != 1:
        raise PlanError(
            "option.max_beam_width",
            opts.max_beam_width,
            "lookahead decoding runs one beam (TensorRT-LLM: 'Beam width must be 1 in Lookahead decoding.')",
            "set option.max_beam_width=1, or leave speculative decoding out",
        )


# Medusa: the 1.x releases (lmi_trt.engines.trtllm_medusa's docstring); examples/medusa/README.md's Support Matrix
# (every copy read, ids 5217130389 and 713996416): "GPU Compute Capability >= 8.0 (Ampere or newer)".
MEDUSA_SINCE = Version("1.0.0")
MEDUSA_MIN_SM = 80


def _check_medusa(opts: CompileOptions, version: Version, gpu: GpuFacts) -> None:
    key = opts.speculative_key
    if version < MEDUSA_SINCE:
        raise PlanError(
            key,
            "medusa",
            f"lmi-trt has not checked TensorRT-LLM {version}'s Medusa path (its builder and Executor differ from "
            "1.x's in places: lmi_trt.engines.trtllm_medusa)",
            "use a 1.x image",
        )
    if gpu.sm < MEDUSA_MIN_SM:
        raise PlanError(
            key,
            "medusa",
            f"Medusa needs compute capability 8.0 or newer (examples/medusa/README.md, Support Matrix), and "
            f"{gpu.name} is {gpu.sm // 10}.{gpu.sm % 10}",
            "leave speculative decoding out on this GPU",
        )
    if opts.max_beam_width != 1:
        raise PlanError(
            "option.max_beam_width",
            opts.max_beam_width,
            "Medusa accepts one draft path per request (medusaDecodingLayer.cpp); beam search does not run beside it",
            "set option.max_beam_width=1, or leave speculative decoding out",
        )
    if opts.medusa is None:
        raise PlanError(
            key,
            "medusa",
            "an engine is built from the model and its Medusa heads, which are not named, or not on local disk yet "
            "(`lmi-trt plan` does not fetch them)",
            "name the heads (option.speculative_config's speculative_model_dir, vLLM's \"model\", or "
            "option.speculative_draft_model), "
            "then serve, or run `lmi-trt compile`, which fetch them first",
        )


def _make_plan(
    opts: CompileOptions,
    hf_config: dict[str, Any],
    gpu: GpuFacts,
    trtllm_version: str,
    checkpoint_quant: QuantPlan | None,
) -> BuildPlan:
    spec = lookup_arch(hf_config)
    dims = read_dims(spec, hf_config)
    version = _check_version(spec, hf_config, trtllm_version)
    from_hf = checkpoint_quant is None
    notes = check_arch_options(spec, opts, hf_config, dims, loads_hf_code=from_hf)
    tp, pp, more = resolve_parallelism(opts, dims, gpu)
    notes += more
    dtype, more = resolve_dtype(opts, hf_config, gpu)
    notes += more
    max_seq_len, more = resolve_lengths(opts, spec, hf_config, dims)
    notes += more
    max_input_len = opts.max_input_len
    if opts.speculative_decoding_mode == "draft_tokens_external" and max_input_len < max_seq_len - 1:
        # each draft iteration's input is the prompt plus the tokens so far (lmi_trt.engines.trtllm_drafts;
        # examples/prompt_lookup/run_dtm_pld.py builds its runner with max_input_len = input + max_output_len)
        max_input_len = max_seq_len - 1  # below max_seq_len, which TensorRT-LLM needs (resolve_lengths)
        notes.append(f"max_input_len={max_input_len}: max_seq_len - 1, as each draft iteration resends the sequence")
    if checkpoint_quant is None:
        quant, more = plan_quant(opts, spec, hf_config, dims, gpu_sm=gpu.sm, tp=tp)
        notes += more
    else:
        quant = checkpoint_quant
    if quant.quant_algo is not None and dtype == "float32":
        raise PlanError(
            "option.dtype",
            opts.dtype,
            f"{quant.quant_algo} engines compute in float16 or bfloat16",
            "Use option.dtype=fp16 or bf16 with option.quantize",
        )
    check_speculative(opts, version, gpu)  # before the plugins: its refusals name the speculation key
    if opts.medusa is not None:
        refused = medusa_plan_errors(
            opts.medusa,
            opts.speculative_key,
            spec.trtllm_class,
            tp,
            pp,
            quant.quantize is not None,
            opts.enable_lora,
            (dims.hidden_size, dims.vocab_size),
            (opts.dtype, dtype),
        )
        if refused is not None:
            raise refused
        notes.append(
            f"Medusa: {opts.medusa.num_heads} heads of {opts.medusa.num_layers} layers from {opts.medusa.heads_dir}, "
            f"{opts.max_draft_len} draft tokens a step (the tree's paths)"
        )
    plugins, more = resolve_plugins(opts, spec, gpu, version, quant)
    notes += more
    lora = plan_lora(opts, spec)
    if lora is not None:  # the plugin's dtype, the model's (trtllm-build --lora_plugin takes a dtype)
        plugins = plugins.model_copy(update={"lora_plugin": dtype})
        notes.append(
            f"LoRA plugin for adapters of rank ≤ {lora.max_lora_rank} on {', '.join(lora.target_modules)} "
            f"(option.enable_lora); option.max_loras={lora.max_loras} on the device at once"
        )
    max_batch_size = opts.max_batch_size or TRTLLM_DEFAULT_BATCH
    # against the planned max_input_len: with draft tokens each iteration's input reaches max_seq_len - 1
    max_num_tokens, more = resolve_max_num_tokens(
        opts, max_batch_size, max_seq_len, max_input_len, plugins.use_paged_context_fmha
    )
    notes += more
    if opts.speculative_decoding_mode is not None and max_num_tokens < max_batch_size * (opts.max_draft_len + 1):
        # builder.py build raises it so (max_draft_len + 1 tokens a request each step); planned here, so the build
        # keeps the plan's limits
        max_num_tokens = max_batch_size * (opts.max_draft_len + 1)
        notes.append(f"max_num_tokens={max_num_tokens}: max_batch_size × (max_draft_len + 1), as speculation needs")
    if from_hf:
        kwargs = converter_kwargs(spec, opts, hf_config)
        if opts.logits_dtype == "fp16":
            kwargs["logits_dtype"] = "float16"
        converter = ConverterPlan(
            trtllm_class=spec.trtllm_class,
            kwargs=kwargs,
            hf_config_overrides=hf_config_overrides(spec, opts, hf_config),
            trust_remote_code=opts.trust_remote_code,
        )
    else:
        converter = ConverterPlan(source="trtllm_checkpoint", trtllm_class=spec.trtllm_class)
    return BuildPlan(
        architecture=hf_architecture(hf_config),
        family=spec.family,
        trtllm_version=trtllm_version,
        dtype=dtype,
        max_input_len=max_input_len,
        max_output_len=opts.max_output_len,
        max_seq_len=max_seq_len,
        max_batch_size=max_batch_size,
        max_beam_width=opts.max_beam_width,
        max_num_tokens=max_num_tokens,
        max_draft_len=opts.max_draft_len,
        speculative_decoding_mode=opts.speculative_decoding_mode,
        tp_size=tp,
        pp_size=pp,
        plugins=plugins,
        quant=quant,
        converter=converter,
        lora=lora,
        medusa=opts.medusa,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------

RUNTIME_OVERHEAD_BYTES = 1 * GiB  # CUDA context, cuBLAS/TensorRT workspaces, NCCL buffers


class MemoryEstimate(BaseModel):
    """Per-GPU sizes for one plan on one GPU (the worst rank when the model is split)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_memory_bytes: int
    weight_bytes_total: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int  # per GPU: layers on it × KV width on it × 2 (K and V) × KV dtype bytes
    activation_reserve_bytes: int
    kv_cache_fraction: float
    kv_cache_bytes: int
    max_kv_tokens: int
    max_concurrent_sequences: int  # sequences of max_seq_len tokens that fit at once
    fits: bool
    notes: tuple[str, ...] = ()


def _param_counts(dims: ModelDims) -> tuple[int, int, int]:
    """(linear params in the decoder layers, embedding params, lm_head params).

    lm_head is counted even for tied embeddings: TensorRT-LLM engines hold their own copy unless
    built with share_embedding_table.
    """
    h, hd = dims.hidden_size, dims.head_dim
    attention = h * dims.num_heads * hd * 2 + h * dims.num_kv_heads * hd * 2
    mats = 3 if dims.gated_mlp else 2
    dense_mlp = mats * h * dims.intermediate_size
    if dims.num_experts:
        moe_mlp = dims.num_experts * mats * h * dims.moe_intermediate_size + h * dims.num_experts
        moe_mlp += mats * h * dims.shared_intermediate_size
        mlp_total = dims.dense_layers * dense_mlp + (dims.num_layers - dims.dense_layers) * moe_mlp
    else:
        mlp_total = dims.num_layers * dense_mlp
    return dims.num_layers * attention + mlp_total, dims.vocab_size * h, dims.vocab_size * h


def _linear_bytes_per_param(plan: BuildPlan) -> float:
    bits = plan.quant.weight_bits
    if bits is None:
        return _DTYPE_BYTES[plan.dtype]
    group_scales = 2 / plan.quant.group_size if plan.quant.group_size else 0.0  # one fp16 scale per group
    return bits / 8 + group_scales


def _kv_bytes_per_token(plan: BuildPlan, dims: ModelDims) -> int:
    kv_dtype_bytes = 1 if plan.quant.kv_cache_quant_algo else _DTYPE_BYTES[plan.dtype]
    width = dims.kv_width
    if dims.kv_split_by_tp:
        # Fewer KV heads than ranks: each rank keeps one replicated head.
        width = width // min(plan.tp_size, dims.num_kv_heads)
    layers = math.ceil(dims.num_layers / plan.pp_size)
    return layers * width * kv_dtype_bytes


def _activation_bytes(plan: BuildPlan, dims: ModelDims) -> int:
    """A heuristic (±30 %) for TensorRT's activation memory at max_num_tokens, plus the logits buffer."""
    act = _DTYPE_BYTES[plan.dtype]
    inter = max(dims.intermediate_size, dims.moe_intermediate_size) // plan.tp_size
    q_width = dims.num_heads * dims.head_dim // plan.tp_size
    per_token = 3 * dims.hidden_size + 2 * inter + 3 * q_width
    logits = plan.max_batch_size * plan.max_beam_width * math.ceil(dims.vocab_size / plan.tp_size) * 4
    return plan.max_num_tokens * per_token * act + logits


def _peft_bytes(plan: BuildPlan, dims: ModelDims) -> int:
    """The Executor's device PEFT cache as lmi-trt sizes it (``compile.lora.peft_cache_sizes``, the LLM API's way):
    units of one rank of one module in one layer, each the widest module's in + out weights."""
    if plan.lora is None:
        return 0
    sizes = peft_cache_sizes(plan.lora.max_lora_rank, dims.num_layers, plan.lora.target_modules, plan.lora.max_loras, 0)
    widest = dims.hidden_size + max(dims.intermediate_size, dims.num_heads * dims.head_dim)
    return peft_device_bytes(sizes, widest, _DTYPE_BYTES[plan.dtype])


def estimate_memory(
    plan: BuildPlan, hf_config: dict[str, Any], gpu: GpuFacts, kv_fraction: float = KV_CACHE_FREE_GPU_MEM_FRACTION
) -> MemoryEstimate:
    """Weights per GPU, KV bytes per token, how many tokens and full-length sequences fit."""
    dims = read_dims(lookup_arch(hf_config), hf_config)
    linear, embed, lm_head = _param_counts(dims)
    dtype_bytes = _DTYPE_BYTES[plan.dtype]
    linear_bytes = linear * _linear_bytes_per_param(plan)
    total = int(linear_bytes + (embed + lm_head) * dtype_bytes)
    # The vocab embedding is replicated on every TP rank of the first stage; lm_head is split over TP.
    ends = (
        embed * dtype_bytes + lm_head * dtype_bytes / plan.tp_size
        if plan.pp_size == 1
        else max(embed * dtype_bytes, lm_head * dtype_bytes / plan.tp_size)
    )
    per_gpu = int(linear_bytes / plan.world_size + ends)
    kv_per_token = _kv_bytes_per_token(plan, dims)
    reserve = int(_activation_bytes(plan, dims) + RUNTIME_OVERHEAD_BYTES)
    peft = _peft_bytes(plan, dims)
    reserve += peft
    gpu_bytes = int(gpu.memory_gib * GiB)
    free = gpu_bytes - per_gpu - reserve
    kv_cache = int(max(0, free) * kv_fraction)
    block = plan.plugins.tokens_per_block
    max_tokens = (kv_cache // kv_per_token) // block * block
    sequences = (max_tokens // block) // math.ceil(plan.max_seq_len / block)
    notes: list[str] = []
    if peft:
        notes.append(
            f"the PEFT cache for option.max_loras={plan.lora.max_loras} adapters of rank {plan.lora.max_lora_rank} "
            f"takes {peft / 2**20:.1f} MiB of device memory (counted with the activations; an upper bound with "
            "tensor parallelism)"
        )
    fits = free > 0 and sequences >= 1
    if free <= 0:
        notes.append(
            f"weights ({per_gpu / GiB:.1f} GiB) + activations ({reserve / GiB:.1f} GiB) exceed the "
            f"{gpu.memory_gib:.0f} GiB of one {gpu.name}"
        )
    elif sequences < 1:
        notes.append(
            f"the KV cache holds {max_tokens} tokens, less than one sequence of max_seq_len={plan.max_seq_len}"
        )
    elif sequences < plan.max_batch_size:
        notes.append(
            f"only {sequences} sequences of max_seq_len={plan.max_seq_len} fit at once "
            f"(max_batch_size={plan.max_batch_size}); shorter sequences share the KV pool"
        )
    return MemoryEstimate(
        gpu_memory_bytes=gpu_bytes,
        weight_bytes_total=total,
        weight_bytes_per_gpu=per_gpu,
        kv_bytes_per_token=kv_per_token,
        activation_reserve_bytes=reserve,
        kv_cache_fraction=kv_fraction,
        kv_cache_bytes=kv_cache,
        max_kv_tokens=max_tokens,
        max_concurrent_sequences=sequences,
        fits=fits,
        notes=tuple(notes),
    )


def check_fits(plan: BuildPlan, estimate: MemoryEstimate) -> None:
    """Turn an estimate that cannot work into a ``PlanError`` before a long compile."""
    if estimate.fits:
        return
    raise PlanError(
        "option.tensor_parallel_degree",
        plan.tp_size,
        "; ".join(estimate.notes),
        "Use more GPUs (option.tensor_parallel_degree), quantize (option.quantize), or lower "
        "option.max_num_tokens / option.max_rolling_batch_size / the max lengths",
    )
