"""``chat_template_caps`` for ``/props``: what a Jinja chat template does, found by rendering probe
conversations (system role, typed content, tools, tool calls, reasoning, effort)."""

from __future__ import annotations

from typing import Any

import jinja2


def template_caps(template: jinja2.Template | None, bos_token: str, eos_token: str) -> dict[str, bool]:
    """Best-effort capabilities of ``template`` (all false when there is no Jinja template)."""
    probe = "<<probe-4a7c>>"

    def renders(messages: list[dict[str, Any]], **kw: Any) -> str | None:
        if template is None:
            return None
        try:
            return template.render(
                messages=messages, bos_token=bos_token, eos_token=eos_token,
                add_generation_prompt=False, **{"tools": None, **kw}
            )
        except Exception:
            return None

    user = {"role": "user", "content": "hi"}

    def call(name: str, args: Any) -> dict[str, Any]:
        return {"type": "function", "id": f"id_{name}", "function": {"name": name, "arguments": args}}

    tool = {"type": "function", "function": {"name": "probe_tool", "description": "", "parameters": {}}}

    out = renders([{"role": "user", "content": probe}])
    string_content = out is not None and probe in out
    out = renders([{"role": "user", "content": [{"type": "text", "text": probe}]}])
    typed_content = out is not None and probe in out and "'type'" not in out and '"type"' not in out
    out = renders([{"role": "system", "content": probe}, user])
    system_role = out is not None and probe in out
    out = renders([user], tools=[tool])
    supports_tools = out is not None and "probe_tool" in out
    def assistant_calls(*calls: dict[str, Any]) -> list[dict[str, Any]]:
        return [user, {"role": "assistant", "content": "", "tool_calls": list(calls)}]

    out = renders(assistant_calls(call("probe_fn", '{"a": 1}')))
    tool_calls = out is not None and "probe_fn" in out
    out = renders(assistant_calls(call("probe_fn", '{"a": 1}'), call("probe_fn2", '{"b": 2}')))
    parallel = tool_calls and out is not None and "probe_fn2" in out
    out = renders(assistant_calls(call("probe_fn", {"a": 1})))
    object_args = tool_calls and out is not None and '{"a": 1}' in out
    out = renders([user, {"role": "assistant", "content": "x", "reasoning_content": probe}, user])
    preserve_reasoning = out is not None and probe in out
    low = renders([user], reasoning_effort="low")
    high = renders([user], reasoning_effort="high")
    reasoning_effort = low is not None and high is not None and low != high
    return {
        "supports_object_arguments": bool(object_args),
        "supports_parallel_tool_calls": bool(parallel),
        "supports_preserve_reasoning": preserve_reasoning,
        "supports_reasoning_effort": reasoning_effort,
        "supports_string_content": string_content,
        "supports_system_role": system_role,
        "supports_tool_calls": tool_calls,
        "supports_tools": supports_tools,
        "supports_typed_content": typed_content,
    }
