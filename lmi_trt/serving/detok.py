"""Incremental, multi-byte-safe detokenization (the vLLM/TGI prefix-offset technique).

Decoding token by token loses information: byte-level BPE splits one character over several
tokens, and SentencePiece drops the leading space of the first token in a decoded sequence.
So each step decodes a short sliding window — the tokens of the previous emission ("prefix")
plus the tokens not yet emitted — and emits only the text beyond the prefix's text. While
that text ends in U+FFFD the tail is an incomplete UTF-8 character and is held back.

The window only ever holds the last emission plus held tokens (at most ``MAX_HELD_TOKENS``),
so the cost per token stays flat however long the output grows. In the common case (the
previous emission was one token) a step costs one decode of a two-token window: the length of
a one-token prefix comes from ``TokenLengths``, a cache shared by all requests of a server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

REPLACEMENT = "\ufffd"
# Text before a trailing run of U+FFFD is final (only the unfinished tail can still change),
# so it is emitted at once and the window keeps growing only while the tail stays broken.
# A random model can emit invalid bytes for ever; past this many held tokens the window
# slides anyway, emitting the U+FFFD as decode() shows it, so the cost stays bounded.
MAX_HELD_TOKENS = 16
# Prompt tokens decoded as left context, so the first generated token keeps its leading space.
PROMPT_CONTEXT_TOKENS = 5
# Drop consumed ids from the front of the buffer now and then; a list delete is a memmove.
_TRIM_AT = 1024


def make_decode(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``ids -> text`` equal to ``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Fast tokenizers: call the Rust decoder directly; transformers' wrapper only adds
        # Python overhead and the clean-up pass, which rewrites already-streamed text.
        return partial(backend.decode, skip_special_tokens=skip_special_tokens)
    return partial(tokenizer.decode, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


class TokenLengths(dict):
    """``len(decode([token_id]))`` per token id, filled on first use.

    The length of a one-token prefix is all a step needs besides the window's own decode, and it
    depends on nothing but the token id and the decode function; one cache per decode function
    (per server and ``skip_special_tokens``) serves every request. At most one entry per vocab id.
    """

    __slots__ = ("_decode",)

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        super().__init__()
        self._decode = decode

    def __missing__(self, token_id: int) -> int:
        n = len(self._decode([token_id]))
        self[token_id] = n
        return n


class IncrementalDetokenizer:
    """Turns generated token ids into text pieces whose concatenation equals decoding them all at once."""

    __slots__ = ("_decode", "_emitted", "_ids", "_lengths", "_prefix_len", "_prefix_offset", "_read_offset")

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        decode: Callable[[list[int]], str] | None = None,
        token_lengths: TokenLengths | None = None,
    ) -> None:
        """``token_lengths`` must cache the same ``decode`` (``TokenLengths(decode)``); a private one when omitted."""
        self._decode = decode or make_decode(tokenizer, skip_special_tokens)
        self._lengths = token_lengths if token_lengths is not None else TokenLengths(self._decode)
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)  # ids before this have been emitted (or are context)
        self._prefix_len = len(self._decode(context)) if context else 0
        self._emitted = 0  # chars of the window's text beyond the prefix already emitted

    def step(self, token_id: int) -> str:
        """Add one token; return the text that became final ("" while holding back)."""
        ids = self._ids
        ids.append(token_id)
        text = self._decode(ids[self._prefix_offset :])
        start = self._prefix_len + self._emitted
        n = len(ids)
        read = self._read_offset
        if n - read < MAX_HELD_TOKENS:
            if text[-1:] == REPLACEMENT:  # an unfinished character: emit what precedes it
                stable = len(text.rstrip(REPLACEMENT))
                if stable <= start:
                    return ""
                self._emitted = stable - self._prefix_len
                return text[start:stable]
            if len(text) <= start:
                # Nothing visible yet (e.g. skipped special tokens). Sliding now would leave a
                # prefix without text, and SentencePiece would then strip the next token's space.
                return ""
        # Emit everything and slide the window: the tokens just emitted become the prefix
        # (as in _emit, inlined: this is the per-token path).
        self._emitted = 0
        self._prefix_offset = read
        self._read_offset = n
        self._prefix_len = self._lengths[token_id] if n - read == 1 else len(self._decode(ids[read:n]))
        if read >= _TRIM_AT:
            del ids[:read]
            self._read_offset = n - read
            self._prefix_offset = 0
        return text[start:]

    def step_many(self, token_ids: Sequence[int]) -> list[str]:
        """``[step(t) for t in token_ids]``: the pieces of one engine delta, in one call."""
        step = self.step
        return [step(t) for t in token_ids]

    def finish(self) -> str:
        """Flush what is held at the end of generation, an incomplete character included (as decode() shows it)."""
        if self._read_offset >= len(self._ids):
            return ""
        return self._emit(self._decode(self._ids[self._prefix_offset :]), self._prefix_len + self._emitted)

    def _emit(self, text: str, start: int) -> str:
        piece = text[start:]
        self._emitted = 0
        ids = self._ids
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)
        self._prefix_len = len(self._decode(ids[self._prefix_offset : self._read_offset]))
        if self._prefix_offset >= _TRIM_AT:
            del ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return piece
