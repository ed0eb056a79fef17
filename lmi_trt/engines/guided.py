"""Constrained decoding: the torch engine's xgrammar token bitmasks, and guides as TensorRT-LLM takes them.

A request's ``GuidedDecoding`` is compiled once per (kind, value) into an xgrammar ``CompiledGrammar``; each
request gets a ``Guide`` (an xgrammar ``GrammarMatcher``) that, before every step, says which tokens may come
next. The engine turns that into a ban on the step's logits and feeds the chosen token back. The tokenizer's
EOS ids are the grammar's stop tokens, so a complete JSON value or match ends with EOS.

What one guide may cost is bounded (README "Reliability and limits"): its text (``MAX_GUIDE_CHARS``) and a
JSON schema's nesting (``MAX_SCHEMA_DEPTH``) before anything is compiled (``guide_problem``, checked by the
serving layer for every engine); on the torch engine the compile, off the event loop and first done in a
fork of a probe process, killed past ``option.grammar_compile_timeout`` (xgrammar's compile cannot be
interrupted, and some small schemas take minutes: a thousand optional properties took 15 s with a 512-token
vocabulary; a compile that crashes takes only that fork with it); the compiled
grammars kept (``CACHE_BYTES``, xgrammar's own cache off); and each matcher call (``STEP_CPU_S`` of CPU per
token: an ambiguous grammar's Earley chart grows with the output, to seconds a step), past which that request
alone fails with a 400.

The TensorRT-LLM engines hand the guide to TensorRT-LLM's own xgrammar (``backend_guide``): a regex or EBNF as
given, JSON as the same whitespace-free grammar the torch engine compiles (``compact_json_grammar``), with the
tokenizer's side as ``GuideVocab``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import orjson

from lmi_trt.child_process import die_with_parent

from .base import EngineError, GuidedDecoding

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch


JSON_KINDS = ("json_schema", "json_object")
# A guide's text (schema, regex or grammar), in characters. OpenAI's structured outputs cap a schema's
# properties, nesting and characters of names and values too ("Supported schemas", platform.openai.com/docs/
# guides/structured-outputs; raised since launch); 128 Ki holds a tool_choice="required" schema of many tools.
MAX_GUIDE_CHARS = 128 * 1024
# Levels of JSON arrays and objects in a schema document. xgrammar's schema converter slows with the cube of
# the nesting (200 levels of properties: 4.5 s, 400: 35 s); 64 levels hold the few levels of nested objects
# OpenAI allows (5 at launch, raised since) many times over (each level of an object schema is two here: the
# object and its "properties").
MAX_SCHEMA_DEPTH = 64
# CPU seconds one matcher call (the allowed-token mask, or taking the chosen token) may take.
STEP_CPU_S = 0.05
# Compiled grammars kept, by xgrammar's own measure of each (CompiledGrammar.memory_size_bytes).
CACHE_BYTES = 128 * 2**20
_REFUSED_KEPT = 1024  # grammars refused (too slow, not compilable): answered at once when sent again
_PROBE_START_S = 300.0  # the probe process's start: importing xgrammar (torch, transformers) on a busy host
_PROBE_SLACK_S = 30.0  # past the time bound: the probe process itself is stuck


def refusal(message: str) -> EngineError:
    """A request's guide that cannot be followed: a 400 naming the request's constraint field."""
    return EngineError(message, code=400, field="guided")


def json_extent(value: Any, depth_limit: int) -> tuple[int, int]:
    """Pure: how many levels of arrays and objects a JSON value nests, counted no further than
    ``depth_limit + 1``, and the characters of its strings and keys. Walked without recursion (a value
    nested a thousand levels overflows recursive walkers), each value once."""
    deepest, chars, stack = 0, 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            chars += len(item)
        elif isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth > depth_limit:
                return depth, chars
            if isinstance(item, dict):
                chars += sum(len(k) for k in item if isinstance(k, str))
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
    return deepest, chars


def schema_problem(schema: Any) -> str | None:
    """Pure: why a JSON schema (a JSON value) is refused before it is compiled, or None."""
    if json_extent(schema, MAX_SCHEMA_DEPTH)[0] > MAX_SCHEMA_DEPTH:
        return (
            f"the json schema nests more than {MAX_SCHEMA_DEPTH} levels of objects and arrays, more than "
            "constrained decoding follows; flatten it"
        )
    return None


def guide_problem(guided: GuidedDecoding) -> str | None:
    """Pure: why a guide is refused before any compile (its size, a schema's nesting), or None."""
    what = guided.kind.replace("_", " ")
    if len(guided.value) > MAX_GUIDE_CHARS:
        return f"the {what} has {len(guided.value)} characters, more than the {MAX_GUIDE_CHARS} compiled; shorten it"
    if guided.kind != "json_schema":
        return None
    try:
        schema = orjson.loads(guided.value)
    except orjson.JSONDecodeError as exc:
        return f"the json schema is not JSON: {exc}"
    return schema_problem(schema)


def schema_text(schema: Any) -> str:
    """A JSON schema sent as a JSON value, as text; ``ValueError`` saying why for one ``schema_problem``
    refuses (orjson's writer itself stops at 255 levels) or that has no JSON text (an integer past 64 bits)."""
    problem = schema_problem(schema)
    if problem is not None:
        raise ValueError(problem)
    try:
        return orjson.dumps(schema).decode()
    except orjson.JSONEncodeError as exc:
        raise ValueError(f"the json schema cannot be written as JSON: {exc}") from None


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """Least recently used values whose sizes add up to at most ``limit``; a value bigger than that is not
    kept. Not thread-safe: one thread (or the event loop) uses it."""

    def __init__(self, limit: int) -> None:
        self.limit, self.size = limit, 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: K, value: V, size: int) -> None:
        if key in self._items or size > self.limit:
            return
        self._items[key] = (value, size)
        self.size += size
        while self.size > self.limit:
            _, (_, dropped) = self._items.popitem(last=False)
            self.size -= dropped

    def __len__(self) -> int:
        return len(self._items)


