"""Reading a tool call's ``params`` with llama-server's messages (nlohmann::json's exceptions).

A required key that is missing or of the wrong type raises ``ToolParamError`` (HTTP 400) with the
text llama-server answers. An optional key that is absent or ``null`` gives its default; one of the
wrong type is a 400 too (llama-server logs a warning and uses the default: a value the caller sent
is never silently dropped here).
"""

from __future__ import annotations

from typing import Any

from kvserve.server.agent_tools.registry import ToolParamError
from kvserve.server.jsonio import json_type

_KIND = {str: "string", int: "number", bool: "boolean", list: "array", dict: "object"}


def _check(value: Any, kind: type, suffix: str) -> Any:
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolParamError(
                f"[json.exception.type_error.302] type must be number, but is {json_type(value)}{suffix}"
            )
        return int(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ToolParamError(
            f"[json.exception.type_error.302] type must be {_KIND[kind]}, but is {json_type(value)}{suffix}"
        )
    return value


def required(params: dict[str, Any], key: str, kind: type) -> Any:
    """llama-server's exact text (nlohmann names no key in a type error)."""
    if key not in params:
        raise ToolParamError(f"[json.exception.out_of_range.403] key '{key}' not found")
    return _check(params[key], kind, "")


def optional(params: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """A wrong type is refused here (llama-server warns and uses the default), naming the key."""
    value = params.get(key)
    if value is None:
        return default
    return _check(value, kind, f" (parameter '{key}')")
