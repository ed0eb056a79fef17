"""Incremental, multi-byte-safe detokenization (the vLLM/TGI prefix-offset technique).

Decoding token by token loses information: byte-level BPE splits one character over several
tokens, and SentencePiece drops the leading space of the first token in a decoded sequence.
So each step decodes a short sliding window — the tokens of the previous emission ("prefix")
plus the tokens not yet emitted — and emits only the text beyond the prefix's text. While
that text ends in U+FFFD the tail is an incomplete UTF-8 character and is held back.

The window only ever holds the last emission plus held tokens (at most ``MAX_HELD_TOKENS``),
so the cost per token stays flat however long the output grows.

The common case is cheaper still (``TokenCache``, shared by all requests of a server): the
length of a one-token prefix is cached per token id, so a step costs one decode of a two-token
window; and with a byte-level BPE decoder (GPT-2, Llama 3, Qwen, Mistral-Nemo, ...), where
decoding is "concatenate the tokens' bytes, then UTF-8", a token whose own bytes are complete
UTF-8, following text that ended on a complete character, decodes to its own cached text, so
the step calls no decoder at all. Either way the pieces are exactly those of the plain method.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

try:
    from tokenizers.decoders import ByteLevel as _ByteLevelDecoder
except ImportError:  # tokenizers is a dependency; a slow-tokenizer-only install still works
    _ByteLevelDecoder = None

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
    """``ids -> text`` equal to
    ``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Fast tokenizers: call the Rust decoder directly; transformers' wrapper only adds
        # Python overhead and the clean-up pass, which rewrites already-streamed text.
        return partial(backend.decode, skip_special_tokens=skip_special_tokens)
    return partial(tokenizer.decode, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def is_byte_level(tokenizer: Any) -> bool:
    """True when the tokenizer decodes with exactly the byte-level decoder: each token maps to
    bytes on its own, and the text is those bytes concatenated, decoded as UTF-8 (invalid bytes
    as U+FFFD). Then text that ended on a complete character never changes when bytes follow."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return _ByteLevelDecoder is not None and backend is not None and type(backend.decoder) is _ByteLevelDecoder


class _Lengths(dict):
    """``len(decode([token_id]))``, filled on first use."""

    __slots__ = ("_decode",)

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        super().__init__()
        self._decode = decode

    def __missing__(self, token_id: int) -> int:
        n = self[token_id] = len(self._decode([token_id]))
        return n


class _Pieces(dict):
    """The text a token adds after text that ended on a complete character, where that does not
    depend on what came before: ``decode([token_id])`` when it is non-empty and has no U+FFFD
    (so its bytes are complete UTF-8), else "" (no shortcut for this token). Only for byte-level
    decoders; the pair check below guards against decoders that treat a token specially."""

    __slots__ = ("_decode",)

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        super().__init__()
        self._decode = decode

    def __missing__(self, token_id: int) -> str:
        text = self._decode([token_id])
        if not text or REPLACEMENT in text or self._decode([token_id, token_id]) != text + text:
            text = ""
        self[token_id] = text
        return text


class TokenCache:
    """Per-token facts for one decode function, filled on first use and shared by every
    detokenizer using that function (one per server and ``skip_special_tokens``): at most one
    entry per vocab id in each table."""

    __slots__ = ("decode", "lengths", "pieces")

    def __init__(self, decode: Callable[[list[int]], str], *, byte_level: bool = False) -> None:
        """``byte_level``: ``decode`` is a byte-level decoder's (``is_byte_level``), which allows the shortcut."""
        self.decode = decode
        self.lengths = _Lengths(decode)
        self.pieces = _Pieces(decode) if byte_level else None


def make_token_cache(tokenizer: Any, skip_special_tokens: bool) -> TokenCache:
    return TokenCache(make_decode(tokenizer, skip_special_tokens), byte_level=is_byte_level(tokenizer))


class IncrementalDetokenizer:
    """Turns generated token ids into text pieces whose concatenation equals decoding them all at once."""

    __slots__ = (
        "_clean",
        "_decode",
        "_emitted",
        "_ids",
        "_lengths",
        "_pieces",
        "_prefix_len",
        "_prefix_offset",
        "_read_offset",
    )

    def __init__(
        self,
        tokenizer: Any,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = True,
        decode: Callable[[list[int]], str] | None = None,
        cache: TokenCache | None = None,
    ) -> None:
        """``cache`` (shared, see ``TokenCache``) brings its decode function; else ``decode``, else
        the tokenizer's own (``skip_special_tokens``) with a private cache."""
        if cache is None:
            cache = TokenCache(decode) if decode is not None else make_token_cache(tokenizer, skip_special_tokens)
        self._decode = decode = cache.decode
        self._lengths = cache.lengths
        self._pieces = cache.pieces
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)  # ids before this have been emitted (or are context)
        context_text = decode(context) if context else ""
        self._prefix_len = len(context_text)
        self._emitted = 0  # chars of the window's text beyond the prefix already emitted
        # Everything so far is emitted and the text ends on a complete character: the shortcut applies.
        self._clean = self._pieces is not None and bool(context_text) and context_text[-1] != REPLACEMENT

    def step(self, token_id: int) -> str:
        """Add one token; return the text that became final ("" while holding back)."""
        ids = self._ids
        if self._clean:
            piece = self._pieces[token_id]
            if piece:  # byte-level shortcut: decode(window + [t]) == decode(window) + piece
                ids.append(token_id)
                n = len(ids)
                read = self._read_offset
                self._prefix_offset = read
                self._read_offset = n
                self._prefix_len = len(piece)
                if read >= _TRIM_AT:
                    del ids[:read]
                    self._read_offset = n - read
                    self._prefix_offset = 0
                return piece
        ids.append(token_id)
        text = self._decode(ids[self._prefix_offset :])
        start = self._prefix_len + self._emitted
        n = len(ids)
        read = self._read_offset
        if n - read < MAX_HELD_TOKENS:
            if text[-1:] == REPLACEMENT:  # an unfinished character: emit what precedes it
                self._clean = False
                stable = len(text.rstrip(REPLACEMENT))
                if stable <= start:
                    return ""
                self._emitted = stable - self._prefix_len
                return text[start:stable]
            if len(text) <= start:
                # Nothing visible yet (e.g. skipped special tokens). Sliding now would leave a
                # prefix without text, and SentencePiece would then strip the next token's space.
                self._clean = False
                return ""
        # Emit everything and slide the window: the tokens just emitted become the prefix
        # (as in _emit, inlined: this is the per-token path).
        self._emitted = 0
        self._prefix_offset = read
        self._read_offset = n
        self._prefix_len = self._lengths[token_id] if n - read == 1 else len(self._decode(ids[read:n]))
        self._clean = self._pieces is not None and text[-1:] != REPLACEMENT
        if read >= _TRIM_AT:
            del ids[:read]
            self._read_offset = n - read
            self._prefix_offset = 0
        return text[start:]

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
        self._clean = self._pieces is not None and text[-1:] != REPLACEMENT
        if self._prefix_offset >= _TRIM_AT:
            del ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return piece
