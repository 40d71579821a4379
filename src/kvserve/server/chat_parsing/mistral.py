"""Mistral tool calls after ``[TOOL_CALLS]``, in either generation of the format:

- Nemo / Small 3.1: ``[TOOL_CALLS][{"name": …, "arguments": …, "id": "abc123xyz"}, …]``
- Small 3.2 / Magistral / Devstral: ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{…}`` (``[CALL_ID]`` optional),
  repeated for several calls.

Text before the first ``[TOOL_CALLS]`` is content."""

from __future__ import annotations

from kvserve.server.chat_parsing.json_calls import read_call_list
from kvserve.server.chat_parsing.markers import hold_back
from kvserve.server.chat_parsing.msg import ToolCall
from kvserve.server.chat_parsing.partial_json import Incomplete, scan_value, skip_ws

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralFormat:
    name = "Mistral Nemo"

    def __init__(self, tool_names: frozenset[str] = frozenset()) -> None:
        self.tool_names = tool_names

    @property
    def trigger(self) -> str:
        return TOOL_CALLS

    def parse(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]]:
        i = text.find(TOOL_CALLS)
        if i < 0:
            return hold_back(text, [TOOL_CALLS], is_partial).strip(), []
        content = text[:i].strip()
        j = skip_ws(text, i + len(TOOL_CALLS))
        if j >= len(text):
            return (content, []) if is_partial else (text.strip(), [])
        try:
            if text[j] == "[":
                calls, _, _ = read_call_list(text, j, self.tool_names)
                return content, calls
            return content, self._tagged(text, i, is_partial)
        except ValueError:
            return text.strip(), []

    def _tagged(self, text: str, i: int, is_partial: bool) -> list[ToolCall]:
        calls: list[ToolCall] = []
        pos = i
        while text.startswith(TOOL_CALLS, pos):
            pos += len(TOOL_CALLS)
            a = text.find(ARGS, pos)
            if a < 0:
                if is_partial:
                    return calls
                raise ValueError("[TOOL_CALLS] without [ARGS]")
            head = text[pos:a]
            name, _, call_id = head.partition(CALL_ID)
            name = name.strip()
            if not name or (self.tool_names and name not in self.tool_names):
                raise ValueError(f"unknown tool {name!r}")
            j = skip_ws(text, a + len(ARGS))
            try:
                end = scan_value(text, j)
            except Incomplete:
                calls.append(ToolCall(name, text[j:].rstrip(), call_id.strip()))
                return calls
            calls.append(ToolCall(name, text[j:end], call_id.strip()))
            pos = skip_ws(text, end)
        return calls
