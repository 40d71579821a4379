"""``--models-preset FILE``: llama-server's INI model presets (``common/preset.cpp``).

Each ``[NAME]`` section is a model; its keys are llama-server flags without leading dashes (any
alias: ``c``, ``ctx-size``), or their environment variables (``LLAMA_ARG_CTX_SIZE``), applied to
that model's child. ``[*]`` holds defaults for every model (models-dir ones too); keys before
any section form a model named ``default``. ``model = PATH`` names the GGUF; a section named
like a models-dir model only adds options to it. The preset-only keys ``load-on-startup``,
``stop-timeout`` and ``dedup-cache-models`` steer the router and are never passed on.

The grammar is llama.cpp's (a PEG): a line is a header ``[NAME]`` (at the line start; spaces
after ``[`` are skipped, spaces before ``]`` stay in the name), ``key = value``, a comment
(``;`` or ``#``, also after a value, which ends at the first ``;``/``#`` or at trailing
spaces), or blank; anything else (an indented key, a key without ``=``) fails the whole file.
A repeated section starts over; a repeated key keeps its last value; ``version`` is skipped; an
unknown key is an error naming it. A tag after ``:`` in a section name is canonicalised
(``model:q4_k_m`` is ``model:Q4_K_M``).

Options are ``{canonical key: value}``, the canonical key being the flag's last name without
dashes (``ctx-size``, ``temperature``); a negative name (``no-jinja = true``) is stored as the
positive one with the opposite value (``jinja = false``).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvserve.args.spec import FALSEY, TRUTHY, ArgType, FlagSpec
from kvserve.args.table import FLAGS, find_flag

DEFAULT_NAME = "default"
GLOBAL_NAME = "*"
# preset-only keys (not flags): key -> llama.cpp's env name for it
LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS = "load-on-startup", "stop-timeout", "dedup-cache-models"
PRESET_ONLY = {LOAD_ON_STARTUP: "__PRESET_LOAD_ON_STARTUP", STOP_TIMEOUT: "__PRESET_STOP_TIMEOUT",
               DEDUP_CACHE_MODELS: "__PRESET_DEDUP_CACHE_MODELS"}

Options = dict[str, str]


class PresetError(Exception):
    """A preset file that cannot be used: the router does not start (llama-server's messages)."""


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
def _options_by_key() -> dict[str, Option]:
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


def load_presets(path: str) -> tuple[Options, dict[str, Options]]:
    """(the ``[*]`` options, ``{model name: options}``) of a preset file; PresetError otherwise."""
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


# ---------------------------------------------------------------------------------------------
# Options <-> command lines
# ---------------------------------------------------------------------------------------------
def cli_options(argv: Sequence[str]) -> Options:
    """A command line as options (``common_params_to_map``: the last value of a flag wins)."""
    out: Options = {}
    i = 0
    while i < len(argv):
        try:
            spec = find_flag(argv[i])
        except KeyError:
            i += 1
            continue
        if spec.takes_value:
            n = spec.nargs
            out[canonical_key(spec)] = " ".join(argv[i + 1 : i + 1 + n])
            i += 1 + n
        else:
            out[canonical_key(spec)] = "0" if argv[i] in spec.neg_names else "1"
            i += 1
    return out


def to_args(options: Options) -> list[str]:
    """The child's flags for ``options`` (``common_preset::to_args``): the long name and its
    value; a valueless flag set false becomes its negative name, or is left out."""
    by_key = _options_by_key()
    args: list[str] = []
    for key, value in ordered(options):
        spec = by_key[key].spec
        if spec is None:
            continue  # preset-only
        if spec.takes_value:
            if spec.nargs != 1:
                raise PresetError(f"option '{spec.names[-1]}' has two values, which is not supported yet")
            args += [spec.names[-1], value]
        elif value not in FALSEY:
            args.append(spec.names[-1])
        elif spec.type is ArgType.BOOL and spec.neg_names:
            args.append(spec.neg_names[-1])
    return args


def to_ini(name: str, options: Options) -> str:
    lines = [f"[{name}]"]
    for key, value in ordered(options):
        lines.append(f"{key} = {value.replace(chr(10), chr(92) + chr(10))}")
    return "\n".join(lines) + "\n\n"


def without(options: Options, keys: Iterable[str]) -> Options:
    drop = set(keys)
    return {k: v for k, v in options.items() if k not in drop}


def keys_of_dests(dests: Iterable[str]) -> set[str]:
    wanted = set(dests)
    return {canonical_key(s) for s in FLAGS if s.dest in wanted}
