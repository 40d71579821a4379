"""How one chat request's output is read: which tool-call format, which thinking tags.

``detect_tool_format`` picks the family from the chat template's source, as llama.cpp's
common/chat.cpp recognises templates by their markers; templates that render ``tools``
without a known marker, or cannot render tools at all, use the generic JSON format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kvserve.server.chat_parsing.generic import GenericFormat
from kvserve.server.chat_parsing.hermes import HermesFormat
from kvserve.server.chat_parsing.llama3 import Llama3Format
from kvserve.server.chat_parsing.mistral import MistralFormat
from kvserve.server.chat_parsing.msg import ChatMsg, ToolCall
from kvserve.server.chat_parsing.reasoning import ThinkTags, split_reasoning


class ToolFormat(Protocol):
    name: str

    @property
    def trigger(self) -> str:
        """The text that starts a call (where a lazy grammar activates)."""
        ...

    def parse(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]]:
        """(content, tool calls) of ``text`` (calls without ids)."""
        ...


def detect_tool_format(source: str, tool_names: frozenset[str] = frozenset(),
                       parallel: bool = False) -> ToolFormat:
    if "[TOOL_CALLS]" in source:
        return MistralFormat(tool_names)
    if "<tool_call>" in source:
        return HermesFormat(tool_names)
    if "<|start_header_id|>" in source and ("<|python_tag|>" in source or '"parameters"' in source):
        return Llama3Format(tool_names)
    return GenericFormat(tool_names, parallel)


@dataclass(frozen=True)
class ChatSyntax:
    """Everything the output parser needs; one per chat request.

    ``tools`` None: no tool-call parsing (no tools, ``tool_choice: none``). ``think`` None:
    no reasoning extraction (``reasoning_format: none`` or a template without thinking tags).
    ``opened``: the prompt ends inside a thinking block. ``parallel``: more than one call kept.
    """

    tools: ToolFormat | None = None
    think: ThinkTags | None = None
    opened: bool = False
    parallel: bool = True

    @property
    def name(self) -> str:
        """``chat_format`` as generation_settings reports it."""
        return self.tools.name if self.tools is not None else "Content-only"

    @property
    def is_plain(self) -> bool:
        return self.tools is None and self.think is None

    def parse(self, text: str, is_partial: bool) -> ChatMsg:
        reasoning, rest = "", text
        if self.think is not None:
            reasoning, rest = split_reasoning(text, self.think, self.opened, is_partial)
        if self.tools is None:
            return ChatMsg(rest, reasoning)
        own_json = isinstance(self.tools, (GenericFormat, Llama3Format))  # these read bare JSON themselves
        bare = None if own_json else self._bare_json(rest, is_partial)
        content, calls = bare if bare is not None else self.tools.parse(rest, is_partial)
        if not self.parallel:
            calls = calls[:1]
        return ChatMsg(content, reasoning, calls)

    def _bare_json(self, text: str, is_partial: bool) -> tuple[str, list[ToolCall]] | None:
        """A reply that is only a JSON call (``{"name": …, "arguments": …}``, maybe fenced), as
        small models write it without their family's markers. None: not such a reply."""
        lead = text.lstrip()
        if not (lead.startswith("{") or lead.startswith("```") or (is_partial and "```".startswith(lead))):
            return None
        if not lead:
            return None
        generic = GenericFormat(getattr(self.tools, "tool_names", frozenset()), self.parallel)
        content, calls = generic.parse(text, is_partial)
        if calls or (is_partial and content == ""):
            return "", calls
        return None
