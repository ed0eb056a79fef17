"""``lmi-trt plan`` and ``lmi-trt compile``.

The CLI module owns the configuration flags: it passes ``add_config_flags(parser)`` (the same
flags ``serve`` takes) and ``load_config(args) -> LmiConfig``.

* ``plan [--json] [--gpu NAME] [--gpu-sm N] [--gpu-memory-gib N] [--gpu-count N] [--trtllm-version V]``
  prints the BuildPlan and the memory estimate. It reads only config.json (local folder, s3:// or
  the HF hub), never weights, and needs no GPU: without one it plans for ``--gpu`` (default h100).
* ``compile --output DIR|s3://bucket/prefix`` downloads the model, builds every rank on this
  host's GPUs and writes a self-describing precompiled artifact that ``serve`` loads as it is.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmi_trt.vocabulary import quantization_name

from .errors import BuildError, CacheError, PlanError
from .options import CompileOptions
from .plan import GpuFacts, check_fits
from .probe import GPU_PRESETS, detect_gpu, detect_trtllm_version

if TYPE_CHECKING:
    from .jit import CompileJob

log = logging.getLogger(__name__)

# CLI flags → (the configuration, for finding the model; the CompileJob built from it), injected by lmi_trt.cli.
LoadJob = Callable[[argparse.Namespace], "tuple[Any, CompileJob]"]

# What `plan` assumes when neither a GPU nor --gpu* flags say otherwise.
DEFAULT_PLAN_GPU = "h100"
DEFAULT_PLAN_TRTLLM_VERSION = "1.0.0"
MAX_TP_ASSUMED_GPUS = 8  # tensor_parallel_degree=max on an assumed host: one 8-GPU node
GiB = 1024**3


def _add_target_flags(p: argparse.ArgumentParser, *, for_compile: bool) -> None:
    g = p.add_argument_group(
        "target GPU"
        + (
            " (only when this host's GPU cannot be detected)"
            if for_compile
            else " (default: the GPUs of this host, else --gpu h100)"
        )
    )
    g.add_argument("--gpu", choices=sorted(GPU_PRESETS), help="a known GPU model")
    g.add_argument("--gpu-sm", type=int, metavar="N", help="compute capability × 10 (H100: 90, L4: 89, A100: 80)")
    g.add_argument("--gpu-memory-gib", type=float, metavar="N", help="memory of one GPU in GiB")
    g.add_argument("--gpu-count", type=int, metavar="N", help="GPUs on the host")
    if not for_compile:
        p.add_argument(
            "--trtllm-version",
            metavar="V",
            help=f"plan for this TensorRT-LLM (default: the installed one, else {DEFAULT_PLAN_TRTLLM_VERSION})",
        )


def target_gpu(
    args: argparse.Namespace, detected: GpuFacts | None, wanted_count: int = 1
) -> tuple[GpuFacts, str | None]:
    """The GPU to plan for and, when it is an assumption rather than this host's, a sentence saying so.

    A preset (or the default one) comes with as many GPUs as the configuration asks for
    (``wanted_count``) unless ``--gpu-count`` says otherwise.
    """
    overrides = {
        k: v
        for k, v in (("sm", args.gpu_sm), ("memory_gib", args.gpu_memory_gib), ("count", args.gpu_count))
        if v is not None
    }
    if args.gpu:
        base, why = GPU_PRESETS[args.gpu], f"--gpu {args.gpu}"
    elif detected is not None:
        base, why = detected, None
    else:
        base, why = GPU_PRESETS[DEFAULT_PLAN_GPU], f"no GPU detected; assuming --gpu {DEFAULT_PLAN_GPU}"
    if base is not detected:
        base = base.model_copy(update={"count": wanted_count})
    gpu = base.model_copy(update=overrides)
    if overrides and why is None:
        why = "this host's GPU with " + ", ".join(f"{k}={v}" for k, v in overrides.items())
    return gpu, why


def fetch_hf_config(config: Any) -> dict[str, Any]:
    """config.json of the model ``config`` names (HF or TensorRT-LLM checkpoint), without its weights."""
    from lmi_trt.sources import SourceError

    model_id = config.model_id or (str(config.model_dir) if config.model_dir else None)
    if model_id is None:
        raise SourceError("no model given: set option.model_id (HF id, s3:// URI or folder) or --model-id")
    if model_id.startswith("s3://"):
        from lmi_trt.sources.s3 import make_client, parse_s3_uri

        uri = parse_s3_uri(model_id)
        try:
            body = make_client().get_object(Bucket=uri.bucket, Key=f"{uri.prefix}config.json")["Body"].read()
        except Exception as e:
            raise SourceError(f"option.model_id={model_id!r}: cannot read {uri}config.json ({e})") from e
        return json.loads(body)
    local = Path(model_id).expanduser()
    if local.is_dir():
        path = local / "config.json"
        if not path.is_file():
            raise SourceError(f"option.model_id={model_id!r}: {path} does not exist")
        return json.loads(path.read_text())
    from huggingface_hub import hf_hub_download

    token = config.hf_token.get_secret_value() if config.hf_token is not None else None
    try:
        return json.loads(
            Path(hf_hub_download(model_id, "config.json", revision=config.revision, token=token)).read_text()
        )
    except Exception as e:
        raise SourceError(
            f"option.model_id={model_id!r}: cannot fetch config.json from the Hugging Face hub "
            f"({type(e).__name__}: {e})"
        ) from e


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def checkpoint_backend(config: Any, version: str) -> tuple[str, str]:
    """Pure: the TensorRT-LLM backend ``serve`` would pick for a Hugging Face checkpoint on ``version``, and why."""
    from lmi_trt.engines import choose_backend

    return choose_backend(
        config.backend,
        release_facts(version),
        "hf_checkpoint",
        config.quantize.value if config.quantize is not None else None,
    )


def release_facts(version: str) -> Any:
    """A release's ``TrtllmFacts`` as planned for: the Executor binding up to 1.2 (NVIDIA/TensorRT-LLM PRs 15918
    and 16369 removed it after)."""
    from lmi_trt.engines import TrtllmFacts

    return TrtllmFacts(version, has_executor=TrtllmFacts(version, True).series <= (1, 2))


def plan_backend(config: Any, version: str) -> tuple[str, str, dict[str, Any] | None]:
    """Pure: the TensorRT-LLM backend ``serve`` would pick for a checkpoint on ``version``, why, and on the
    pytorch backend the ``LLM`` keywords (no engine build)."""
    from lmi_trt.engines import registry

    backend, why = checkpoint_backend(config, version)
    if backend != "pytorch":
        return backend, why, None
    from lmi_trt.engines.llmapi import llm_api_series, llm_plan

    # ``config`` is settled for the compiling engine (lmi_trt.cli.load_compile_job); 'max' is the launcher's
    tp = config.tensor_parallel_degree
    settings = registry.llmapi_settings(config.derived("plan", tensor_parallel_degree=tp if tp != "max" else 1))
    planned = llm_plan(settings, llm_api_series(version))
    nested = {"kv_cache_config": planned.kv_cache_config, "scheduler_config": planned.scheduler_config}
    return backend, why, {**planned.keywords, **{k: v for k, v in nested.items() if v}}


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


def cmd_plan(args: argparse.Namespace, load_job: LoadJob) -> int:
    from lmi_trt.engines.base import EngineError
    from lmi_trt.sources import SourceError

    from .jit import prepare_plan

    try:
        config, job = load_job(args)
        model_config = fetch_hf_config(config)
        if "build_config" in model_config:
            raise PlanError(
                "option.model_id",
                config.model_id,
                "is already a TensorRT-LLM engine",
                "Serve it as it is; plan the HF checkpoint it was built from",
            )
        checkpoint = "architecture" in model_config and "architectures" not in model_config
        gpu, assumption = target_gpu(args, detect_gpu(), _wanted_gpus(job.options))
        version = args.trtllm_version or detect_trtllm_version()
        if version is None:
            version = DEFAULT_PLAN_TRTLLM_VERSION
            assumption = "; ".join(filter(None, [assumption, f"TensorRT-LLM not installed; planning for {version}"]))
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


def cmd_compile(args: argparse.Namespace, load_job: LoadJob) -> int:
    from lmi_trt.sources import SourceError

    try:
        config, job = load_job(args)
        version = detect_trtllm_version()
        if version is None:
            raise PlanError(
                "tensorrt_llm",
                None,
                "TensorRT-LLM is not installed on this host",
                "Run `lmi-trt compile` in the lmi-trt TensorRT-LLM image on a GPU of the target type",
            )
        made = (_calibrate if _calibrates_only(config, version) else _build)(args, config, job, version)
    except (PlanError, SourceError, ValueError, CacheError, BuildError) as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code if isinstance(e, BuildError) else 2  # 1: the build itself failed; 2: its input
    print(made)
    return 0


def _build(args: argparse.Namespace, config: Any, job: CompileJob, version: str) -> str:
    """The TensorRT engine, for the GPU of this host (or the one the --gpu* flags name when there is none)."""
    from lmi_trt.sources import resolve_model

    from .jit import check_output, compile_to

    detected = detect_gpu()
    flags = any(v is not None for v in (args.gpu, args.gpu_sm, args.gpu_memory_gib, args.gpu_count))
    if detected is not None and flags:
        raise PlanError(
            "--gpu",
            args.gpu or args.gpu_sm,
            f"this host has {detected.count}× {detected.name}; engines are built for the GPU they are built on",
            "Remove the --gpu* flags",
        )
    if detected is None and not flags:
        raise PlanError("--gpu", None, "no GPU detected", "Run on the target GPU type")
    gpu, _ = target_gpu(args, detected)
    check_output(args.output)
    artifact = resolve_model(config)
    prepared = compile_to(
        job, artifact, args.output, gpu=gpu, trtllm_version=version, progress=lambda msg: log.info("compile: %s", msg)
    )
    return (
        f"compiled {artifact.model_id} → {args.output} (TP {prepared.plan.tp_size} × PP {prepared.plan.pp_size}, "
        f"{prepared.plan.dtype}); serve it with option.model_id={args.output}"
    )


def add_subcommands(
    subparsers: Any, *, add_config_flags: Callable[[argparse.ArgumentParser], None], load_job: LoadJob
) -> None:
    plan = subparsers.add_parser("plan", help="print the engine build plan and memory estimate (no weights, no GPU)")
    add_config_flags(plan)
    plan.add_argument("--json", action="store_true", help="machine-readable output")
    _add_target_flags(plan, for_compile=False)
    plan.set_defaults(func=lambda args: cmd_plan(args, load_job))

    comp = subparsers.add_parser("compile", help="build the TensorRT-LLM engine ahead of time into a folder or s3://")
    add_config_flags(comp)
    comp.add_argument(
        "--output",
        required=True,
        metavar="DIR|s3://bucket/prefix",
        help="a new folder, or an s3:// prefix to upload the artifact to",
    )
    _add_target_flags(comp, for_compile=True)
    comp.set_defaults(func=lambda args: cmd_compile(args, load_job))


def _calibrates_only(config: Any, version: str) -> bool:
    """``lmi-trt compile`` builds a TensorRT engine, except where serving would take the pytorch backend without
    one: chosen (option.backend=pytorch), or the only one left (a release without the Executor). There the
    artifact made ahead of time is the calibrated checkpoint of option.quantize."""
    backend, _ = checkpoint_backend(config, version)  # a combination the release cannot serve: StartupError
    return backend == "pytorch" and (config.backend == "pytorch" or not release_facts(version).has_executor)


def _calibrate(args: argparse.Namespace, config: Any, job: CompileJob, version: str) -> str:
    """The pytorch backend's artifact: option.quantize's calibrated checkpoint (there is no engine to build)."""
    from lmi_trt.engines import registry
    from lmi_trt.sources import resolve_model

    from .hf_quant import quantize_to

    if config.quantize is None:
        raise PlanError(
            "option.quantize",
            None,
            "the pytorch backend loads the Hugging Face checkpoint itself: there is no engine to compile",
            "Set option.quantize (fp8, fp8_kv or awq) to calibrate a checkpoint ahead of time, or "
            "option.backend=tensorrt to build an engine on a 0.12-1.2 image",
        )
    artifact = resolve_model(config)
    quant = quantize_to(
        registry.quantize_job(config),
        artifact,
        args.output,
        trtllm_version=version,
        progress=lambda msg: log.info("compile: %s", msg),
    )
    return (
        f"calibrated {artifact.model_id} → {args.output} ({quant.quant_algo}, a modelopt Hugging Face checkpoint "
        f"for the pytorch backend); serve it with option.model_id={args.output}, without option.quantize"
    )
