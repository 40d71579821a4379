"""The request side of tool calls and reasoning on /v1/chat/completions.

- ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` are read and checked here (llama-server's
  ``oaicompat_chat_params_parse``): tools need ``--jinja`` (else 400; llama-server: 500), ``tool_choice`` is
  ``auto``, ``none``, ``required`` or ``{"type": "function", "function": {"name": …}}``.
- The tool-call family comes from the template source (``chat_parsing.detect_tool_format``). A
  template that cannot render tools gets them described in its system message, in the generic
  JSON format, and sees earlier calls and results as JSON text.
- ``ChatSyntax`` (what the output parser needs) is built from the family, the thinking tags of
  the template and the rendered generation prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kvserve.model.chat_template import MessageFormatError, validate_tools
from kvserve.server.chat_parsing import ChatSyntax, detect_tool_format
from kvserve.server.chat_parsing.generic import GenericFormat
from kvserve.server.chat_parsing.reasoning import detect_think_tags, starts_in_reasoning
from kvserve.server.chat_parsing.syntax import ToolFormat
from kvserve.server.errors import invalid

_CAPS: dict[str, dict[str, bool]] = {}
_THINKING: dict[str, bool] = {}


def template_source(tmpl: Any) -> str:
    src = getattr(tmpl, "source", "")
    return src if isinstance(src, str) else ""


def template_caps(tmpl: Any) -> dict[str, bool]:
    """``ChatTemplate.caps()``, computed once per template source."""
    src = template_source(tmpl)
    if src not in _CAPS:
        caps = getattr(tmpl, "caps", None)
        _CAPS[src] = dict(caps()) if callable(caps) else {}
    return _CAPS[src]


def supports_thinking(tmpl: Any) -> bool:
    """Whether the template has thinking tags or renders ``enable_thinking`` differently."""
    src = template_source(tmpl)
    if src not in _THINKING:
        ok = detect_think_tags(src) is not None
        if not ok:
            user = [{"role": "user", "content": "test"}]
            try:
                ok = tmpl.render(user, add_generation_prompt=True, enable_thinking=True) != tmpl.render(
                    user, add_generation_prompt=True, enable_thinking=False)
            except Exception:  # noqa: BLE001 - a template that cannot render this has no thinking switch
                ok = False
        _THINKING[src] = ok
    return _THINKING[src]


@dataclass
class ToolRequest:
    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str = "auto"  # auto | none | required | function
    function: str = ""  # the named function of tool_choice
    parallel: bool = False
    format: ToolFormat | None = None  # None: tool calls are not parsed
    polyfill: bool = False  # the template cannot render tools: describe them in the system message

    @property
    def active(self) -> bool:
        return self.format is not None


def _choice(raw: Any) -> tuple[str, str]:
    if raw is None:
        return "auto", ""
    if isinstance(raw, str):
        if raw in ("auto", "none", "required"):
            return raw, ""
        raise invalid(f"Invalid tool_choice: {raw}")
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            return "function", name
    raise invalid("Invalid tool_choice: expected \"auto\", \"none\", \"required\" or "
                  "{\"type\": \"function\", \"function\": {\"name\": ...}}")


def read_tool_request(body: dict[str, Any], tmpl: Any, jinja: bool) -> ToolRequest:
    tools = body.get("tools")
    has_tools = isinstance(tools, list) and bool(tools)
    raw_choice = body.get("tool_choice")
    if not jinja:
        if has_tools:
            raise invalid("tools param requires --jinja flag")  # llama-server: 500; a client error here
        if raw_choice is not None and raw_choice != "auto":
            raise invalid("tool_choice param requires --jinja flag")
    choice, function = _choice(raw_choice)
    if tools is not None and not isinstance(tools, list):
        try:
            validate_tools(tools)  # a non-array: llama-server answers 500; a client error here
        except MessageFormatError as e:
            raise invalid(str(e)) from None
    if not has_tools:
        return ToolRequest(choice=choice, function=function)
    try:
        checked = validate_tools(tools)
    except MessageFormatError as e:
        raise invalid(str(e)) from None
    names = frozenset(t["function"]["name"] for t in checked)
    if choice == "function" and function not in names:
        raise invalid(f"tool_choice names an unknown function: {function}")
    caps = template_caps(tmpl)
    parallel_raw = body.get("parallel_tool_calls")
    parallel = parallel_raw if isinstance(parallel_raw, bool) else bool(caps.get("supports_parallel_tool_calls"))
    if choice == "function":
        names = frozenset({function})
    polyfill = not caps.get("supports_tools", False)
    fmt: ToolFormat | None = None
    if choice != "none":
        fmt = GenericFormat(names, parallel) if polyfill else detect_tool_format(template_source(tmpl), names, parallel)
        if body.get("grammar") is not None:
            raise invalid("Cannot use custom grammar constraints with tools.")
    return ToolRequest(checked, choice, function, parallel, fmt, polyfill)


# --------------------------------------------------------------------------------------------------
# messages for templates that cannot render tools
# --------------------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _args_value(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def polyfill_messages(messages: list[Any], treq: ToolRequest) -> list[Any]:
    """Describe the tools in the system message (generic JSON format) and write earlier tool
    calls and tool results as the JSON the model is asked to produce."""
    fmt = treq.format if isinstance(treq.format, GenericFormat) else GenericFormat(parallel=treq.parallel)
    system = fmt.system_prompt(treq.tools)
    out: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        role = m.get("role")
        if role == "assistant" and isinstance(m.get("tool_calls"), list) and m["tool_calls"]:
            calls = [{"name": (c.get("function") or {}).get("name", ""),
                      "arguments": _args_value((c.get("function") or {}).get("arguments", {}))}
                     for c in m["tool_calls"] if isinstance(c, dict)]
            payload = {"tool_calls": calls} if len(calls) > 1 or treq.parallel else {"tool_call": calls[0]}
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = json.dumps(payload, ensure_ascii=False)
        elif role == "tool":
            result: dict[str, Any] = {"content": _text(m.get("content"))}
            if m.get("name"):
                result = {"tool": m["name"], **result}
            if m.get("tool_call_id"):
                result["id"] = m["tool_call_id"]
            m = {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
        out.append(m)
    if out and isinstance(out[0], dict) and out[0].get("role") == "system":
        first = dict(out[0])
        first["content"] = (_text(first.get("content")) + "\n\n" + system).lstrip()
        out[0] = first
    else:
        out.insert(0, {"role": "system", "content": system})
    return out


# --------------------------------------------------------------------------------------------------
# the output syntax
# --------------------------------------------------------------------------------------------------


def build_syntax(treq: ToolRequest, tmpl: Any, reasoning_format: str, generation_prompt: str,
                 skip_parsing: bool) -> ChatSyntax:
    if skip_parsing:
        return ChatSyntax()
    think = detect_think_tags(template_source(tmpl)) if reasoning_format != "none" else None
    opened = think is not None and starts_in_reasoning(generation_prompt, think)
    return ChatSyntax(tools=treq.format, think=think, opened=opened, parallel=treq.parallel)


def generation_prompt(with_prompt: str, without_prompt: str) -> str:
    """What ``add_generation_prompt`` added: the rendered prompt past the longest common prefix."""
    n = 0
    m = min(len(with_prompt), len(without_prompt))
    while n < m and with_prompt[n] == without_prompt[n]:
        n += 1
    return with_prompt[n:]
