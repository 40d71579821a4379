"""Per-flag converters ``(text, warn) -> value`` and merges for accumulating flags.

A converter raises ``ValueError(message)``; the parser wraps it in a ``ConfigError``. A merge
``(current, new, first_time_set) -> stored`` decides how a repeated (or env + CLI) flag combines.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from .spec import FALSEY, TRUTHY, Convert, Warn, parse_csv_row, stof, stoi, stoul32

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def _int_min(lo: int, message: str) -> Convert:
    def conv(text: str, warn: Warn) -> int:
        value = stoi(text)
        if value < lo:
            raise ValueError(message.format(value=value))
        return value

    return conv


def _choice(flag: str, choices: Sequence[str]) -> Convert:
    def conv(text: str, warn: Warn) -> str:
        if text not in choices:
            expected = ", ".join(choices)
            raise ValueError(f"error: unknown value for {flag}: '{text}' (expected one of {expected})")
        return text

    return conv


def _tristate(flag: str) -> Convert:
    """on|off|auto with llama.cpp's truthy/falsey/autoy words, normalized to on/off/auto."""
    return _onoff(flag, auto=True)


def _onoff(flag: str, auto: bool = False) -> Convert:
    """on|off with llama.cpp's truthy/falsey words (and, with ``auto``, auto or -1: auto)."""

    def conv(text: str, warn: Warn) -> str:
        if text in TRUTHY:
            return "on"
        if text in FALSEY:
            return "off"
        if auto and text in ("auto", "-1"):
            return "auto"
        raise ValueError(f"error: unknown value for {flag}: '{text}'")

    return conv


def _np(text: str, warn: Warn) -> int:
    value = stoi(text)
    if value == 0:
        raise ValueError("error: invalid value for n_parallel")
    return value


def _temp(text: str, warn: Warn) -> float:
    return max(stof(text), 0.0)


def _sleep_idle(text: str, warn: Warn) -> int:
    value = stoi(text)
    if value == 0 or value < -1:
        raise ValueError("invalid value: cannot be 0 or less than -1")
    return value


def _kv_type(text: str, warn: Warn) -> str:
    if text not in KV_CACHE_TYPES:
        raise ValueError(f"Unsupported cache type: {text}")
    return text


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        raise ValueError(f"error: failed to open file '{path}'") from None


def _chat_template_file(text: str, warn: Warn) -> str:
    return _read_text(text)


def _api_keys(text: str, warn: Warn) -> tuple[str, ...]:
    return tuple(k for k in parse_csv_row(text) if k)


def _api_key_file(text: str, warn: Warn) -> tuple[str, ...]:
    lines = _read_text(text).split("\n")
    return tuple(line for line in lines if line and not line.startswith("#"))


def _csv_names(text: str, warn: Warn) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _slot_save_path(text: str, warn: Warn) -> str:
    if not os.path.isdir(text):
        raise ValueError(f"not a directory: {text}")
    return text if text.endswith(os.sep) else text + os.sep


def _template_kwargs(text: str, warn: Warn) -> tuple[tuple[str, Any], ...]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ValueError("must be a JSON object")  # noqa: TRY004 (converters report ValueError)
    if "enable_thinking" in obj:
        warn("Setting 'enable_thinking' via --chat-template-kwargs is deprecated. "
             "Use --reasoning on / --reasoning off instead.")
    return tuple(obj.items())  # decoded JSON values (llama.cpp keeps their dumps)


SAMPLER_NAMES = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc",
                 "infill", "penalties", "adaptive_p")
_SAMPLER_ALT = {"top-k": "top_k", "top-p": "top_p", "top-n-sigma": "top_n_sigma", "nucleus": "top_p",
                "typical-p": "typ_p", "typical": "typ_p", "typ-p": "typ_p", "typ": "typ_p",
                "min-p": "min_p", "temp": "temperature", "adaptive-p": "adaptive_p"}
SAMPLER_CHARS = {"d": "dry", "k": "top_k", "y": "typ_p", "p": "top_p", "s": "top_n_sigma", "m": "min_p",
                 "t": "temperature", "x": "xtc", "i": "infill", "e": "penalties", "a": "adaptive_p"}
DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                    "temperature")


def sampler_names(names: Sequence[str], warn: Warn) -> tuple[str, ...]:
    """Canonical sampler names; unknown names are skipped with a warning (as llama.cpp does)."""
    out: list[str] = []
    for name in names:
        canon = name if name in SAMPLER_NAMES else _SAMPLER_ALT.get(name)
        if canon is None:
            warn(f"common_sampler_types_from_names: unable to match sampler by name '{name}'")
        else:
            out.append(canon)
    return tuple(out)


def _samplers(text: str, warn: Warn) -> tuple[str, ...]:
    return sampler_names(text.split(";"), warn)


def _sampler_seq(text: str, warn: Warn) -> tuple[str, ...]:
    out: list[str] = []
    for ch in text:
        if ch in SAMPLER_CHARS:
            out.append(SAMPLER_CHARS[ch])
        else:
            warn(f"common_sampler_types_from_chars: unable to match sampler by char '{ch}'")
    return tuple(out)


_LOGIT_BIAS_RE = re.compile(r"\s*([+-]?\d+)\s*([+-])(.*)\Z", re.DOTALL)


def _logit_bias(text: str, warn: Warn) -> tuple[tuple[int, float], ...]:
    m = _LOGIT_BIAS_RE.match(text)
    if m is None:
        raise ValueError("invalid input format")
    try:
        bias = stof(m.group(3))
    except ValueError:
        raise ValueError("invalid input format") from None
    return ((int(m.group(1)), -bias if m.group(2) == "-" else bias),)


def _seed(text: str, warn: Warn) -> int:
    return stoul32(text)


# -- merges: (current, new, first_time_set) -> stored value (the default, replace, is in spec.py)
def _append(current: Any, new: Any, first: bool) -> Any:
    return tuple(current) + tuple(new)


def _append_one(current: Any, new: Any, first: bool) -> Any:
    return tuple(current) + (new,)


def _sorted_set(current: Any, new: Any, first: bool) -> Any:
    return tuple(sorted(set(current) | set(new)))


def _dict_update(current: Any, new: Any, first: bool) -> Any:
    merged = dict(current)
    merged.update(dict(new))
    return tuple(merged.items())


def _dry_base(current: Any, new: Any, first: bool) -> Any:
    return new if new >= 1.0 else current  # llama.cpp ignores a base below 1


def _dry_breaker(current: Any, new: Any, first: bool) -> Any:
    base = () if first else tuple(current)  # the first use clears the defaults
    return () if new == "none" else base + (new,)
