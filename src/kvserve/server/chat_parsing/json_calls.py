"""Tool calls written as JSON objects: ``{"name": "f", "arguments": {...}}`` (also
``"parameters"``), read from a text that may still be arriving.

A call is reported once its name is complete; its ``arguments`` are the raw text of the
arguments value so far (trailing whitespace dropped), so they only ever grow.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvserve.server.chat_parsing.msg import ToolCall
from kvserve.server.chat_parsing.partial_json import ObjectScan, scan_object, skip_ws

ARG_KEYS = ("arguments", "parameters")


@dataclass
class JsonCall:
    call: ToolCall | None  # None until the name is known
    end: int  # index after the object (len(text) while incomplete)
    complete: bool


def _args(text: str, scan: ObjectScan) -> tuple[str, bool]:
    for key in ARG_KEYS:
        m = scan.get(key)
        if m is not None:
            raw = text[m.start:m.end]
            if m.complete:
                return raw, True
            return raw.rstrip(), False
    return "", False


def read_call(text: str, i: int, names: frozenset[str] = frozenset()) -> JsonCall:
    """The call object at ``text[i] == '{'``. Raises ValueError when it is not one
    (malformed JSON, complete without a string name, or a name not in ``names`` when given)."""
    scan = scan_object(text, i)
    name_m = scan.get("name")
    name: str | None = None
    if name_m is not None and name_m.complete:
        value = json.loads(text[name_m.start:name_m.end])
        if not isinstance(value, str):
            raise ValueError("tool call name is not a string")
        if names and value not in names:
            raise ValueError(f"unknown tool {value!r}")
        name = value
    if scan.complete:
        if name is None:
            raise ValueError("tool call without a name")
        args, _ = _args(text, scan)
        call_id = scan.get("id")
        tc_id = ""
        if call_id is not None and call_id.complete:
            v = json.loads(text[call_id.start:call_id.end])
            tc_id = v if isinstance(v, str) else ""
        return JsonCall(ToolCall(name, args or "{}", tc_id), scan.end, True)
    if name is None:
        return JsonCall(None, len(text), False)
    args, _ = _args(text, scan)
    return JsonCall(ToolCall(name, args), len(text), False)


def read_call_list(text: str, i: int, names: frozenset[str] = frozenset()) -> tuple[list[ToolCall], int, bool]:
    """A JSON array of call objects at ``text[i] == '['``: (calls so far, end, complete)."""
    calls: list[ToolCall] = []
    n = len(text)
    j = skip_ws(text, i + 1)
    if j < n and text[j] == "]":
        return calls, j + 1, True
    while j < n:
        if text[j] != "{":
            raise ValueError("expected a tool call object")
        jc = read_call(text, j, names)
        if jc.call is not None:
            calls.append(jc.call)
        if not jc.complete:
            return calls, n, False
        j = skip_ws(text, jc.end)
        if j >= n:
            break
        if text[j] == "]":
            return calls, j + 1, True
        if text[j] != ",":
            raise ValueError("expected ',' or ']'")
        j = skip_ws(text, j + 1)
    return calls, n, False
