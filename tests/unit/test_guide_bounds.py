"""What a constrained request may cost, checked before any compile (lmi_trt/engines/guided.py): pure parts."""

from __future__ import annotations

import json

import pytest

from lmi_trt.engines.base import GuidedDecoding
from lmi_trt.engines.guided import (
    MAX_GUIDE_CHARS,
    MAX_SCHEMA_DEPTH,
    SizedLru,
    guide_problem,
    json_extent,
    schema_text,
)


def _nested(levels: int) -> object:
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_json_extent_walks_without_recursion_and_stops_past_the_limit():
    assert json_extent({"ab": ["cde", {"f": 1}]}, 10) == (3, 6)  # levels; characters of keys and strings
    assert json_extent(_nested(100_000), 64) == (65, 0)  # far past Python's recursion limit, stopped at 65
    assert json_extent("plain", 1) == (0, 5)


def test_guides_past_their_size_or_nesting_are_refused_before_a_compile():
    assert guide_problem(GuidedDecoding("regex", "a" * MAX_GUIDE_CHARS)) is None
    assert "characters" in guide_problem(GuidedDecoding("regex", "a" * (MAX_GUIDE_CHARS + 1)))
    deep = json.dumps(_nested(MAX_SCHEMA_DEPTH))
    assert guide_problem(GuidedDecoding("json_schema", deep)) is None
    assert "nests more than" in guide_problem(GuidedDecoding("json_schema", f"[{deep}]"))
    assert "not JSON" in guide_problem(GuidedDecoding("json_schema", "{"))
    assert guide_problem(GuidedDecoding("json_object")) is None


def test_schema_text_refuses_what_no_json_writer_takes():
    assert schema_text({"type": "object"}) == '{"type":"object"}'
    with pytest.raises(ValueError, match="nests more than"):
        schema_text(_nested(300))  # orjson's writer stops at 255 levels: once a 500
    with pytest.raises(ValueError, match="cannot be written as JSON"):
        schema_text({"maximum": 2**70})


def test_sized_lru_keeps_to_its_bytes():
    cache: SizedLru[str, str] = SizedLru(10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"  # now the most recent
    cache.put("c", "C", 4)  # 12 > 10: the least recent ("b") goes
    assert (cache.get("b"), cache.get("a"), cache.get("c"), cache.size) == (None, "A", "C", 8)
    cache.put("huge", "H", 11)  # bigger than the bound: not kept, nothing evicted for it
    assert (cache.get("huge"), len(cache)) == (None, 2)
