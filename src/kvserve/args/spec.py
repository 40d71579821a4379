"""Flag rows and llama.cpp's value rules: ``FlagSpec``, ``ArgType``, errors, ``stoi`` / ``stof``.

Everything the table, the parser and the renderers share: the row type, the fatal-error and
exit exceptions, and the C++-style text-to-value primitives the converters build on.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .status import REFUSED_VALUES, WARNED_VALUES

COMPAT_BUILD = "b10621"
INT_MAX = 2**31 - 1
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
IMPLEMENTED = "implemented"
REFUSED_STATUS = "refused"
WARNED_STATUS = "warns"

Warn = Callable[[str], None]
Convert = Callable[[str, Warn], Any]
Merge = Callable[[Any, Any, bool], Any]  # (current, new, first_time_set) -> stored value


class ConfigError(Exception):
    """Fatal startup error: ``__main__`` prints ``message`` to stderr and exits 1."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ExitRequest(Exception):
    """``-h`` / ``--version``: print ``text`` on ``stream`` ("stdout" | "stderr"), exit ``code``."""

    def __init__(self, text: str, *, stream: str = "stdout", code: int = 0) -> None:
        super().__init__(text)
        self.text, self.stream, self.code = text, stream, code


class ArgType(enum.Enum):
    INT = "int"
    FLOAT = "float"
    STR = "str"
    BOOL = "bool"  # flag pair: positive names set True, negative names set False
    VOID = "void"  # valueless: sets ``const``


# ---------------------------------------------------------------------------------------------
# Value parsing (C++ std::stoi / std::stof / std::stoul semantics: leading number, rest ignored)
# ---------------------------------------------------------------------------------------------
TRUTHY = frozenset({"on", "enabled", "true", "1"})
FALSEY = frozenset({"off", "disabled", "false", "0"})
_WS = " \t\n\v\f\r"
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)


def parse_bool_word(text: str) -> bool:
    if text in TRUTHY:
        return True
    if text in FALSEY:
        return False
    raise ValueError("invalid boolean value")


def stoi(text: str) -> int:
    m = _INT_RE.match(text.lstrip(_WS))
    if m is None:
        raise ValueError(f"invalid integer value: '{text}'")
    value = int(m.group(0))
    if not -(2**31) <= value <= INT_MAX:
        raise ValueError(f"integer value out of range: '{text}'")
    return value


def stof(text: str) -> float:
    m = _FLOAT_RE.match(text.lstrip(_WS))
    if m is None:
        raise ValueError(f"invalid number: '{text}'")
    return float(m.group(0))


def stoul32(text: str) -> int:
    """``std::stoul`` stored in a uint32 (a seed): ``-1`` wraps to 0xFFFFFFFF."""
    m = _INT_RE.match(text.lstrip(_WS))
    if m is None:
        raise ValueError(f"invalid integer value: '{text}'")
    value = int(m.group(0))
    if value >= 2**64 or value <= -(2**64):
        raise ValueError(f"integer value out of range: '{text}'")
    return (value % 2**64) & 0xFFFFFFFF


def parse_csv_row(text: str) -> list[str]:
    """llama.cpp CSV: ``,`` separates; a field starting with ``"`` is quoted; ``""`` escapes."""
    fields: list[str] = []
    cur: list[str] = []
    in_quotes = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if not in_quotes:
                if cur:
                    cur.append('"')
                else:
                    in_quotes = True
            elif i + 1 < len(text) and text[i + 1] == '"':
                cur.append('"')
                i += 1
            else:
                in_quotes = False
        elif ch == "," and not in_quotes:
            fields.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    fields.append("".join(cur))
    return fields


def process_escapes(text: str) -> str:
    """``string_process_escapes``: \\n \\r \\t \\' \\" \\\\ and \\xHH; other escapes kept as is."""
    src = text.encode("utf-8")
    out = bytearray()
    simple = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("'"): 39, ord('"'): 34, ord("\\"): 92}
    i = 0
    while i < len(src):
        c = src[i]
        if c == 0x5C and i + 1 < len(src):
            nxt = src[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            hexpart = src[i + 2 : i + 4]
            is_hex = len(hexpart) == 2 and all(chr(h) in "0123456789abcdefABCDEF" for h in hexpart)
            if nxt == ord("x") and is_hex:
                out.append(int(hexpart.decode(), 16))
                i += 4
                continue
            out += bytes((c, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return out.decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# One row of the table
# ---------------------------------------------------------------------------------------------
def _replace(current: Any, new: Any, first: bool) -> Any:
    return new


@dataclass(frozen=True)
class FlagSpec:
    names: tuple[str, ...]
    dest: str
    type: ArgType
    default: Any
    help: str
    env: str | None = None
    neg_names: tuple[str, ...] = ()
    hint: str | None = None
    convert: Convert | None = None
    merge: Merge = _replace
    const: Any = True
    group: str = "server"  # server | sampling | kvserve
    kvserve_only: bool = False
    notes: str = ""
    shown_default: str | None = None
    action: str | None = None  # "help" | "version"
    status: str = IMPLEMENTED
    reason: str = ""
    nargs: int = 1  # values a value-taking flag consumes (joined by a space)

    @property
    def all_names(self) -> tuple[str, ...]:
        return self.names + self.neg_names

    @property
    def envs(self) -> tuple[str, ...]:
        """Env vars read for this flag: the main one, plus ``LLAMA_ARG_NO_*`` for flag pairs."""
        if self.env is None:
            return ()
        neg = negative_env(self)
        return (self.env,) if neg is None else (self.env, neg)

    @property
    def takes_value(self) -> bool:
        return self.type in (ArgType.INT, ArgType.FLOAT, ArgType.STR)

    def is_default(self, value: Any) -> bool:
        if value == self.default:
            return True
        return self.default is None and value in ("", ())

    def refusal(self, value: Any) -> str | None:
        """Why ``value`` cannot be honoured, or None when it can."""
        if self.status == REFUSED_STATUS:
            return None if self.is_default(value) else self.reason
        rule = REFUSED_VALUES.get(self.dest)
        return rule.check(value) if rule is not None else None

    def warning(self, value: Any) -> str | None:
        """Why ``value`` is accepted without effect (one start-up warning), or None."""
        if self.status == WARNED_STATUS:
            return None if self.is_default(value) else self.reason
        rule = WARNED_VALUES.get(self.dest)
        return rule.check(value) if rule is not None else None


def negative_env(spec: FlagSpec) -> str | None:
    if not spec.neg_names or spec.env is None or "LLAMA_ARG_" not in spec.env:
        return None
    return spec.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
