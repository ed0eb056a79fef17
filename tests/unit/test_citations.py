"""Comments cite public sources (a repository and its path), never working documents outside this
repository: a reader of the code cannot open those (issue 14 found sixteen)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The team's working notes that lived beside the repository, by name.
OUTSIDE = re.compile(
    r"\b(trtllm_api\.md|trtllm_llmapi\.md|djl_lmi\.md|peers\.md|environment\.md|"
    r"trtllm_image_pins\.md|DESIGN\.md)|\.\./shared|shared/reference"
)


def test_no_comment_cites_a_document_outside_the_repository():
    offenders = []
    for folder in ("lmi_trt", "tests", "ci", "docker", "benchmarks", ".ci"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in {".py", ".sh", ".txt", ".md", ""} or not path.is_file() or path == Path(__file__):
                continue
            if ".models" in path.parts or "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []
