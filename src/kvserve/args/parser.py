"""``parse_args``: defaults → env vars (every row, table order) → CLI args, as llama-server does.

Follows ``common_params_parse_ex`` (spec §1.1): the CLI beats the env, accumulating flags merge,
a repeated flag warns, and ``check_refusals`` turns every refused value into one ``ConfigError``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .render import action_text, format_usage, format_value, usage_entry, version_text
from .spec import (
    REFUSED_STATUS,
    TRUTHY,
    WARNED_STATUS,
    ArgType,
    ConfigError,
    ExitRequest,
    FlagSpec,
    Warn,
    negative_env,
    parse_bool_word,
    stof,
    stoi,
)
from .status import REFUSED_UNLESS
from .table import _LOOKUP, FLAGS

@dataclass(frozen=True)
class ParsedArgs:
    """Final value per dest, plus where it came from (CLI arg as typed / env var / default)."""

    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)
    order: Mapping[str, int] = field(default_factory=dict)  # when each dest was last set
    warnings: tuple[str, ...] = ()

    def __getitem__(self, dest: str) -> Any:
        return self.values[dest]

    def explicit(self, dest: str) -> bool:
        return dest in self.sources

    def source(self, dest: str) -> str | None:
        return self.sources.get(dest)


class _State:
    def __init__(self, warn: Warn) -> None:
        self.values: dict[str, Any] = {}
        for spec in FLAGS:
            if spec.action is None:
                self.values.setdefault(spec.dest, spec.default)
        self.sources: dict[str, str] = {}
        self.order: dict[str, int] = {}
        self.warnings: list[str] = []
        self._warn = warn
        self._seq = 0

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self._warn(message)

    def set(self, spec: FlagSpec, value: Any, source: str) -> None:
        first = spec.dest not in self.sources
        self.values[spec.dest] = spec.merge(self.values[spec.dest], value, first)
        self.sources[spec.dest] = source
        self._seq += 1
        self.order[spec.dest] = self._seq


def _convert(spec: FlagSpec, text: str, warn: Warn) -> Any:
    if spec.convert is not None:
        return spec.convert(text, warn)
    if spec.type is ArgType.INT:
        return stoi(text)
    if spec.type is ArgType.FLOAT:
        return stof(text)
    return text


def _env_value(spec: FlagSpec, environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(env var used, raw value); a set ``LLAMA_ARG_NO_*`` reads as "0" (llama.cpp compat)."""
    if spec.env is None:
        return None
    neg = negative_env(spec)
    if neg is not None and neg in environ:
        return neg, "0"
    if spec.env in environ:
        return spec.env, environ[spec.env]
    return None


