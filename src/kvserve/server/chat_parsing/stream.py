"""One choice's output, parsed again as it grows, and the deltas to send for it."""

from __future__ import annotations

import logging

from kvserve.server.chat_parsing.msg import ChatMsg, DiffError, MsgDiff, compute_diffs
from kvserve.server.chat_parsing.syntax import ChatSyntax
from kvserve.server.random_ids import random_alnum

log = logging.getLogger("kvserve.server")


def tool_call_id() -> str:
    """32 random alphanumerics, like llama-server's ``gen_tool_call_id``."""
    return random_alnum(32)


class ChatStream:
    """Feed text as it arrives (``update``), then the full text once (``finish``).

    Tool calls get an id when they first appear (the model's own id if it wrote one) and keep
    it. If a parse ever fails to extend the previous one, nothing more is sent for that step:
    what the client already has stays valid.
    """

    def __init__(self, syntax: ChatSyntax) -> None:
        self.syntax = syntax
        self.text = ""
        self.msg = ChatMsg()
        self._ids: list[str] = []

    def _assign_ids(self, msg: ChatMsg) -> None:
        for i, tc in enumerate(msg.tool_calls):
            if i >= len(self._ids):
                self._ids.append(tc.id or tool_call_id())
            tc.id = self._ids[i]

    def _step(self, is_partial: bool) -> list[MsgDiff]:
        new = self.syntax.parse(self.text, is_partial)
        self._assign_ids(new)
        try:
            diffs = compute_diffs(self.msg, new)
        except DiffError as e:
            log.warning("chat output parse did not extend the previous one: %s", e)
            return []
        self.msg = new
        return diffs

    def update(self, text: str) -> list[MsgDiff]:
        self.text += text
        return self._step(is_partial=True)

    def finish(self, full_text: str) -> list[MsgDiff]:
        self.text = full_text
        return self._step(is_partial=False)


def parse_final(syntax: ChatSyntax, text: str) -> ChatMsg:
    """The message of a non-streamed result (tool calls with fresh ids)."""
    s = ChatStream(syntax)
    s.finish(text)
    return s.msg