def _compile(compiler: Any, kind: str, value: str, after: str = "") -> Any:
    """xgrammar's CompiledGrammar of one guide; raises what xgrammar raises for one it refuses."""
    if after:
        import xgrammar as xgr

        return compiler.compile_grammar(_after(xgr, after, _grammar(xgr, kind, value)))
    # JSON without free whitespace: a model cannot pad its answer with spaces until max_tokens and leave
    # the value unfinished.
    if kind in JSON_KINDS:
        return compiler.compile_json_schema(json_schema_of(kind, value), any_whitespace=False)
    if kind == "regex":
        return compiler.compile_regex(value)
    return compiler.compile_grammar(value)


def _grammar(xgr: Any, kind: str, value: str) -> Any:
    """A guide as an xgrammar ``Grammar`` (JSON compact, as ``_compile`` compiles it)."""
    if kind in JSON_KINDS:
        return xgr.Grammar.from_json_schema(json_schema_of(kind, value), any_whitespace=False)
    if kind == "regex":
        return xgr.Grammar.from_regex(value)
    return xgr.Grammar.from_ebnf(value)


def _after(xgr: Any, marker: str, grammar: Any) -> Any:
    """Any text up to and including the first ``marker``, then ``grammar``: a reasoning model thinks freely and
    its answer is constrained, as vLLM fills a request's grammar mask only once the reasoning has ended
    (vllm-project/vllm ``vllm/v1/structured_output/__init__.py``, ``should_fill_bitmask``)."""
    return xgr.Grammar.concat(xgr.Grammar.from_regex(free_text_until(marker)), grammar)


_REGEX_SPECIAL = frozenset("\\^$.|?*+()[]{}/-")


def free_text_until(marker: str) -> str:
    """Pure: a regex of any text without ``marker``, then ``marker``: a run without the marker's first character,
    then pieces that each start with that character, follow the marker for a while and leave it (or stop where
    the next piece starts), none of them the whole marker. Exact for markers whose first character occurs once
    in them (``</think>``)."""
    first = marker[0]
    if first in marker[1:]:
        raise ValueError(f"{marker!r}: its first character occurs again in it")

    def esc(text: str) -> str:
        return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)

    partial = "|".join(
        f"{esc(marker[:j])}([^{esc(marker[j] + first)}][^{esc(first)}]*)?" for j in range(1, len(marker))
    )
    return f"[^{esc(first)}]*({partial})*{esc(marker)}"


def _cannot(kind: str, exc: BaseException) -> str:
    why = _XGRAMMAR_WHERE.sub("", str(exc)).strip()  # "[14:04:05] /project/cpp/regex_converter.cc:83: " is noise
    return f"the {kind.replace('_', ' ')} cannot be compiled for constrained decoding: {why}"


