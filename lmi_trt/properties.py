"""Java ``.properties`` parsing, as ``java.util.Properties.load(Reader)`` reads ``serving.properties``.

DJL-Serving loads ``serving.properties`` with Java's parser, so files written for it rely on its
rules: ``#``/``!`` comments, ``=``/``:``/whitespace separators, backslash continuations, and
``\\t \\n \\r \\f \\uXXXX`` escapes (any other escaped character stands for itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from lmi_trt.errors import LmiError

# Java's notion of whitespace in properties files: space, tab and form feed (not \v).
_WHITESPACE = " \t\f"
# Java ends natural lines at \n, \r or \r\n only; str.splitlines() would also split on \v, \x1c, \u2028...
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_HEX = frozenset("0123456789abcdefABCDEF")


class PropertiesSyntaxError(LmiError, ValueError):
    """The text is not valid Java properties syntax (the only case: a malformed ``\\uXXXX``)."""


def parse_properties(text: str) -> dict[str, str]:
    """Parse properties text into ``{key: value}``; a repeated key keeps its last value, as in Java."""
    return {key: value for _, key, value in iter_properties(text)}


def iter_properties(text: str) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, key, value)`` per entry, in file order, duplicates included.

    ``line_number`` is 1-based and names the first natural line of the logical line.
    """
    for line_number, line in _logical_lines(text):
        raw_key, raw_value = _split_entry(line)
        yield line_number, _unescape(raw_key, line_number), _unescape(raw_value, line_number)


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Join continuation lines, drop comments and blank lines, strip each natural line's indent."""
    pending: list[str] = []
    start = 0
    for number, natural in enumerate(_LINE_BREAK.split(text), start=1):
        content = natural.lstrip(_WHITESPACE)
        if not pending:
            # A comment is recognised only at the start of a logical line, and never continues.
            if not content or content[0] in "#!":
                continue
            start = number
        continues = _odd_trailing_backslashes(content)
        pending.append(content[:-1] if continues else content)
        if not continues:
            # An empty continuation line ends the logical line too: Java appends nothing and stops.
            yield start, "".join(pending)
            pending = []
    if pending:
        # A backslash on the last line of the text continues into nothing; Java drops it.
        yield start, "".join(pending)


def _odd_trailing_backslashes(content: str) -> bool:
    return (len(content) - len(content.rstrip("\\"))) % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped ``=``, ``:`` or whitespace (Java's load0)."""
    key_end = len(line)
    value_start = len(line)
    has_separator = False
    escaped = False
    for i, ch in enumerate(line):
        if not escaped and ch in "=:":
            key_end, value_start, has_separator = i, i + 1, True
            break
        if not escaped and ch in _WHITESPACE:
            key_end, value_start = i, i + 1
            break
        escaped = ch == "\\" and not escaped
    # After whitespace, one '=' or ':' may still follow ("key = value"); whitespace around it is skipped.
    while value_start < len(line):
        ch = line[value_start]
        if ch in _WHITESPACE:
            value_start += 1
        elif not has_separator and ch in "=:":
            has_separator = True
            value_start += 1
        else:
            break
    return line[:key_end], line[value_start:]


def _unescape(raw: str, line_number: int) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        i += 1
        if ch != "\\":
            out.append(ch)
            continue
        if i == len(raw):
            break  # a lone trailing backslash stands for nothing (Java reads past it the same way)
        ch = raw[i]
        i += 1
        if ch == "u":
            digits = raw[i : i + 4]
            if len(digits) < 4 or not set(digits) <= _HEX:
                raise PropertiesSyntaxError(
                    f"line {line_number}: malformed \\uXXXX escape '\\u{digits}'; "
                    "write exactly four hex digits (e.g. \\u00e9), or \\\\u for a literal backslash-u"
                )
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(ch, ch))
    return _join_surrogates("".join(out), line_number)


def _join_surrogates(text: str, line_number: int) -> str:
    """Java strings are UTF-16: ``\\ud83d\\ude00`` is one emoji. Pair such escapes into one code point."""
    if not any("\ud800" <= ch <= "\udfff" for ch in text):
        return text
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise PropertiesSyntaxError(
            f"line {line_number}: a \\uD800-\\uDFFF escape is not part of a surrogate pair; "
            "write the character itself or both halves of the pair"
        ) from None
