"""Llama 3.1 / 3.2 / 3.3 tool calls: the whole reply is a JSON object
``{"name": …, "parameters": …}`` (optionally after ``<|python_tag|>``), several separated by
``;``. Any other reply is content."""

from __future__ import annotations

from kvserve.server.chat_parsing.json_calls import read_call
from kvserve.server.chat_parsing.msg import ToolCall
from kvserve.server.chat_parsing.partial_json import skip_ws

PYTHON_TAG = "<|python_tag|>"


class Llama3Format:
    name = "Llama 3.x"

    def __init__(self, tool_names: frozenset[str] = frozenset()) -> None:
        self.tool_names = tool_names

    @property
    def trigger(self) -> str:
        return '{"name":'

    def parse(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]]:
        j = skip_ws(text, 0)
        rest = text[j:]
        if is_partial and (not rest or PYTHON_TAG.startswith(rest)):
            return "", []  # undecided: a call may follow
        if rest.startswith(PYTHON_TAG):
            j = skip_ws(text, j + len(PYTHON_TAG))
        if j >= len(text):
            return ("", []) if is_partial else (text.strip(), [])
        if text[j] != "{":
            return text.strip(), []
        calls: list[ToolCall] = []
        try:
            while True:
                jc = read_call(text, j, self.tool_names)
                if jc.call is not None:
                    calls.append(jc.call)
                if not jc.complete:
                    if jc.call is None and not is_partial:
                        return text.strip(), []
                    return "", calls
                j = skip_ws(text, jc.end)
                if j < len(text) and text[j] == ";":
                    j = skip_ws(text, j + 1)
                if j >= len(text):
                    return "", calls
                if text[j] != "{":
                    raise ValueError("text after a tool call")
        except ValueError:  # not a call (or text after the calls, which is dropped)
            return ("", calls) if calls else (text.strip(), [])
