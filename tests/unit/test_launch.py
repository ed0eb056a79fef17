"""The launch plan (TP×PP ranks, model copies per host) and the MPI command lines, both flavours."""

from __future__ import annotations

import sys

import pytest

from lmi_trt.config import ConfigError, LmiConfig
from lmi_trt.launch import (
    UNDER_MPI_FLAG,
    LaunchError,
    LaunchPlan,
    forwarded_env_names,
    mpi_command,
    parse_mpi_version,
    plan_for,
    plan_launch,
    probe_mpi,
    rank_argv,
    visible_device_ids,
)

RANK = [sys.executable, "-m", "lmi_trt", "serve", "--model-id", "/m", UNDER_MPI_FLAG]


# ------------------------------------------------------------------ plan_launch


def test_single_gpu_trtllm_runs_in_one_process():
    plan = plan_launch(1, 1, 1, "trtllm")
    assert (plan.world_size, plan.num_copies, plan.copies, plan.needs_mpi) == (1, 1, ((0,),), False)
    assert plan.trtllm_mode == "leader" and plan.notes == ()


def test_a_draft_model_runs_its_one_copy_in_orchestrator_mode_under_mpirun_n_1():
    """Both Executors spawn their worker (orchestrator mode), so the process runs under a launcher, as NVIDIA's
    launch_triton_server.py starts spawning orchestrators (lmi_trt.launch's docstring); with or without a GPU seen."""
    for gpus in (1, 0):
        plan = plan_launch(1, 1, gpus, "trtllm", "tensorrt", draft_model=True)
        assert (plan.mpi_ranks, plan.trtllm_mode, plan.num_copies) == (1, "orchestrator", 1)
        assert [p.orchestrator for p in plan.placements()] == [True]
        assert any("draft model" in note for note in plan.notes)
    assert plan_launch(1, 1, 4, "trtllm", "tensorrt", draft_model=True).copies == ((0,), (1,), (2,), (3,))
    config = LmiConfig(model_id="/m", speculative_draft_model="/d", draft_kv_cache_free_gpu_mem_fraction=0.1)
    assert plan_for(config, "trtllm", 1).mpi_ranks == 1
    assert plan_for(LmiConfig(model_id="/m"), "trtllm", 1).mpi_ranks == 0


def test_tensor_parallel_trtllm_is_one_leader_mode_mpi_job():
    plan = plan_launch(4, 1, 4, "trtllm")
    assert plan.world_size == 4 and plan.copies == ((0, 1, 2, 3),)
    assert plan.needs_mpi and plan.mpi_ranks == 4 and plan.trtllm_mode == "leader"


def test_tp_and_pp_multiply():
    plan = plan_launch(2, 2, 4, "trtllm")
    assert plan.world_size == 4 and plan.mpi_ranks == 4 and plan.num_copies == 1


def test_more_gpus_than_tp_gives_copies_in_orchestrator_mode():
    plan = plan_launch(2, 1, 8, "trtllm")
    assert plan.copies == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert plan.trtllm_mode == "orchestrator" and plan.mpi_ranks == 1
    placements = plan.placements()
    assert [p.devices for p in placements] == list(plan.copies) and all(p.orchestrator for p in placements)
    assert "4 copies" in plan.describe()


def test_tp1_on_several_gpus_is_one_copy_per_gpu():
    plan = plan_launch(1, 1, 4, "trtllm")
    assert plan.copies == ((0,), (1,), (2,), (3,)) and plan.trtllm_mode == "orchestrator"


def test_leftover_gpus_are_named_idle():
    plan = plan_launch(4, 1, 6, "trtllm")
    assert plan.copies == ((0, 1, 2, 3),) and plan.idle_devices == (4, 5)
    assert any("4, 5 stay idle" in n for n in plan.notes)


def test_max_is_all_gpus_divided_by_pp():
    assert plan_launch("max", 1, 8, "trtllm").tensor_parallel == 8
    plan = plan_launch("max", 2, 8, "trtllm")
    assert (plan.tensor_parallel, plan.pipeline_parallel, plan.num_copies) == (4, 2, 1)
    assert any("max → 4" in n for n in plan.notes)
    assert plan_launch("max", 1, 0, "trtllm").tensor_parallel == 1  # CPU: at least 1


