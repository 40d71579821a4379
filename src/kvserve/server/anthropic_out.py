"""Anthropic Messages responses: the message object and its event stream (llama-server's
``to_json_anthropic`` / ``to_json_anthropic_stream``).

Content blocks in order: ``thinking`` (from ``reasoning_content``, empty ``signature``), ``text``,
then one ``tool_use`` per tool call (``input`` = the parsed arguments). ``stop_reason``:
``tool_use`` when the model called tools, ``end_turn`` on EOS or a stop sequence (which is also
reported in ``stop_sequence``), else ``max_tokens``. ``usage``: ``input_tokens`` are the prompt
tokens evaluated (not from the cache), ``cache_read_input_tokens`` those reused, ``output_tokens``.

Stream: ``event: <type>`` + ``data: <json>`` per event: ``message_start``, then per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``; a ``signature_delta`` closes a thinking block) / ``content_block_stop``, then
``message_delta`` (stop reason, output tokens) and ``message_stop``. Blocks are numbered in the
order they start and each is stopped before the next starts. Keep-alives are SSE comments, an error
after the start is ``event: error``. No ``[DONE]``, no ``timings``.
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.engine.request import FinalEvent, ProgressEvent, TokenEvent
from kvserve.server import responses as R
from kvserve.server.chat_parsing import ChatMsg, ChatStream, MsgDiff
from kvserve.server.jsonio import dumps


def stop_reason(ev: FinalEvent, has_tool_calls: bool) -> str:
    if ev.stop_type in ("eos", "word", "grammar"):
        return "tool_use" if has_tool_calls else "end_turn"
    return "max_tokens"


def _stop_sequence(ev: FinalEvent) -> str | None:
    return ev.stopping_word or None


def _input(arguments: str) -> Any:
    try:
        v = json.loads(arguments)
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


def usage(n_prompt: int, n_cached: int, n_decoded: int) -> dict[str, int]:
    return {"cache_read_input_tokens": n_cached, "input_tokens": n_prompt - n_cached,
            "output_tokens": n_decoded}


def content_blocks(msg: ChatMsg) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if msg.reasoning_content:
        out.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        out.append({"type": "text", "text": msg.content})
    for tc in msg.tool_calls:
        out.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": _input(tc.arguments)})
    return out


def message_body(ev: FinalEvent, ctx: R.ResponseContext) -> dict[str, Any]:
    """The non-streamed ``message`` object."""
    msg = R.chat_message(ev, ctx.params)
    return {
        "id": ctx.id,
        "type": "message",
        "role": "assistant",
        "content": content_blocks(msg),
        "model": ctx.model,
        "stop_reason": stop_reason(ev, bool(msg.tool_calls)),
        "stop_sequence": _stop_sequence(ev),
        "usage": usage(ev.n_prompt, ev.n_cached, ev.n_decoded),
    }


def event_frame(obj: dict[str, Any]) -> str:
    return f"event: {obj['type']}\ndata: {dumps(obj)}\n\n"


class AnthropicFormat:
    """The event stream of one message (Anthropic takes no ``n``: one result per request)."""

    done_marker = ""

    def __init__(self, ctx: R.ResponseContext):
        self.ctx = ctx
        self.syntax = ctx.params.chat_syntax
        self.stream = ChatStream(self.syntax) if self.syntax is not None else None
        self.started = False
        self.text = ""  # output without a parser (plain text)
        self.block = -1  # index of the open block (-1: none yet)
        self.block_kind = ""  # thinking | text | tool_use:<i>

    # framing -------------------------------------------------------------------------
    encode = staticmethod(event_frame)

    @staticmethod
    def fast_token(ev: Any) -> None:
        """No template: every event is rendered (see ``sse.NativeFormat.fast_token``)."""
        return None

    @staticmethod
    def error_frame(body: dict[str, Any]) -> str:
        return f"event: error\ndata: {dumps(body.get('error', body))}\n\n"

    # events --------------------------------------------------------------------------
    def _begin(self, n_prompt: int, n_cached: int) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        return [{"type": "message_start", "message": {
            "id": self.ctx.id, "type": "message", "role": "assistant", "content": [], "model": self.ctx.model,
            "stop_reason": None, "stop_sequence": None, "usage": usage(n_prompt, n_cached, 0)}}]

    def _close(self) -> list[dict[str, Any]]:
        if self.block < 0 or not self.block_kind:
            return []
        out: list[dict[str, Any]] = []
        if self.block_kind == "thinking":  # Anthropic clients expect a signature before the stop
            out.append({"type": "content_block_delta", "index": self.block,
                        "delta": {"type": "signature_delta", "signature": ""}})
        out.append({"type": "content_block_stop", "index": self.block})
        self.block_kind = ""
        return out

    def _open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        if self.block_kind == kind:
            return []
        out = self._close()
        self.block += 1
        self.block_kind = kind
        out.append({"type": "content_block_start", "index": self.block, "content_block": block})
        return out

    def _diff_events(self, d: MsgDiff) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if d.reasoning_content:
            out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append({"type": "content_block_delta", "index": self.block,
                        "delta": {"type": "thinking_delta", "thinking": d.reasoning_content}})
        if d.content:
            out += self._open("text", {"type": "text", "text": ""})
            out.append({"type": "content_block_delta", "index": self.block,
                        "delta": {"type": "text_delta", "text": d.content}})
        if d.tool_index is not None:
            if d.tool_name:
                out += self._open(f"tool_use:{d.tool_index}",
                                  {"type": "tool_use", "id": d.tool_id, "name": d.tool_name, "input": {}})
            if d.tool_arguments:
                out.append({"type": "content_block_delta", "index": self.block,
                            "delta": {"type": "input_json_delta", "partial_json": d.tool_arguments}})
        return out

    def _text_diffs(self, text: str) -> list[MsgDiff]:
        return [MsgDiff(content=text)] if text else []

    def token(self, ev: TokenEvent) -> list[dict[str, Any]]:
        out = self._begin(ev.n_prompt, ev.n_cached)
        diffs = self.stream.update(ev.text) if self.stream is not None else self._text_diffs(ev.text)
        for d in diffs:
            out += self._diff_events(d)
        return out

    def progress(self, ev: ProgressEvent) -> list[dict[str, Any]]:
        return []  # llama-server sends nothing for prompt progress on this API

    def final(self, ev: FinalEvent) -> list[dict[str, Any]]:
        out = self._begin(ev.n_prompt, ev.n_cached)
        if self.stream is not None:
            diffs = self.stream.finish(ev.content)
            has_calls = bool(self.stream.msg.tool_calls)
        else:
            diffs = []
            has_calls = False
        for d in diffs:
            out += self._diff_events(d)
        out += self._close()
        out.append({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(ev, has_calls), "stop_sequence": _stop_sequence(ev)},
                    "usage": {"output_tokens": ev.n_decoded}})
        out.append({"type": "message_stop"})
        return out
