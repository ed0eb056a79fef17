"""``lmi-trt plan [--json] [--gpu NAME] [--gpu-sm N] [--gpu-memory-gib N] [--gpu-count N] [--trtllm-version V]``
prints the BuildPlan and the memory estimate. It reads only config.json (local folder, s3:// or the HF hub), never
weights, and needs no GPU: without one it plans for ``--gpu`` (default h100)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from lmi_trt.compile.errors import PlanError
from lmi_trt.compile.options import CompileOptions
from lmi_trt.compile.plan import check_fits
from lmi_trt.compile.probe import detect_gpu, detect_trtllm_version
from lmi_trt.vocabulary import quantization_name

from .flags import add_config_flags, fitted_job, load_compile_job
from .target import DEFAULT_PLAN_TRTLLM_VERSION, add_target_flags, checkpoint_backend, target_gpu

MAX_TP_ASSUMED_GPUS = 8  # tensor_parallel_degree=max on an assumed host: one 8-GPU node
GiB = 1024**3


def add_parser(subparsers: Any) -> None:
    plan = subparsers.add_parser("plan", help="print the engine build plan and memory estimate (no weights, no GPU)")
    add_config_flags(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    add_target_flags(plan, for_compile=False)
    plan.set_defaults(func=cmd_plan)


def fetch_hf_config(config: Any) -> dict[str, Any]:
    """config.json of the model ``config`` names (HF or TensorRT-LLM checkpoint), without its weights."""
    from lmi_trt.sources import SourceError, model_ref, read_config

    ref = model_ref(config)
    if ref is None:
        raise SourceError("no model given: set option.model_id (HF id, s3:// URI or folder) or --model-id")
    found = read_config(ref, config, download=True)
    if found is None:
        raise SourceError(
            f"{ref.key}={ref.name!r}: no readable config.json (a JSON object) in {ref.folder or ref.name}"
        )
    return found


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def plan_backend(config: Any, version: str) -> tuple[str, str, dict[str, Any] | None]:
    """Pure: the TensorRT-LLM backend ``serve`` would pick for a checkpoint on ``version``, why, and where it builds
    no engine (the pytorch backend) the ``LLM`` keywords."""
    from lmi_trt import stages
    from lmi_trt.engines.registry import COMPILING_ENGINE, entry

    backend, why = checkpoint_backend(config, version)
    if entry(COMPILING_ENGINE, backend).builds_engine:
        return backend, why, None
    from lmi_trt.engines.llmapi import llm_api_release, llm_plan

    # ``config`` is settled for the compiling engine (lmi_trt.cli.load_compile_job); 'max' is the launcher's
    tp = config.tensor_parallel_degree
    settings = stages.llmapi_settings(config.derived("plan", tensor_parallel_degree=tp if tp != "max" else 1))
    planned = llm_plan(settings, llm_api_release(version))
    nested = {
        "kv_cache_config": planned.kv_cache_config,
        "scheduler_config": planned.scheduler_config,
        "moe_config": planned.moe_config,
    }
    nested["lora_config"] = planned.lora_config
    graphs = {"cuda_graph_config": planned.cuda_graph_config} if "cuda_graph_config" in planned.origins else {}
    return backend, why, {**planned.keywords, **{k: v for k, v in nested.items() if v}, **graphs}


def lora_cache_note(config: Any, model_config: Mapping[str, Any], version: str) -> str:
    """Pure: the LLM's device PEFT cache on the pytorch backend. TensorRT-LLM sizes it as ``max_lora_rank × layers ×
    modules × max_loras`` units (``num_device_module_layer``, _torch/pyexecutor/_util.py of the 1.1 line, read_file id
    843526953) and hands that to the C++ PeftCacheManager (_torch/pyexecutor/resource_manager.py ``PeftCacheManager``
    builds ``bindings.PeftCacheManagerConfig`` from it, read_file ids 77926604, 56147854442), whose unit is executor.h's
    "max sized 1-layer 1-module adapterSize=1 set of weights": the widest module's in + out values, as the Executor's
    (``compile.lora.peft_device_bytes``)."""
    from lmi_trt.compile.lora import peft_cache_sizes, peft_device_bytes
    from lmi_trt.engines.llmapi import LORA_MODULES
    from lmi_trt.engines.lora_layout import module_dims

    text = model_config.get("text_config") or model_config
    layers = int(text.get("num_hidden_layers") or 0)
    units = peft_cache_sizes(config.max_lora_rank, layers, LORA_MODULES, config.max_loras, 0)["num_device_module_layer"]
    head = (
        f"LoRA: TensorRT-LLM {version} sizes its device PEFT cache as max_lora_rank {config.max_lora_rank} × "
        f"{layers} layers × {len(LORA_MODULES)} modules × max_loras {config.max_loras} = {units:,} units"
    )
    if not all(text.get(k) for k in ("hidden_size", "num_attention_heads", "intermediate_size")):
        return f"{head}; their size is unknown here (no hidden_size, num_attention_heads or intermediate_size)"
    widest = max(fan_in + fan_out for fan_in, fan_out in module_dims(text).values())
    dtype = str(text.get("torch_dtype") or model_config.get("torch_dtype") or model_config.get("dtype") or "bfloat16")
    cache = peft_device_bytes({"num_device_module_layer": units}, widest, 4 if dtype == "float32" else 2)
    return (
        f"{head} of {widest:,} {dtype} values (the widest module's in + out): {cache / 2**20:,.1f} MiB of device "
        "memory, taken by the release beside the KV cache (not in the estimate above)"
    )


def render_plan(prepared: Any, assumption: str | None, backend: tuple[str, str, dict[str, Any] | None]) -> str:
    plan, mem, gpu = prepared.plan, prepared.memory, prepared.gpu
    name, why, llm_keywords = backend
    q = plan.quant
    quant = (
        "none"
        if q.quant_algo is None and q.kv_cache_quant_algo is None
        else f"{quantization_name(q.quantize)}: quant_algo={q.quant_algo}, "
        f"kv_cache_quant_algo={q.kv_cache_quant_algo} ({q.method})"
    )
    plugins = ", ".join(f"{k}={v}" for k, v in plan.plugins.plugin_config_kwargs().items())
    lines = [
        f"Plan: {plan.architecture} ({plan.family} → {plan.converter.trtllm_class}), TensorRT-LLM "
        f"{plan.trtllm_version}, {gpu.count}× {gpu.name} (SM {gpu.sm / 10:.1f}, {gpu.memory_gib:.0f} GiB)",
        f"  dtype          {plan.dtype}",
        f"  lengths        max_input_len {plan.max_input_len}, max_output_len {plan.max_output_len} (new tokens), "
        f"max_seq_len {plan.max_seq_len}",
        f"  batch          max_batch_size {plan.max_batch_size}, max_num_tokens {plan.max_num_tokens}, "
        f"max_beam_width {plan.max_beam_width}",
        f"  parallelism    TP {plan.tp_size} × PP {plan.pp_size}",
        f"  backend        {name} ({why})",
    ]
    if llm_keywords is None:
        lines += [
            f"  quantization   {quant}",
            f"  plugins        {plugins}",
            f"  converter      {json.dumps(plan.converter.kwargs)}"
            + (
                f", config.json overrides {json.dumps(plan.converter.hf_config_overrides)}"
                if plan.converter.hf_config_overrides
                else ""
            ),
        ]
    else:  # no TensorRT engine: the LLM loads the checkpoint with these keywords
        lines.append(f"  LLM keywords   {json.dumps(llm_keywords)}")
    lines += [
        "Memory per GPU (estimate):",
        f"  weights        {_gib(mem.weight_bytes_per_gpu)} (all ranks: {_gib(mem.weight_bytes_total)})",
        f"  activations    {_gib(mem.activation_reserve_bytes)} reserved",
        f"  KV cache       {mem.kv_bytes_per_token:,} bytes/token; {_gib(mem.kv_cache_bytes)} at fraction "
        f"{mem.kv_cache_fraction} → {mem.max_kv_tokens:,} tokens",
        f"  concurrency    {mem.max_concurrent_sequences:,} sequences of {plan.max_seq_len} tokens at once",
    ]
    notes = ([assumption] if assumption else []) + list(plan.notes) + list(mem.notes)
    if notes:
        lines.append("Notes:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from lmi_trt.compile.jit import prepare_plan
    from lmi_trt.engines.base import EngineError
    from lmi_trt.engines.registry import COMPILING_ENGINE, entry
    from lmi_trt.sources import SourceError

    try:
        config, job = load_compile_job(args)
        model_config = fetch_hf_config(config)
        if "build_config" in model_config:
            raise PlanError(
                "option.model_id",
                config.model_id,
                "is already a TensorRT-LLM engine",
                "Serve it as it is; plan the HF checkpoint it was built from",
            )
        version = args.trtllm_version or detect_trtllm_version()
        installed = version is not None
        version = version or DEFAULT_PLAN_TRTLLM_VERSION
        builds_engine = entry(COMPILING_ENGINE, checkpoint_backend(config, version)[0]).builds_engine
        config, job = fitted_job(config, model_config)
        checkpoint = "architecture" in model_config and "architectures" not in model_config
        gpu, assumption = target_gpu(args, detect_gpu(), _wanted_gpus(job.options))
        if not installed:
            assumption = "; ".join(filter(None, [assumption, f"TensorRT-LLM not installed; planning for {version}"]))
        if config.enable_lora and not builds_engine:
            assumption = "; ".join(filter(None, [assumption, lora_cache_note(config, model_config, version)]))
        prepared = prepare_plan(job, model_config, gpu, version, checkpoint=checkpoint, require_fit=False)
        backend = plan_backend(config, version)
    except (PlanError, SourceError, ValueError, EngineError) as e:  # EngineError: a key the LLM cannot take
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        name, why, llm_keywords = backend
        print(
            json.dumps(
                {
                    "plan": prepared.plan.model_dump(mode="json"),
                    "memory": prepared.memory.model_dump(mode="json"),
                    "gpu": gpu.model_dump(mode="json"),
                    "assumption": assumption,
                    "backend": {"name": name, "why": why, "llm_keywords": llm_keywords},
                },
                indent=2,
            )
        )
    else:
        print(render_plan(prepared, assumption, backend))
    try:
        check_fits(prepared.plan, prepared.memory)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _wanted_gpus(opts: CompileOptions) -> int:
    tp = opts.tensor_parallel_degree
    return (tp if isinstance(tp, int) else MAX_TP_ASSUMED_GPUS) * opts.pipeline_parallel_degree
