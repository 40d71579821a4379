"""``--models-preset FILE``: llama-server's INI model presets (``common/preset.cpp``).

Each ``[NAME]`` section is a model; its keys are llama-server flags without leading dashes (any
alias: ``c``, ``ctx-size``), or their environment variables (``LLAMA_ARG_CTX_SIZE``), applied to
that model's child. ``[*]`` holds defaults for every model (models-dir ones too); keys before
any section form a model named ``default``. ``model = PATH`` names the GGUF; a section named
like a models-dir model only adds options to it. The preset-only keys ``load-on-startup``,
``stop-timeout`` and ``dedup-cache-models`` steer the router and are never passed on.

The file's grammar and key rules are llama.cpp's (``kvserve.args.ini``); an unknown key is an
error naming it. This module turns a model's options into its child's command line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvserve.args.ini import (
    DEDUP_CACHE_MODELS,
    DEFAULT_NAME,
    GLOBAL_NAME,
    LOAD_ON_STARTUP,
    PRESET_ONLY,
    STOP_TIMEOUT,
    Option,
    Options,
    PresetError,
    canonical_key,
    canonical_tag,
    load_presets,
    options_by_key,
    ordered,
    parse_ini,
)
from kvserve.args.spec import FALSEY, ArgType
from kvserve.args.table import FLAGS, find_flag

__all__ = ["DEDUP_CACHE_MODELS", "DEFAULT_NAME", "GLOBAL_NAME", "LOAD_ON_STARTUP", "PRESET_ONLY", "STOP_TIMEOUT",
           "Option", "Options", "PresetError", "canonical_key", "canonical_tag", "cli_options", "keys_of_dests",
           "load_presets", "ordered", "parse_ini", "to_args", "to_ini", "without"]


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
    by_key = options_by_key()
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
