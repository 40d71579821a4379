from __future__ import annotations

import random
from typing import Any

from kvserve.engine.stop import StopHit, StopMatcher, TextStreamer


Streamed = tuple[list[str], StopHit | None, TextStreamer]


def _stream(pieces: list[str], stops: list[str], **kw: Any) -> Streamed:
    st = TextStreamer(stops, **kw)
    out: list[str] = []
    hit = None
    for piece in pieces:
        text, hit = st.push(piece)
        out.append(text)
        if hit:
            break
    if hit is None:
        out.append(st.finish())
    return out, hit, st


def test_stop_spanning_increments() -> None:
    out, hit, st = _stream(["Hello", " wor", "ld! and", " more"], ["world"])
    assert hit == StopHit(6, "world")
    assert "".join(out) == "Hello " and st.text == "Hello "
    assert out == ["Hello", "", " "]  # " " is held with "wor" (llama-server holds all unsent text)


def test_partial_hold_back_then_release() -> None:
    out, hit, _ = _stream(["abc", "d", "x", "yz"], ["dxq"])
    assert hit is None
    assert out == ["abc", "", "", "dxyz", ""]


def test_partial_hold_back_only_suffix() -> None:
    out, hit, _ = _stream(["abc", "d", "x", "yz"], ["dxq"], hold_all_on_partial=False)
    assert hit is None
    assert out == ["abc", "", "", "dxyz", ""]
    out, _, _ = _stream(["abcd", "xy"], ["dxq"], hold_all_on_partial=False)
    assert out == ["abc", "dxy", ""]


def test_finish_flushes_held_text() -> None:
    st = TextStreamer(["</end>"])
    assert st.push("answer </e") == ("", None)
    assert st.held == "answer </e"
    assert st.finish() == "answer </e"
    assert st.finish() == ""


def test_earliest_match_wins_and_tie_takes_first_listed() -> None:
    m = StopMatcher(["cd", "bc", ""])
    assert m.find("abcdef", 6) == StopHit(1, "bc")
    assert StopMatcher(["abc", "ab"]).find("xxabc", 5) == StopHit(2, "abc")
    # a match that ends before the last increment's reach is not searched again
    assert m.find("bc" + "x" * 10, 1) is None


def test_stop_inside_single_piece_and_after_stop() -> None:
    st = TextStreamer(["STOP"])
    assert st.push("aSTOPb") == ("a", StopHit(1, "STOP"))
    assert st.push("more") == ("", StopHit(1, "STOP"))
    assert st.text == "a" and st.finish() == ""


def test_unicode_stop_strings() -> None:
    pieces = ["Grüß ", "Gott ", "→", "ende", " 日本", "語です"]
    out, hit, st = _stream(pieces, ["→ende", "日本語"])
    assert hit == StopHit(10, "→ende")
    assert st.text == "Grüß Gott " and "".join(out) == "Grüß Gott "
    out, hit, st = _stream(["数学", "は日", "本語"], ["日本語"])
    assert hit == StopHit(3, "日本語") and "".join(out) == "数学は"
    assert StopMatcher(["日本語"]).partial("これは日本") == 2


def test_partial_lengths() -> None:
    m = StopMatcher(["hello", "lol"])
    assert m.partial("say hel") == 3
    assert m.partial("lo") == 2
    assert m.partial("xyz") == 0
    assert m.partial("say hello") == 2  # a full match is find()'s job; "lo" still prefixes "lol"
    assert m.partial("abc lo", start=4) == 2
    assert m.partial("abc lo", start=5) == 0  # only the text from start may be held


def test_streamed_output_never_contains_stop_or_prefix() -> None:
    rnd = random.Random(1)
    alphabet = "ab\n"
    stops = ["abba", "b\nb"]
    for _ in range(300):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 30)))
        cuts = sorted(rnd.sample(range(1, len(text) + 1), k=min(len(text), rnd.randrange(1, 6))))
        bounds = [0] + cuts + ([len(text)] if cuts[-1] < len(text) else [])
        pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
        for hold_all in (True, False):
            out, hit, _ = _stream(pieces, stops, hold_all_on_partial=hold_all)
            emitted = "".join(out)
            found = [(text.find(s), s) for s in stops if s in text]
            first = min(found) if found else None
            if first is None:
                assert hit is None and emitted == text
            else:
                assert hit == StopHit(first[0], first[1]) and emitted == text[: first[0]]


def test_n_indent_stops_at_shallow_line() -> None:
    out, hit, st = _stream(["def f():\n", "    return 1\n", "  ", "x = 2"], [], n_indent=4)
    assert hit == StopHit(len("def f():\n    return 1\n  "), "", "indent")
    assert st.text == "def f():\n    return 1\n  "
    assert "".join(out) == st.text
    out, hit, _ = _stream(["a\n", "\tb\n", "    c"], [], n_indent=1)
    assert hit is None and "".join(out) == "a\n\tb\n    c"
    _, hit, st = _stream(["a\n", "\n"], [], n_indent=2)  # an empty line counts as unindented
    assert hit == StopHit(2, "", "indent") and st.text == "a\n"
