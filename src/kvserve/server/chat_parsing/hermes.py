"""Hermes / Qwen 2.5 tool calls: ``<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``,
any number of them, with free text before (and between) the calls."""

from __future__ import annotations

from kvserve.server.chat_parsing.json_calls import read_call
from kvserve.server.chat_parsing.markers import hold_back
from kvserve.server.chat_parsing.msg import ToolCall
from kvserve.server.chat_parsing.partial_json import skip_ws


class HermesFormat:
    name = "Hermes 2 Pro"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, tool_names: frozenset[str] = frozenset()) -> None:
        self.tool_names = tool_names

    @property
    def trigger(self) -> str:
        return self.open_tag

    def parse(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]]:
        content: list[str] = []
        calls: list[ToolCall] = []
        pos = 0
        while True:
            i = text.find(self.open_tag, pos)
            if i < 0:
                content.append(hold_back(text[pos:], [self.open_tag], is_partial))
                break
            content.append(text[pos:i])
            j = skip_ws(text, i + len(self.open_tag))
            if j >= len(text):
                if not is_partial:
                    content.append(text[i:])
                break
            try:
                if text[j] != "{":
                    raise ValueError("not a JSON object")
                jc = read_call(text, j, self.tool_names)
            except ValueError:
                content.append(hold_back(text[i:], [self.open_tag], is_partial))
                break
            if jc.call is not None:
                calls.append(jc.call)
            if not jc.complete:
                if not is_partial and jc.call is None:
                    content.append(text[i:])
                break
            k = skip_ws(text, jc.end)
            if text.startswith(self.close_tag, k):
                pos = k + len(self.close_tag)
            elif is_partial and self.close_tag.startswith(text[k:]):
                break  # the closing tag is arriving
            else:
                pos = k  # a call without its closing tag: what follows is text
        return _join(content), calls


def _join(parts: list[str]) -> str:
    return "".join(parts).strip()
