"""What the tool-call parsers share: the events a reader gives, the reading helpers, and the registry.

A parser reads one model family's tool-call format out of its output. As vLLM's tool parsers are
(vllm-project/vllm ``vllm/tool_parsers/``: one module per format, registered by name in ``ToolParserManager``),
each is one module here that registers a ``ToolParser`` by name; ``tool_parsers/__init__.py`` imports them.

A ``Reader`` reads one output as it comes: ``feed`` each piece, ``finish`` at the end. It gives events:
``Content`` (text outside the calls), ``CallStart`` (a call's index and function name) and ``CallArgs`` (a piece
of that call's ``arguments``, JSON text as OpenAI sends it). A reader decides only on what it has read, holding
back text while it may still be the start of a call, so the events of any split of one output fold to the same
content and calls: a stream reassembles to the answer the same request gets unstreamed (that fold, on the whole
output). Arguments stream as the model writes them where the format spells them as JSON text; formats that need
the whole call to write its JSON (Qwen3-Coder's parameters, Llama 4's Python calls) give each piece once it is
complete.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

# --- events ---


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


Event = Content | CallStart | CallArgs
# Function parameters' JSON schemas by function name: what a format that writes untyped values needs to type them.
Schemas = Mapping[str, Mapping[str, Any]]


def held_prefix(text: str, marker: str) -> int:
    """Pure: how many characters at the end of ``text`` may still be the start of ``marker``."""
    for cut in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-cut:]):
            return cut
    return 0


class Reader:
    """One output's reader. Subclasses implement ``_step``: read from ``pending`` as far as can be decided
    (``final``: nothing more will come) and say whether it consumed or decided anything."""

    def __init__(self, state: str = "content") -> None:
        self.state = state  # the step to take next (``_step``)
        self.pending = ""  # read, not consumed
        self.final = False
        self.calls = 0
        self._out: list[Event] = []
        self._held: list[str] = []  # consumed text of what may turn out to be a call (see hold / release)

    def feed(self, text: str) -> list[Event]:
        self.pending += text
        return self._run()

    def finish(self) -> list[Event]:
        self.final = True
        return self._run()

    def _run(self) -> list[Event]:
        while self._step():
            pass
        out, self._out = self._out, []
        return out

    def _step(self) -> bool:
        """One step of the state machine: the method named after ``state`` (``_content`` for "content")."""
        return getattr(self, f"_{self.state}")()

    def content_until(self, *markers: str, then: str | Mapping[str, str]) -> bool:
        """Content up to the first of ``markers``, which is held (a call may start there) and moves to the state
        ``then`` (or ``then[marker]``); whether anything was read."""
        text, marker = self.take_until(*markers)
        self.content(text)
        if marker is not None:
            self.hold(marker)
            self.state = then if isinstance(then, str) else then[marker]
        return bool(text) or marker is not None

    # --- what a step gives ---
    def content(self, text: str) -> None:
        if text:
            if self._out and isinstance(self._out[-1], Content):
                self._out[-1] = Content(self._out[-1].text + text)
            else:
                self._out.append(Content(text))

    def start(self, name: str) -> None:
        """A call begins: what was held for it is its own (``held`` empties)."""
        self._held.clear()
        self._out.append(CallStart(self.calls, name))
        self.calls += 1

    def args(self, text: str) -> None:
        if text:
            self._out.append(CallArgs(self.calls - 1, text))

    # --- reading ---
    def consume(self, n: int) -> str:
        taken, self.pending = self.pending[:n], self.pending[n:]
        return taken

    def hold(self, text: str) -> None:
        """Consumed text that is a call's if one starts, else content (``release``)."""
        self._held.append(text)

    def drop(self) -> None:
        self._held.clear()

    def release(self) -> None:
        self.content("".join(self._held))
        self._held.clear()

    def take_until(self, *markers: str) -> tuple[str, str | None]:
        """Consume the text before the first of ``markers`` and that marker; (the text, the marker found). Not
        found: the text that cannot be the start of one (all of it once ``final``), and None."""
        found = [(at, m) for m in markers if (at := self.pending.find(m)) >= 0]
        if found:
            at, marker = min(found)
            text = self.consume(at)
            self.consume(len(marker))
            return text, marker
        keep = 0 if self.final else max(held_prefix(self.pending, m) for m in markers)
        return self.consume(len(self.pending) - keep), None

    def opens(self, marker: str) -> bool | None:
        """``pending`` starts with ``marker`` (consumed: True), cannot (False), or may once more comes (None)."""
        if self.pending.startswith(marker):
            self.consume(len(marker))
            return True
        if not self.final and marker.startswith(self.pending):
            return None
        return False

    def opens_one(self, *markers: str) -> str | bool | None:
        """The one of ``markers`` ``pending`` starts with (consumed), or None while one may still come, else False."""
        waiting = False
        for marker in markers:
            opened = self.opens(marker)
            if opened:
                return marker
            waiting = waiting or opened is None
        return None if waiting else False

    def skip_space(self) -> str:
        stripped = self.pending.lstrip()
        return self.consume(len(self.pending) - len(stripped))

    def optional(self, marker: str, then: str) -> bool:
        """Space and, if written, ``marker`` (both held: a call's opening), then the state ``then``."""
        self.hold(self.skip_space())
        opened = self.opens(marker)
        if opened is None:
            return False
        if opened:
            self.hold(marker)
        self.state = then
        return True

    def follow_to(self, call: CallObject, then: str) -> bool:
        """``follow`` a call; once it is read, the state ``then``, or "content" where it was none or broke."""
        progressed = self.follow(call)
        if call.state != "reading":
            self.state = then if call.state == "done" else "content"
        return progressed

    def follow(self, call: CallObject) -> bool:
        """Read one JSON call object on (``call.state`` says how it went; a "no call" gives back as content what
        was held for it); whether anything was consumed or decided."""
        progressed = call.feed()
        if call.state == "reading" and self.final:
            call.finish()
        if call.state == "no call":
            self.release()
        return progressed or call.state != "reading"


