"""The generic JSON format, for templates that cannot render tools themselves.

The prompt gets a system message listing the tools and asking for one JSON object:
``{"tool_call": {"name": …, "arguments": …}}`` (``{"tool_calls": [...]}`` with parallel calls)
to call tools, or ``{"response": "…"}`` to answer. A bare ``{"name": …, "arguments": …}`` is
read as a call too; any other output is content.
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.server.chat_parsing.json_calls import read_call, read_call_list
from kvserve.server.chat_parsing.msg import ToolCall
from kvserve.server.chat_parsing.partial_json import partial_string, scan_object, skip_ws

FENCES = ("```json", "```")


class GenericFormat:
    name = "Generic"

    def __init__(self, tool_names: frozenset[str] = frozenset(), parallel: bool = False) -> None:
        self.tool_names = tool_names
        self.parallel = parallel

    @property
    def trigger(self) -> str:
        return "{"

    # ---- the prompt side -------------------------------------------------------------------

    def system_prompt(self, tools: list[dict[str, Any]]) -> str:
        shape = ('{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}, ...]}' if self.parallel
                 else '{"tool_call": {"name": "<tool name>", "arguments": {<arguments>}}}')
        listing = json.dumps([t["function"] for t in tools], ensure_ascii=False, indent=2)
        return ("You can call any of the following tools to satisfy the user's requests:\n" + listing +
                "\n\nRespond in JSON format, either with `tool_call" + ("s" if self.parallel else "") +
                "` (a request to call tools) or with `response` (a reply to the user's request).\n"
                "To call tools: " + shape + '\nTo reply: {"response": "<reply>"}')

    # ---- the output side -------------------------------------------------------------------

    def parse(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]]:
        j = skip_ws(text, 0)
        rest = text[j:]
        if is_partial and any(f.startswith(rest) for f in FENCES):
            return "", []
        for f in FENCES:
            if rest.startswith(f):
                j = skip_ws(text, j + len(f))
                break
        if j >= len(text):
            return ("", []) if is_partial else (text.strip(), [])
        if text[j] != "{":
            return text.strip(), []
        try:
            return self._object(text, j, is_partial)
        except ValueError:
            return text.strip(), []

    def _object(self, text: str, j: int, is_partial: bool) -> tuple[str, list[ToolCall]]:
        scan = scan_object(text, j)
        if not scan.members:
            if scan.complete:
                raise ValueError("empty object")
            return "", []
        first = scan.members[0]
        if first.key == "tool_call":
            if text[first.start:first.start + 1] not in ("{", ""):
                raise ValueError("tool_call is not an object")
            if first.start >= len(text):
                return "", []
            jc = read_call(text, first.start, self.tool_names)
            return "", [jc.call] if jc.call is not None else []
        if first.key == "tool_calls":
            if first.start >= len(text):
                return "", []
            if text[first.start] != "[":
                raise ValueError("tool_calls is not an array")
            calls, _, _ = read_call_list(text, first.start, self.tool_names)
            return "", calls
        if first.key == "response":
            raw = text[first.start:first.end]
            if not raw:
                return "", []
            if raw[0] != '"':
                value = json.loads(raw) if first.complete else None
                return ("" if value is None else json.dumps(value, ensure_ascii=False)), []
            return partial_string(raw), []
        if first.key == "name":
            jc = read_call(text, j, self.tool_names)
            return "", [jc.call] if jc.call is not None else []
        if scan.complete or not is_partial:
            raise ValueError("not a tool call or a response")
        return "", []
