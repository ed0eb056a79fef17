"""Totals pytest's JUnit XML reports of every CI leg into one closing line: 'total: N passed, N failed, N skipped'."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def main(paths: list[str]) -> None:
    passed = failed = skipped = 0
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as exc:  # a leg that died before pytest wrote its report
            print(f"{path}: no report ({exc})")
            failed += 1
            continue
        for suite in root.iter("testsuite"):
            tests, skips = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
            bad = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
            print(f"{path}: {tests - bad - skips} passed, {bad} failed, {skips} skipped")
            passed, failed, skipped = passed + tests - bad - skips, failed + bad, skipped + skips
    print(f"total: {passed} passed, {failed} failed, {skipped} skipped")


if __name__ == "__main__":
    main(sys.argv[1:])
