"""TP=2 under MPI on the CPU, with the fake TensorRT-LLM Executor (leader mode), as real processes:
``lmi-trt serve`` re-executes itself under ``mpiexec -n 2`` (PyPI MPICH); rank 0 serves HTTP, rank 1
follows; the ranks end together on SIGTERM and when one of them fails, within bounded times.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from cliserver import free_port
from tinymodels import tiny_model
from trtllm_testing import FAKE_GPU, FAKES, fake_tensorrt_llm, make_engine_dir

# The waits below (readiness, then END_S for the job to end) are bounds that hold under load; the
# per-test limit covers both.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

BIN = Path(sys.executable).parent
if shutil.which("mpiexec", path=str(BIN)) is None:
    pytest.skip("the mpich launcher (pip install mpich) is not in the venv", allow_module_level=True)

READY_S = 240.0  # two ranks and two front ends importing torch on a loaded 2-core machine (90 s ran out in a CI run)
END_S = 180.0  # the job must be gone this long after a stop or a failure (a bound that holds under load)


@pytest.fixture(scope="module")
def hf_dir():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def engine_dir(hf_dir, tmp_path_factory):
    with fake_tensorrt_llm():
        return make_engine_dir(
            hf_dir,
            tmp_path_factory.mktemp("tp2") / "engine",
            tp_size=2,
            max_batch_size=4,
            max_input_len=64,
            max_seq_len=96,
        )


@pytest.fixture(scope="module")
def site_dir():
    return FAKE_GPU  # the one hardware seam, in every process of the job: this machine has no GPU


def _env(site_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_", "PMI_", "OMPI_"))}
    env.update(
        {
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join([str(site_dir), str(FAKES), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "HF_HUB_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def _serve_args(engine: Path, hf_dir: Path, port: int, **options: object) -> list[str]:
    """``serve`` of the engine, TP=2 unless ``options`` (option.NAME=value, or a top-level key) say otherwise."""
    options = {"option.tensor_parallel_degree": 2, **options}
    base = {"option.max_input_len": 64, "option.max_output_len": 32, "option.max_rolling_batch_size": 4}
    args = ["serve", "--model-id", str(engine), "--engine", "trtllm", "--port", str(port)]
    for key, value in {"option.tokenizer_id": hf_dir, **base, **options}.items():
        args += ["-o", f"{key}={value}"]
    return args


def _invoke(job: Job) -> None:
    r = requests.post(
        job.url + "/invocations",
        json={"inputs": "The quick brown fox", "parameters": {"max_new_tokens": 8}},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["generated_text"], r.text


def _job_pids(token: str) -> list[int]:
    """Processes of this test's job (their command line names the unique port)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if token in cmdline and "zombie" not in state:
            pids.append(int(entry.name))
    return pids


def _rank_pid(token: str, rank: int) -> int | None:
    for pid in _job_pids(token):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"lmi_trt" in cmdline and f"PMI_RANK={rank}".encode() in environ:
            return pid
    return None


