"""The assistant message parsed from model output, and the diffs streaming sends.

A parser maps the text generated so far to a ``ChatMsg``. While streaming, each new parse is
compared with the previous one (``compute_diffs``): every field only ever grows, so a diff is
the appended suffix of ``reasoning_content``/``content``, the appended arguments of the last
tool call, and whole new tool calls (llama-server's ``common_chat_msg_diff``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    name: str
    arguments: str  # the JSON text of the arguments object, as generated
    id: str = ""


@dataclass
class ChatMsg:
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def to_oai(self) -> dict[str, Any]:
        """``message`` of a non-streamed chat completion (llama-server's key order)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [
                {"type": "function", "function": {"name": tc.name, "arguments": tc.arguments}, "id": tc.id}
                for tc in self.tool_calls
            ]
        return out


@dataclass
class MsgDiff:
    reasoning_content: str = ""
    content: str = ""
    tool_index: int | None = None
    tool_id: str = ""
    tool_name: str = ""
    tool_arguments: str = ""

    def to_delta(self) -> dict[str, Any]:
        """The ``delta`` of one chat.completion.chunk."""
        delta: dict[str, Any] = {}
        if self.reasoning_content:
            delta["reasoning_content"] = self.reasoning_content
        if self.content:
            delta["content"] = self.content
        if self.tool_index is not None:
            call: dict[str, Any] = {"index": self.tool_index}
            if self.tool_id:
                call["id"] = self.tool_id
                call["type"] = "function"
            fn: dict[str, Any] = {}
            if self.tool_name:
                fn["name"] = self.tool_name
            if self.tool_arguments:
                fn["arguments"] = self.tool_arguments
            if fn:
                call["function"] = fn
            delta["tool_calls"] = [call]
        return delta


class DiffError(RuntimeError):
    """A later parse does not extend an earlier one (a parser bug, never user input)."""


def string_diff(last: str, current: str) -> str:
    if current.startswith(last):
        return current[len(last):]
    if last.startswith(current):
        return ""  # the previous parse ended in a partial stop word that is now removed
    raise DiffError(f"parsed text shrank: {last!r} is not a prefix of {current!r}")


def compute_diffs(prev: ChatMsg, new: ChatMsg) -> list[MsgDiff]:
    out: list[MsgDiff] = []
    if prev.reasoning_content != new.reasoning_content:
        d = string_diff(prev.reasoning_content, new.reasoning_content)
        if d:
            out.append(MsgDiff(reasoning_content=d))
    if prev.content != new.content:
        d = string_diff(prev.content, new.content)
        if d:
            out.append(MsgDiff(content=d))
    if len(new.tool_calls) < len(prev.tool_calls):
        raise DiffError("parsed tool calls disappeared")
    if prev.tool_calls:
        i = len(prev.tool_calls) - 1
        p, n = prev.tool_calls[i], new.tool_calls[i]
        if p.name != n.name or p.id != n.id:
            raise DiffError(f"tool call {i} changed its name or id")
        args = string_diff(p.arguments, n.arguments)
        if args:
            out.append(MsgDiff(tool_index=i, tool_arguments=args))
    for i in range(len(prev.tool_calls), len(new.tool_calls)):
        tc = new.tool_calls[i]
        out.append(MsgDiff(tool_index=i, tool_id=tc.id, tool_name=tc.name, tool_arguments=tc.arguments))
    return out
