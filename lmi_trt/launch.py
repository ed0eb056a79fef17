"""How ``lmi-trt serve`` occupies a host: TP×PP ranks under MPI, and model copies behind one front end.

``plan_launch`` is pure: (TP, PP, visible GPUs, engine) → ``LaunchPlan``: the ranks of one model
copy (TP×PP), how many copies the host holds (GPUs ÷ (TP×PP), DJL's worker count; at least one,
also on a CPU host), the GPUs of each copy, and whether ``serve`` must run under ``mpirun``.

How each engine uses the plan (TensorRT-LLM's two MPI modes, ``CommunicationMode.LEADER``/``ORCHESTRATOR`` of
tensorrt_llm.bindings.executor, NVIDIA/TensorRT-LLM cpp/include/tensorrt_llm/executor/types.h):

* trtllm, one copy, TP×PP = 1: one process, no MPI launcher (the Executor initialises MPI itself).
* trtllm, one copy, TP×PP > 1: **leader mode**. ``serve`` re-executes itself under
  ``mpirun -n TP×PP`` with ``CUDA_VISIBLE_DEVICES`` set to the copy's GPUs; every rank builds the
  Executor (rank r loads ``rank{r}.engine``); rank 0 (``can_enqueue_requests()``) serves HTTP, the
  other ranks block in ``wait_for_shutdown()`` until rank 0 shuts the Executor down.
* trtllm with a draft model (option.speculative_draft_model, TP×PP = 1): **orchestrator mode**, one copy: the model's
  and the draft's Executors both spawn their worker (as examples/prompt_lookup/run_dtm_pld.py builds both runners with
  ``is_orchestrator_mode=True``), so ``serve`` re-executes itself under ``mpirun -n 1`` as below. NVIDIA's own
  launcher does the same for spawning orchestrators: triton_backend/scripts/launch_triton_server.py (NVIDIA/
  TensorRT-LLM, the 1.x copy with --trtllm_llmapi_launch) starts ``mpirun -n 1 tritonserver`` with
  TRTLLM_ORCHESTRATOR=1 for --multi-model ("World size must be 1 when using multi-model without
  disable-spawn-processes"), which is how the draft-target model is served through Triton (examples/
  draft_target_model/README.md). Without a launcher the spawn depends on the MPI library's singleton support, which
  the 1.3.0rc27 image's Open MPI 5 lacks (ai-dynamo/dynamo#15060: ``MPI_ERR_UNKNOWN`` on spawn).
* trtllm, several copies (a host with more GPUs than TP×PP): **orchestrator mode**, the way
  NVIDIA's Triton backend runs several instances of one model on one host ("multi-model",
  ``gpu_device_ids`` "0,1;2,3"): ``serve`` re-executes itself under ``mpirun -n 1`` (dynamic
  spawning needs a process manager), and builds one Executor per copy with
  ``ParallelConfig(communication_mode=ORCHESTRATOR, device_ids=<the copy's GPUs>,
  orchestrator_config=OrchestratorConfig(is_orchestrator=True, worker_executable_path=.../bin/executorWorker))``;
  each Executor spawns its TP×PP workers with ``MPI_Comm_spawn``. The copies sit behind one
  ``ReplicaSet`` (least-loaded routing). This also covers TP = 1 (one worker per GPU): several
  leader-mode Executors in one process are not a documented configuration, orchestrator mode is.
* torch: no tensor parallelism; one ``TorchEngine`` per GPU (``cuda:i``) behind a ``ReplicaSet``,
  or one on the CPU.
* synthetic: one copy; GPUs are not used.

Under MPI the ranks end together: any rank that fails calls ``MPI_Abort`` (which ends the whole
job; a rank merely exiting non-zero does not, with MPICH), and a clean exit passes a
``goodbye`` barrier with a timeout, so a rank whose partner never shut down aborts the job
instead of hanging. On SIGTERM/SIGINT the launcher sends ``mpirun`` SIGUSR1, which Open MPI and Hydra
both pass on to every rank (rank 0 treats it as SIGTERM: drain, then shut the Executor down, which
releases the followers), waits a bounded time, then kills it; ``mpirun`` dies with the launcher
(PR_SET_PDEATHSIG).
Ranks are identified through mpi4py, never by parsing MPI's environment variables.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lmi_trt.config import LmiConfig, speculation
from lmi_trt.engines.registry import ENGINE_NAMES, entry
from lmi_trt.errors import ConfigError

if TYPE_CHECKING:
    from lmi_trt.engines.trtllm import TrtllmSettings

log = logging.getLogger(__name__)

MpiFlavour = Literal["openmpi", "mpich"]
TrtllmMode = Literal["leader", "orchestrator"]

# The hidden `serve` flag the relaunch adds: "this process is a rank that lmi-trt started".
UNDER_MPI_FLAG = "--under-mpi"
# Where a rank that aborts the job writes why, for the launching process to print: mpirun forwards a rank's
# output asynchronously, and MPI_Abort can end the job before the rank's last lines get through (seen under load).
RANK_REPORTS_FLAG = "--rank-reports"
# How long ranks wait for each other at a clean exit before aborting the job.
GOODBYE_TIMEOUT_S = 15.0
# How long a follower keeps waiting for the leader's shutdown after it got SIGTERM itself,
# beyond the leader's drain time; and how long the launcher waits for mpirun after forwarding.
SHUTDOWN_MARGIN_S = 30.0
# What the launcher sends mpirun to stop the job gracefully: both launchers propagate SIGUSR1 to the
# ranks, which treat it as SIGTERM (Open MPI's mpirun turns a SIGTERM into SIGTERM+SIGKILL of the job).
STOP_SIGNAL = signal.SIGUSR1
DEFAULT_DRAIN_S = 30.0  # serving.app.run_app's shutdown_timeout default


class LaunchError(ConfigError):
    """A parallelism setting this host or engine cannot honour; the message names the key and the fix."""


# =============================================================================== the plan


@dataclass(frozen=True)
class Placement:
    """Where one model copy runs: GPU indices (as this process sees them; empty = CPU / no GPU)."""

    index: int
    devices: tuple[int, ...] = ()
    orchestrator: bool = False  # trtllm: an ORCHESTRATOR-mode Executor with device_ids=devices

    @property
    def torch_device(self) -> str | None:
        """``cuda:i`` for a one-GPU copy; None = the configured device (option.device)."""
        return f"cuda:{self.devices[0]}" if self.devices else None


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    tensor_parallel: int
    pipeline_parallel: int
    gpu_count: int
    copies: tuple[tuple[int, ...], ...]  # GPU indices per copy; ((),) = one copy without GPUs
    mpi_ranks: int  # processes `mpirun -n` starts; 0 = no MPI launcher
    trtllm_mode: TrtllmMode | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def world_size(self) -> int:
        """Ranks of one model copy (TP×PP)."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def num_copies(self) -> int:
        return len(self.copies)

    @property
    def needs_mpi(self) -> bool:
        """Whether ``serve`` must run under an MPI launcher (it re-executes itself there)."""
        return self.mpi_ranks > 0

    @property
    def idle_devices(self) -> tuple[int, ...]:
        used = {d for copy in self.copies for d in copy}
        return tuple(d for d in range(self.gpu_count) if d not in used)

    def placements(self) -> list[Placement]:
        orchestrator = self.trtllm_mode == "orchestrator"
        return [Placement(i, devices, orchestrator) for i, devices in enumerate(self.copies)]

    def describe(self) -> str:
        where = "; ".join(f"copy {i}: GPU {','.join(map(str, d))}" for i, d in enumerate(self.copies) if d) or "no GPU"
        mpi = {
            None: "",
            "leader": f", MPI leader mode with {self.mpi_ranks} rank(s)",
            "orchestrator": ", MPI orchestrator mode (mpirun -n 1, workers spawned per copy)",
        }[self.trtllm_mode]
        if self.trtllm_mode == "leader" and not self.needs_mpi:
            mpi = ", one process"
        return (
            f"{self.engine}: TP={self.tensor_parallel} PP={self.pipeline_parallel}, "
            f"{self.num_copies} cop{'y' if self.num_copies == 1 else 'ies'} ({where}){mpi}"
        )


