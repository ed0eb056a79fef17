"""Server-side stop strings, matched on the detokenized text across token boundaries.

Stop strings cannot be left to the engine as token ids: the same text tokenizes differently
depending on its neighbours. The matcher holds back the longest tail of the text that could
still grow into a stop string, and on a match returns the text before it.

Matching is one Knuth–Morris–Pratt automaton per stop string: building it is linear in the stop
string and each character of output advances every automaton in amortized constant time, so a
request's cost is linear in its text and its stop strings (no table of every prefix).
"""

from __future__ import annotations

from collections.abc import Sequence


def _failure(s: str) -> list[int]:
    """KMP failure function: fail[i] = length of the longest proper border of s[:i + 1]."""
    fail = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = fail[k - 1]
        if s[i] == s[k]:
            k += 1
        fail[i] = k
    return fail


class StopMatcher:
    __slots__ = ("_fails", "_held", "_states", "_stops", "matched")

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty, got {list(stops)!r}")
        self._stops = tuple(stops)
        self._fails = [_failure(s) for s in self._stops]
        # Per stop string: how many of its first characters the text currently ends with.
        self._states = [0] * len(self._stops)
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, piece: str) -> str:
        """Add newly decoded text; return what is safe to emit. After a match this is the
        text before the stop string, ``matched`` is set, and later pieces are ignored.
        Where several stop strings complete at the same character, the longest wins."""
        if self.matched is not None or not piece:
            return ""
        stops, fails, states = self._stops, self._fails, self._states
        for pos, c in enumerate(piece):
            done = -1
            for j, s in enumerate(stops):
                k = states[j]
                while k and s[k] != c:
                    k = fails[j][k - 1]
                if s[k] == c:
                    k += 1
                if k == len(s):
                    if done == -1 or len(s) > len(stops[done]):
                        done = j
                    k = fails[j][k - 1]
                states[j] = k
            if done != -1:
                self.matched = stops[done]
                buf = self._held + piece[: pos + 1]
                self._held = ""
                return buf[: len(buf) - len(self.matched)]
        buf = self._held + piece
        hold = max(states)  # the longest tail that is still a prefix of some stop string
        cut = len(buf) - hold
        self._held = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        """The held-back tail, at the end of generation (it never completed a stop string)."""
        held, self._held = self._held, ""
        return held