# --- JSON read as it comes ---
_SCALAR_ENDS = frozenset(",}] \t\r\n")


class JsonValue:
    """The extent of one JSON value read as it comes, from its first character (no leading space): ``feed``
    says how many characters of the text belong to it; ``done`` once it is complete. Lexical only: strings,
    escapes and nesting are followed, the value itself is checked by whoever decodes it."""

    def __init__(self) -> None:
        self.kind = ""  # its first character: '{', '[', '"', or another (a number, true, false, null)
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def feed(self, text: str) -> int:
        for i, ch in enumerate(text):
            if not self.kind:
                self.kind = ch
                if ch in "{[":
                    self.depth = 1
                elif ch == '"':
                    self.in_string = True
                continue
            if self.kind not in '{["':  # a scalar ends before the first delimiter
                if ch in _SCALAR_ENDS:
                    self.done = True
                    return i
                continue
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.kind == '"':
                        self.done = True
                        return i + 1
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


class CallObject:
    """One JSON object read as a call, as it comes: ``{"name": ..., <args key>: {...}}`` in any member order.
    The call starts (``reader.start``) once its name is read; its arguments are the value of the first of
    ``args_keys`` present, streamed as written when an object or array, decoded when a JSON string (some
    models write the arguments as JSON text inside a string), ``{}`` when absent or null. Other members are
    skipped. ``state``: "reading", "done" (the object closed), "no call" (it closed, or broke, before a name:
    the reader releases what it held), "broken" (lexically not JSON after the call started: the rest is the
    reader's)."""

    def __init__(self, reader: Reader, args_keys: Sequence[str]) -> None:
        self.reader = reader
        self.args_keys = args_keys
        self.state = "reading"
        self.phase = "open"  # open, key, colon, value, after
        self.text: JsonValue | None = None  # the key or value being read
        self.raw: list[str] = []  # its text
        self.key = ""
        self.members = 0
        self.args_key: str | None = None
        self.args_raw: list[str] = []  # the arguments' text not yet sent (all of it until the call starts)
        self.started = False

    def feed(self) -> bool:
        """Read from ``reader.pending``; whether anything was consumed or decided."""
        r = self.reader
        before = len(r.pending)
        while r.pending and self.state == "reading":
            if self.text is not None:
                self._read_text()
            elif r.pending[0].isspace():
                self._take(1)
            else:
                self._punctuation(r.pending[0])
        return len(r.pending) != before or self.state != "reading"

    def finish(self) -> None:
        """The output ended inside the object: a started call keeps what it has, else it was no call."""
        if self.state == "reading":
            if self.started:
                self._send_args(final=True)
                self.state = "done"
            else:
                self.state = "no call"

    def _punctuation(self, ch: str) -> None:
        closes = ch == "}" and (self.phase == "after" or (self.phase == "key" and not self.members))
        if self.phase == "value" or (self.phase == "key" and ch == '"'):
            self.text, self.raw = JsonValue(), []
        elif closes:
            self._take(1)
            self._close()
        elif ch == {"open": "{", "colon": ":", "after": ","}.get(self.phase):
            self._take(1)
            self.phase = "value" if self.phase == "colon" else "key"
        else:
            self.state = "broken" if self.started else "no call"

    def _read_text(self) -> None:
        assert self.text is not None
        text = self._take(self.text.feed(self.reader.pending))
        self.raw.append(text)
        if self.phase == "value" and self._is_args():
            self.args_key = self.key
            self.args_raw.append(text)
            if self.started:
                self._send_args(final=False)
        if not self.text.done:
            return
        self.text = None
        if self.phase == "key":
            try:
                self.key = json.loads("".join(self.raw))
            except ValueError:
                self.state = "broken" if self.started else "no call"
            self.phase = "colon"
            return
        self.members += 1
        self.phase = "after"
        if self.key == "name" and not self.started:
            self._named()
        elif self._is_args() and self.started:
            self._send_args(final=True)

    def _is_args(self) -> bool:
        return self.key in self.args_keys and self.args_key in (None, self.key)

    def _named(self) -> None:
        try:
            name = json.loads("".join(self.raw))
        except ValueError:
            name = None
        if not isinstance(name, str) or not name:
            self.state = "no call"
            return
        self.reader.start(name)
        self.started = True
        if self.args_key is not None:  # the arguments came first, and are complete
            self._send_args(final=True)

    def _send_args(self, *, final: bool) -> None:
        text = "".join(self.args_raw)
        if not text:
            return
        if text[0] in "{[":
            self.args_raw.clear()
            self.reader.args(text)
        elif final:
            self.args_raw.clear()
            self.reader.args(scalar_arguments(text))

    def _close(self) -> None:
        if not self.started:
            self.state = "no call"
            return
        if self.args_key is None:
            self.reader.args("{}")
        self.state = "done"

    def _take(self, n: int) -> str:
        text = self.reader.consume(n)
        if not self.started:
            self.reader.hold(text)
        return text