_XGRAMMAR_WHERE = re.compile(r"^\[[0-9:]+\] \S+:[0-9]+: ")


def probe_main() -> None:
    """The probe process (``python -c``, ``_Probe``): each guide it is sent is compiled in a fork of it, which
    it kills past the time bound; it answers ("ok" | "refused" | "timeout" | "crashed", xgrammar's message)."""
    down, up = (int(fd) for fd in sys.argv[1:3])
    die_with_parent(os.getppid())
    receive, send = Connection(down, writable=False), Connection(up, readable=False)
    info_json, timeout_s = receive.recv()
    import xgrammar as xgr  # once: torch and transformers with it take seconds; a fork of this takes ms

    info = xgr.TokenizerInfo.deserialize_json(info_json)
    send.send(None)
    while True:
        try:
            kind, value, after = receive.recv()
        except EOFError:  # the server closed the pipe
            return
        send.send(_compile_in_a_fork(xgr, info, kind, value, after, timeout_s))


def _compile_in_a_fork(
    xgr: Any, info: Any, kind: str, value: str, after: str, timeout_s: float
) -> tuple[str, str | None]:
    """In the probe process: the guide compiled by a child process, killed at ``timeout_s``."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:  # the compile; os._exit: no interpreter teardown in a fork
        os.close(read_end)
        die_with_parent(parent)
        try:
            _compile(xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False), kind, value, after)
            os.write(write_end, b"ok")
        except Exception as exc:  # noqa: BLE001 - whatever xgrammar refuses is the guide's problem
            os.write(write_end, b"refused" + _cannot(kind, exc)[:4000].encode())
        os._exit(0)
    os.close(write_end)
    try:
        if not select.select([read_end], [], [], timeout_s)[0]:
            os.kill(child, signal.SIGKILL)
            return "timeout", None
        answer = os.read(read_end, 8192).decode(errors="replace")
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
    if answer.startswith("refused"):
        return "refused", answer.removeprefix("refused")
    return ("ok", None) if answer == "ok" else ("crashed", None)


class _Probe:
    """The probe process, seen from the server: a guide is compiled there first, within the time bound (a
    compile cannot be interrupted; a process can be killed). Started on the first guide (importing xgrammar,
    which imports torch and transformers, took 8 s on a busy 2-core host), kept for the server's life. A
    separate program rather than a multiprocessing child, which would run the server's main module again.
    Used by one thread at a time."""

    def __init__(self, tokenizer_info: str, timeout_s: float) -> None:
        self._info = tokenizer_info
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._send: Connection | None = None
        self._receive: Connection | None = None

    def problem(self, kind: str, value: str, after: str) -> str | None:
        """Why the guide cannot be compiled (xgrammar's error, or the time bound), or None."""
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        what = kind.replace("_", " ")
        try:
            self._send.send((kind, value, after))  # type: ignore[union-attr]
            if self._receive.poll(self.timeout_s + _PROBE_SLACK_S):  # type: ignore[union-attr]
                outcome, message = self._receive.recv()  # type: ignore[union-attr]
                if outcome == "timeout":
                    return (
                        f"the {what} took more than option.grammar_compile_timeout={self.timeout_s:g} s to compile "
                        "for constrained decoding; simplify it (fewer optional properties or alternatives)"
                    )
                if outcome == "crashed":
                    return f"the {what} crashed the grammar compiler"
                return message
        except (EOFError, OSError):
            pass
        self.close()  # the probe itself failed: a new one for the next guide
        raise EngineError("the grammar compiler process failed; retry", code=503)

    def _start_early(self) -> None:
        try:
            self._start()
        except Exception:  # noqa: BLE001 - the first guided request starts it again and answers 503 with why
            log.debug("constrained decoding's early start failed; the first guided request retries", exc_info=True)

    def _start(self) -> None:
        self.close()
        down_read, down_write = os.pipe()
        up_read, up_write = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import probe_main; probe_main()", str(down_read), str(up_write)],
            pass_fds=(down_read, up_write),
            stdin=subprocess.DEVNULL,
        )
        os.close(down_read)
        os.close(up_write)
        self._send, self._receive = Connection(down_write, readable=False), Connection(up_read, writable=False)
        try:
            self._send.send((self._info, self.timeout_s))
            if self._receive.poll(_PROBE_START_S):
                self._receive.recv()
                return
        except (EOFError, OSError):
            pass
        self.close()
        raise EngineError("the grammar compiler process did not start; retry later", code=503)

    def close(self) -> None:
        for end in (self._send, self._receive):
            if end is not None:
                end.close()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = self._send = self._receive = None


