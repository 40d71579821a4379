"""Holding back a marker that may be arriving: while streaming, text that could be the start
of a marker (``<tool_c`` of ``<tool_call>``) is not sent as content until it is decided."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """The length of the longest suffix of ``text`` that is a proper prefix of a marker."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text)), best, -1):
            if text.endswith(m[:n]):
                best = n
                break
    return best


def hold_back(text: str, markers: Iterable[str], is_partial: bool) -> str:
    """``text`` without a trailing partial marker (only while the output is partial)."""
    if not is_partial:
        return text
    n = partial_marker_len(text, markers)
    return text[: len(text) - n] if n else text
