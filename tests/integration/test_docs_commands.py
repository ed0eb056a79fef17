"""The commands of README.md's Quick start, benchmarks/README.md, notebooks/README.md and docker/README.md, as
written, in the order written, against the Quick-start server, wherever this machine can run them.

Each runs with bash from a copy of the repository's layout (links to its files) in a temporary folder, so what
they write (./models/tiny-llama, lmi.json, notebooks/out/) stays there. Servers a block starts (`lmi-trt serve`,
`bare_server.py`) run in the background for the blocks after it, on free ports: their port and the clients'
are the one substitution made. Installs, the test suite itself, the hub, GPUs and Docker are what this machine
cannot run (SKIPPED says why for each); the Docker commands are checked against the Dockerfiles and the CLI
instead. What the commands print is checked where it is the point: the Quick start's JSON answer fits its
schema, its tool call fits the function's parameters, bench prints a table.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SERVERS = ("lmi-trt serve ", "bare_server.py")
BLOCK_TIMEOUT_S = 300


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", text, re.S)


def quick_start() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Quick start") : readme.index("## Configuration")]


def quick_start_setup(server: bool = True) -> list[str]:
    """The Quick start's blocks that make its model and, with ``server``, start its server."""
    wanted = ("tests/tinymodels.py", "lmi-trt serve --properties") if server else ("tests/tinymodels.py",)
    return [b for b in bash_blocks(quick_start()) if any(w in b for w in wanted)]


