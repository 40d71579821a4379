"""Chat messages as llama-server checks and parses them: the one place ``messages``/``tools`` are validated.

* ``request_messages``: ``oaicompat_chat_params_parse``'s checks on a chat body (400s; media parts
  kvserve cannot take are refused naming the part), typed text parts joined by newlines.
* ``validate_messages``: those checks plus ``common_chat_msgs_parse_oaicompat``: the messages as
  templates see them. llama-server answers 500 for the errors raised while parsing; they are the
  client's mistakes, so kvserve answers 400 for all of them. ``validate_tools``: ``common_chat_tools_parse_oaicompat``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

MEDIA_PARTS = ("image_url", "input_audio", "input_video", "audio_url", "video_url")


class MessageFormatError(ValueError):
    """A malformed ``messages``/``tools`` list: a client error, answered 400."""

    def __init__(self, message: str, unsupported: str | None = None) -> None:
        super().__init__(message)
        self.unsupported = unsupported  # a request part kvserve cannot take (answered 400 naming it)


def request_messages(body: Mapping[str, Any]) -> list[Any]:
    """The checks llama-server makes on ``body["messages"]`` before templating; copies of the
    messages with typed text content joined by newlines (what templates taking strings see)."""
    if "messages" not in body:
        raise MessageFormatError("'messages' is required")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise MessageFormatError("Expected 'messages' to be an array")
    out: list[Any] = []
    for msg in messages:
        is_obj = isinstance(msg, dict)
        role = msg.get("role") if is_obj else None
        role = role if isinstance(role, str) else ""
        if role != "assistant" and not (is_obj and "content" in msg):
            raise MessageFormatError("All non-assistant messages must contain 'content'")
        if role == "assistant" and "content" not in msg and "tool_calls" not in msg:
            raise MessageFormatError("Assistant message must contain either 'content' or 'tool_calls'!")
        m = dict(msg)
        content = msg.get("content")
        if isinstance(content, list):
            texts: list[str] = []
            for part in content:
                ptype = part.get("type") if isinstance(part, dict) else None
                if ptype in MEDIA_PARTS:
                    raise MessageFormatError("multimodal input is not implemented",
                                             unsupported=f"content[].type={ptype}")
                if ptype != "text":
                    raise MessageFormatError("unsupported content[].type")
                text = part.get("text", "")
                texts.append(text if isinstance(text, str) else json.dumps(text))
            m["content"] = "\n".join(texts)
        elif content is None:
            m["content"] = ""
        elif not isinstance(content, str):
            raise MessageFormatError("Expected 'content' to be a string or an array")
        out.append(m)
    return out




def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """llama-server's checks on ``messages`` (``oaicompat_chat_params_parse`` then
    ``common_chat_msgs_parse_oaicompat``). Returns the messages as templates see them: ``content``
    always a string (text parts joined by newlines), tool calls normalized."""
    if messages is None:
        raise MessageFormatError("'messages' is required")
    if not isinstance(messages, list):
        raise MessageFormatError("Expected 'messages' to be an array")
    for msg in messages:
        is_obj = isinstance(msg, dict)
        role = msg.get("role") if is_obj else None
        role = role if isinstance(role, str) else ""
        has_content = is_obj and "content" in msg
        if role != "assistant" and not has_content:
            raise MessageFormatError("All non-assistant messages must contain 'content'")
        if role == "assistant":
            if not has_content and "tool_calls" not in msg:
                raise MessageFormatError("Assistant message must contain either 'content' or 'tool_calls'!")
            if not has_content:
                continue
        content = msg["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise MessageFormatError("Expected 'content' to be a string or an array")
        for part in content:
            ptype = part.get("type") if isinstance(part, dict) else None
            ptype = ptype if isinstance(ptype, str) else ""
            if ptype in ("image_url", "input_audio"):
                media = "image" if ptype == "image_url" else "audio"
                raise MessageFormatError(
                    f"{media} input is not supported - hint: if this is unexpected, "
                    "you may need to provide the mmproj"
                )
            if ptype != "text":
                raise MessageFormatError("unsupported content[].type")
    try:
        return [_parse_message(m) for m in messages]
    except ValueError as e:
        raise MessageFormatError(f"Failed to parse messages: {e}") from None


def _parse_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError(f"Expected 'message' to be an object, got {_dump(message)}")
    if "role" not in message:
        raise ValueError(f"Missing 'role' in message: {_dump(message)}")
    role = message["role"]
    if not isinstance(role, str):
        raise ValueError(f"'role' must be a string, got {_dump(role)}")
    out: dict[str, Any] = {"role": role}
    has_content = "content" in message
    has_tool_calls = "tool_calls" in message
    content = ""
    if has_content:
        raw = message["content"]
        if isinstance(raw, str):
            content = raw
        elif isinstance(raw, list):
            texts: list[str] = []
            for part in raw:
                if not isinstance(part, dict) or "type" not in part:
                    raise ValueError(f"Missing content part type: {_dump(part)}")
                if part["type"] not in ("text", "media_marker"):
                    raise ValueError(f"Unsupported content part type: {_dump(part['type'])}")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part 'text' must be a string: {_dump(part)}")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif raw is not None:
            raise ValueError(
                f"Invalid 'content' type: expected string or array, got {_dump(raw)} "
                "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)"
            )
    out["content"] = content
    if has_tool_calls:
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise ValueError(f"Expected 'tool_calls' to be an array, got {_dump(calls)}")
        out_calls = [_parse_tool_call(tc) for tc in calls]
    if not has_content and not has_tool_calls:
        raise ValueError(
            "Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/llama.cpp/issues/8367 & "
            "https://github.com/ggml-org/llama.cpp/issues/12279)"
        )
    for key in ("reasoning_content", "name", "tool_call_id"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"'{key}' must be a string, got {_dump(value)}")
        if value:
            out[key] = value
    if has_tool_calls and out_calls:
        out["tool_calls"] = out_calls
    return out


def _parse_tool_call(tool_call: Any) -> dict[str, Any]:
    if not isinstance(tool_call, dict) or "type" not in tool_call:
        raise ValueError(f"Missing tool call type: {_dump(tool_call)}")
    if tool_call["type"] != "function":
        raise ValueError(f"Unsupported tool call type: {_dump(tool_call)}")
    fn = tool_call.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"Missing tool call function: {_dump(tool_call)}")
    if "name" not in fn:
        raise ValueError(f"Missing tool call name: {_dump(tool_call)}")
    args = fn.get("arguments", "")
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else _dump(args)},
    }
    if tool_call.get("id"):
        call["id"] = tool_call["id"]
    return call


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """``common_chat_tools_parse_oaicompat``: tools as templates see them."""
    if tools is None:
        return []
    try:
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {_dump(tools)}")
        out: list[dict[str, Any]] = []
        for tool in tools:
            if not isinstance(tool, dict) or "type" not in tool:
                raise ValueError(f"Missing tool type: {_dump(tool)}")
            if tool["type"] != "function":
                raise ValueError(f"Unsupported tool type: {_dump(tool)}")
            fn = tool.get("function")
            if not isinstance(fn, dict):
                raise ValueError(f"Missing tool function: {_dump(tool)}")
            if "name" not in fn:
                raise ValueError(f"Missing tool function name: {_dump(tool)}")
            out.append({
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": fn.get("parameters", {}),
                },
            })
        return out
    except ValueError as e:
        raise MessageFormatError(f"Failed to parse tools: {e}") from None



def arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``func_args_not_string`` workaround: tool-call arguments decoded from JSON."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out_calls = []
    for call in calls:
        args = call["function"]["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError as e:
                raise MessageFormatError(f"Failed to parse tool call arguments as JSON: {e}") from None
        out_calls.append({**call, "function": {**call["function"], "arguments": args}})
    return {**message, "tool_calls": out_calls}


def prefill_text(message: Mapping[str, Any]) -> str:
    """The prefilled assistant text, as llama.cpp continues a final message
    (``common_chat_msg::render_content``): text parts joined by a blank line."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content if isinstance(content, str) else ""


