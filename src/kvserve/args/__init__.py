"""The llama-server flag table and a hand-written parser that follows llama.cpp's rules.

One row (``FlagSpec``) per flag: names, env var, type, default, help, ``dest`` (the config
field it feeds) and status. Parsing follows ``common_params_parse_ex`` (spec §1.1):

  defaults → env vars (every row, table order) → CLI args (left to right; CLI beats env)

A flag marked refused is accepted only at its default value; any other value, from the CLI
or from the environment, is a fatal ``ConfigError`` (only for values that would silently change
every answer). A flag marked warned is accepted with one start-up warning; its feature is
missing, and requests that would use it get a 400. Statuses live in ``REFUSED``, ``WARNED``
(whole flag), ``REFUSED_VALUES`` and ``WARNED_VALUES`` (some values of an implemented flag):
flipping a flag to implemented means deleting its line there.

Modules: ``spec`` (``FlagSpec``, ``ArgType``, errors, ``stoi``/``stof``-style value parsing),
``status`` (``REFUSED``, ``REFUSED_VALUES``), ``convert`` (per-flag converters and merges),
``table`` (the ``FLAGS`` rows), ``parser`` (``parse_args``), ``render`` (usage, version,
compat.md). This package re-exports their public names.

``python -m kvserve.args --write-compat docs/compat.md`` regenerates the compatibility doc.
"""

from .convert import (
    DEFAULT_SAMPLERS,
    KV_CACHE_TYPES,
    SAMPLER_CHARS,
    SAMPLER_NAMES,
    sampler_names,
)
# Private merges, re-exported because the tests compare a row's merge with them.
from .convert import _append as _append
from .convert import _append_one as _append_one
from .convert import _dict_update as _dict_update
from .convert import _sorted_set as _sorted_set
from .parser import ParsedArgs, check_refusals, parse_args
from .render import (
    format_usage,
    format_value,
    long_name,
    main,
    render_compat,
    shown_default,
    usage_entry,
    version_text,
)
from .spec import (
    COMPAT_BUILD,
    FALSEY,
    IMPLEMENTED,
    INT_MAX,
    LLAMA_DEFAULT_SEED,
    REFUSED_STATUS,
    TRUTHY,
    WARNED_STATUS,
    ArgType,
    ConfigError,
    Convert,
    ExitRequest,
    FlagSpec,
    Merge,
    Warn,
    negative_env,
    parse_bool_word,
    parse_csv_row,
    process_escapes,
    stof,
    stoi,
    stoul32,
)
from .status import (
    FEATURES,
    KV_CACHE_TYPES_SUPPORTED,
    REFUSED,
    REFUSED_VALUES,
    WARNED,
    WARNED_VALUES,
    ValueRule,
)
from .table import FL, FLAGS, B, F, I, S, V, find_flag, flags_for_dest

__all__ = [
    "FEATURES", "WARNED", "WARNED_STATUS", "WARNED_VALUES",
    "B", "COMPAT_BUILD", "DEFAULT_SAMPLERS", "F", "FALSEY", "FL", "FLAGS", "I", "IMPLEMENTED", "INT_MAX",
    "KV_CACHE_TYPES", "KV_CACHE_TYPES_SUPPORTED", "LLAMA_DEFAULT_SEED", "REFUSED", "REFUSED_STATUS",
    "REFUSED_VALUES", "S", "SAMPLER_CHARS", "SAMPLER_NAMES", "TRUTHY", "V", "ArgType", "ConfigError",
    "Convert", "ExitRequest", "FlagSpec", "Merge", "ParsedArgs", "ValueRule", "Warn", "check_refusals",
    "find_flag", "flags_for_dest", "format_usage", "format_value", "long_name", "main", "negative_env",
    "parse_args", "parse_bool_word", "parse_csv_row", "process_escapes", "render_compat", "sampler_names",
    "shown_default", "stof", "stoi", "stoul32", "usage_entry", "version_text",
]
