"""pytest imports test modules by basename (rootdir-relative, no packages under tests/): two test files of one
name in different folders stop the whole run at collection ("import file mismatch"), which only the full run sees."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_every_test_file_name_is_unique_across_folders():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "fakes" not in p.parts)
    assert [n for n, c in names.items() if c > 1] == []
