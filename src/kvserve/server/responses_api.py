"""OpenAI Responses bodies -> OpenAI chat bodies (``server_chat_convert_responses_to_chatcmpl``).

``/v1/responses`` (and ``/responses``, ``/v1/responses/input_tokens``) convert the body here and
take the chat path. ``instructions`` -> a leading system message; ``input`` is a string (one user
message) or a list of items:

- input messages (``role`` user/system/developer; ``content`` a string or ``input_text`` /
  ``input_image`` parts; images are then refused by the chat checks: no media input);
- output messages (``role: assistant``, ``type: message``; ``output_text`` / ``refusal`` parts);
- ``function_call`` (-> an assistant tool call) and ``function_call_output`` (-> a tool message);
- ``reasoning`` items (-> ``reasoning_content``).

Consecutive assistant items merge into one assistant message. ``tools`` of type ``function`` become
chat functions (others have no chat equivalent and are skipped, as in llama-server);
``tool_choice`` ``{"type": "function", "name": …}`` becomes the chat form; ``max_output_tokens`` ->
``max_tokens``; ``reasoning.effort`` -> ``reasoning_effort``; ``text.format`` -> ``response_format``.
``previous_response_id`` is refused: responses are not stored. Other keys pass through to the chat
body, as in llama-server.
"""

from __future__ import annotations

import logging
from typing import Any

from kvserve.server.errors import invalid, unsupported_field

log = logging.getLogger("kvserve.server")
_INPUT_ROLES = ("user", "system", "developer")


def _is_str(d: dict[str, Any], key: str) -> bool:
    return isinstance(d.get(key), str)