def test_max_with_fewer_gpus_than_pp_is_an_error():
    with pytest.raises(LaunchError, match=r"option.pipeline_parallel_degree=4 needs at least 4 GPUs.*2 GPU"):
        plan_launch("max", 4, 2, "trtllm")


def test_tp_above_visible_gpus_names_the_option_and_the_count():
    with pytest.raises(LaunchError) as e:
        plan_launch(8, 1, 4, "trtllm")
    msg = str(e.value)
    assert "option.tensor_parallel_degree=8" in msg and "4 GPU(s) are visible" in msg and "at most 4" in msg
    assert isinstance(e.value, ConfigError)
    with pytest.raises(
        LaunchError,
        match=r"option.tensor_parallel_degree=2 × option.pipeline_parallel_degree=2 "
        r"needs 4 GPUs, but 2 GPU",
    ):
        plan_launch(2, 2, 2, "trtllm")


def test_cpu_host_keeps_the_ranks_and_one_copy():
    plan = plan_launch(2, 1, 0, "trtllm")
    assert plan.copies == ((),) and plan.mpi_ranks == 2 and plan.trtllm_mode == "leader"
    assert plan_launch(1, 1, 0, "trtllm").needs_mpi is False


def test_torch_is_one_copy_per_gpu_and_one_on_cpu():
    assert plan_launch(1, 1, 0, "torch").copies == ((),)
    plan = plan_launch(1, 1, 2, "torch")
    assert plan.copies == ((0,), (1,)) and not plan.needs_mpi and plan.trtllm_mode is None
    assert [p.torch_device for p in plan.placements()] == ["cuda:0", "cuda:1"]
    assert plan.placements()[0].orchestrator is False


def test_torch_with_max_runs_copies_and_says_so():
    plan = plan_launch("max", 1, 4, "torch")
    assert plan.num_copies == 4 and plan.tensor_parallel == 1
    assert any("no tensor parallelism" in n for n in plan.notes)


def test_tensor_parallel_is_trtllm_only():
    with pytest.raises(LaunchError, match=r"option.tensor_parallel_degree=2.*only the trtllm engine.*4 copies"):
        plan_launch(2, 1, 4, "torch")
    with pytest.raises(LaunchError, match="option.pipeline_parallel_degree=2"):
        plan_launch(1, 2, 0, "torch")


def test_synthetic_ignores_gpus_and_parallelism():
    plan = plan_launch(4, 1, 8, "synthetic")
    assert plan.copies == ((),) and not plan.needs_mpi and plan.notes


def test_bad_inputs():
    with pytest.raises(LaunchError, match="engine 'vllm'"):
        plan_launch(1, 1, 1, "vllm")
    with pytest.raises(LaunchError, match="option.tensor_parallel_degree=0"):
        plan_launch(0, 1, 1, "trtllm")
    with pytest.raises(ValueError, match="gpu_count"):
        plan_launch(1, 1, -1, "trtllm")


def test_plan_for_config_uses_the_options():
    config = LmiConfig(tensor_parallel_degree="max", pipeline_parallel_degree=2)
    assert plan_for(config, "trtllm", 8).tensor_parallel == 4
    cpu = LmiConfig(device="cpu")
    assert plan_for(cpu, "torch", 4).copies == ((),)  # option.device=cpu: no GPU copies


# ------------------------------------------------------------------ MPI flavour and command lines


OPEN_MPI_4 = "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPEN_MPI_5 = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
HYDRA = (
    "HYDRA build details:\n    Version:                                 5.0.2\n"
    "    Release Date:                            Fri Sep 25 20:45:26 UTC 2026\n"
)


def test_parse_mpi_version():
    assert parse_mpi_version(OPEN_MPI_4) == ("openmpi", "4.1.4")
    assert parse_mpi_version(OPEN_MPI_5) == ("openmpi", "5.0.11")
    assert parse_mpi_version(HYDRA) == ("mpich", "5.0.2")
    # mpi4py's MPI.Get_library_version() strings
    assert parse_mpi_version("MPICH Version:      5.0.2\nMPICH Release date: ...") == ("mpich", "5.0.2")
    assert parse_mpi_version("Open MPI v4.1.5, package: Open MPI root@host Distribution") == ("openmpi", "4.1.5")
    assert parse_mpi_version("Intel(R) MPI Library 2021.10 for Linux* OS") == ("mpich", "2021.10")
    assert parse_mpi_version("bash: mpirun: command not found") is None


