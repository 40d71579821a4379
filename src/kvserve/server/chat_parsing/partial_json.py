"""Scanning JSON that may still be arriving: where a value ends, and the members of an object.

Streaming needs the raw text of a value before it is complete, so these functions report
spans into the input instead of decoded values. ``Incomplete`` means "a valid prefix so far";
``ValueError`` means the text cannot become JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WS = " \t\n\r"
_DECODER = json.JSONDecoder()


class Incomplete(Exception):
    """The text ends inside the value (it may still become valid JSON)."""


def skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in WS:
        i += 1
    return i


def _scan_string(text: str, i: int) -> int:
    """``text[i] == '"'``; the index after the closing quote."""
    j = i + 1
    n = len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":
            raise ValueError("control character in string")
        j += 1
    raise Incomplete


_LITERALS = ("true", "false", "null")


def scan_value(text: str, i: int) -> int:
    """The end of the JSON value starting at ``text[i]`` (no leading whitespace)."""
    n = len(text)
    if i >= n:
        raise Incomplete
    c = text[i]
    if c == '"':
        return _scan_string(text, i)
    if c in "{[":
        close = "}" if c == "{" else "]"
        j = skip_ws(text, i + 1)
        if j >= n:
            raise Incomplete
        if text[j] == close:
            return j + 1
        while True:
            if c == "{":
                if text[j] != '"':
                    raise ValueError("expected a key")
                j = skip_ws(text, _scan_string(text, j))
                if j >= n:
                    raise Incomplete
                if text[j] != ":":
                    raise ValueError("expected ':'")
                j = skip_ws(text, j + 1)
            j = skip_ws(text, scan_value(text, j))
            if j >= n:
                raise Incomplete
            if text[j] == close:
                return j + 1
            if text[j] != ",":
                raise ValueError(f"expected ',' or '{close}'")
            j = skip_ws(text, j + 1)
            if j >= n:
                raise Incomplete
    for lit in _LITERALS:
        if text.startswith(lit, i):
            return i + len(lit)
        if lit.startswith(text[i:]):
            raise Incomplete
    if c == "-" or c.isdigit():
        j = i + 1
        while j < n and (text[j].isdigit() or text[j] in "+-.eE"):
            j += 1
        if j == n:
            raise Incomplete  # more digits may follow
        _DECODER.raw_decode(text[i:j])  # validates the number
        return j
    raise ValueError(f"unexpected {c!r}")


@dataclass
class Member:
    key: str
    start: int  # where the value starts
    end: int  # where the value ends (len(text) while incomplete)
    complete: bool


@dataclass
class ObjectScan:
    members: list[Member]
    end: int
    complete: bool

    def get(self, key: str) -> Member | None:
        return next((m for m in self.members if m.key == key), None)


def scan_object(text: str, i: int) -> ObjectScan:
    """The members of the object at ``text[i] == '{'``, as far as the text goes."""
    members: list[Member] = []
    n = len(text)
    j = skip_ws(text, i + 1)
    if j < n and text[j] == "}":
        return ObjectScan(members, j + 1, True)
    while j < n:
        if text[j] != '"':
            raise ValueError("expected a key")
        try:
            k_end = _scan_string(text, j)
        except Incomplete:
            break
        key = json.loads(text[j:k_end])
        j = skip_ws(text, k_end)
        if j >= n:
            break
        if text[j] != ":":
            raise ValueError("expected ':'")
        j = skip_ws(text, j + 1)
        if j >= n:
            members.append(Member(key, j, j, False))
            break
        try:
            v_end = scan_value(text, j)
        except Incomplete:
            members.append(Member(key, j, n, False))
            break
        members.append(Member(key, j, v_end, True))
        j = skip_ws(text, v_end)
        if j >= n:
            break
        if text[j] == "}":
            return ObjectScan(members, j + 1, True)
        if text[j] != ",":
            raise ValueError("expected ',' or '}'")
        j = skip_ws(text, j + 1)
    return ObjectScan(members, n, False)


def partial_string(raw: str) -> str:
    """The decoded prefix of a JSON string literal that may lack its end (``raw[0] == '"'``).
    A trailing incomplete escape (or half a surrogate pair) is left out, so the result only
    grows as ``raw`` grows."""
    try:
        value = json.loads(raw)
        if isinstance(value, str):
            return value
    except ValueError:
        pass
    body = raw[1:]
    for k in range(7):
        try:
            value = json.loads('"' + body[: len(body) - k] + '"')
        except ValueError:
            continue
        if value and "\ud800" <= value[-1] <= "\udbff":
            value = value[:-1]
        return str(value)
    return ""
