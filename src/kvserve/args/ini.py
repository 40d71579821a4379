"""llama.cpp's INI files (``common/preset.cpp``): model presets and config files.

The grammar is llama.cpp's (a PEG): a line is a header ``[NAME]`` (at the line start; spaces
after ``[`` are skipped, spaces before ``]`` stay in the name), ``key = value``, a comment
(``;`` or ``#``, also after a value, which ends at the first ``;``/``#`` or at trailing
spaces), or blank; anything else (an indented key, a key without ``=``) fails the whole file.
A repeated section starts over; a repeated key keeps its last value; ``version`` is skipped.
Keys before any section form the section ``default``; ``[*]`` is the global one. A tag after
``:`` in a section name is canonicalised (``model:q4_k_m`` is ``model:Q4_K_M``).

Keys are llama-server flags without leading dashes (any alias: ``c``, ``ctx-size``) or their
environment variables (``LLAMA_ARG_CTX_SIZE``), plus the preset-only keys ``load-on-startup``,
``stop-timeout`` and ``dedup-cache-models``. Options are ``{canonical key: value}``, the
canonical key being the flag's last name without dashes (``ctx-size``, ``temperature``); a
negative name (``no-jinja = true``) is stored as the positive one with the opposite value
(``jinja = false``). An unknown key is an error naming it, or (config files, shared by all of
llama.cpp's programs) a warning.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .spec import TRUTHY, ConfigError, FlagSpec, Warn
from .table import FLAGS

DEFAULT_NAME = "default"
GLOBAL_NAME = "*"
# preset-only keys (not flags): key -> llama.cpp's env name for it
LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS = "load-on-startup", "stop-timeout", "dedup-cache-models"
PRESET_ONLY = {LOAD_ON_STARTUP: "__PRESET_LOAD_ON_STARTUP", STOP_TIMEOUT: "__PRESET_STOP_TIMEOUT",
               DEDUP_CACHE_MODELS: "__PRESET_DEDUP_CACHE_MODELS"}

Options = dict[str, str]


class PresetError(Exception):
    """An INI file that cannot be used (llama-server's messages)."""


@dataclass(frozen=True)
class Option:
    key: str  # canonical key
    spec: FlagSpec | None  # None: a preset-only key


def _strip_dashes(name: str) -> str:
    return name.lstrip("-")


def canonical_key(spec: FlagSpec) -> str:
    return _strip_dashes(spec.names[-1])


@functools.lru_cache(maxsize=1)
def _key_map() -> dict[str, tuple[Option, bool]]:
    """Every accepted key -> (option, negated)."""
    out: dict[str, tuple[Option, bool]] = {}
    for spec in FLAGS:
        opt = Option(canonical_key(spec), spec)
        for env in spec.envs:
            out[env] = (opt, False)
        for name in spec.names:
            out[_strip_dashes(name)] = (opt, False)
        for name in spec.neg_names:
            out[_strip_dashes(name)] = (opt, True)
    for key, env in PRESET_ONLY.items():
        out[key] = out[env] = (Option(key, None), False)
    return out


@functools.lru_cache(maxsize=1)
def options_by_key() -> dict[str, Option]:
    return {opt.key: opt for opt, _ in _key_map().values()}


@functools.lru_cache(maxsize=1)
def _order() -> dict[str, int]:
    keys = [canonical_key(s) for s in FLAGS] + list(PRESET_ONLY)
    return {k: i for i, k in enumerate(dict.fromkeys(keys))}


def ordered(options: Options) -> list[tuple[str, str]]:
    order = _order()
    return sorted(options.items(), key=lambda kv: order.get(kv[0], len(order)))


# ---------------------------------------------------------------------------------------------
# The INI grammar
# ---------------------------------------------------------------------------------------------
_NEWLINE = re.compile(r"\r\n|\n|\r")
_WS = re.compile(r"[ \t]*")
_IDENT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.\-]*")
_SECTION = re.compile(r"\[[ \t]*+([^\]]+)\]")  # both greedy, no backtracking: spaces before "]" stay
_EOL_START = re.compile(r"[ \t]*(?:[;#]|\r|\n|\Z)")


class _Fail(Exception):
    pass