def _input_parts(content: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for part in content:
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype == "input_text":
            if "text" not in part:
                raise invalid("'Input text' requires 'text'")
            out.append({"text": part["text"], "type": "text"})
        elif ptype == "input_image":
            if "image_url" not in part:
                raise invalid("'image_url' is required")
            out.append({"image_url": {"url": part["image_url"]}, "type": "image_url"})
        elif ptype == "input_file":
            raise unsupported_field("input[].content[].type=input_file", "file input is not implemented")
        else:
            raise invalid("'type' must be one of 'input_text', 'input_image', or 'input_file'")
    return out


def _output_parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    content = item.get("content")
    if isinstance(content, str):
        return [{"text": content, "type": "text"}]
    out: list[dict[str, Any]] = []
    if isinstance(content, list):
        for part in content:
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype in ("output_text", "input_text"):
                if not _is_str(part, "text"):
                    raise invalid("'Output text' requires 'text'")
                out.append({"text": part["text"], "type": "text"})
            elif ptype == "refusal":
                if not _is_str(part, "refusal"):
                    raise invalid("'Refusal' requires 'refusal'")
                # chat content parts have text only: a refusal is what the assistant said
                out.append({"text": part["refusal"], "type": "text"})
            else:
                raise invalid("'type' must be one of 'output_text' or 'refusal'")
    return out


def _tool_output(item: dict[str, Any]) -> dict[str, Any]:
    output = item["output"]
    if isinstance(output, str):
        return {"content": output, "role": "tool", "tool_call_id": item["call_id"]}
    parts = []
    for o in output:
        otype = o.get("type") if isinstance(o, dict) else None
        if otype == "input_text":
            parts.append({**o, "type": "text"})
        elif otype == "input_image":
            if "image_url" not in o:
                raise invalid("'image_url' is required")
            parts.append({**o, "type": "image_url", "image_url": {"url": o["image_url"]}})
        elif otype is None:
            raise invalid("Output of tool call missing 'type' field")
        else:
            raise invalid("Output of tool call should be 'Input text' or 'Input image'")
    return {"content": parts, "role": "tool", "tool_call_id": item["call_id"]}


def _messages(inp: Any) -> list[dict[str, Any]]:
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if not isinstance(inp, list):
        raise invalid("'input' must be a string or array of objects")
    msgs: list[dict[str, Any]] = []
    for raw in inp:
        if not isinstance(raw, dict):
            raise invalid("Cannot determine type of 'item'")
        item = dict(raw)
        merge = bool(msgs) and msgs[-1].get("role") == "assistant"
        if _is_str(item, "content"):
            item["content"] = [{"text": item["content"], "type": "input_text"}]
        itype = item.get("type")
        role = item.get("role")
        if isinstance(item.get("content"), list) and role in _INPUT_ROLES:
            item.pop("type", None)
            item.pop("status", None)
            item["content"] = _input_parts(item["content"])
            msgs.append(item)
        elif role == "assistant" and itype == "message":
            parts = _output_parts(item)
            if merge:
                prev = msgs[-1]
                if not isinstance(prev.get("content"), list):
                    prev["content"] = []
                prev["content"].extend(parts)
            else:
                item.pop("status", None)
                item.pop("type", None)
                item.pop("id", None)
                item["content"] = parts
                msgs.append(item)
        elif itype == "function_call" and all(_is_str(item, k) for k in ("arguments", "call_id", "name")):
            call = {"function": {"arguments": item["arguments"], "name": item["name"]},
                    "id": item["call_id"], "type": "function"}
            if merge:
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif (itype == "function_call_output" and _is_str(item, "call_id")
              and isinstance(item.get("output"), (str, list))):
            msgs.append(_tool_output(item))
        elif itype == "reasoning" and isinstance(item.get("summary"), list):
            content = item.get("content")
            if not isinstance(content, list):
                raise invalid("item['content'] is not an array")
            if not content:
                raise invalid("item['content'] is empty")
            if not isinstance(content[0], dict) or not _is_str(content[0], "text"):
                raise invalid("item['content']['text'] is not a string")
            if merge:
                msgs[-1]["reasoning_content"] = content[0]["text"]
            else:
                msgs.append({"role": "assistant", "content": "", "reasoning_content": content[0]["text"]})
        else:
            raise invalid("Cannot determine type of 'item'")
    return msgs


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array of objects")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise invalid("'tools' must be an array of objects")
        if tool.get("type") != "function":
            log.warning("unsupported Responses tool type %r skipped", tool.get("type"))
            continue
        fn = {k: v for k, v in tool.items() if k != "type"}
        fn.setdefault("strict", True)
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(tc: Any) -> Any:
    if isinstance(tc, dict) and tc.get("type") == "function" and "function" not in tc:
        return {"type": "function", "function": {"name": tc.get("name")}}
    return tc


def _response_format(text: Any) -> dict[str, Any] | None:
    """``text.format`` -> the chat ``response_format`` (None: plain text)."""
    if not isinstance(text, dict) or text.get("format") is None:
        return None
    fmt = text["format"]
    if not isinstance(fmt, dict):
        raise invalid("'text.format' must be an object")
    ftype = fmt.get("type")
    if ftype == "text":
        return None
    if ftype == "json_object":
        return {"type": "json_object"}
    if ftype == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid("'text.format.type' must be one of 'text', 'json_object', 'json_schema'")


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat body equivalent to a Responses body."""
    if "input" not in body:
        raise invalid("'input' is required")
    prev = body.get("previous_response_id")
    if isinstance(prev, str) and prev:
        raise unsupported_field("previous_response_id", "responses are not stored")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions", "tools", "max_output_tokens",
                                                       "reasoning", "text", "previous_response_id")}
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        instr = body["instructions"]
        messages.append({"role": "system", "content": instr if isinstance(instr, str) else ""})
    messages += _messages(body["input"])
    chat["messages"] = messages
    if "tools" in body:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if "tool_choice" in body:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and "effort" in reasoning:
        chat["reasoning_effort"] = reasoning["effort"]
    rf = _response_format(body.get("text"))
    if rf is not None:
        chat["response_format"] = rf
    return chat