def _degree(value: int | str, key: str) -> int | str:
    if value == "max":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"{key}={value!r} is not a positive integer{' or max' if 'tensor' in key else ''}")
    return value


def plan_launch(
    tp: int | Literal["max"], pp: int, gpu_count: int, engine: str, backend: str = "auto", draft_model: bool = False
) -> LaunchPlan:
    """Pure: how to run ``engine`` (on TensorRT-LLM's ``backend``) with TP×PP on a host with ``gpu_count``
    visible GPUs, by the registry entry's launch rule.

    ``tp='max'`` is all visible GPUs ÷ PP (1 without GPUs). TP×PP above the visible GPUs is an
    error; on a host without GPUs the plan keeps TP×PP ranks (the engine reports the missing GPU).
    Only the trtllm engine runs TP×PP > 1: under MPI for TensorRT engines; on its ``pytorch`` backend in one
    process, whose LLM starts its own TP×PP workers. A backend not chosen yet (``auto``: decided once the model
    is read) is planned as TensorRT engines are. With ``draft_model`` (a draft model's engine beside the model's) one
    copy of TP×PP = 1 runs in orchestrator mode under ``mpirun -n 1`` (module docstring).
    """
    if engine not in ENGINE_NAMES:
        raise LaunchError(f"engine {engine!r} is not one of {', '.join(ENGINE_NAMES)}")
    rule = entry(engine, backend).launch
    tp = _degree(tp, "option.tensor_parallel_degree")
    pp = _degree(pp, "option.pipeline_parallel_degree")
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0:
        raise ValueError(f"gpu_count={gpu_count!r}: expected a count ≥ 0")
    notes: list[str] = []

    if rule == "none":
        if tp != 1 or pp != 1:
            notes.append(
                f"the {engine} engine uses no GPU and ignores option.tensor_parallel_degree={tp} "
                f"and option.pipeline_parallel_degree={pp}"
            )
        return LaunchPlan(engine, 1, 1, gpu_count, ((),), 0, None, tuple(notes))

    if rule == "per_gpu":
        if tp == "max":
            notes.append(
                f"option.tensor_parallel_degree=max: the {engine} engine has no tensor parallelism; "
                "it runs one model copy per GPU instead"
            )
            tp = 1
        if tp * pp > 1:
            copies = f" (this host: {gpu_count} GPU(s) → {gpu_count} copies)" if gpu_count > 1 else ""
            raise LaunchError(
                f"option.tensor_parallel_degree={tp} and option.pipeline_parallel_degree={pp}: only the trtllm engine "
                "splits a model over GPUs (TensorRT-LLM ranks under MPI); the torch engine runs one whole model copy "
                f"per GPU. Set option.tensor_parallel_degree=1 and option.pipeline_parallel_degree=1{copies}, or serve "
                "a TensorRT-LLM engine with option.rolling_batch=trtllm"
            )
        if gpu_count == 0:
            return LaunchPlan(engine, 1, 1, 0, ((),), 0, None, tuple(notes))
        if gpu_count > 1:
            notes.append(f"{gpu_count} GPUs, one model copy per GPU behind one front end (least-loaded routing)")
        return LaunchPlan(engine, 1, 1, gpu_count, tuple((i,) for i in range(gpu_count)), 0, None, tuple(notes))

    # mpi_ranks and llm_workers (trtllm)
    if tp == "max":
        tp = max(1, gpu_count // pp)
        if gpu_count and gpu_count < pp:
            raise LaunchError(
                f"option.tensor_parallel_degree=max with option.pipeline_parallel_degree={pp} needs at least {pp} "
                f"GPUs, but {gpu_count} GPU(s) are visible; lower option.pipeline_parallel_degree to at most "
                f"{gpu_count}"
            )
        notes.append(f"option.tensor_parallel_degree=max → {tp} ({gpu_count} visible GPU(s) ÷ PP {pp})")
    world = tp * pp
    if rule == "llm_workers" and (gpu_count == 0 or world <= gpu_count):
        return _llm_workers_plan(engine, tp, pp, gpu_count, notes)
    # a draft model beside the model: both Executors spawn their worker (TP×PP > 1 beside one is refused by the engine)
    drafts = draft_model and world == 1
    if drafts:
        notes.append("a draft model's Executor beside the model's: both in ORCHESTRATOR mode under mpirun -n 1")
    if gpu_count == 0:
        # Nothing to place; the engine itself says that TensorRT-LLM needs a GPU.
        if drafts:
            return LaunchPlan(engine, tp, pp, 0, ((),), 1, "orchestrator", tuple(notes))
        return LaunchPlan(engine, tp, pp, 0, ((),), world if world > 1 else 0, "leader", tuple(notes))
    if world > gpu_count:
        fit = max(1, gpu_count // pp)
        raise LaunchError(
            f"option.tensor_parallel_degree={tp} × option.pipeline_parallel_degree={pp} needs {world} GPUs, but "
            f"{gpu_count} GPU(s) are visible; set option.tensor_parallel_degree to at most {fit} (or max), or run on a "
            "host with more GPUs (check CUDA_VISIBLE_DEVICES and the container's --gpus)"
        )
    n = gpu_count // world
    copies = tuple(tuple(range(i * world, (i + 1) * world)) for i in range(n))
    idle = gpu_count - n * world
    if idle:
        notes.append(
            f"{gpu_count} GPUs hold {n} cop{'y' if n == 1 else 'ies'} of TP×PP={world}; "
            f"GPU(s) {', '.join(map(str, range(n * world, gpu_count)))} stay idle"
        )
    if n == 1 and not drafts:
        return LaunchPlan(engine, tp, pp, gpu_count, copies, world if world > 1 else 0, "leader", tuple(notes))
    if n > 1:
        notes.append(f"{n} copies of TP×PP={world} behind one front end: one ORCHESTRATOR-mode Executor per copy")
    return LaunchPlan(engine, tp, pp, gpu_count, copies, 1, "orchestrator", tuple(notes))


def _llm_workers_plan(engine: str, tp: int, pp: int, gpu_count: int, notes: list[str]) -> LaunchPlan:
    """TensorRT-LLM's PyTorch backend: one process and one copy. Its LLM spawns the TP×PP workers itself
    (NVIDIA/TensorRT-LLM, tensorrt_llm/executor/proxy.py: ``MpiPoolSession(n_workers=model_world_size)``
    unless already inside an mpirun of that size) and ``LLM.shutdown`` ends them, so lmi-trt starts no ranks."""
    world = tp * pp
    if world > 1:
        notes.append(
            f"TensorRT-LLM's LLM API starts the {world} TP×PP workers itself (MPI pool) and stops them with the server"
        )
    copy = tuple(range(world)) if gpu_count else ()
    if gpu_count > world:
        notes.append(
            f"the pytorch backend serves one model copy; GPU(s) {', '.join(map(str, range(world, gpu_count)))} "
            "stay idle (use them with option.tensor_parallel_degree=max)"
        )
    return LaunchPlan(engine, tp, pp, gpu_count, (copy,), 0, None, tuple(notes))


def plan_for(config: LmiConfig, kind: str, gpu_count: int) -> LaunchPlan:
    """``plan_launch`` for an ``LmiConfig``; a per-GPU engine (torch) on ``option.device=cpu`` uses no GPU."""
    if entry(kind, config.backend).launch == "per_gpu" and config.device == "cpu":
        gpu_count = 0
    spec = speculation(config)
    return plan_launch(
        config.tensor_parallel_degree,
        config.pipeline_parallel_degree,
        gpu_count,
        kind,
        config.backend,
        draft_model=spec is not None and spec.method == "draft_model",
    )


# =============================================================================== MPI launcher


@dataclass(frozen=True)
class MpiRuntime:
    launcher: str  # path of mpirun / mpiexec
    flavour: MpiFlavour
    version: str

    def describe(self) -> str:
        return f"{'Open MPI' if self.flavour == 'openmpi' else 'MPICH (Hydra)'} {self.version} ({self.launcher})"


def parse_mpi_version(text: str) -> tuple[MpiFlavour, str] | None:
    """Pure: the flavour and version from ``mpirun --version`` (or mpi4py's ``Get_library_version()``)."""
    m = re.search(r"Open MPI\)?\s*v?(\d+(?:\.\d+)*)", text) or re.search(r"OpenRTE\)?\s*v?(\d+(?:\.\d+)*)", text)
    if m:
        return "openmpi", m.group(1)
    for pattern in (
        r"HYDRA build details:\s*\n\s*Version:\s*(\S+)",
        r"MPICH Version:\s*(\S+)",
        r"Intel\(R\) MPI Library[^\n]*?(\d{4}(?:\.\d+)*)",
    ):
        m = re.search(pattern, text)
        if m:
            return "mpich", m.group(1)
    if "HYDRA" in text or "MPICH" in text or "Intel(R) MPI" in text:
        return "mpich", "unknown"
    return None


def probe_mpi(which: Callable[[str], str | None] = shutil.which, timeout: float = 10.0) -> MpiRuntime:
    """Find ``mpirun`` (else ``mpiexec``) and tell Open MPI from MPICH/Hydra by its ``--version``."""
    for name in ("mpirun", "mpiexec"):
        path = which(name)
        if path is None:
            continue
        try:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"`{path} --version` failed ({exc}); cannot tell which MPI launches the ranks") from exc
        parsed = parse_mpi_version(out.stdout + out.stderr)
        if parsed is None:
            raise LaunchError(
                f"`{path} --version` names neither Open MPI nor MPICH/Hydra: "
                f"{(out.stdout + out.stderr).strip()[:200]!r}"
            )
        return MpiRuntime(path, *parsed)
    raise LaunchError(
        "option.tensor_parallel_degree × option.pipeline_parallel_degree > 1 (or several TensorRT-LLM copies) needs "
        "an MPI launcher, and neither mpirun nor mpiexec is on PATH; install Open MPI or MPICH (pip install mpich) "
        "with mpi4py (pip install 'lmi-trt[mpi]')"
    )


# Never forwarded: the MPI runtime's own variables (a nested launch must not inherit them).
_MPI_OWN = ("OMPI_", "PMIX_", "PMI_", "PRTE_", "ORTE_", "HYDRA_", "HYDI_", "MPIR_", "MPI_LOCAL")
_SHELL_NOISE = {"PWD", "OLDPWD", "SHLVL", "_", "PS1", "TERM", "COLUMNS", "LINES"}


def forwarded_env_names(env: Mapping[str, str]) -> list[str]:
    """Pure: the variables Open MPI should export to the ranks (``-x NAME``): all but MPI's own."""
    return sorted(
        k
        for k in env
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and k not in _SHELL_NOISE and not k.startswith(_MPI_OWN)
    )


def visible_device_ids(devices: Sequence[int], env: Mapping[str, str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for GPU indices, through the parent's own ``CUDA_VISIBLE_DEVICES``."""
    parent = [d.strip() for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return ",".join(parent[d] if d < len(parent) else str(d) for d in devices)


def mpi_command(
    plan: LaunchPlan,
    flavour: MpiFlavour,
    argv: Sequence[str],
    *,
    launcher: str | None = None,
    env: Mapping[str, str] | None = None,
) -> list[str]:
    """Pure: the ``mpirun``/``mpiexec`` command line that starts ``argv`` as the plan's ranks.

    Open MPI (DJL's flags): ``--allow-run-as-root --oversubscribe --bind-to none --tag-output``, no
    single-copy mechanism (containers lack CAP_SYS_PTRACE), ``-x NAME`` for the environment.
    MPICH/Hydra passes the whole environment by default; ``-genv`` sets what differs.
    In leader mode on GPUs the ranks see only their copy's GPUs (``CUDA_VISIBLE_DEVICES``).
    """
    if not plan.needs_mpi:
        raise ValueError(f"this plan runs without MPI ({plan.describe()})")
    env = dict(env or {})
    n = str(plan.mpi_ranks)
    devices = visible_device_ids(plan.copies[0], env) if plan.trtllm_mode == "leader" and plan.copies[0] else None
    if flavour == "openmpi":
        cmd = [
            launcher or "mpirun",
            "-n",
            n,
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
            "--tag-output",
            "--mca",
            "btl_vader_single_copy_mechanism",
            "none",
        ]
        for name in forwarded_env_names(env):
            if not (devices is not None and name == "CUDA_VISIBLE_DEVICES"):
                cmd += ["-x", name]
        if devices is not None:
            cmd += ["-x", f"CUDA_VISIBLE_DEVICES={devices}"]
    elif flavour == "mpich":
        cmd = [launcher or "mpiexec", "-n", n, "-bind-to", "none"]
        if devices is not None:
            cmd += ["-genv", "CUDA_VISIBLE_DEVICES", devices]
    else:
        raise ValueError(f"unknown MPI flavour {flavour!r}; expected openmpi or mpich")
    return cmd + list(argv)


def rank_argv(cli_argv: Sequence[str], reports: Path | None = None) -> list[str]:
    """The command every rank runs: this same ``lmi-trt`` invocation, marked as started by us (and told where
    to report a failure that aborts the job)."""
    args = list(cli_argv)
    if UNDER_MPI_FLAG not in args:
        args.append(UNDER_MPI_FLAG)
    if reports is not None:
        args += [RANK_REPORTS_FLAG, str(reports)]
    return [sys.executable, "-m", "lmi_trt", *args]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def supervise(cmd: Sequence[str], env: Mapping[str, str], *, grace: float, stop_signal: int = STOP_SIGNAL) -> int:
    """Run the MPI launcher; on SIGTERM/SIGINT/SIGHUP send it ``stop_signal`` (which both Open MPI
    and Hydra pass on to every rank; Open MPI answers SIGTERM itself by killing the job within
    seconds, before rank 0 has drained), give the job ``grace`` seconds, then kill the launcher
    (its daemons then kill the ranks). Returns its exit status (128 + signal for a signal death)."""
    proc = subprocess.Popen(
        list(cmd),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
    )
    deadline: list[float] = []

    def forward(signum: int, _frame: Any) -> None:
        if deadline:  # a second signal: no more waiting
            log.warning("second %s: killing %s", signal.Signals(signum).name, cmd[0])
            proc.kill()
            return
        log.info("%s: stopping the MPI job (up to %.0f s)", signal.Signals(signum).name, grace)
        deadline.append(time.monotonic() + grace)
        try:
            proc.send_signal(stop_signal)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if deadline and time.monotonic() > deadline[0]:
                    log.error("the MPI job did not end %.0f s after the stop signal; killing it", grace)
                    proc.kill()
                    rc = proc.wait()
                    break
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - rc if rc < 0 else rc


# =============================================================================== ranks


@dataclass
class MpiWorld:
    rank: int
    size: int
    mpi: Any  # the mpi4py.MPI module
    comm: Any = None  # a duplicate of COMM_WORLD for our own coordination (not TensorRT-LLM's)
    reports: Path | None = None  # RANK_REPORTS_FLAG's folder, when lmi-trt started the job

    def abort(self, code: int, reason: str) -> None:
        """End every rank of the job now (MPI_Abort), ``reason`` reported first; does not return."""
        log.error("rank %d: aborting the MPI job with exit status %d", self.rank, code)
        if self.reports is not None:
            try:
                (self.reports / f"rank-{self.rank}.txt").write_text(reason)
            except OSError as exc:
                log.error("rank %d: cannot write the failure report: %s", self.rank, exc)
        for handler in logging.getLogger().handlers:
            handler.flush()
        self.mpi.COMM_WORLD.Abort(code)
        os._exit(code)  # unreachable unless Abort returned


def mpi_world() -> MpiWorld:
    """The MPI world through mpi4py (initialises MPI: a singleton of size 1 outside a launcher)."""
    try:
        from mpi4py import MPI
    except Exception as exc:  # ImportError, or RuntimeError when libmpi is missing
        raise LaunchError(
            f"mpi4py cannot load an MPI library ({exc}); TP×PP > 1 and several TensorRT-LLM copies run under MPI: "
            "pip install 'lmi-trt[mpi]' and an MPI runtime (Open MPI, or pip install mpich)"
        ) from exc
    world = MPI.COMM_WORLD
    return MpiWorld(world.Get_rank(), world.Get_size(), MPI)


def _mpi4py_flavour(mpi: Any) -> MpiFlavour | None:
    parsed = parse_mpi_version(mpi.Get_library_version())
    return parsed[0] if parsed else None


def _label_logs(rank: int) -> None:
    """Name the rank in every log line (ranks share one output stream)."""
    from lmi_trt.config import process_environment
    from lmi_trt.log_context import install_request_tag, log_format
    from lmi_trt.log_redaction import install_log_redaction

    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(log_format(f"rank{rank} ")))
    install_request_tag()
    install_log_redaction(env=process_environment())  # wraps the new formatters again: secrets stay masked


def goodbye(world: MpiWorld, timeout: float) -> bool:
    """A barrier with a deadline on our own communicator: True when every rank reached it."""
    req = world.comm.Ibarrier()
    deadline = time.monotonic() + timeout
    while not req.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class _StopWatch:
    """Records the first SIGTERM/SIGINT/SIGUSR1 (a follower keeps waiting for its leader after one)."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.at is None:
            self.at = time.monotonic()
            log.info("%s: waiting for the leader rank to shut the engine down", signal.Signals(signum).name)


def run_follower(load: Callable[[], Awaitable[Any]], *, grace: float) -> int:
    """A non-leader rank: build the engine (collectively with the others), then block until the
    leader shuts it down. 0 after a clean shutdown; 1 when loading fails, the engine claims to be
    the leader, or the leader does not shut down within ``grace`` seconds of a stop signal."""
    stop = _StopWatch()
    for s in (signal.SIGTERM, signal.SIGINT, STOP_SIGNAL):
        signal.signal(s, stop)
    loaded = asyncio.run(load())
    engine = loaded.engine
    if getattr(engine, "is_leader", False):
        log.error("this rank's Executor can enqueue requests, but only rank 0 serves; check the MPI rank order")
        return 1
    done = threading.Event()
    failure: list[BaseException] = []

    def wait() -> None:
        try:
            engine.wait_for_shutdown()
        except BaseException as exc:  # noqa: BLE001 — reported by the main thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="trtllm-follower-wait", daemon=True).start()
    log.info("follower rank ready: waiting for the leader (rank 0) to shut the engine down")
    while not done.wait(0.2):
        if stop.at is not None and time.monotonic() - stop.at > grace:
            log.error("the leader did not shut the engine down within %.0f s of the stop signal", grace)
            return 1
    if failure:
        log.error("waiting for the leader failed: %s: %s", type(failure[0]).__name__, failure[0])
        return 1
    log.info("the leader shut the engine down; follower rank exiting")
    return 0


def run_rank(
    world: MpiWorld,
    plan: LaunchPlan,
    *,
    serve_http: Callable[[], int],
    load_follower: Callable[[], Awaitable[Any]],
    drain_s: float = DEFAULT_DRAIN_S,
    goodbye_timeout: float = GOODBYE_TIMEOUT_S,
) -> int:
    """One rank of the job: rank 0 serves HTTP, the others follow. Any failure aborts the whole job."""
    world.comm = world.mpi.COMM_WORLD.Dup()  # collective: every rank runs it first
    _label_logs(world.rank)
    if world.size != plan.mpi_ranks:
        problem = f"mpirun started {world.size} rank(s), but this launch needs {plan.mpi_ranks} ({plan.describe()})"
        log.error("%s", problem)
        world.abort(2, problem)
    try:
        if world.rank == 0:
            # The launcher's stop signal is a SIGTERM for the server (graceful drain, then engine shutdown).
            signal.signal(STOP_SIGNAL, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
            rc = serve_http()
        else:
            rc = run_follower(load_follower, grace=drain_s + SHUTDOWN_MARGIN_S)
    except BaseException as exc:  # noqa: BLE001 — one rank's failure must end every rank
        if isinstance(exc, SystemExit) and not exc.code:
            rc = 0
        else:
            log.exception("rank %d failed", world.rank)
            rc = exc.code if isinstance(exc, SystemExit) and isinstance(exc.code, int) else 1
            world.abort(rc, f"rank {world.rank} failed: {type(exc).__name__}: {exc}")
    if rc != 0:
        world.abort(rc, f"rank {world.rank} ended with exit status {rc}")
    if not goodbye(world, goodbye_timeout):
        problem = f"rank {world.rank}: the other ranks did not finish within {goodbye_timeout:.0f} s"
        log.error("%s", problem)
        world.abort(1, problem)
    return 0


# =============================================================================== serve entry


def run_serve(
    plan: LaunchPlan,
    *,
    argv: Sequence[str],
    under_mpi: bool,
    serve_http: Callable[[], int],
    load_follower: Callable[[], Awaitable[Any]],
    env: Mapping[str, str] | None = None,
    drain_s: float = DEFAULT_DRAIN_S,
    reports: Path | None = None,
) -> int:
    """``lmi-trt serve`` for a plan: serve directly, re-execute under MPI, or run as one of its ranks.

    ``argv`` is the command line after the program name (re-used for the ranks); ``under_mpi`` and
    ``reports`` are the hidden flags the relaunch adds. Returns the process exit status.
    """
    if not plan.needs_mpi:
        return serve_http()
    env = dict(os.environ if env is None else env)  # before MPI initialises and adds its own variables
    world = mpi_world()
    if world.size == 1 and not under_mpi:
        runtime = probe_mpi()
        library = _mpi4py_flavour(world.mpi)
        world.mpi.Finalize()
        if library is not None and library != runtime.flavour:
            raise LaunchError(
                f"{runtime.launcher} is {runtime.describe()}, but mpi4py is linked to "
                f"{'Open MPI' if library == 'openmpi' else 'MPICH'}; every rank would see a world of 1. Put the "
                "launcher of mpi4py's MPI first on PATH (or reinstall mpi4py against this one)"
            )
        job_reports = Path(tempfile.mkdtemp(prefix="lmi-trt-ranks-"))
        try:
            cmd = mpi_command(plan, runtime.flavour, rank_argv(argv, job_reports), launcher=runtime.launcher, env=env)
            log.info("%s; starting the ranks with %s: %s", plan.describe(), runtime.describe(), shlex.join(cmd))
            rc = supervise(cmd, env, grace=drain_s + SHUTDOWN_MARGIN_S)
            for report in sorted(job_reports.glob("rank-*.txt")):  # said here, where no line is lost
                log.error("the MPI job was aborted: %s", report.read_text().strip())
            return rc
        finally:
            shutil.rmtree(job_reports, ignore_errors=True)
    if under_mpi and world.size != plan.mpi_ranks:
        log.error(
            "this rank sees an MPI world of %d, but %d rank(s) were started: is mpi4py linked to a different "
            "MPI than the launcher?",
            world.size,
            plan.mpi_ranks,
        )
        return 2
    world.reports = reports
    return run_rank(world, plan, serve_http=serve_http, load_follower=load_follower, drain_s=drain_s)


# =============================================================================== model copies


def build_copies(
    plan: LaunchPlan | None, make_engine: Callable[[Placement | None], Any], *, parallel: bool = True
) -> Any:
    """One engine per copy of the plan (not started); several sit behind one ``ReplicaSet``, which starts them
    at once or, with ``parallel=False`` (option.parallel_loading=false), one after another."""
    if plan is None:
        return make_engine(None)
    placements = plan.placements()
    if len(placements) == 1:  # one copy, orchestrator mode too (a draft model beside it)
        return make_engine(placements[0])
    from lmi_trt.engines.replicas import ReplicaSet

    return ReplicaSet([make_engine(p) for p in placements], parallel=parallel)


def trtllm_copy_settings(settings: TrtllmSettings, placement: Placement) -> TrtllmSettings:
    """``TrtllmSettings`` for one orchestrator-mode copy (``device_ids`` = the copy's GPUs; none on a host without
    GPUs)."""
    return settings.model_copy(update={"device_ids": tuple(placement.devices), "orchestrator": True})


__all__ = [
    "GOODBYE_TIMEOUT_S",
    "LaunchError",
    "LaunchPlan",
    "MpiRuntime",
    "MpiWorld",
    "Placement",
    "RANK_REPORTS_FLAG",
    "UNDER_MPI_FLAG",
    "build_copies",
    "forwarded_env_names",
    "mpi_command",
    "mpi_world",
    "parse_mpi_version",
    "plan_for",
    "plan_launch",
    "probe_mpi",
    "rank_argv",
    "run_follower",
    "run_rank",
    "run_serve",
    "supervise",
    "trtllm_copy_settings",
    "visible_device_ids",
]
