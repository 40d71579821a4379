"""OpenAI Responses results: the ``response`` object and its event stream (llama-server's
``to_json_oaicompat_resp`` / ``…_resp_stream``).

``output``: a ``reasoning`` item (``rs_…``, from ``reasoning_content``), a ``message`` item
(``msg_…``, one ``output_text`` part), then one ``function_call`` item per tool call (``fc_<id>``,
``call_id`` ``call_<id>``). ``usage``: ``input_tokens`` (the whole prompt), ``output_tokens``,
``total_tokens``, ``input_tokens_details.cached_tokens``.

Stream: ``event: <type>`` + ``data: <json>``: ``response.created`` and ``response.in_progress``
first (again with ``prompt_progress`` under ``return_progress``), then per item
``response.output_item.added`` and its deltas (``response.reasoning_text.delta``,
``response.content_part.added`` + ``response.output_text.delta``,
``response.function_call_arguments.delta``), at the end the ``….done`` events and
``response.completed`` (with ``timings``). Besides llama-server's keys, events carry
``sequence_number``, ``output_index`` and ``content_index`` as OpenAI's own stream does, so the
OpenAI SDKs' stream helpers can assemble the response. No ``[DONE]``.
"""

from __future__ import annotations

import time
from typing import Any

from kvserve.engine.request import FinalEvent, ProgressEvent, TokenEvent
from kvserve.server import responses as R
from kvserve.server.chat_parsing import ChatMsg, ChatStream, MsgDiff
from kvserve.server.jsonio import dumps
from kvserve.server.random_ids import random_alnum



def random_id(prefix: str) -> str:
    return prefix + random_alnum(32)


def usage(ev: FinalEvent) -> dict[str, Any]:
    return {"input_tokens": ev.n_prompt, "output_tokens": ev.n_decoded,
            "total_tokens": ev.n_prompt + ev.n_decoded, "input_tokens_details": {"cached_tokens": ev.n_cached}}


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"id": item_id, "summary": [], "type": "reasoning",
            "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": "",
            "status": "completed"}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _message_item(item_id: str, text: str) -> dict[str, Any]:
    return {"content": [_text_part(text)], "id": item_id, "role": "assistant", "status": "completed",
            "type": "message"}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": "fc_" + call_id, "type": "function_call", "status": status, "arguments": arguments,
            "call_id": "call_" + call_id, "name": name}


