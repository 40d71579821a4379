"""Per-field readers with llama-server's request-field semantics (``server-schema.cpp``).

- ``null`` is absent (the server default applies); aliases are tried in order, first present wins.
- ``clamp=(lo, hi)``: out-of-range values are clamped silently ("limits").
- ``hard=(lo, hi)``: out-of-range values are a 400
  ``Field '<name>': Value must be between <lo> <= value <= <hi>, but got <v>`` ("hard limits").
- Wrong JSON types are a 400 naming the field, with nlohmann's wording
  (``type must be number, but is string``). As in nlohmann, numbers accept booleans and
  integers accept floats (truncated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kvserve.server.errors import ApiError
from kvserve.server.jsonio import json_type

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

T = TypeVar("T")


class FieldError(ApiError):
    def __init__(self, name: str, message: str):
        super().__init__(f"Field '{name}': {message}")
        self.field = name


def type_error(name: str, expected: str, value: Any) -> FieldError:
    return FieldError(name, f"[json.exception.type_error.302] type must be {expected}, but is {json_type(value)}")


def present(data: dict[str, Any], names: str | Sequence[str]) -> str | None:
    """The first of ``names`` whose value is present and not null."""
    for n in (names,) if isinstance(names, str) else names:
        if data.get(n) is not None:
            return n
    return None


def _fmt_limit(v: float, is_float: bool) -> str:
    # std::to_string: integers plainly, floats with 6 decimals.
    return f"{v:.6f}" if is_float else str(int(v))


def _number(name: str, v: Any, cast: Callable[[Any], T]) -> T:
    if isinstance(v, bool):
        return cast(int(v))
    if isinstance(v, (int, float)):
        if isinstance(v, float) and not math.isfinite(v) and cast is int:
            raise FieldError(name, "[json.exception.type_error.302] type must be number, but is number")
        return cast(v)
    raise type_error(name, "number", v)


def _num(data: dict[str, Any], names: str | Sequence[str], default: T, cast: Callable[[Any], T],
         clamp: tuple[Any, Any] | None, hard: tuple[Any, Any] | None) -> T:
    n = present(data, names)
    if n is None:
        return default
    v = _number(n, data[n], cast)
    if hard is not None:
        lo, hi = hard
        if v < lo or v > hi:  # type: ignore[operator]
            f = cast is float
            raise FieldError(
                n, f"Value must be between {_fmt_limit(lo, f)} <= value <= {_fmt_limit(hi, f)}, "
                f"but got {_fmt_limit(v, f)}"  # type: ignore[arg-type]
            )
    elif clamp is not None:
        v = max(clamp[0], min(clamp[1], v))  # type: ignore[type-var]
    return v


def get_int(data: dict[str, Any], names: str | Sequence[str], default: int,
            clamp: tuple[int, int] | None = None, hard: tuple[int, int] | None = None) -> int:
    return _num(data, names, default, int, clamp, hard)


def get_float(data: dict[str, Any], names: str | Sequence[str], default: float,
              clamp: tuple[float, float] | None = None, hard: tuple[float, float] | None = None) -> float:
    return _num(data, names, default, float, clamp, hard)


def get_bool(data: dict[str, Any], names: str | Sequence[str], default: bool) -> bool:
    n = present(data, names)
    if n is None:
        return default
    v = data[n]
    if not isinstance(v, bool):
        raise type_error(n, "boolean", v)
    return v


def get_str(data: dict[str, Any], names: str | Sequence[str], default: str) -> str:
    n = present(data, names)
    if n is None:
        return default
    v = data[n]
    if not isinstance(v, str):
        raise type_error(n, "string", v)
    return v


def get_str_list(data: dict[str, Any], name: str, default: list[str] | None) -> list[str] | None:
    """An array of strings (a wrong element type is a 400 naming the field)."""
    if data.get(name) is None:
        return default
    v = data[name]
    if not isinstance(v, list):
        raise type_error(name, "array", v)
    for e in v:
        if not isinstance(e, str):
            raise type_error(name, "string", e)
    return list(v)


# Lenient readers for fields llama-server reads with json_value (wrong type -> default).
def value(data: Any, name: str, default: T) -> T:
    if not isinstance(data, dict):
        return default
    v = data.get(name)
    if v is None:
        return default
    if isinstance(default, bool):
        return v if isinstance(v, bool) else default  # type: ignore[return-value]
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else default  # type: ignore[return-value]
    if isinstance(default, str):
        return v if isinstance(v, str) else default  # type: ignore[return-value]
    return v  # type: ignore[no-any-return]
