"""llama-server's error JSON and status mapping (``format_error_response``).

Body: ``{"error": {"code": <int>, "message": <str>, "type": <str>[, extras]}}``, HTTP status
equal to ``code``. ``exceed_context_size_error`` is a 400 carrying ``n_prompt_tokens`` and
``n_ctx`` inside ``error``.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
NOT_FOUND = "not_found_error"
SERVER = "server_error"
NOT_SUPPORTED = "not_supported_error"
UNAVAILABLE = "unavailable_error"
EXCEED_CONTEXT = "exceed_context_size_error"

STATUS: dict[str, int] = {
    INVALID_REQUEST: 400,
    AUTHENTICATION: 401,
    PERMISSION: 403,
    NOT_FOUND: 404,
    SERVER: 500,
    NOT_SUPPORTED: 501,
    UNAVAILABLE: 503,
    EXCEED_CONTEXT: 400,
}

_TYPE_FOR_CODE = {400: INVALID_REQUEST, 401: AUTHENTICATION, 403: PERMISSION, 404: NOT_FOUND,
                  500: SERVER, 501: NOT_SUPPORTED, 503: UNAVAILABLE}


class ApiError(Exception):
    """Raised anywhere in the HTTP layer; rendered by the app's exception handler."""

    def __init__(self, message: str, type: str = INVALID_REQUEST, code: int | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.type = type
        self.code = code if code is not None else STATUS.get(type, 500)
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message, "type": self.type}
        err.update(self.extra)
        return {"error": err}


def invalid(message: str) -> ApiError:
    return ApiError(message, INVALID_REQUEST)


def not_supported(message: str) -> ApiError:
    return ApiError(message, NOT_SUPPORTED)


def unsupported_field(name: str, why: str = "") -> ApiError:
    """A request field kvserve does not implement: refused instead of silently ignored.

    HTTP 400 (the client can drop the field and retry), message naming the field."""
    msg = f"Field '{name}' is not supported by this server"
    return ApiError(msg + (f": {why}" if why else ""), INVALID_REQUEST)


def unsupported_feature(what: str, why: str) -> ApiError:
    """A feature a start-up flag asked for that kvserve lacks (the flag only warned): HTTP 400."""
    return ApiError(f"{what} is not supported by kvserve: {why}", INVALID_REQUEST)


def server_error(message: str) -> ApiError:
    return ApiError(message, SERVER)


def exceed_context(n_prompt_tokens: int, n_ctx: int) -> ApiError:
    return ApiError(
        f"request ({n_prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it",
        EXCEED_CONTEXT,
        extra={"n_prompt_tokens": n_prompt_tokens, "n_ctx": n_ctx},
    )


def disabled_endpoint(what: str, flag: str) -> ApiError:
    """``This server does not support <what>. Start it with `<flag>``` (501)."""
    return ApiError(f"This server does not support {what}. Start it with `{flag}`", NOT_SUPPORTED)


def from_event(code: int, message: str, type: str, extra: dict[str, Any] | None = None) -> ApiError:
    return ApiError(message, type or _TYPE_FOR_CODE.get(code, SERVER), code, extra)


def from_exception(exc: BaseException) -> ApiError:
    """Engine exceptions: anything with an int ``code`` keeps it; the rest is a 500."""
    if isinstance(exc, ApiError):
        return exc
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code in _TYPE_FOR_CODE:
        type_ = getattr(exc, "type", "") or _TYPE_FOR_CODE[code]
        message = getattr(exc, "message", None) or str(exc)
        return ApiError(message, type_, code, getattr(exc, "extra", None))
    if isinstance(exc, ValueError):
        return ApiError(str(exc), INVALID_REQUEST)
    return ApiError(str(exc) or type(exc).__name__, SERVER)


def not_found_body() -> dict[str, Any]:
    # llama-server's 404 handler orders the keys message, type, code.
    return {"error": {"message": "File Not Found", "type": NOT_FOUND, "code": 404}}


def auth_body() -> dict[str, Any]:
    return {"error": {"message": "Invalid API Key", "type": AUTHENTICATION, "code": 401}}


def loading_body() -> dict[str, Any]:
    return {"error": {"message": "Loading model", "type": UNAVAILABLE, "code": 503}}
