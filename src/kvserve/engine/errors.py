"""Errors the engine reports synchronously to its callers."""

from __future__ import annotations

from typing import Any


class EngineError(Exception):
    """A failure the engine reports synchronously (``slot_action``, ``embed``).

    ``code``/``type`` follow llama-server's table (400 invalid_request_error,
    500 server_error, 501 not_supported_error, 503 unavailable_error). Any exception that
    carries an int ``code`` attribute is mapped the same way; others become 500.
    """

    def __init__(self, message: str, code: int = 400, type: str = "", extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.type = type
        self.extra = dict(extra or {})


def exceed_context(n_prompt: int, n_ctx: int) -> tuple[int, str, str, dict[str, Any]]:
    msg = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it"
    )
    return 400, msg, "exceed_context_size_error", {"n_prompt_tokens": n_prompt, "n_ctx": n_ctx}