def test_probe_mpi_runs_version(tmp_path):
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\nprintf '{OPEN_MPI_4}'\n")
    fake.chmod(0o755)
    runtime = probe_mpi(which=lambda name: str(fake) if name == "mpirun" else None)
    assert (runtime.flavour, runtime.version, runtime.launcher) == ("openmpi", "4.1.4", str(fake))
    with pytest.raises(LaunchError, match="neither mpirun nor mpiexec"):
        probe_mpi(which=lambda name: None)


def test_open_mpi_command_has_djls_flags_and_exports_the_environment():
    plan = plan_launch(2, 1, 3, "trtllm")  # one copy on GPUs 0,1; GPU 2 idle
    env = {
        "PATH": "/usr/bin",
        "OPTION_MODEL_ID": "s3://m/x",
        "HF_TOKEN": "t",
        "OMPI_COMM_WORLD_SIZE": "9",
        "PMIX_RANK": "0",
        "PWD": "/x",
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
    }
    cmd = mpi_command(plan, "openmpi", RANK, launcher="/opt/ompi/bin/mpirun", env=env)
    assert cmd[:3] == ["/opt/ompi/bin/mpirun", "-n", "2"]
    head = cmd[: len(cmd) - len(RANK)]
    for flag in ("--allow-run-as-root", "--oversubscribe", "--tag-output"):
        assert flag in head
    assert head[head.index("--bind-to") + 1] == "none"
    exported = [head[i + 1] for i, a in enumerate(head) if a == "-x"]
    assert {"PATH", "OPTION_MODEL_ID", "HF_TOKEN"} <= set(exported)
    assert not any(x.startswith(("OMPI_", "PMIX_")) or x == "PWD" for x in exported)
    # the copy's GPUs, through the parent's CUDA_VISIBLE_DEVICES; set once
    assert [x for x in exported if x.startswith("CUDA_VISIBLE_DEVICES")] == ["CUDA_VISIBLE_DEVICES=4,5"]
    assert cmd[-len(RANK) :] == RANK


def test_mpich_command_uses_genv():
    plan = plan_launch(2, 1, 2, "trtllm")
    cmd = mpi_command(plan, "mpich", RANK, env={"PATH": "/usr/bin"})
    assert cmd == ["mpiexec", "-n", "2", "-bind-to", "none", "-genv", "CUDA_VISIBLE_DEVICES", "0,1", *RANK]


