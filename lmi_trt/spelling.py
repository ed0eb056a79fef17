"""Which known name a misspelt one means: the one a slip of the keyboard away (``temprature`` → ``temperature``).

Configuration keys and request fields use it to refuse a typo of a known name (a start-up error, a 400) rather
than warn and go on without it. Names are compared folded (lower case, letters and digits only, so
``maxTokens``, ``max-tokens`` and ``max_tokens`` are one name), by optimal-string-alignment distance: the edits
(insert, delete, replace, swap two neighbours) that turn one into the other. One edit for short names, two
from six characters: ``store`` is not a typo of ``stop`` (two edits, five characters).
"""

from __future__ import annotations

from collections.abc import Iterable

_LONG = 6  # folded length from which two edits still count as a typo


def fold(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _distance(a: str, b: str, most: int) -> int:
    """Optimal-string-alignment distance of ``a`` and ``b``, or ``most + 1`` once it is known to exceed ``most``."""
    if abs(len(a) - len(b)) > most:
        return most + 1
    before: list[int] | None = None
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(row[j] + 1, current[j - 1] + 1, row[j - 1] + cost)
            if before is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
        if min(current) > most:
            return most + 1
        before, row = row, current
    return row[-1]


def within_a_typo(name: str, known: Iterable[str]) -> list[str]:
    """The known names ``name`` is within a typo of (the closest, sorted), or [] when it is none's (or is one)."""
    folded = fold(name)
    most = 2 if len(folded) >= _LONG else 1
    by_distance: dict[int, list[str]] = {}
    for candidate in known:
        if candidate == name:
            return []
        d = _distance(folded, fold(candidate), most)
        if d <= most:
            by_distance.setdefault(d, []).append(candidate)
    return sorted(by_distance[min(by_distance)]) if by_distance else []


def did_you_mean(names: list[str]) -> str:
    return " or ".join(names)
