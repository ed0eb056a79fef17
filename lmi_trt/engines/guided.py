"""Constrained decoding: the torch engine's xgrammar token bitmasks, and guides as TensorRT-LLM takes them.

A request's ``GuidedDecoding`` is compiled once per (kind, value) into an xgrammar
``CompiledGrammar`` (an LRU here, on top of the compiler's own cache); each request gets a
``GrammarMatcher`` that, before every step, says which tokens may come next. The engine turns that
into a ban on the step's logits and feeds the chosen token back. The tokenizer's EOS ids are the
grammar's stop tokens, so a complete JSON value or match ends with EOS.

The TensorRT-LLM engines hand the guide to TensorRT-LLM's own xgrammar (``backend_guide``): a regex or EBNF as
given, JSON as the same whitespace-free grammar the torch engine compiles (``compact_json_grammar``), with the
tokenizer's side as ``GuideVocab``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .base import EngineError, GuidedDecoding

if TYPE_CHECKING:
    import torch

_CACHED_GRAMMARS = 256
JSON_KINDS = ("json_schema", "json_object")


class Grammars:
    """Compiles and caches grammars for one model's tokenizer; hands out per-request matchers."""

    def __init__(self, tokenizer_path: Path, vocab_size: int, stop_ids: Sequence[int]) -> None:
        self._path = tokenizer_path
        self._vocab = vocab_size
        self._stop = list(stop_ids)
        self._compiler: Any = None
        self._lock = threading.Lock()
        self._compiled = functools.lru_cache(maxsize=_CACHED_GRAMMARS)(self._compile)

    def matcher(self, guided: GuidedDecoding) -> Any:
        """A fresh matcher for one request; ``EngineError`` 400 for a schema/regex/grammar xgrammar refuses."""
        import xgrammar as xgr

        with self._lock:
            compiled = self._compiled(guided.kind, guided.value)
        return xgr.GrammarMatcher(compiled)

    def _compile(self, kind: str, value: str) -> Any:
        import xgrammar as xgr

        if self._compiler is None:
            from transformers import AutoTokenizer

            info = xgr.TokenizerInfo.from_huggingface(
                AutoTokenizer.from_pretrained(self._path), vocab_size=self._vocab, stop_token_ids=self._stop or None
            )
            self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        try:
            # JSON without free whitespace: a model cannot pad its answer with spaces until
            # max_tokens and leave the value unfinished.
            if kind in JSON_KINDS:
                schema = json_schema_of(kind, value)
                json.loads(schema)  # a clear message for text that is not JSON at all
                return self._compiler.compile_json_schema(schema, any_whitespace=False)
            if kind == "regex":
                return self._compiler.compile_regex(value)
            return self._compiler.compile_grammar(value)
        except (RuntimeError, ValueError) as exc:
            raise EngineError(
                f"the {kind.replace('_', ' ')} cannot be compiled for constrained decoding: {exc}", code=400
            ) from exc


def json_schema_of(kind: str, value: str) -> str:
    """Pure: the JSON schema a JSON guide means; OpenAI's ``json_object`` is any object (the backends' own JSON
    guide, xgrammar's built-in JSON grammar, would allow arrays and scalars too)."""
    return value if kind == "json_schema" else '{"type": "object"}'


@functools.lru_cache(maxsize=_CACHED_GRAMMARS)
def compact_json_grammar(schema: str) -> str:
    """A JSON schema as xgrammar EBNF text without free whitespace, for engines that take a grammar: the same
    compact JSON the torch engine writes, where a backend's own JSON-schema guide would allow whitespace
    anywhere (xgrammar's default), which a model can pad with until max_tokens. ``EngineError`` 400 for a
    schema that is not JSON or that xgrammar refuses."""
    try:
        import xgrammar as xgr
    except ImportError as exc:
        raise EngineError(
            "constrained decoding needs xgrammar (TensorRT-LLM's own dependency), which this Python lacks", code=400
        ) from exc
    try:
        json.loads(schema)
        return str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    except (RuntimeError, ValueError) as exc:
        raise EngineError(f"the json schema cannot be compiled for constrained decoding: {exc}", code=400) from exc


def backend_guide(guided: GuidedDecoding) -> tuple[Literal["regex", "grammar"], str]:
    """A request's constraint as TensorRT-LLM's xgrammar backends take it: a regex, or xgrammar EBNF, which they
    compile as given (tensorrt_llm/_torch/pyexecutor/grammar_matcher.py; the Executor's GuideType REGEX and
    EBNF_GRAMMAR). JSON goes as ``compact_json_grammar`` of ``json_schema_of``."""
    if guided.kind == "regex":
        return "regex", guided.value
    if guided.kind == "grammar":
        return "grammar", guided.value
    return "grammar", compact_json_grammar(json_schema_of(guided.kind, guided.value))


async def warm_guide(guided: GuidedDecoding | None) -> None:
    """Compile a JSON schema's grammar off the event loop (``compact_json_grammar`` caches it), so that the
    request built after this does not stall every other request while a large schema compiles; an error is
    left for that build to report as the request's 400."""
    if guided is not None and guided.kind in JSON_KINDS:
        with contextlib.suppress(EngineError):
            await asyncio.to_thread(backend_guide, guided)


@dataclass(frozen=True)
class GuideVocab:
    """What TensorRT-LLM's xgrammar backend needs of the tokenizer, as ``_xgrammar_tokenizer_info``
    (tensorrt_llm/llmapi/tokenizer.py) gives it to the Executor's ``GuidedDecodingConfig``: the vocabulary in
    id order, the fast tokenizer's JSON (for xgrammar's vocabulary type), and the ids that end the output."""

    encoded_vocab: list[str]
    tokenizer_str: str | None
    stop_token_ids: list[int]

    @classmethod
    def of(cls, tokenizer: Any, stop_token_ids: Sequence[int]) -> GuideVocab:
        vocab = tokenizer.get_vocab()
        backend = getattr(tokenizer, "backend_tokenizer", None)
        return cls(
            [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])],
            backend.to_str() if backend is not None else None,
            list(stop_token_ids),
        )


def allowed_tokens(matchers: Sequence[Any], vocab: int) -> torch.Tensor:
    """[n, vocab] bool on the CPU: the tokens each matcher accepts next."""
    import torch
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab)
    for i, m in enumerate(matchers):
        m.fill_next_token_bitmask(bitmask, i)
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.view(len(matchers), -1)[:, :vocab].bool()