class Guide:
    """One request's xgrammar ``GrammarMatcher``, each call's CPU time bounded by ``STEP_CPU_S`` (measured on
    the calling thread: xgrammar releases the GIL and runs the call there, and the wall clock of a loaded
    host would fail grammars that are not slow). Past the bound ``error`` says why, and the engine fails the
    request with a 400. Engine thread only."""

    __slots__ = ("_matcher", "error")

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher
        self.error: str | None = None

    def fill(self, bitmask: Any, row: int) -> None:
        started = time.thread_time()
        self._matcher.fill_next_token_bitmask(bitmask, row)
        self._charge(time.thread_time() - started, "to find the tokens allowed next")

    def accept(self, token: int) -> None:
        started = time.thread_time()
        self._matcher.accept_token(token)
        self._charge(time.thread_time() - started, "to take a token")

    def _charge(self, spent: float, what: str) -> None:
        if spent > STEP_CPU_S and self.error is None:
            self.error = (
                f"the constraint's matcher took {spent * 1000:.0f} ms of CPU {what}, more than the "
                f"{STEP_CPU_S * 1000:.0f} ms allowed per token: the grammar is too ambiguous to follow at this "
                "length; make it unambiguous"
            )


class Grammars:
    """Compiles and caches grammars for one model's tokenizer and hands out per-request ``Guide``s. Compiles run
    one at a time on a thread of their own, each after the probe process compiled it within the time bound;
    requests for a grammar being compiled wait for that compile."""

    def __init__(self, tokenizer_path: Path, vocab_size: int, stop_ids: Sequence[int], timeout_s: float) -> None:
        import xgrammar as xgr  # here, at the engine's load: its first import (0.3 s) must not stall the loop

        self._xgr = xgr
        self._path = tokenizer_path
        self._vocab = vocab_size
        self._stop = list(stop_ids)
        self._timeout_s = timeout_s
        self._compiler: Any = None
        self._probe: _Probe | None = None
        self._compiled: SizedLru[bytes, Any] = SizedLru(CACHE_BYTES)  # event loop only
        self._refused: OrderedDict[bytes, str] = OrderedDict()  # event loop only
        self._pending: dict[bytes, asyncio.Future[Any]] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lmi-grammar")  # one compile at a time
        # The probe process starts now, beside the model's load, not at the first guided request: its start
        # (importing xgrammar, which imports torch) takes seconds that request would otherwise wait.
        self._thread.submit(self._start_early)

    async def guide(self, guided: GuidedDecoding) -> Guide:
        """A fresh matcher for one request; ``refusal`` (400) for a guide that cannot be compiled in time."""
        key = hashlib.sha256(f"{guided.kind}\0{guided.after}\0{guided.value}".encode("utf-8", "surrogatepass")).digest()
        compiled = self._compiled.get(key)
        if compiled is None:
            if key in self._refused:
                raise refusal(self._refused[key])
            pending = self._pending.get(key)
            if pending is None:
                pending = asyncio.get_running_loop().run_in_executor(self._thread, self._compile_bounded, guided)
                self._pending[key] = pending
                pending.add_done_callback(lambda done: self._compiled_one(key, done))
            compiled = await asyncio.shield(pending)  # a client that leaves does not waste the compile
        return Guide(self._xgr.GrammarMatcher(compiled))

    def _compiled_one(self, key: bytes, done: asyncio.Future[Any]) -> None:
        del self._pending[key]
        if done.cancelled():
            return
        exc = done.exception()
        if exc is None:
            result = done.result()
            self._compiled.put(key, result, result.memory_size_bytes)
        elif isinstance(exc, EngineError) and exc.code == 400:
            self._refused[key] = str(exc)
            while len(self._refused) > _REFUSED_KEPT:
                self._refused.popitem(last=False)

    def _compile_bounded(self, guided: GuidedDecoding) -> Any:
        """On the compile thread: the probe first (within the time bound), then the compile here."""
        if self._compiler is None:
            try:
                self._start()
            except Exception as exc:  # noqa: BLE001 - the tokenizer's side: the server's failure, not the guide's
                raise EngineError(f"constrained decoding could not start: {exc}", code=503) from exc
        problem = self._probe.problem(guided.kind, guided.value, guided.after)  # type: ignore[union-attr]
        if problem is not None:
            raise refusal(problem)
        try:
            return _compile(self._compiler, guided.kind, guided.value, guided.after)
        except Exception as exc:  # noqa: BLE001 - the probe compiled it: not expected, still the guide's
            raise refusal(_cannot(guided.kind, exc)) from exc

    def _start_early(self) -> None:
        try:
            self._start()
        except Exception:  # noqa: BLE001 - the first guided request starts it again and answers 503 with why
            log.debug("constrained decoding's early start failed; the first guided request retries", exc_info=True)

    def _start(self) -> None:
        from transformers import AutoTokenizer

        xgr = self._xgr
        info = xgr.TokenizerInfo.from_huggingface(
            AutoTokenizer.from_pretrained(self._path), vocab_size=self._vocab, stop_token_ids=self._stop or None
        )
        # xgrammar's own cache of compiled grammars has no size bound unless given one (GrammarCompiler's
        # cache_limit_bytes=-1 by default, xgrammar 0.2.8 python/xgrammar/compiler.py); ours (CACHE_BYTES) is
        # the one cache, so the compiler keeps none.
        self._probe = _Probe(info.serialize_json(), self._timeout_s)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._probe is not None:
            self._probe.close()


