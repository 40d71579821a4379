"""Random alphanumeric ids (completion ids, tool-call ids): one read of the OS's random source
per id, not one per character."""

from __future__ import annotations

import secrets
import string

ALNUM = string.digits + string.ascii_uppercase + string.ascii_lowercase
_LIMIT = 256 - 256 % len(ALNUM)  # bytes at or above it would favour the first characters


def random_alnum(n: int) -> str:
    out: list[str] = []
    while len(out) < n:
        out += [ALNUM[b % len(ALNUM)] for b in secrets.token_bytes(n + 8) if b < _LIMIT]
    return "".join(out[:n])
