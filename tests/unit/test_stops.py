"""Stop strings matched on text across token boundaries."""

from __future__ import annotations

import pytest

from lmi_trt.serving.stops import StopMatcher


def _run(stops: list[str], pieces: list[str]) -> tuple[list[str], str | None, str]:
    m = StopMatcher(stops)
    out = [m.feed(p) for p in pieces]
    return out, m.matched, m.flush()


def test_stop_split_over_pieces_truncates_before_it():
    out, matched, rest = _run(["###"], ["Hello #", "#", "# world"])
    assert "".join(out) == "Hello "
    assert matched == "###"
    assert rest == ""


def test_held_prefix_is_released_when_it_does_not_complete():
    out, matched, rest = _run(["###"], ["a #", "#", "b"])
    assert out == ["a ", "", "##b"]
    assert matched is None and rest == ""


def test_held_tail_is_flushed_at_the_end():
    out, matched, rest = _run(["</answer>"], ["42 </ans"])
    assert out == ["42 "]
    assert matched is None
    assert rest == "</ans"


def test_nothing_is_held_without_a_possible_prefix():
    out, _, rest = _run(["STOP"], ["abc", "def"])
    assert out == ["abc", "def"] and rest == ""


def test_earliest_stop_wins_among_several():
    out, matched, _ = _run(["world", "lo w"], ["hello world"])
    assert out == ["hel"] and matched == "lo w"


def test_stop_inside_one_piece_and_later_pieces_ignored():
    m = StopMatcher(["\n\n"])
    assert m.feed("line one\n\nline two") == "line one"
    assert m.matched == "\n\n"
    assert m.feed("more") == ""
    assert m.flush() == ""


def test_overlapping_prefix_is_found():
    # "aab" must match in "aaab" although the first held "aa" is not its start.
    out, matched, _ = _run(["aab"], ["a", "a", "a", "b", "c"])
    assert "".join(out) == "a" and matched == "aab"


def test_stop_at_the_very_start():
    out, matched, _ = _run(["User:"], ["Us", "er:", " hi"])
    assert "".join(out) == "" and matched == "User:"


def test_multibyte_stop_strings():
    out, matched, _ = _run(["。東京"], ["日本語", "。", "東", "京は"])
    assert "".join(out) == "日本語" and matched == "。東京"


def test_concatenation_is_preserved_without_match():
    pieces = ["St", "ra", "ße ", "S", "T", "O", "P?"]
    out, matched, rest = _run(["STOPX", "Straße!"], pieces)
    assert matched is None
    assert "".join(out) + rest == "".join(pieces)


@pytest.mark.parametrize("bad", [[], [""], ["ok", ""]])
def test_empty_stop_strings_are_refused(bad):
    with pytest.raises(ValueError, match="non-empty"):
        StopMatcher(bad)


def test_matching_is_linear_in_the_text_and_the_stop_strings():
    """The worst case for a prefix table: 1024-character stop strings and a text whose tail is
    never one of their prefixes, fed one character at a time (the old matcher sliced and hashed
    every tail length at every step: ~1e11 character operations here). Linear work takes well
    under a second."""
    import threading
    import time

    stops = ["a" * 1023 + "b", "ab" * 512]
    out: list[str] = []

    def run() -> None:
        m = StopMatcher(stops)
        out.extend(m.feed("b") for _ in range(200_000))
        out.append(m.feed("a" * 1023 + "bz"))
        out.append(m.matched or "")

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)  # a generous bound: the thread is still running only if matching is superlinear
    assert not worker.is_alive(), f"still matching after {time.monotonic() - t0:.0f} s"
    assert out[-1] == stops[0] and "".join(out[:-1]) == "b" * 200_000
