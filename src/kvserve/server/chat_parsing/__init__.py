"""Reading chat model output: reasoning blocks and tool calls, whole or while streaming.

- ``msg``: the parsed message and the streaming diffs between two parses
- ``reasoning``: thinking tags and their extraction
- ``hermes``, ``llama3``, ``mistral``, ``generic``: one module per tool-call family
- ``syntax``: family detection and the per-request parser; ``stream``: incremental parsing
"""

from kvserve.server.chat_parsing.msg import ChatMsg, MsgDiff, ToolCall
from kvserve.server.chat_parsing.stream import ChatStream, parse_final
from kvserve.server.chat_parsing.syntax import ChatSyntax, detect_tool_format

__all__ = ["ChatMsg", "ChatStream", "ChatSyntax", "MsgDiff", "ToolCall", "detect_tool_format", "parse_final"]