class CallList:
    """A JSON list of call objects (``CallObject``) read as it comes: ``[{...}, {...}]``. ``state`` as
    ``CallObject``'s: "done" once the list closed (or, the output having ended, after its last call), "no call"
    when it held no call (what was held is released), "broken" when an item after the first call is not one
    (what it held is released; the rest is the reader's)."""

    def __init__(self, reader: Reader, args_keys: Sequence[str]) -> None:
        self.reader = reader
        self.args_keys = args_keys
        self.state = "reading"
        self.phase = "open"  # open, item, after
        self.item: CallObject | None = None

    def feed(self) -> bool:
        r, progressed = self.reader, False
        while self.state == "reading":
            if self.item is not None:
                progressed = r.follow(self.item) or progressed
                if self.item.state == "reading":
                    break
                if self.item.state != "done":
                    self.state = "broken" if r.calls else "no call"
                self.item, self.phase = None, "after"
                continue
            space = r.skip_space()
            if self.phase != "after":
                r.hold(space)
            progressed = progressed or bool(space)
            if not r.pending:
                if r.final:
                    self.state = "done" if r.calls else "no call"
                    if self.state == "no call":
                        r.release()
                break
            ch = r.pending[0]
            if self.phase == "item":
                self.item = CallObject(r, self.args_keys)
            elif self.phase == "open" and ch == "[":
                r.hold(r.consume(1))
                self.phase = "item"
            elif self.phase == "after" and ch in ",]":
                r.consume(1)
                self.phase = "item"
                if ch == "]":
                    self.state = "done"
            else:
                self.state = "broken" if r.calls else "no call"
                if self.state == "no call":
                    r.release()
            progressed = True
        return progressed


def scalar_arguments(raw: str) -> str:
    """Arguments written as a JSON string hold the JSON text itself; null or nothing is no arguments."""
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except ValueError:
            return raw
        return value if isinstance(value, str) else raw
    return raw if raw and raw != "null" else "{}"


def arguments_json(arguments: Mapping[str, Any]) -> str:
    """Arguments built from parsed values (formats that do not write JSON): JSON with Python's spacing, as
    vLLM writes them (``json.dumps``), non-ASCII kept."""
    return json.dumps(dict(arguments), ensure_ascii=False)


# --- the registry ---


@dataclass(frozen=True)
class ToolParser:
    """One tool-call format.

    ``reader``: a fresh ``Reader`` for one output, given the request's function schemas. ``markers``: the texts
    that open its calls (where a tokenizer makes them special tokens, the output must keep special tokens).
    ``recognise``: whether a chat template's text writes this format. ``write``: calls (name, arguments) in
    this format, as a model writes them (the tool description of a template that cannot render tools shows
    it; tests read it back)."""

    name: str
    reader: Callable[[Schemas], Reader]
    markers: tuple[str, ...]
    recognise: Callable[[str], bool]
    write: Callable[[Sequence[tuple[str, Mapping[str, Any]]]], str]
    aliases: tuple[str, ...] = ()  # other servers' spellings (trtllm-serve's --tool_parser names)


REGISTRY: dict[str, ToolParser] = {}
P = TypeVar("P", bound="Named")


class Named(Protocol):
    name: str
    aliases: tuple[str, ...]


def register_in(registry: dict[str, P], parser: P) -> P:
    """``parser`` under its name and its aliases (a name taken twice is a mistake in the code)."""
    for name in (parser.name, *parser.aliases):
        if name in registry:
            raise ValueError(f"parser {name!r} is registered twice")
        registry[name] = parser
    return parser


def register(parser: ToolParser) -> ToolParser:
    return register_in(REGISTRY, parser)