def benchmarks_to_run() -> str:
    """benchmarks/README.md up to its Results: the recorded runs after it name other hosts, trees and GPUs."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    return text[: text.index("## Results")]


def skipped(block: str) -> str | None:
    """Why this machine cannot run ``block`` as written, or None."""
    if block.startswith("python3 -m venv"):
        return "an install: .ci/run runs the development one verbatim (tests/unit/test_install_docs.py)"
    if block.startswith("pip install"):
        return "an install: the development install has it"
    if block.strip() == "pytest":
        return "the test suite itself"
    if "Qwen/" in block:
        return "needs the Hugging Face hub"
    if "--client-procs 4" in block and (os.cpu_count() or 1) < 6:
        return "written for a host with 6 or more cores"
    if "--cpus" in block and not {0, 1} <= os.sched_getaffinity(0):
        return "pins to CPUs 0 and 1"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Shell:
    """Runs blocks in ``cwd`` with the test's Python first on PATH; keeps the servers blocks started."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.ports: dict[int, int] = {}  # port as written → the free one used
        self.servers: list[subprocess.Popen] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OPTION_", "SERVING_", "HF_MODEL"))}
        self.env.update({"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"})

    def _ported(self, command: str) -> str:
        for written, used in self.ports.items():
            command = re.sub(rf"(localhost|127\.0\.0\.1):{written}\b", rf"\g<1>:{used}", command)
            command = re.sub(rf"--port {written}\b", f"--port {used}", command)
        return command

    def start_server(self, command: str) -> None:
        written = int(m.group(1)) if (m := re.search(r"--port (\d+)", command)) else 8080
        self.ports[written] = port = free_port()
        command = self._ported(command) if "--port" in command else f"{command} --port {port}"
        log = open(self.cwd / f"server-{port}.log", "wb")  # noqa: SIM115 - closed with the server
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.servers.append(proc)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, (command, (self.cwd / f"server-{port}.log").read_text()[-3000:])
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    pass
                if subprocess.run(["curl", "-sf", f"http://127.0.0.1:{port}/ping"], capture_output=True).returncode:
                    raise OSError("not ready")
                return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"{command}: not ready after 180 s")

    def run(self, block: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", self._ported(block)],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        assert done.returncode == 0, (block, done.stdout[-3000:], done.stderr[-3000:])
        return done

    def run_all(self, blocks: list[str]) -> dict[str, subprocess.CompletedProcess]:
        """Every block that can run here, in order; {block: its result}. Prints what was skipped and why."""
        results = {}
        for block in blocks:
            why = skipped(block)
            if why is not None:
                print(f"SKIPPED ({why}): {block.splitlines()[0]}")
            elif any(s in block for s in SERVERS) and "bench" not in block.split()[0]:
                self.start_server(block.strip())
            else:
                t0 = time.monotonic()
                results[block] = self.run(block)
                print(f"ran ({time.monotonic() - t0:.0f} s): {block.splitlines()[0]}")
        return results

    def stop(self) -> None:
        for proc in self.servers:
            proc.send_signal(signal.SIGTERM)
        for proc in self.servers:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def shell(tmp_path):
    """A layout like the repository's: links to its files, a real notebooks/ folder (for notebooks/out)."""
    for entry in ROOT.iterdir():
        if entry.name in (".git", ".venv", "models", "notebooks") or entry.name.startswith(".ci"):
            continue
        (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / "notebooks").mkdir()
    for entry in (ROOT / "notebooks").glob("*.*"):
        (tmp_path / "notebooks" / entry.name).symlink_to(entry)
    sh = Shell(tmp_path)
    yield sh
    sh.stop()


def _body(block: str) -> dict:
    return json.loads(re.search(r"-d '(.*)'", block, re.S).group(1))


def test_readme_quick_start(shell):
    blocks = bash_blocks(quick_start())
    results = shell.run_all(blocks)
    out = {b: r.stdout for b, r in results.items()}
    (lmi,) = [o for b, o in out.items() if "/invocations" in b]
    assert json.loads(lmi)["details"]["generated_tokens"] == 16
    (streamed,) = [o for b, o in out.items() if '"stream": true' in b]
    events = [e for e in streamed.split("\n\n") if e.strip()]
    assert len(events) > 2 and events[-1] == "data: [DONE]", streamed
    (fmt_block,) = [b for b in out if "response_format" in b]
    answer = json.loads(json.loads(out[fmt_block])["choices"][0]["message"]["content"])
    jsonschema.validate(answer, _body(fmt_block)["response_format"]["json_schema"]["schema"])
    (tool_block,) = [b for b in out if '"tools"' in b]
    (call,) = json.loads(out[tool_block])["choices"][0]["message"]["tool_calls"]
    (tool,) = _body(tool_block)["tools"]
    assert call["function"]["name"] == tool["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    (table,) = [o for b, o in out.items() if b.startswith("lmi-trt bench")]
    assert "out tok/s" in table.splitlines()[0], table


def test_benchmarks_readme(shell):
    shell.run_all(quick_start_setup())
    results = shell.run_all(bash_blocks(benchmarks_to_run()))
    for block, done in results.items():
        for command in block.splitlines():
            if command.startswith("lmi-trt bench") and "--url" in command:
                assert "out tok/s" in done.stdout, (command, done.stdout)
            for flag in ("--json", "--plot"):
                if flag in command and command.startswith(("lmi-trt", "python")):
                    written = shlex.split(command)[shlex.split(command).index(flag) + 1]
                    assert (shell.cwd / written).stat().st_size > 0, (command, written)


def test_notebooks_readme(shell):
    shell.run_all(quick_start_setup(server=False))
    results = shell.run_all(bash_blocks((ROOT / "notebooks" / "README.md").read_text()))
    ran = "".join(done.stdout for done in results.values())
    for name in ("local_docker", "sagemaker_deploy", "aot_compile"):
        assert f"{name}.ipynb: every cell ran" in ran, ran
        assert (shell.cwd / "notebooks" / "out" / f"{name}.ipynb").exists()


def test_docker_readme_builds_the_tags_it_runs_and_its_commands_parse():
    """No Docker here: each build names a Dockerfile whose header gives the same command (one tag per image across
    the Dockerfiles, README.md and the notebooks), each run uses a tag built there, and what runs in the
    container is a command lmi-trt's CLI (through the entrypoint's mapping) accepts."""
    from lmi_trt.cli import build_parser

    text = (ROOT / "docker" / "README.md").read_text()
    commands = [c.replace("\\\n", " ") for block in bash_blocks(text) for c in re.split(r"(?<!\\)\n", block)]
    built = set()
    for command in commands:
        argv = shlex.split(command)
        if argv[:2] == ["docker", "build"]:
            dockerfile, tag = argv[argv.index("-f") + 1], argv[argv.index("-t") + 1]
            header = (ROOT / dockerfile).read_text().split("\nFROM", 1)[0].split("\nARG", 1)[0]
            assert "--build-arg" in argv or command in header, (command, dockerfile)
            built.add(tag)
    assert {"lmi-trt:trtllm", "lmi-trt:cpu"} <= built
    elsewhere = " ".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "notebooks").glob("*.ipynb")])
    tags = set(re.findall(r"lmi-trt:\w[\w.-]*", elsewhere))
    assert tags and tags <= built, tags - built
    runs = [shlex.split(c) for c in commands if c.startswith("docker run")]
    assert runs
    parser = build_parser()
    for argv in runs:
        image = next(a for a in argv if a in built)
        inside = argv[argv.index(image) + 1 :] or ["serve"]
        if inside[0] in ("compile", "partition"):  # the entrypoint runs `lmi-trt compile ARGS`
            inside = ["compile", *inside[1:]]
        elif inside[0] == "lmi-trt":
            inside = inside[1:]
        parser.parse_args(inside)  # SystemExit on a command or flag lmi-trt does not have
