"""Prompt lookup (n-gram drafting) over one token sequence, shared by the engines that draft on the host: the torch
engine's decode loop (``lmi_trt.engines.torch.speculation``) and the Executor's draft-token loop
(``lmi_trt.engines.trtllm_drafts``). Pure Python, no torch."""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """Prompt lookup over one sequence: the continuation of the latest (or, ``oldest``, the first)
    earlier occurrence of its last n tokens, for the largest n in [low, high] that occurs. Indexed
    incrementally, so a step costs (high − low + 1) dictionary probes per new token."""

    def __init__(self, low: int, high: int, oldest: bool) -> None:
        self.low, self.high, self.oldest = low, high, oldest
        self.tokens: list[int] = []
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(high + 1)]  # n-gram → end of a match

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens``: each n-gram ending where the sequence ended becomes an earlier occurrence."""
        for token in tokens:
            end = len(self.tokens)
            for n in range(self.low, min(self.high, end) + 1):
                gram = tuple(self.tokens[end - n : end])
                if self.oldest:
                    self._ends[n].setdefault(gram, end)
                else:
                    self._ends[n][gram] = end
            self.tokens.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest matching n-gram (none: no match)."""
        for n in range(min(self.high, len(self.tokens)), self.low - 1, -1):
            end = self._ends[n].get(tuple(self.tokens[-n:]))
            if end is not None:
                return self.tokens[end : end + k]
        return []
