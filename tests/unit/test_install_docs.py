"""README's two install commands (issue 12, item 3): CI runs the development one verbatim, and both
take torch from PyTorch's CPU index (PyPI's Linux torch is a CUDA build) without stalling where
that index cannot be reached."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"


def _commands_after(readme: str, lead: str) -> str:
    block = re.search(re.escape(lead) + r".*?```bash\n(.*?)\n```", readme, re.S)
    assert block, lead
    return block.group(1).strip()


def test_ci_runs_the_readme_development_install_verbatim():
    readme = (ROOT / "README.md").read_text()
    develop = _commands_after(readme, "To develop")
    pip = develop.split(" && ")[-1]
    assert pip.startswith("pip install ") and pip.endswith('-e ".[test]"'), develop
    # .ci/run chains its steps with && (a failed install must stop the run)
    ci_lines = [line.strip().removesuffix(" &&") for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert pip in ci_lines, (pip, ci_lines)


def test_both_installs_take_the_cpu_torch_and_do_not_retry_an_unreachable_index():
    readme = (ROOT / "README.md").read_text()
    serve, develop = _commands_after(readme, "To serve on a CPU host"), _commands_after(readme, "To develop")
    assert serve.endswith("-e .") and develop.endswith('-e ".[test]"')
    for command in (serve, develop):
        assert command.count("&&") == 2 and "\n" not in command  # one command: venv, activate, install
        assert CPU_INDEX in command and "--retries 0" in command and '"torch==2.13.0"' in command


def test_the_test_extra_has_what_the_notebook_and_plot_tests_import():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names: set[str] = set()
    pending = ["test"]
    while pending:  # an extra may pull in another of ours ("lmi-trt[test-core]")
        for spec in extras[pending.pop()]:
            name = re.split(r"[<>=\[; ]", spec, maxsplit=1)[0].lower()
            if name == "lmi-trt":
                pending.extend(re.search(r"\[(.*)\]", spec).group(1).split(","))
            names.add(name)
    assert {"nbformat", "nbclient", "ipykernel", "matplotlib", "sagemaker", "moto"} <= names


def test_the_quick_start_install_has_constrained_decoding():
    """`-e .` installs xgrammar (response_format, tool_choice, TGI grammar failed with a 400 after the Quick start),
    at the floor the torch engine's 400 and start-up notice name when it is missing."""
    import tomllib

    from lmi_trt.engines.torch.engine import XGRAMMAR_MISSING

    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (xgrammar,) = [d for d in dependencies if d.startswith("xgrammar")]
    assert f'pip install "{xgrammar}"' in XGRAMMAR_MISSING


def test_the_quick_start_says_what_the_installs_share_and_what_pytest_needs():
    readme = (ROOT / "README.md").read_text()
    quick = readme[readme.index("## Quick start") : readme.index("## Configuration")]
    installs = quick[quick.index("To develop") : quick.index("Get a model folder")]
    assert "same `.venv`" in installs
    before_pytest = quick[: quick.index("```bash\npytest\n```")].rstrip()
    assert "need the development install" in before_pytest[before_pytest.rindex("\n\n") :]