def output_items(msg: ChatMsg, reasoning_id: str, message_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if msg.reasoning_content:
        out.append(_reasoning_item(reasoning_id, msg.reasoning_content))
    if msg.content:
        out.append(_message_item(message_id, msg.content))
    for tc in msg.tool_calls:
        out.append(_call_item(tc.id, tc.name, tc.arguments))
    return out


def response_body(ev: FinalEvent, ctx: R.ResponseContext) -> dict[str, Any]:
    """The non-streamed ``response`` object."""
    msg = R.chat_message(ev, ctx.params)
    t = int(time.time())
    return {"completed_at": t, "created_at": ctx.created, "id": random_id("resp_"), "model": ctx.model,
            "object": "response", "output": output_items(msg, random_id("rs_"), random_id("msg_")),
            "status": "completed", "usage": usage(ev)}


class ResponsesFormat:
    """The event stream of one response (one result per request)."""

    done_marker = ""

    def __init__(self, ctx: R.ResponseContext):
        self.ctx = ctx
        self.stream = ChatStream(ctx.params.chat_syntax) if ctx.params.chat_syntax is not None else None
        self.id = random_id("resp_")
        self.reasoning_id = random_id("rs_")
        self.message_id = random_id("msg_")
        self.created = False
        self.seq = 0
        self.items: list[str] = []  # output item kinds in order: reasoning | message | fc:<i>
        self.fc_ids: dict[int, str] = {}

    @staticmethod
    def encode(obj: dict[str, Any]) -> str:
        return f"event: {obj['type']}\ndata: {dumps(obj)}\n\n"

    @staticmethod
    def fast_token(ev: Any) -> None:
        """No template: every event is rendered (see ``sse.NativeFormat.fast_token``)."""
        return None

    @staticmethod
    def error_frame(body: dict[str, Any]) -> str:
        return "data: " + dumps(body) + "\n\n"

    # helpers -------------------------------------------------------------------------
    def _ev(self, type_: str, **fields: Any) -> dict[str, Any]:
        out = {"type": type_, **fields, "sequence_number": self.seq}
        self.seq += 1
        return out

    def _response(self, status: str, output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.ctx.created, "status": status,
                "model": self.ctx.model, "output": output or []}

    def _begin(self) -> list[dict[str, Any]]:
        if self.created:
            return []
        self.created = True
        return [self._ev("response.created", response=self._response("in_progress")),
                self._ev("response.in_progress", response=self._response("in_progress"))]

    def _item(self, kind: str) -> tuple[int, bool]:
        """(output_index, new) of an output item."""
        if kind in self.items:
            return self.items.index(kind), False
        self.items.append(kind)
        return len(self.items) - 1, True

    def _diff_events(self, d: MsgDiff) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if d.reasoning_content:
            i, new = self._item("reasoning")
            if new:
                out.append(self._ev("response.output_item.added", output_index=i, item={
                    "id": self.reasoning_id, "summary": [], "type": "reasoning", "content": [],
                    "encrypted_content": "", "status": "in_progress"}))
            out.append(self._ev("response.reasoning_text.delta", delta=d.reasoning_content,
                                item_id=self.reasoning_id, output_index=i, content_index=0))
        if d.content:
            i, new = self._item("message")
            if new:
                out.append(self._ev("response.output_item.added", output_index=i, item={
                    "content": [], "id": self.message_id, "role": "assistant", "status": "in_progress",
                    "type": "message"}))
                part = {"type": "output_text", "text": "", "annotations": []}
                out.append(self._ev("response.content_part.added", item_id=self.message_id, output_index=i,
                                    content_index=0, part=part))
            out.append(self._ev("response.output_text.delta", item_id=self.message_id, delta=d.content,
                                output_index=i, content_index=0, logprobs=[]))
        if d.tool_index is not None:
            i, new = self._item(f"fc:{d.tool_index}")
            if new:
                self.fc_ids[d.tool_index] = d.tool_id
                out.append(self._ev("response.output_item.added", output_index=i,
                                    item=_call_item(d.tool_id, d.tool_name, "", "in_progress")))
            if d.tool_arguments:
                out.append(self._ev("response.function_call_arguments.delta", delta=d.tool_arguments,
                                    item_id="fc_" + self.fc_ids.get(d.tool_index, d.tool_id), output_index=i))
        return out

    # events --------------------------------------------------------------------------
    def token(self, ev: TokenEvent) -> list[dict[str, Any]]:
        out = self._begin()
        diffs = self.stream.update(ev.text) if self.stream is not None else (
            [MsgDiff(content=ev.text)] if ev.text else [])
        for d in diffs:
            out += self._diff_events(d)
        if ev.timings and out:
            out[-1]["timings"] = ev.timings
        return out

    def progress(self, ev: ProgressEvent) -> list[dict[str, Any]]:
        out = self._begin() or [self._ev("response.in_progress", response=self._response("in_progress"))]
        out[-1]["prompt_progress"] = {"total": ev.total, "cache": ev.cache, "processed": ev.processed,
                                      "time_ms": ev.time_ms}
        return out

    def final(self, ev: FinalEvent) -> list[dict[str, Any]]:
        out = self._begin()
        if self.stream is not None:
            for d in self.stream.finish(ev.content):
                out += self._diff_events(d)
            msg = self.stream.msg
        else:
            msg = ChatMsg(ev.content)
        output = output_items(msg, self.reasoning_id, self.message_id)
        kinds = (["reasoning"] if msg.reasoning_content else []) + (["message"] if msg.content else []) + [
            f"fc:{j}" for j in range(len(msg.tool_calls))]
        for kind, item in zip(kinds, output):
            i, _ = self._item(kind)
            if kind == "reasoning":
                out.append(self._ev("response.reasoning_text.done", item_id=self.reasoning_id, output_index=i,
                                    content_index=0, text=msg.reasoning_content))
            elif kind == "message":
                out.append(self._ev("response.output_text.done", item_id=self.message_id, text=msg.content,
                                    output_index=i, content_index=0, logprobs=[]))
                out.append(self._ev("response.content_part.done", item_id=self.message_id, output_index=i,
                                    content_index=0, part=_text_part(msg.content)))
            else:
                out.append(self._ev("response.function_call_arguments.done", item_id=item["id"],
                                    output_index=i, arguments=item["arguments"]))
            out.append(self._ev("response.output_item.done", output_index=i, item=item))
        done = self._response("completed", output)
        done["usage"] = usage(ev)
        out.append(self._ev("response.completed", response=done))
        out[-1]["timings"] = R.timings(ev)
        return out
