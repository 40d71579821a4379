"""JSON in and out, the way llama-server (nlohmann::json) does it.

Out: compact separators, UTF-8 (no \\u escapes), non-finite floats as ``null`` (a banned
token's -inf bias shows as ``"bias": null``), content type ``application/json; charset=utf-8``.
In: strict JSON (no NaN/Infinity). A malformed body or one that is not UTF-8 is a 400
``invalid_request_error`` with nlohmann's parse-error message (llama-server answers 500 there,
because its parse exception is not an ``invalid_argument``: the client's error, so 4xx here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kvserve.server.errors import ApiError, invalid

JSON_CONTENT_TYPE = "application/json; charset=utf-8"


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# A str as a JSON string the way ``dumps`` writes one (quotes, backslash and control characters
# escaped, other characters as they are): the C function the encoder itself uses.
encode_basestring: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]

# one encoder for every call (json.dumps builds a new one per call unless all options are defaults)
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> str:
    try:
        return _ENCODER.encode(obj)
    except ValueError:
        return _ENCODER.encode(_finite(obj))


class JSONResponse(Response):
    media_type = None

    def __init__(self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None):
        h = {"content-type": JSON_CONTENT_TYPE}
        if headers:
            h.update(headers)
        super().__init__(dumps(content).encode("utf-8", "replace"), status_code, h)


def error_response(err: ApiError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(err.body(), err.code, headers)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid literal '{name}'")


def parse_json(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid(f"[json.exception.parse_error.316] invalid UTF-8 byte at index {e.start}: "
                      f"0x{raw[e.start]:02X}") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise invalid(
            f"[json.exception.parse_error.101] parse error at line {e.lineno}, column {e.colno}: "
            f"syntax error while parsing value - {e.msg}"
        ) from None
    except ValueError as e:
        raise invalid(f"[json.exception.parse_error.101] parse error: {e}") from None
    except RecursionError:
        raise invalid("[json.exception.parse_error.101] parse error: nesting too deep") from None


async def read_json(request: Request) -> Any:
    return parse_json(await request.body())


async def read_object(request: Request, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty body when ``empty_ok``)."""
    raw = await request.body()
    if empty_ok and not raw.strip():
        return {}
    body = parse_json(raw)
    if not isinstance(body, dict):
        raise ApiError(
            f"[json.exception.type_error.306] cannot use value() with {json_type(body)}"
        )
    return body


def json_type(v: Any) -> str:
    """nlohmann's type_name()."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "discarded"