def _default_warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _apply_config(state: _State, config: Sequence[tuple[str, FlagSpec, str]]) -> None:
    """Config-file options (``common_preset::apply_to_params``): a valueless flag is set
    whatever its value, a flag pair takes truthy words as true and anything else as false."""
    for label, spec, raw in config:
        try:
            if spec.action is not None:
                continue
            if spec.type is ArgType.VOID:
                state.set(spec, spec.const, label)
            elif spec.type is ArgType.BOOL:
                state.set(spec, raw in TRUTHY, label)
            elif spec.nargs != 1:
                raise ValueError("option with two values is not supported yet")
            else:
                state.set(spec, _convert(spec, raw, state.warn), label)
        except ValueError as e:
            raise ConfigError(f'error while handling "{label}": {e}') from None


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None, *,
               warn: Warn | None = None, config: Sequence[tuple[str, FlagSpec, str]] = ()) -> ParsedArgs:
    """Parse ``argv`` (without the program name) over ``environ`` like llama-server does.

    ``config``: values from llama.cpp's config files, ``(label, row, text)``, applied first
    (the environment and the command line override them). Raises ``ConfigError`` (exit 1) or
    ``ExitRequest`` (help/version, exit 0).
    """
    environ = os.environ if environ is None else environ
    state = _State(warn or _default_warn)
    _apply_config(state, config)  # 0. config files

    for spec in FLAGS:  # 1. environment, table order
        got = _env_value(spec, environ)
        if got is None:
            continue
        env_name, raw = got
        try:
            if spec.type is ArgType.VOID:
                if raw in TRUTHY:
                    state.set(spec, spec.const, env_name)
            elif spec.type is ArgType.BOOL:
                state.set(spec, parse_bool_word(raw), env_name)
            else:
                state.set(spec, _convert(spec, raw, state.warn), env_name)
        except ValueError as e:
            raise ConfigError(f'error while handling environment variable "{spec.env}": {e}') from None

    help_requested = False  # 2. command line, left to right
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            arg = arg.replace("_", "-")
        hit = _LOOKUP.get(arg)
        if hit is None:
            raise ConfigError(f"error: invalid argument: {arg}")
        spec, positive = hit
        if arg in seen and arg != "--spec-type":
            state.warn(f"DEPRECATED: argument '{arg}' specified multiple times, use comma-separated values "
                       "instead (only last value will be used)")
        seen.add(arg)
        if spec.env is not None and any(e in environ for e in spec.envs):
            state.warn(f"warn: {spec.env} environment variable is set, but will be overwritten by command "
                       f"line argument {arg}")
        try:
            if spec.action == "help":
                help_requested = True
            elif spec.action == "version":
                raise ExitRequest(version_text(), stream="stderr")
            elif spec.action is not None:
                raise ExitRequest(action_text(spec.action))
            elif spec.type is ArgType.VOID:
                state.set(spec, spec.const, arg)
            elif spec.type is ArgType.BOOL:
                state.set(spec, positive, arg)
            else:
                if i + spec.nargs >= len(argv):
                    raise ValueError("expected value for argument")
                text = " ".join(argv[i + 1 : i + 1 + spec.nargs])
                i += spec.nargs
                state.set(spec, _convert(spec, text, state.warn), arg)
        except ValueError as e:
            raise ConfigError(f'error while handling argument "{arg}": {e}\n\nusage:\n{usage_entry(spec)}\n'
                              "to show complete usage, run with -h") from None
        i += 1

    if help_requested:
        raise ExitRequest(format_usage())
    parsed = ParsedArgs(dict(state.values), dict(state.sources), dict(state.order), tuple(state.warnings))
    check_refusals(parsed)
    for message in unsupported_warnings(parsed):
        state.warn(message)
    return ParsedArgs(parsed.values, parsed.sources, parsed.order, tuple(state.warnings))


def _shown(parsed: ParsedArgs, spec: FlagSpec, value: Any, *, name_value: bool) -> str:
    source = parsed.source(spec.dest) or spec.names[-1]
    if name_value and spec.takes_value:
        sep = " " if source in _LOOKUP else "="  # CLI arg or env var
        return f"{source}{sep}{format_value(value)}"
    return source


def _excused(parsed: ParsedArgs, spec: FlagSpec) -> str | None:
    """The warning that replaces ``spec``'s refusal because of another flag (``REFUSED_UNLESS``)."""
    rule = REFUSED_UNLESS.get(spec.dest)
    if rule is None or not parsed.values.get(rule[0]):
        return None
    return rule[1]


def _valued_flags(parsed: ParsedArgs) -> Iterator[tuple[FlagSpec, Any]]:
    """Each value-carrying destination once (its first spec in the table), with its parsed value."""
    done: set[str] = set()
    for spec in FLAGS:
        if spec.action is not None or spec.dest in done:
            continue
        done.add(spec.dest)
        yield spec, parsed.values[spec.dest]


def unsupported_warnings(parsed: ParsedArgs) -> list[str]:
    """One line per flag that is accepted but whose feature kvserve lacks."""
    out: list[str] = []
    for spec, value in _valued_flags(parsed):
        reason = spec.warning(value)
        if reason is None and spec.refusal(value) is not None:
            reason = _excused(parsed, spec)
        if reason is not None:
            shown = _shown(parsed, spec, value, name_value=spec.status != WARNED_STATUS)
            out.append(f"warn: {shown} is accepted but has no effect in kvserve: {reason}")
    return out


def check_refusals(parsed: ParsedArgs) -> None:
    """Raise one ``ConfigError`` listing every value kvserve cannot honour."""
    errors: list[str] = []
    for spec, value in _valued_flags(parsed):
        reason = spec.refusal(value)
        if reason is None or _excused(parsed, spec) is not None:
            continue
        shown = _shown(parsed, spec, value, name_value=spec.status != REFUSED_STATUS)  # name a refused value
        errors.append(f"error: {shown} is not supported by kvserve: {reason}")
    if errors:
        raise ConfigError("\n".join(errors))
