"""Anthropic Messages bodies -> OpenAI chat bodies (llama-server's ``server_chat_convert_anthropic_to_oai``).

``/v1/messages`` and ``/v1/messages/count_tokens`` convert the body here and then take the chat
path unchanged (template, tool calls, reasoning, sampling). The mapping follows llama-server:

- ``system``: a string or text blocks (concatenated) -> a leading system message; the ``cch=``
  stamp of an ``x-anthropic-billing-header`` system prompt is masked so the prefix cache holds.
- message content blocks: ``text`` stays a text part, ``thinking`` -> ``reasoning_content``,
  ``tool_use`` -> ``tool_calls``, ``tool_result`` -> ``role: tool`` messages that follow the
  message they came in. ``image`` blocks are refused (400): kvserve has no media input.
- ``tools`` (``name``/``description``/``input_schema``) -> functions; ``tool_choice`` ``auto``,
  ``any`` (-> ``required``), ``tool`` (-> that named function), ``none``;
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
- ``stop_sequences`` -> ``stop``; ``max_tokens`` (4096 when absent); ``temperature``, ``top_p``,
  ``top_k``, ``stream``, ``chat_template_kwargs`` pass through.
- ``thinking: {type: enabled, budget_tokens}`` -> a reasoning budget when the template has thinking
  tags (a model that cannot think has nothing to budget, as in llama-server);
  ``thinking: {type: disabled}`` -> ``enable_thinking: false``.

Other keys (``metadata``, ``service_tier``, …) change nothing in a local server and are dropped,
as llama-server drops them. Malformed bodies are 400s (llama-server: mostly 500).
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.server.errors import invalid, unsupported_field

DEFAULT_MAX_TOKENS = 4096
PASS_THROUGH = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")
BILLING_HEADER = "x-anthropic-billing-header:"
_IGNORED_BLOCKS = ("redacted_thinking",)  # encrypted thinking of another model: nothing to render


def normalize_billing_header(text: str) -> str:
    """``x-anthropic-billing-header: …; cch=a5145;…`` -> ``cch=fffff``: the stamp changes with every
    request and would stop prompt-cache reuse at the first line. Other prompts are unchanged."""
    if not text.startswith(BILLING_HEADER):
        return text
    i = text.find("cch=", len(BILLING_HEADER))
    if i < 0:
        return text
    j = i + 4
    if j + 5 < len(text) and text[j + 5] == ";":
        return text[:j] + "fffff" + text[j + 5:]
    return text


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return normalize_billing_header(system)
    if not isinstance(system, list):
        raise invalid("'system' must be a string or an array of text blocks")
    out = []
    for block in system:
        if not isinstance(block, dict):
            raise invalid("'system' blocks must be objects")
        if block.get("type") == "text":
            text = block.get("text", "")
            if not isinstance(text, str):
                raise invalid("'system' text blocks need a string 'text'")
            out.append(normalize_billing_header(text))
    return "".join(out)


def _no_media(where: str) -> None:
    raise unsupported_field(where, "image input is not supported (kvserve has no multimodal input)")


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id", "")
    if not isinstance(tool_use_id, str):
        raise invalid("'tool_result.tool_use_id' must be a string")
    content = block.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for c in content:
            ctype = c.get("type") if isinstance(c, dict) else None
            if ctype == "text":
                t = c.get("text", "")
                parts.append(t if isinstance(t, str) else json.dumps(t, ensure_ascii=False))
            elif ctype == "image":
                _no_media("messages[].content[].tool_result.content[].type=image")
            else:
                raise invalid(f"unsupported tool_result content block type: {ctype!r}")
        text = "".join(parts)
    elif content is None:
        text = ""
    else:
        raise invalid("'tool_result.content' must be a string or an array of blocks")
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    name = block.get("name", "")
    if not isinstance(name, str):
        raise invalid("'tool_use.name' must be a string")
    args = block.get("input", {})
    call_id = block.get("id", "")
    arguments = json.dumps(args, ensure_ascii=False, separators=(",", ":"))
    return {"id": call_id if isinstance(call_id, str) else str(call_id), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _convert_message(msg: Any) -> list[Any]:
    """One Anthropic message -> the chat messages it becomes (tool results after it)."""
    if not isinstance(msg, dict):
        return [msg]  # the chat checks answer for it
    role = msg.get("role")
    if "content" not in msg:
        return [] if role == "assistant" else [msg]
    content = msg["content"]
    if not isinstance(content, list):
        return [msg]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    reasoning = ""
    for block in content:
        btype = block.get("type") if isinstance(block, dict) else None
        if btype == "text":
            parts.append(block)
        elif btype == "thinking":
            t = block.get("thinking", "")
            reasoning += t if isinstance(t, str) else ""
        elif btype == "image":
            _no_media("messages[].content[].type=image")
        elif btype == "tool_use":
            calls.append(_tool_call(block))
        elif btype == "tool_result":
            results.append(_tool_result(block))
        elif btype in _IGNORED_BLOCKS:
            continue
        else:
            raise invalid(f"unsupported content block type: {btype!r}")
    out: list[Any] = []
    if parts or calls or reasoning:
        new: dict[str, Any] = {"role": role, "content": parts if parts else ""}
        if calls:
            new["tool_calls"] = calls
        if reasoning:
            new["reasoning_content"] = reasoning
        out.append(new)
    return out + results


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid("'tools' must be an array")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid("each tool needs a string 'name'")
        desc = tool.get("description", "")
        out.append({"type": "function", "function": {
            "name": tool["name"], "description": desc if isinstance(desc, str) else "",
            "parameters": tool.get("input_schema", {})}})
    return out


def _tool_choice(tc: Any, out: dict[str, Any]) -> None:
    if not isinstance(tc, dict):
        raise invalid("'tool_choice' must be an object with a 'type'")
    ttype = tc.get("type")
    if ttype == "auto":
        out["tool_choice"] = "auto"
    elif ttype == "any":
        out["tool_choice"] = "required"
    elif ttype == "tool":
        name = tc.get("name")
        if not isinstance(name, str) or not name:
            raise invalid("'tool_choice' of type 'tool' needs a 'name'")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif ttype == "none":
        out["tool_choice"] = "none"
    else:
        raise invalid("'tool_choice.type' must be one of 'auto', 'any', 'tool', 'none'")
    if tc.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def _thinking(thinking: Any, out: dict[str, Any], template_thinks: bool) -> None:
    if not isinstance(thinking, dict):
        raise invalid("'thinking' must be an object")
    ttype = thinking.get("type")
    if ttype == "enabled":
        budget = thinking.get("budget_tokens", 10000)
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise invalid("'thinking.budget_tokens' must be an integer")
        if template_thinks:
            out["thinking_budget_tokens"] = budget
    elif ttype == "disabled":
        kwargs = dict(out.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", False)
        out["chat_template_kwargs"] = kwargs
    elif ttype not in ("adaptive", None):
        raise invalid("'thinking.type' must be 'enabled' or 'disabled'")


def anthropic_to_chat(body: dict[str, Any], template_thinks: bool = False) -> dict[str, Any]:
    """The OpenAI chat body equivalent to an Anthropic Messages body. ``template_thinks``: the
    chat template has thinking tags (a thinking budget can apply)."""
    messages: list[Any] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _system_text(body["system"])})
    if "messages" not in body:
        raise invalid("'messages' is required")
    if not isinstance(body["messages"], list):
        raise invalid("Expected 'messages' to be an array")
    for msg in body["messages"]:
        messages.extend(_convert_message(msg))
    out: dict[str, Any] = {"messages": messages}
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], out)
    if "stop_sequences" in body:
        out["stop"] = body["stop_sequences"]
    out["max_tokens"] = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    for key in PASS_THROUGH:
        if key in body:
            out[key] = body[key]
    if body.get("thinking") is not None:
        _thinking(body["thinking"], out, template_thinks)
    return out