class Job:
    def __init__(self, cmd: list[str], env: dict[str, str], log_path: Path, port: int):
        self.port, self.token, self.log_path = port, f"--port {port}", log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the job ended with {self.proc.returncode}:\n{self.log()[-4000:]}"
            try:
                if requests.get(self.url + "/ping", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"not ready after {READY_S}s:\n{self.log()[-4000:]}")

    def wait_end(self) -> int:
        try:
            return self.proc.wait(timeout=END_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not end within {END_S}s:\n{self.log()[-4000:]}") from None

    def leftovers(self) -> list[int]:
        deadline = time.monotonic() + 5
        while (pids := _job_pids(self.token)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return pids

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in _job_pids(self.token):  # only this job's processes, by their unique port
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("frontends", [1, 2])
def test_rank0_serves_rank1_follows_and_sigterm_ends_both(engine_dir, hf_dir, site_dir, tmp_path, frontends):
    """With option.api_server_count=2 rank 0 is the engine's process and its two front ends serve HTTP."""
    port = free_port()
    job = Job(
        [
            sys.executable,
            "-m",
            "lmi_trt",
            *_serve_args(engine_dir, hf_dir, port),
            "-o",
            f"option.api_server_count={frontends}",
        ],
        _env(site_dir),
        tmp_path / "job.log",
        port,
    )
    try:
        job.wait_ready()
        _invoke(job)
        stream = requests.post(
            job.url + "/generate_stream",
            json={"inputs": "Once upon a time", "parameters": {"max_new_tokens": 4}},
            timeout=60,
        )
        assert stream.status_code == 200 and stream.text.count("data:") >= 1, stream.text
        log = job.log()
        tail = log[-4000:]
        assert "mpirun -n 2" in log and "--under-mpi" in log, tail  # relaunched itself under MPI
        assert log.count("listening on http://") == frontends, tail
        listener = "rank0" if frontends == 1 else "frontend1"
        assert f"{listener} INFO lmi_trt.serving.app: listening" in log, tail
        assert "rank1 INFO lmi_trt.launch: follower rank ready" in log, tail  # rank 1 follows, serves nothing
        assert _rank_pid(job.token, 0) and _rank_pid(job.token, 1), _job_pids(job.token)

        job.proc.send_signal(signal.SIGTERM)
        rc = job.wait_end()
        log = job.log()
        assert rc == 0, log[-4000:]
        assert "the leader shut the engine down; follower rank exiting" in log, log[-4000:]
        assert job.leftovers() == [], "processes of the job are still running"
    finally:
        job.cleanup()


def test_a_failing_follower_ends_the_job_with_an_error(engine_dir, hf_dir, site_dir, tmp_path):
    broken = tmp_path / "engine"
    shutil.copytree(engine_dir, broken)
    (broken / "rank1.engine").write_text("not a TensorRT plan")  # only rank 1 fails to load
    port = free_port()
    job = Job(
        [sys.executable, "-m", "lmi_trt", *_serve_args(broken, hf_dir, port)],
        _env(site_dir),
        tmp_path / "job.log",
        port,
    )
    try:
        rc = job.wait_end()
        log = job.log()
        assert rc != 0, log[-4000:]
        # Why, said by the launching process from the rank's report: the rank's own lines can be lost, since
        # MPI_Abort can tear the job down before mpirun forwards its last stderr bytes (seen in CI under load).
        assert re.search(r"the MPI job was aborted: rank 1 failed: .*Failed to deserialize", log), log[-4000:]
        assert job.leftovers() == []  # the job ended and no rank outlives it: that is the abort
    finally:
        job.cleanup()


def test_user_started_mpiexec_is_detected_and_a_dead_leader_ends_the_followers(engine_dir, hf_dir, site_dir, tmp_path):
    """DJL-style: the job is started by `mpiexec -n 2 lmi-trt serve` (no relaunch); then rank 0 is killed."""
    port = free_port()
    cmd = [str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "lmi_trt", *_serve_args(engine_dir, hf_dir, port)]
    job = Job(cmd, _env(site_dir), tmp_path / "job.log", port)
    try:
        job.wait_ready()
        assert "starting the ranks" not in job.log()  # already under MPI: no nested mpirun
        leader = _rank_pid(job.token, 0)
        assert leader is not None
        os.kill(leader, signal.SIGKILL)
        rc = job.wait_end()  # within END_S
        assert rc != 0
        assert job.leftovers() == [], "the follower outlived its leader"
    finally:
        job.cleanup()


def test_a_draft_model_runs_under_mpiexec_n_1_in_orchestrator_mode(hf_dir, tmp_path):
    """option.speculative_draft_model puts two orchestrator-mode Executors in the process, each spawning its worker:
    ``serve`` re-executes itself under ``mpiexec -n 1`` for them (lmi_trt.launch's docstring), and serves."""
    # draft tokens run on the Executor of 1.0-1.2 (0.12 is refused, 1.3 has no Executor): the leg's release if one
    leg = os.environ.get("LMI_TRT_FAKE_RELEASE", "")
    release = leg if leg in ("1.0.0", "1.1.0", "1.2.1") else "1.2.1"
    build = dict(max_batch_size=4, max_input_len=95, max_seq_len=96)
    with fake_tensorrt_llm(release):
        from tensorrt_llm.models.modeling_utils import SpeculativeDecodingMode

        target = make_engine_dir(
            hf_dir,
            tmp_path / "target",
            **build,
            max_draft_len=5,  # DJL's default speculative_length
            speculative_decoding_mode=SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL,
        )
    port = free_port()
    args = _serve_args(
        target,
        hf_dir,
        port,
        **{
            "option.tensor_parallel_degree": 1,
            "option.speculative_draft_model": hf_dir,  # built by the compile stage (JIT)
            "option.draft_kv_cache_free_gpu_mem_fraction": 0.1,
            "download_dir": tmp_path / "dl",  # the draft's engine is built and cached there
        },
    )
    site = tmp_path / "site"  # the hardware seams: a GPU for the Executor, and the GPU the compile stage builds for
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        (FAKE_GPU / "sitecustomize.py").read_text()
        + "import lmi_trt.compile.jit as _jit\nfrom lmi_trt.compile.plan import GpuFacts as _Gpu\n"
        + '_jit._host_gpu = lambda: _Gpu(name="NVIDIA H100 80GB HBM3", sm=90, memory_gib=80, count=1)\n'
    )
    env = {**_env(site), "LMI_TRT_FAKE_RELEASE": release}
    job = Job([sys.executable, "-m", "lmi_trt", *args], env, tmp_path / "job.log", port)
    try:
        job.wait_ready()
        _invoke(job)
        log = job.log()
        assert "mpirun -n 1" in log and "--under-mpi" in log, log[-4000:]  # relaunched itself under MPI
        assert "MPI orchestrator mode" in log and "draft model" in log, log[-4000:]
        job.proc.send_signal(signal.SIGTERM)
        assert job.wait_end() == 0, job.log()[-4000:]
        assert job.leftovers() == []
    finally:
        job.cleanup()