def json_schema_of(kind: str, value: str) -> str:
    """Pure: the JSON schema a JSON guide means; OpenAI's ``json_object`` is any object (the backends' own JSON
    guide, xgrammar's built-in JSON grammar, would allow arrays and scalars too)."""
    return value if kind == "json_schema" else '{"type": "object"}'


_GRAMMAR_TEXTS: SizedLru[str, str] = SizedLru(CACHE_BYTES // 4)  # schema → compact grammar text, in characters
_GRAMMAR_TEXTS_LOCK = threading.Lock()  # the event loop and warm_guide's threads


def compact_json_grammar(schema: str) -> str:
    """A JSON schema as xgrammar EBNF text without free whitespace, for engines that take a grammar: the same
    compact JSON the torch engine writes, where a backend's own JSON-schema guide would allow whitespace
    anywhere (xgrammar's default), which a model can pad with until max_tokens. ``EngineError`` 400 for a
    schema that is not JSON or that xgrammar refuses. Kept for the next request with the same schema."""
    with _GRAMMAR_TEXTS_LOCK:
        known = _GRAMMAR_TEXTS.get(schema)
    if known is not None:
        return known
    try:
        import xgrammar as xgr
    except ImportError as exc:
        raise EngineError(
            "constrained decoding needs xgrammar (TensorRT-LLM's own dependency), which this Python lacks", code=400
        ) from exc
    try:
        orjson.loads(schema)
        text = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False))
    except (RuntimeError, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise refusal(_cannot("json_schema", exc)) from exc
    with _GRAMMAR_TEXTS_LOCK:
        _GRAMMAR_TEXTS.put(schema, text, len(schema) + len(text))
    return text


def backend_guide(guided: GuidedDecoding) -> tuple[Literal["regex", "grammar"], str]:
    """A request's constraint as TensorRT-LLM's xgrammar backends take it: a regex, or xgrammar EBNF, which they
    compile as given (tensorrt_llm/_torch/pyexecutor/grammar_matcher.py; the Executor's GuideType REGEX and
    EBNF_GRAMMAR). JSON goes as ``compact_json_grammar`` of ``json_schema_of``."""
    if guided.kind == "regex":
        kind, text = "regex", guided.value
    elif guided.kind == "grammar":
        kind, text = "grammar", guided.value
    else:
        kind, text = "grammar", compact_json_grammar(json_schema_of(guided.kind, guided.value))
    if not guided.after:
        return kind, text  # type: ignore[return-value]
    import xgrammar as xgr  # compact_json_grammar's import, or the engine's: TensorRT-LLM's own dependency

    try:
        grammar = _grammar(xgr, kind, text)
        return "grammar", str(_after(xgr, guided.after, grammar))
    except (RuntimeError, ValueError) as exc:
        raise refusal(_cannot(guided.kind, exc)) from exc


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


def allowed_tokens(guides: Sequence[Guide], vocab: int) -> torch.Tensor:
    """[n, vocab] bool on the CPU: the tokens each guide accepts next (a guide that took too long to say so
    has its ``error`` set: the engine fails its request)."""
    import torch
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(guides), vocab)
    for i, guide in enumerate(guides):
        guide.fill(bitmask, i)
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.view(len(guides), -1)[:, :vocab].bool()