def test_cpu_and_orchestrator_commands_do_not_restrict_devices():
    cpu = mpi_command(plan_launch(2, 1, 0, "trtllm"), "mpich", RANK, env={})
    assert cpu == ["mpiexec", "-n", "2", "-bind-to", "none", *RANK]
    orch = mpi_command(plan_launch(1, 1, 4, "trtllm"), "openmpi", RANK, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert orch[:3] == ["mpirun", "-n", "1"]
    assert "CUDA_VISIBLE_DEVICES" in orch and not any(a.startswith("CUDA_VISIBLE_DEVICES=") for a in orch)


def test_mpi_command_refuses_plans_without_mpi_and_unknown_flavours():
    with pytest.raises(ValueError, match="without MPI"):
        mpi_command(plan_launch(1, 1, 1, "trtllm"), "mpich", RANK)
    with pytest.raises(ValueError, match="flavour"):
        mpi_command(plan_launch(2, 1, 2, "trtllm"), "lam", RANK)  # type: ignore[arg-type]


def test_helpers():
    assert visible_device_ids((2, 3), {}) == "2,3"
    assert visible_device_ids((0, 1), {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b,GPU-c"}) == "GPU-a,GPU-b"
    assert forwarded_env_names({"A": "1", "bad-name": "x", "PMI_RANK": "0", "HYDRA_X": "1", "_": "x"}) == ["A"]
    argv = rank_argv(["--log-level", "DEBUG", "serve", "--model-id", "/m"])
    assert argv[:3] == [sys.executable, "-m", "lmi_trt"] and argv[-1] == UNDER_MPI_FLAG
    assert rank_argv(argv[3:]).count(UNDER_MPI_FLAG) == 1


def test_plan_is_a_value():
    assert plan_launch(2, 1, 4, "trtllm") == plan_launch(2, 1, 4, "trtllm")
    assert isinstance(plan_launch(1, 1, 0, "torch"), LaunchPlan)


def test_trtllm_copy_settings():
    from lmi_trt.engines.trtllm import TrtllmSettings
    from lmi_trt.launch import Placement, trtllm_copy_settings

    s = trtllm_copy_settings(TrtllmSettings(), Placement(1, (2, 3), orchestrator=True))
    assert s.device_ids == (2, 3) and s.orchestrator is True


# ------------------------------------------------------------------ ranks (MPI replaced by a stub)


class _Aborted(Exception):
    pass


class _Request:
    def __init__(self, done: bool):
        self.done = done

    def Test(self) -> bool:
        return self.done


class _Comm:
    def __init__(self, others_arrive: bool = True):
        self.others_arrive = others_arrive
        self.aborted: int | None = None

    def Dup(self):
        return self

    def Ibarrier(self):
        return _Request(self.others_arrive)

    def Abort(self, code):
        self.aborted = code
        raise _Aborted(code)


class _MPI:
    def __init__(self, comm):
        self.COMM_WORLD = comm


def _world(rank=0, size=2, others_arrive=True):
    from lmi_trt.launch import MpiWorld

    comm = _Comm(others_arrive)
    return MpiWorld(rank, size, _MPI(comm)), comm


@pytest.fixture
def keep_signals():
    """A rank installs signal handlers and log formatters for its process; undo them after each test."""
    import logging
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    formatters = {h: h.formatter for h in logging.getLogger().handlers}
    yield
    for s, h in saved.items():
        signal.signal(s, h)
    for h, f in formatters.items():
        h.setFormatter(f)


TP2 = plan_launch(2, 1, 0, "trtllm")


def test_rank0_failure_aborts_the_job(keep_signals):
    from lmi_trt.launch import run_rank

    world, comm = _world()
    with pytest.raises(_Aborted):
        run_rank(world, TP2, serve_http=lambda: 1, load_follower=None)
    assert comm.aborted == 1

    def crash():
        raise RuntimeError("boom")

    world, comm = _world()
    with pytest.raises(_Aborted):
        run_rank(world, TP2, serve_http=crash, load_follower=None)
    assert comm.aborted == 1


def test_clean_exit_needs_every_rank_at_the_goodbye(keep_signals):
    from lmi_trt.launch import run_rank

    world, comm = _world()
    assert run_rank(world, TP2, serve_http=lambda: 0, load_follower=None) == 0 and comm.aborted is None
    world, comm = _world(others_arrive=False)  # a follower never released: abort instead of hanging
    with pytest.raises(_Aborted):
        run_rank(world, TP2, serve_http=lambda: 0, load_follower=None, goodbye_timeout=0.05)
    assert comm.aborted == 1


def test_world_size_must_match_the_plan(keep_signals):
    from lmi_trt.launch import run_rank

    world, comm = _world(size=3)
    with pytest.raises(_Aborted):
        run_rank(world, TP2, serve_http=lambda: 0, load_follower=None)
    assert comm.aborted == 2


class _Engine:
    def __init__(self, leader=False, wait=None):
        self.is_leader = leader
        self._wait = wait

    def wait_for_shutdown(self):
        self._wait()


def _loaded(engine):
    from types import SimpleNamespace

    async def load():
        return SimpleNamespace(engine=engine)

    return load


def test_follower_waits_for_the_leader_and_gives_up_after_a_stop_signal(keep_signals):
    import os
    import signal
    import threading
    import time

    from lmi_trt.launch import run_follower, run_rank

    assert run_follower(_loaded(_Engine(wait=lambda: None)), grace=5) == 0  # the leader shut down
    assert run_follower(_loaded(_Engine(leader=True)), grace=5) == 1

    def boom():
        raise RuntimeError("executor died")

    assert run_follower(_loaded(_Engine(wait=boom)), grace=5) == 1
    never = threading.Event()
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
    t0 = time.monotonic()
    assert run_follower(_loaded(_Engine(wait=never.wait)), grace=0.3) == 1  # the leader never shut down
    assert time.monotonic() - t0 < 5
    never.set()

    async def failing_load():
        raise RuntimeError("rank1.engine: Failed to deserialize")

    world, comm = _world(rank=1)
    with pytest.raises(_Aborted):
        run_rank(world, TP2, serve_http=None, load_follower=failing_load)
    assert comm.aborted == 1
