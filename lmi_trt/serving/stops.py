"""Server-side stop strings, matched on the detokenized text across token boundaries.

Stop strings cannot be left to the engine as token ids: the same text tokenizes differently
depending on its neighbours. The matcher holds back the longest tail of the text that could
still grow into a stop string, and on a match returns the text before it.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    __slots__ = ("_held", "_max_hold", "_prefixes", "_stops", "matched")

    def __init__(self, stops: Sequence[str]) -> None:
        if not stops or any(not s for s in stops):
            raise ValueError(f"stop strings must be non-empty, got {list(stops)!r}")
        self._stops = tuple(stops)
        # Every proper prefix of every stop string: a tail equal to one of them is held back.
        self._prefixes = frozenset(s[:k] for s in self._stops for k in range(1, len(s)))
        self._max_hold = max(len(s) for s in self._stops) - 1
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, piece: str) -> str:
        """Add newly decoded text; return what is safe to emit. After a match this is the
        text before the stop string, ``matched`` is set, and later pieces are ignored."""
        if self.matched is not None or not piece:
            return ""
        buf = self._held + piece
        best = -1
        for stop in self._stops:
            i = buf.find(stop)
            if i != -1 and (best == -1 or i < best):
                best, self.matched = i, stop
        if best != -1:
            self._held = ""
            return buf[:best]
        hold = self._hold_len(buf)
        cut = len(buf) - hold
        self._held = buf[cut:]
        return buf[:cut]

    def flush(self) -> str:
        """The held-back tail, at the end of generation (it never completed a stop string)."""
        held, self._held = self._held, ""
        return held

    def _hold_len(self, buf: str) -> int:
        for k in range(min(len(buf), self._max_hold), 0, -1):
            if buf[-k:] in self._prefixes:
                return k
        return 0