def _eol(text: str, i: int) -> int:
    """``ws comment? (newline / EOF)``: the index after it."""
    i = _WS.match(text, i).end()  # type: ignore[union-attr]
    if i < len(text) and text[i] in ";#":
        m = _NEWLINE.search(text, i)
        return len(text) if m is None else m.end()
    if i == len(text):
        return i
    m = _NEWLINE.match(text, i)
    if m is None:
        raise _Fail
    return m.end()


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """``{section: {key: value}}``, as ``parse_ini_from_file``; ValueError when a line fits no rule."""
    parsed: dict[str, dict[str, str]] = {}
    section = DEFAULT_NAME
    i = 0
    try:
        while i < len(text):
            if text[i] == "[":
                m = _SECTION.match(text, i)
                if m is None:
                    raise _Fail
                i = _eol(text, m.end())
                section = m.group(1)
                parsed[section] = {}
                continue
            m = _IDENT.match(text, i)
            if m is not None:
                key = m.group(0)
                j = _WS.match(text, m.end()).end()  # type: ignore[union-attr]
                if j >= len(text) or text[j] != "=":
                    raise _Fail
                j = _WS.match(text, j + 1).end()  # type: ignore[union-attr]
                k = j
                while _EOL_START.match(text, k) is None:
                    k += 1
                value = text[j:k]
                i = _eol(text, k)
                parsed.setdefault(section, {})[key] = value
                continue
            i = _eol(text, i)  # a comment line or a blank line
    except _Fail:
        raise ValueError("invalid INI line") from None
    return parsed


_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.IGNORECASE)


def canonical_tag(tag: str) -> str:
    m = _TAG.search(tag)
    return (m.group(1) if m else tag).upper()


def _section_name(name: str) -> str:
    if name in (GLOBAL_NAME, DEFAULT_NAME) or ":" not in name:
        return name
    head, _, tag = name.rpartition(":")
    return f"{head}:{canonical_tag(tag)}"


def _option_value(opt: Option, negated: bool, value: str) -> str:
    if negated:  # "no-jinja = true" is "jinja = false" (a negative env name is taken as is)
        return "false" if value in TRUTHY else "true"
    return value


def load_presets(path: str, warn: Callable[[str], None] | None = None) -> tuple[Options, dict[str, Options]]:
    """(the ``[*]`` options, ``{section name: options}``) of an INI file; PresetError otherwise.
    ``warn``: unknown keys are skipped with a warning (config files) instead of failing."""
    if not os.path.exists(path):
        raise PresetError(f"preset file does not exist: {path}")
    try:
        with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
            text = f.read()
    except OSError:
        raise PresetError(f"failed to open server preset file: {path}") from None
    try:
        sections = parse_ini(text)
    except ValueError:
        raise PresetError(f"failed to parse server config file: {path}") from None
    keys = _key_map()
    glob: Options = {}
    out: dict[str, Options] = {}
    for raw_name, items in sorted(sections.items()):
        name = _section_name(raw_name)
        opts: Options = {}
        for key, value in items.items():
            if key == "version":
                continue
            if key not in keys:
                if warn is not None:
                    warn(f"warn: ignoring option '{key}' from {path}: not supported by this program")
                    continue
                raise PresetError(f"option '{key}' not recognized in preset '{name}'")
            opt, negated = keys[key]
            opts[opt.key] = _option_value(opt, negated, value)
        if name == DEFAULT_NAME and not opts:
            continue
        if name == GLOBAL_NAME:
            glob = opts
        else:
            out[name] = opts
    return glob, out


def config_file_values(paths: Sequence[str], warn: Warn) -> list[tuple[str, FlagSpec, str]]:
    """llama.cpp's config files (``common_params_apply_system_config``), a later one over an
    earlier one: the ``[*]`` section, then the ``default`` one (keys before any section); other
    sections are for other programs. Keys llama-server does not know are skipped with a warning."""
    out: list[tuple[str, FlagSpec, str]] = []
    by_key = options_by_key()
    for path in paths:
        try:
            glob, sections = load_presets(path, warn=warn)
        except PresetError as e:
            raise ConfigError(f"error: {e}") from None
        for opts in (glob, sections.get(DEFAULT_NAME, {})):
            for key, value in ordered(opts):
                spec = by_key[key].spec
                if spec is not None:  # preset-only keys mean nothing here
                    out.append((f"{path}: {key}", spec, value))
    return out


def config_files(environ: Mapping[str, str]) -> list[str]:
    """The config files that exist: the system's, then the user's (``$XDG_CONFIG_HOME`` or ~/.config)."""
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", "~"), ".config")
    paths = ["/etc/llama.cpp/config.ini", os.path.join(xdg, "llama.cpp", "config.ini")]
    return [p for p in paths if os.path.isfile(p)]
