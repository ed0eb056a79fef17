"""Execute a ``BuildPlan`` through TensorRT-LLM's Python API, every rank in its own process.

Per rank (NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py, ``build_and_save``):
``MODEL_MAP[arch].from_hugging_face(hf_dir, dtype,
mapping=Mapping(world_size, rank, tp_size, pp_size), quant_config, **converter kwargs)`` — or
``from_checkpoint(ckpt, rank)`` after calibration — then ``tensorrt_llm.builder.build(model,
BuildConfig(..., plugin_config=plugins))`` (``plugins = PluginConfig()`` set attribute by attribute)
and ``engine.save(out_dir)``.

Ranks run in spawned worker processes (TensorRT-LLM initialises CUDA and MPI on import, and a
model per live rank costs host memory, so ``workers`` bounds the parallelism), under one compile
timeout that is separate from the model-loading timeout. A failure names its stage (quantize,
convert, build, save), its rank and the underlying message. The output folder is the LLM-API
precompiled layout — ``config.json`` + ``rank{N}.engine`` — plus the tokenizer files,
``hf_config.json``, ``build_plan.json`` and a ``serving.properties`` without ``option.model_id``.
It is written into a folder the caller discards on failure (the cache's temporary entry).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BuildError
from .plan import BuildPlan

log = logging.getLogger(__name__)

HF_CONFIG_NAME = "hf_config.json"  # the engine's config.json takes the usual name
PLAN_NAME = "build_plan.json"
PROPERTIES_NAME = "serving.properties"
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "tokenization_*.py",  # remote-code tokenizers (ChatGLM, Qwen-1, Baichuan)
)
_LIMITS = ("max_input_len", "max_seq_len", "max_batch_size", "max_beam_width", "max_num_tokens")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildSettings:
    """How to build (not what): none of these changes the engine, so none is in the cache key."""

    timeout_s: float | None = 3600.0  # option.compile_timeout, for quantize + every rank together
    workers: int | None = None  # option.num_engine_workers; default min(ranks, GPUs)
    gpu_count: int = 1  # ranks are spread over these devices
    load_by_shard: bool = False  # option.load_by_shard (Falcon/LLaMA converters)
    checkpoint_dir: Path | None = None  # option.trtllm_checkpoint_path; kept when given

    def parallel(self, world_size: int) -> int:
        return max(1, min(world_size, self.workers or max(1, self.gpu_count)))


# ---------------------------------------------------------------------------------------------
# worker side (runs in spawned processes; nothing here touches the parent's state)
# ---------------------------------------------------------------------------------------------


def _select_device(device: int | None) -> None:
    if device is None:
        return
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(device)


def _model_class(plan: BuildPlan) -> Any:
    from tensorrt_llm.models import MODEL_MAP

    cls = MODEL_MAP.get(plan.architecture)
    if cls is None or cls.__name__ != plan.converter.trtllm_class:
        found = cls.__name__ if cls is not None else "nothing"
        raise RuntimeError(
            f"this TensorRT-LLM maps {plan.architecture} to {found}, the plan expects {plan.converter.trtllm_class}"
        )
    return cls


def _quant_config(plan: BuildPlan) -> Any:
    from tensorrt_llm.models.modeling_utils import QuantConfig
    from tensorrt_llm.quantization import QuantAlgo

    kwargs = plan.quant.quant_config_kwargs()
    for key in ("quant_algo", "kv_cache_quant_algo"):
        if kwargs[key] is not None:
            kwargs[key] = QuantAlgo(kwargs[key])
    return QuantConfig(**kwargs)


def _mapping(plan: BuildPlan, rank: int) -> Any:
    from tensorrt_llm.mapping import Mapping as TrtMapping

    return TrtMapping(world_size=plan.world_size, rank=rank, tp_size=plan.tp_size, pp_size=plan.pp_size)


def _build_config(plan: BuildPlan) -> Any:
    from tensorrt_llm.builder import BuildConfig
    from tensorrt_llm.plugin import PluginConfig

    # Attribute by attribute: in 0.12, 1.0 and 1.1 PluginConfig is a @dataclass(slots=True) whose
    # fields are all init=False, so keywords raise TypeError; only 1.2 made it a pydantic model
    # (tensorrt_llm/plugin/plugin.py; NVIDIA/TensorRT-LLM PR 8277). Assignment works on all four.
    plugins = PluginConfig()
    for name, value in plan.plugin_settings().items():
        setattr(plugins, name, value)
    kwargs = plan.build_config_kwargs()
    if plan.speculative_decoding_mode is not None:
        from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode

        # BuildConfig takes the enum; trtllm-build's flag value is its member's name in lower case
        # (tensorrt_llm/models/modeling_utils.py SpeculativeDecodingMode.from_arguments).
        kwargs["speculative_decoding_mode"] = SpeculativeDecodingMode[plan.speculative_decoding_mode.upper()]
    if plan.lora is not None:
        # As trtllm-build does (tensorrt_llm/commands/build.py build_model): LoraConfig(lora_dir, lora_ckpt_source,
        # max_lora_rank), then lora_target_modules assigned; build() applies it (model.use_lora, compile/lora.py).
        from tensorrt_llm.lora_manager import LoraConfig

        lora = LoraConfig(lora_dir=[], lora_ckpt_source="hf", max_lora_rank=plan.lora.max_lora_rank)
        lora.lora_target_modules = list(plan.lora.target_modules)
        kwargs["lora_config"] = lora
    return BuildConfig(**kwargs, plugin_config=plugins)


def _quantize(task: dict[str, Any], plan: BuildPlan, say: Progress) -> None:
    calib = plan.quant.calibration
    assert calib is not None
    if plan.quant.method == "modelopt":
        from .quant import calibrate_and_export

        calibrate_and_export(
            Path(task["hf_dir"]),
            Path(task["checkpoint"]),
            plan.quant,
            task["hf_config"],
            dtype=plan.dtype,
            tp=plan.tp_size,
            pp=plan.pp_size,
            trust_remote_code=plan.converter.trust_remote_code,
            progress=say,
        )
        return
    import torch

    # TensorRT-LLM's own quantizer: the per-token/per-tensor SmoothQuant plugin variants (LLaMA).
    say(f"quantize: TensorRT-LLM {plan.quant.quant_algo} calibration on {calib.dataset}")
    _model_class(plan).quantize(
        task["hf_dir"],
        task["checkpoint"],
        dtype=plan.dtype,
        mapping=_mapping(plan, 0),
        quant_config=_quant_config(plan),
        device="cuda" if torch.cuda.is_available() else "cpu",
        calib_dataset=calib.dataset,
        calib_batches=calib.size,
        calib_batch_size=calib.batch_size,
        calib_max_seq_length=calib.max_seq_length,
        random_seed=calib.seed,
        **plan.converter.kwargs,
    )


def _build_rank(task: dict[str, Any], plan: BuildPlan, stage: Callable[[str], None]) -> None:
    rank = task["rank"]
    stage("convert")
    cls = _model_class(plan)
    if task["checkpoint"]:
        model = cls.from_checkpoint(task["checkpoint"], rank=rank)
    else:
        kwargs = dict(plan.converter.kwargs)
        if task["load_by_shard"]:
            kwargs["load_by_shard"] = True
        model = cls.from_hugging_face(
            task["hf_dir"], dtype=plan.dtype, mapping=_mapping(plan, rank), quant_config=_quant_config(plan), **kwargs
        )
    if plan.medusa is not None:
        model = _with_medusa_heads(model, plan, rank, Path(task["work"]) / "medusa-checkpoint")
    stage("build")
    from tensorrt_llm.builder import build

    engine = build(model, _build_config(plan))
    stage("save")
    engine.save(task["out_dir"])


def _with_medusa_heads(model: Any, plan: BuildPlan, rank: int, checkpoint: Path) -> Any:
    """The base model saved as a checkpoint, the heads added (compile.medusa's docstring), read back as TensorRT-LLM's
    MedusaForCausalLM."""
    from tensorrt_llm.models import MODEL_MAP

    from .medusa import MEDUSA_ARCHITECTURE, write_checkpoint

    assert plan.medusa is not None
    model.save_checkpoint(str(checkpoint), save_config=rank == 0)
    write_checkpoint(
        checkpoint, rank, plan.medusa, plan.max_draft_len, plan.dtype, f"Medusa heads {plan.medusa.heads_dir}"
    )
    return MODEL_MAP[MEDUSA_ARCHITECTURE].from_checkpoint(str(checkpoint), rank=rank)


def _worker(task: dict[str, Any], events: Any) -> None:
    """Entry point of a spawned worker: one quantization, or one rank's convert + build + save."""
    rank = task.get("rank")
    current = "quantize" if rank is None else "convert"

    def stage(name: str) -> None:
        nonlocal current
        current = name
        events.put(("stage", rank, name))

    try:
        _select_device(task["device"])
        plan = BuildPlan.model_validate_json(task["plan"])
        if rank is None:
            stage("quantize")
            _quantize(task, plan, lambda msg: events.put(("progress", rank, msg)))
        else:
            _build_rank(task, plan, stage)
        events.put(("done", rank, None))
    except BaseException as e:  # reported to the parent, which names stage and rank
        events.put(("error", rank, (current, f"{type(e).__name__}: {e}", traceback.format_exc(limit=20))))


# ---------------------------------------------------------------------------------------------
# parent side
# ---------------------------------------------------------------------------------------------


class _Pool:
    """Spawned workers reporting (kind, rank, payload) events on one queue, under a deadline."""

    def __init__(self, deadline: float | None, say: Progress) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.events = self.ctx.Queue()
        self.running: dict[Any, Any] = {}
        self.stages: dict[Any, str] = {}
        self.deadline, self.say = deadline, say

    def start(self, task: dict[str, Any]) -> None:
        rank = task.get("rank")
        proc = self.ctx.Process(target=_worker, args=(task, self.events), name=f"lmi-trt-build-{rank}", daemon=True)
        proc.start()
        self.running[rank] = proc
        self.stages[rank] = "quantize" if rank is None else "convert"

    def kill_all(self) -> None:
        for proc in self.running.values():
            if proc.is_alive():
                proc.kill()
        for proc in self.running.values():
            proc.join(timeout=30)
        self.running.clear()

    def wait_one(self) -> None:
        """Handle events until one worker finishes; raise ``BuildError`` on failure or timeout."""
        while True:
            remaining = None if self.deadline is None else self.deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                rank = next(iter(self.running))
                stage = self.stages[rank]
                self.kill_all()
                raise BuildError(
                    stage,
                    f"timed out: option.compile_timeout expired during {stage}; raise "
                    "option.compile_timeout or build ahead of time with `lmi-trt compile`",
                    rank,
                )
            try:
                kind, rank, payload = self.events.get(timeout=min(1.0, remaining) if remaining else 1.0)
            except queue.Empty:
                self._check_deaths()
                continue
            if kind == "stage":
                self.stages[rank] = payload
                self.say(f"{payload}: {'rank ' + str(rank) if rank is not None else 'calibrating'}")
            elif kind == "progress":
                self.say(payload)
            elif kind == "done":
                self.running.pop(rank).join(timeout=60)
                return
            else:
                stage, message, trace = payload
                log.error("compile %s failed%s:\n%s", stage, f" on rank {rank}" if rank is not None else "", trace)
                self.kill_all()
                raise BuildError(stage, message, rank)

    def _check_deaths(self) -> None:
        for rank, proc in list(self.running.items()):
            if proc.exitcode not in (None, 0):
                stage = self.stages[rank]
                hint = (
                    " (killed: out of host memory? build fewer ranks at once with option.num_engine_workers)"
                    if proc.exitcode in (-9, 137)
                    else ""
                )
                self.kill_all()
                raise BuildError(stage, f"worker process exited with code {proc.exitcode}{hint}", rank)


def stage_hf_dir(hf_dir: Path, overrides: Mapping[str, Any], work: Path) -> tuple[Path, dict[str, Any]]:
    """The folder to convert from: ``hf_dir`` itself, or a linked copy whose config.json has ``overrides``."""
    config = json.loads((hf_dir / "config.json").read_text())
    if not overrides:
        return hf_dir, config
    staged = work / "hf"
    staged.mkdir(parents=True)
    for item in hf_dir.iterdir():
        if item.name != "config.json":
            (staged / item.name).symlink_to(item.resolve())
    config = {**config, **overrides}
    (staged / "config.json").write_text(json.dumps(config, indent=2))
    return staged, config


def _check_output(out_dir: Path, plan: BuildPlan) -> None:
    """Every rank's engine is there and TensorRT-LLM kept the plan's limits (it lowers some silently)."""
    missing = [f"rank{r}.engine" for r in range(plan.world_size) if not (out_dir / f"rank{r}.engine").is_file()]
    if missing or not (out_dir / "config.json").is_file():
        raise BuildError("save", f"{out_dir} lacks {', '.join(missing or ['config.json'])} after the build")
    built = json.loads((out_dir / "config.json").read_text()).get("build_config", {})
    expected = {k: getattr(plan, k) for k in _LIMITS}
    if plan.speculative_decoding_mode is not None:
        # builder.py build adds max_draft_len to the recorded max_seq_len for speculation ("Maximum number of
        # generated tokens remains the same"); the engine's reader takes it off again (trtllm.parse_engine_config)
        expected["max_seq_len"] += plan.max_draft_len
    changed = [f"{k} {expected[k]} → {built.get(k)}" for k in _LIMITS if built.get(k) != expected[k]]
    if changed:
        raise BuildError(
            "build",
            "TensorRT-LLM changed the planned limits: "
            + ", ".join(changed)
            + " (djl#3489); adjust the options so the plan is buildable as is",
        )


def format_properties(properties: Mapping[str, Any]) -> str:
    """Java-properties text; booleans as true/false."""

    def text(value: Any) -> str:
        value = str(value).lower() if isinstance(value, bool) else str(value)
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{key}={text(value)}\n" for key, value in sorted(properties.items()))


def write_extras(
    out_dir: Path,
    plan: BuildPlan,
    hf_config: Mapping[str, Any] | None,
    tokenizer_dir: Path | None,
    properties: Mapping[str, Any] | None,
) -> None:
    """Tokenizer files, the HF config, the plan and serving.properties (never option.model_id) beside the engines."""
    if tokenizer_dir is not None:
        for pattern in TOKENIZER_PATTERNS:
            for src in tokenizer_dir.glob(pattern):
                if src.is_file() and not (out_dir / src.name).exists():
                    shutil.copy2(src, out_dir / src.name)
    if hf_config is not None:
        (out_dir / HF_CONFIG_NAME).write_text(json.dumps(hf_config, indent=2))
    (out_dir / PLAN_NAME).write_text(plan.model_dump_json(indent=2))
    props = {k: v for k, v in (properties or {}).items() if v is not None and k != "option.model_id"}
    props.update(
        {
            "option.rolling_batch": "trtllm",
            "option.tensor_parallel_degree": plan.tp_size,
            "option.pipeline_parallel_degree": plan.pp_size,
        }
    )
    (out_dir / PROPERTIES_NAME).write_text(
        "# Written by `lmi-trt compile`: the engine in this folder was built with these settings.\n"
        + format_properties(props)
    )


def build_engine(
    plan: BuildPlan,
    hf_dir: Path,
    out_dir: Path,
    *,
    settings: BuildSettings = BuildSettings(),
    tokenizer_dir: Path | None = None,
    properties: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> None:
    """Quantize if the plan says so, then convert + build + save every rank into ``out_dir``."""
    say = progress or (lambda msg: log.info("compile: %s", msg))
    deadline = None if settings.timeout_s is None else time.monotonic() + settings.timeout_s
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".lmi-trt-build-", dir=out_dir.parent))
    try:
        if plan.converter.source == "trtllm_checkpoint":
            source, hf_config, checkpoint = hf_dir, None, hf_dir
        else:
            (source, hf_config), checkpoint = stage_hf_dir(hf_dir, plan.converter.hf_config_overrides, work), None
        base = {
            "plan": plan.model_dump_json(),
            "hf_dir": str(source),
            "hf_config": hf_config,
            "load_by_shard": settings.load_by_shard,
            "work": str(work),
        }
        pool = _Pool(deadline, say)
        if plan.quant.needs_calibration:
            checkpoint = settings.checkpoint_dir or work / "checkpoint"
            pool.start(
                {**base, "rank": None, "device": 0 if settings.gpu_count else None, "checkpoint": str(checkpoint)}
            )
            pool.wait_one()
        ranks = list(range(plan.world_size))
        started = time.monotonic()
        while ranks or pool.running:
            while ranks and len(pool.running) < settings.parallel(plan.world_size):
                rank = ranks.pop(0)
                pool.start(
                    {
                        **base,
                        "rank": rank,
                        "out_dir": str(out_dir),
                        "checkpoint": str(checkpoint) if checkpoint else None,
                        "device": rank % settings.gpu_count if settings.gpu_count else None,
                    }
                )
            pool.wait_one()
        say(f"built {plan.world_size} rank(s) in {time.monotonic() - started:.0f} s")
        _check_output(out_dir, plan)
        write_extras(out_dir, plan, hf_config, tokenizer_dir, properties)
    finally:
        shutil.rmtree(work, ignore_errors=True)
