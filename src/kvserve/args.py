"""The llama-server flag table and a hand-written parser that follows llama.cpp's rules.

One row (``FlagSpec``) per flag: names, env var, type, default, help, ``dest`` (the config
field it feeds) and status. Parsing follows ``common_params_parse_ex`` (spec §1.1):

  defaults → env vars (every row, table order) → CLI args (left to right; CLI beats env)

A flag marked refused is accepted only at its default value; any other value, from the CLI
or from the environment, is a fatal ``ConfigError`` (kvserve never accepts a flag inertly).
Statuses live in ``REFUSED`` (whole flag) and ``REFUSED_VALUES`` (some values of an
implemented flag): flipping a flag to implemented means deleting its line there.

``python -m kvserve.args --write-compat docs/compat.md`` regenerates the compatibility doc.
"""

from __future__ import annotations

import enum
import json
import os
import platform
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvserve import __version__

COMPAT_BUILD = "b10621"
INT_MAX = 2**31 - 1
LLAMA_DEFAULT_SEED = 0xFFFFFFFF
IMPLEMENTED = "implemented"
REFUSED_STATUS = "refused"

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
# Statuses: the one place to flip. Keyed by dest.
# ---------------------------------------------------------------------------------------------
_DOWNLOAD = "kvserve never downloads models; pass a local GGUF with -m"
_MULTIMODAL = "multimodal input (projectors, media files) is not supported"
_CHECKPOINTS = (
    "the shared paged cache keeps full KV for SWA layers, so checkpoints are not needed; see compat.md"
)
_REASONING = "reasoning extraction, budgets and effort are not implemented"
_SPECULATIVE = "speculative decoding is not supported"
_ROUTER = "router mode (several models) is not supported; kvserve serves one model"
_GRAMMAR = "grammar / JSON-schema constrained sampling is not implemented"
_LORA = "LoRA adapters are not supported"
_FIT = "automatic memory fitting is not implemented; size the KV pool with -c"
_AGENT = "built-in agent tools and the MCP proxy are not supported"
_LOGFMT = "the log line format is fixed"
_TLS = "HTTPS is not supported; terminate TLS in a reverse proxy"

REFUSED: dict[str, str] = {
    "model_url": _DOWNLOAD,
    "hf_repo": _DOWNLOAD,
    "hf_file": _DOWNLOAD,
    "hf_token": _DOWNLOAD,
    "docker_repo": _DOWNLOAD,
    "mmproj": _MULTIMODAL,
    "mmproj_url": _MULTIMODAL,
    "mmproj_auto": _MULTIMODAL,
    "media_path": _MULTIMODAL,
    "reuse_port": "kvserve binds one listening socket; SO_REUSEPORT sharing is not supported",
    "ssl_key_file": _TLS,
    "ssl_cert_file": _TLS,
    "ui": "kvserve has no built-in web UI; it always behaves as --no-ui (GET / returns 404)",
    "static_path": "kvserve has no web UI and serves no static files",
    "ui_mcp_proxy": _AGENT,
    "tools": _AGENT,
    "agent": _AGENT,
    "ctx_checkpoints": _CHECKPOINTS,
    "checkpoint_min_step": _CHECKPOINTS,
    "reasoning_format": _REASONING,
    "reasoning": _REASONING,
    "reasoning_budget": _REASONING,
    "reasoning_budget_message": _REASONING,
    "reasoning_effort": _REASONING,
    "reasoning_preserve": _REASONING,
    "skip_chat_parsing": "switching the chat output parser off is not supported",
    "sleep_idle_seconds": "idle sleeping (unloading the model) is not implemented",
    "log_prompts_dir": "kvserve never writes prompts to disk",
    "log_jsonl": _LOGFMT,
    "log_colors": _LOGFMT,
    "log_prefix": _LOGFMT,
    "log_timestamps": _LOGFMT,
    "n_gpu_layers": "kvserve keeps the whole model on one device; choose it with --device (cpu or cuda)",
    "fit": _FIT,
    "fit_ctx": _FIT,
    "fit_target": _FIT,
    "rerank": "reranking is not supported",
    "lora": _LORA,
    "lora_scaled": _LORA,
    "lora_init_without_apply": _LORA,
    "model_draft": _SPECULATIVE,
    "hf_repo_draft": _SPECULATIVE,
    "spec_type": _SPECULATIVE,
    "spec_draft_n_max": _SPECULATIVE,
    "spec_draft_n_min": _SPECULATIVE,
    "models_dir": _ROUTER,
    "models_preset": _ROUTER,
    "models_max": _ROUTER,
    "models_autoload": _ROUTER,
    "grammar": _GRAMMAR,
    "grammar_file": _GRAMMAR,
    "json_schema": _GRAMMAR,
    "json_schema_file": _GRAMMAR,
    "backend_sampling": "sampling always runs in the engine; there is no separate backend sampler",
    "adaptive_target": "the adaptive-p sampler is not implemented",
    "adaptive_decay": "the adaptive-p sampler is not implemented",
    "cache_idle_slots": "idle slots hold no KV of their own: finished requests always hand their KV "
    "to the shared prefix cache (bounded by --cache-ram)",
    "flash_attn": "the attention backend is chosen by the device (torch SDPA on CPU)",
    "threads_batch": "one torch thread pool serves prompt and generation; use -t",
    "threads_http": "HTTP is served by one asyncio event loop, not a thread pool",
    "timeout": "HTTP read/write timeouts are not configurable; bound generation time per request "
    "with t_max_predict_ms or n_predict",
}

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
KV_CACHE_TYPES_SUPPORTED = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class ValueRule:
    """Some values of an implemented flag are refused: ``check(value)`` returns the reason."""

    check: Callable[[Any], str | None]
    doc: str


def _host_rule(v: Any) -> str | None:
    parts = [p for p in str(v).split(",") if p]
    if any(p.endswith(".sock") for p in parts):
        return "UNIX sockets are not supported; listen on a TCP address"
    if len(parts) != 1:
        return "kvserve listens on a single TCP address"
    return None


def _kv_type_rule(v: Any) -> str | None:
    if v in KV_CACHE_TYPES_SUPPORTED:
        return None
    return "quantized KV cache types are not supported; use f32, f16 or bf16"


REFUSED_VALUES: dict[str, ValueRule] = {
    "host": ValueRule(_host_rule, "one TCP address only; `.sock` UNIX sockets and CSV lists refused"),
    "jinja": ValueRule(
        lambda v: None if v else "kvserve renders chat templates with Jinja only",
        "`--no-jinja` refused: templates are always rendered with Jinja",
    ),
    "prefill_assistant": ValueRule(
        lambda v: None if v else "a trailing assistant message is always prefilled",
        "`--no-prefill-assistant` refused",
    ),
    "cache_type_k": ValueRule(_kv_type_rule, "f32/f16/bf16 only; quantized types refused"),
    "cache_type_v": ValueRule(_kv_type_rule, "f32/f16/bf16 only; quantized types refused"),
    "pooling": ValueRule(
        lambda v: "reranking is not supported" if v == "rank" else None, "`rank` refused (no reranking)"
    ),
}


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
# Converters (text, warn) -> value, raising ValueError(message); merges for accumulating flags
# ---------------------------------------------------------------------------------------------
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

    def conv(text: str, warn: Warn) -> str:
        if text in TRUTHY:
            return "on"
        if text in FALSEY:
            return "off"
        if text in ("auto", "-1"):
            return "auto"
        raise ValueError(f"error: unknown value for {flag}: '{text}'")

    return conv


def _onoff(flag: str) -> Convert:
    def conv(text: str, warn: Warn) -> str:
        if text in TRUTHY:
            return "on"
        if text in FALSEY:
            return "off"
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


def _replace(current: Any, new: Any, first: bool) -> Any:
    return new


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


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------
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


def negative_env(spec: FlagSpec) -> str | None:
    if not spec.neg_names or spec.env is None or "LLAMA_ARG_" not in spec.env:
        return None
    return spec.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")


I, FL, S, B, V = ArgType.INT, ArgType.FLOAT, ArgType.STR, ArgType.BOOL, ArgType.VOID


def F(names: str, dest: str, type_: ArgType, default: Any, help: str, *, neg: str = "",
      **kw: Any) -> FlagSpec:
    hint = kw.pop("hint", None)
    if hint is None and type_ in (I, FL, S):
        hint = "N" if type_ in (I, FL) else "VALUE"
    return FlagSpec(tuple(names.split()), dest, type_, default, help, neg_names=tuple(neg.split()),
                    hint=hint, **kw)


_SRV, _SMP = "server", "sampling"

_ROWS: tuple[FlagSpec, ...] = (
    # --- meta ---------------------------------------------------------------------------------
    F("-h --help --usage", "help", V, False, "print usage and exit", action="help", shown_default="-"),
    F("--version", "version", V, False, "show version and build info, then exit", action="version",
      shown_default="-"),
    # --- model ----------------------------------------------------------------------------------
    F("-m --model", "model", S, None, "model path (GGUF) to load", env="LLAMA_ARG_MODEL", hint="FNAME",
      shown_default="embedded SmolLM2-135M",
      notes="without -m kvserve serves its embedded default model (llama-server would start in router mode)"),
    F("-mu --model-url", "model_url", S, None, "model download url", env="LLAMA_ARG_MODEL_URL",
      hint="MODEL_URL"),
    F("-hf -hfr --hf-repo", "hf_repo", S, None, "Hugging Face model repository", env="LLAMA_ARG_HF_REPO",
      hint="<user>/<model>[:quant]"),
    F("-hff --hf-file", "hf_file", S, None, "Hugging Face model file", env="LLAMA_ARG_HF_FILE", hint="FILE"),
    F("-hft --hf-token", "hf_token", S, None, "Hugging Face access token", hint="TOKEN",
      notes="the HF_TOKEN env var is not read, so a token in the environment does not stop kvserve"),
    F("-dr --docker-repo", "docker_repo", S, None, "Docker Hub model repository",
      env="LLAMA_ARG_DOCKER_REPO", hint="[<repo>/]<model>[:quant]"),
    F("--offline", "offline", V, False, "offline mode: no network access", env="LLAMA_ARG_OFFLINE",
      notes="always true: kvserve never uses the network"),
    F("-a --alias", "aliases", S, (), "model name aliases, comma-separated (used by the API)",
      env="LLAMA_ARG_ALIAS", hint="STRING", convert=_csv_names, merge=_sorted_set,
      shown_default="(the -m path as given)",
      notes="stored sorted; the API model id is the first alias"),
    F("--tags", "tags", S, (), "model tags, comma-separated (informational, shown in /v1/models)",
      env="LLAMA_ARG_TAGS", hint="STRING", convert=_csv_names, merge=_sorted_set),
    # --- HTTP -----------------------------------------------------------------------------------
    F("--host", "host", S, "127.0.0.1", "IP address to listen on", env="LLAMA_ARG_HOST", hint="HOST"),
    F("--port", "port", I, 8080, "port to listen on (0 = any free port)", env="LLAMA_ARG_PORT",
      hint="PORT"),
    F("--reuse-port", "reuse_port", V, False, "allow several sockets to bind the same port",
      env="LLAMA_ARG_REUSE_PORT"),
    F("--api-prefix", "api_prefix", S, "", "prefix path the server serves from, no trailing slash",
      env="LLAMA_ARG_API_PREFIX", hint="PREFIX"),
    F("--api-key", "api_keys", S, (), "API keys, comma-separated", env="LLAMA_API_KEY", hint="KEY",
      convert=_api_keys, merge=_append,
      notes="appends: keys from the env var, --api-key and --api-key-file are all accepted"),
    F("--api-key-file", "api_keys", S, (), "file with one API key per line ('#' lines are comments)",
      env="LLAMA_ARG_API_KEY_FILE", hint="FNAME", convert=_api_key_file, merge=_append,
      notes="a missing file is fatal"),
    F("--ssl-key-file", "ssl_key_file", S, None, "PEM-encoded SSL private key",
      env="LLAMA_ARG_SSL_KEY_FILE", hint="FNAME"),
    F("--ssl-cert-file", "ssl_cert_file", S, None, "PEM-encoded SSL certificate",
      env="LLAMA_ARG_SSL_CERT_FILE", hint="FNAME"),
    F("--cors-origins", "cors_origins", S, "*", "allowed CORS origins, comma-separated, or 'localhost'",
      env="LLAMA_ARG_CORS_ORIGINS", hint="ORIGINS"),
    F("--cors-methods", "cors_methods", S, "GET, POST, DELETE, OPTIONS", "allowed CORS methods",
      env="LLAMA_ARG_CORS_METHODS", hint="METHODS"),
    F("--cors-headers", "cors_headers", S, "*", "allowed CORS headers", env="LLAMA_ARG_CORS_HEADERS",
      hint="HEADERS"),
    F("--cors-credentials", "cors_credentials", B, True, "allow credentials for CORS",
      neg="--no-cors-credentials", env="LLAMA_ARG_CORS_CREDENTIALS"),
    F("-to --timeout", "timeout", I, 3600, "HTTP read/write timeout in seconds", env="LLAMA_ARG_TIMEOUT"),
    F("--sse-ping-interval", "sse_ping_interval", I, 30, "SSE keep-alive interval in seconds (-1 = off)",
      env="LLAMA_ARG_SSE_PING_INTERVAL"),
    F("--threads-http", "threads_http", I, -1, "threads used to process HTTP requests (-1 = auto)",
      env="LLAMA_ARG_THREADS_HTTP"),
    F("--slots", "endpoint_slots", B, True, "expose GET /slots", neg="--no-slots",
      env="LLAMA_ARG_ENDPOINT_SLOTS"),
    F("--metrics", "endpoint_metrics", V, False, "enable the Prometheus /metrics endpoint",
      env="LLAMA_ARG_ENDPOINT_METRICS"),
    F("--props", "endpoint_props", V, False, "allow changing global properties via POST /props",
      env="LLAMA_ARG_ENDPOINT_PROPS"),
    F("--ui --webui", "ui", B, False, "serve the built-in Web UI", neg="--no-ui --no-webui",
      env="LLAMA_ARG_UI", notes="llama-server default: enabled"),
    F("--path", "static_path", S, "", "serve static files from this path", env="LLAMA_ARG_STATIC_PATH",
      hint="PATH"),
    F("--ui-mcp-proxy --webui-mcp-proxy", "ui_mcp_proxy", B, False, "enable the MCP CORS proxy",
      neg="--no-ui-mcp-proxy --no-webui-mcp-proxy", env="LLAMA_ARG_UI_MCP_PROXY"),
    F("--tools", "tools", S, None, "built-in agent tools, comma-separated", env="LLAMA_ARG_TOOLS",
      hint="TOOL1,TOOL2,..."),
    F("-ag --agent", "agent", B, False, "enable the CORS proxy and all built-in tools",
      neg="-no-ag --no-agent", env="LLAMA_ARG_AGENT"),
    F("--sleep-idle-seconds", "sleep_idle_seconds", I, -1, "unload the model after N idle seconds",
      hint="SECONDS", convert=_sleep_idle),
    # --- router ---------------------------------------------------------------------------------
    F("--models-dir", "models_dir", S, None, "router: directory of models", env="LLAMA_ARG_MODELS_DIR",
      hint="PATH"),
    F("--models-preset", "models_preset", S, None, "router: INI file of model presets",
      env="LLAMA_ARG_MODELS_PRESET", hint="PATH"),
    F("--models-max", "models_max", I, 4, "router: models loaded at once", env="LLAMA_ARG_MODELS_MAX"),
    F("--models-autoload", "models_autoload", B, True, "router: load models on demand",
      neg="--no-models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD"),
    # --- context, slots, cache ------------------------------------------------------------------
    F("-c --ctx-size", "n_ctx", I, 0, "total KV size for all slots (0 = from the model)",
      env="LLAMA_ARG_CTX_SIZE", notes="padded to a multiple of 256"),
    F("--kv-unified-per-slot", "kv_unified_per_slot", I, 0, "cap on per-slot context (0 = none)",
      env="LLAMA_ARG_KV_UNIFIED_PER_SLOT", notes="without -c the pool is sized to n_parallel * N"),
    F("-n --predict --n-predict", "n_predict", I, -1, "tokens to predict (-1 = unlimited)",
      env="LLAMA_ARG_N_PREDICT"),
    F("-b --batch-size", "n_batch", I, 2048, "logical maximum batch size", env="LLAMA_ARG_BATCH"),
    F("-ub --ubatch-size", "n_ubatch", I, 512, "physical maximum batch size", env="LLAMA_ARG_UBATCH"),
    F("-np --parallel", "n_parallel", I, -1, "number of server slots (-1 = auto: 4 slots, unified KV)",
      env="LLAMA_ARG_N_PARALLEL", convert=_np, notes="auto (-1) = 4 slots sharing one unified KV pool"),
    F("-cb --cont-batching", "cont_batching", B, True, "continuous batching", neg="-nocb --no-cont-batching",
      env="LLAMA_ARG_CONT_BATCHING"),
    F("-kvu --kv-unified", "kv_unified", B, False, "one KV buffer shared by all sequences",
      neg="-no-kvu --no-kv-unified", env="LLAMA_ARG_KV_UNIFIED", notes="forced on when -np is auto"),
    F("--cache-prompt", "cache_prompt", B, True, "prompt caching", neg="--no-cache-prompt",
      env="LLAMA_ARG_CACHE_PROMPT"),
    F("--cache-reuse", "cache_reuse", I, 0, "min chunk size for KV-shift reuse (0 = off)",
      env="LLAMA_ARG_CACHE_REUSE"),
    F("-sps --slot-prompt-similarity", "slot_prompt_similarity", FL, 0.10,
      "prompt similarity needed to reuse a slot (0.0 = off)", hint="SIMILARITY"),
    F("-cram --cache-ram", "cache_ram_mib", I, 8192,
      "host-RAM prompt cache size in MiB (-1 = no limit, 0 = off)", env="LLAMA_ARG_CACHE_RAM"),
    F("--cache-idle-slots", "cache_idle_slots", B, True, "save idle slots to the prompt cache",
      neg="--no-cache-idle-slots", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
      notes="disabled with a warning when --cache-ram is 0"),
    F("-ctxcp --ctx-checkpoints --swa-checkpoints", "ctx_checkpoints", I, 32,
      "max context checkpoints per slot", env="LLAMA_ARG_CTX_CHECKPOINTS"),
    F("-cms --checkpoint-min-step", "checkpoint_min_step", I, 8192, "min token spacing between checkpoints",
      env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
      convert=_int_min(0, "checkpoint-min-step must be non-negative")),
    F("--context-shift", "context_shift", B, False, "context shift on infinite generation",
      neg="--no-context-shift", env="LLAMA_ARG_CONTEXT_SHIFT"),
    F("--swa-full", "swa_full", V, False, "full-size SWA cache", env="LLAMA_ARG_SWA_FULL"),
    F("--keep", "n_keep", I, 0, "tokens to keep from the prompt on context shift (-1 = all)"),
    F("--slot-save-path", "slot_save_path", S, None, "directory for slot save/restore (enables POST /slots)",
      hint="PATH", convert=lambda t, w: _slot_save_path(t, w), notes="must be an existing directory"),
    F("-fa --flash-attn", "flash_attn", S, "auto", "flash attention: on, off or auto",
      env="LLAMA_ARG_FLASH_ATTN", hint="[on|off|auto]", convert=_tristate("--flash-attn"),
      notes="selects the attention backend"),
    F("-ctk --cache-type-k", "cache_type_k", S, "f16", "KV cache data type for K",
      env="LLAMA_ARG_CACHE_TYPE_K", hint="TYPE", convert=_kv_type),
    F("-ctv --cache-type-v", "cache_type_v", S, "f16", "KV cache data type for V",
      env="LLAMA_ARG_CACHE_TYPE_V", hint="TYPE", convert=_kv_type),
    F("--warmup", "warmup", B, True, "empty warmup run at load time", neg="--no-warmup"),
    F("-ngl --gpu-layers --n-gpu-layers", "n_gpu_layers", S, "auto", "layers to store in VRAM",
      env="LLAMA_ARG_N_GPU_LAYERS", hint="N"),
    F("-fit --fit", "fit", S, "on", "adjust unset arguments to fit in device memory",
      env="LLAMA_ARG_FIT", hint="[on|off]", convert=_onoff("--fit")),
    F("-fitc --fit-ctx", "fit_ctx", I, 4096, "minimum ctx size --fit may choose", env="LLAMA_ARG_FIT_CTX"),
    F("-fitt --fit-target", "fit_target", S, "1024", "--fit margin per device in MiB",
      env="LLAMA_ARG_FIT_TARGET", hint="MiB0,MiB1,..."),
    F("-t --threads", "threads", I, -1, "CPU threads for generation (torch intra-op threads)",
      env="LLAMA_ARG_THREADS", notes="<= 0 given explicitly means all cores"),
    F("-tb --threads-batch", "threads_batch", I, -1, "CPU threads for prompt processing (default: -t)"),
    # --- chat -----------------------------------------------------------------------------------
    F("--jinja", "jinja", B, True, "use Jinja chat templates", neg="--no-jinja", env="LLAMA_ARG_JINJA"),
    F("--chat-template", "chat_template", S, None, "chat template: a built-in name or inline Jinja",
      env="LLAMA_ARG_CHAT_TEMPLATE", hint="JINJA_TEMPLATE", shown_default="model metadata"),
    F("--chat-template-file", "chat_template", S, None, "file with a Jinja chat template",
      env="LLAMA_ARG_CHAT_TEMPLATE_FILE", hint="JINJA_TEMPLATE_FILE", convert=_chat_template_file,
      shown_default="model metadata", notes="read at startup; a missing file is fatal"),
    F("--chat-template-kwargs", "chat_template_kwargs", S, (), "extra template params as a JSON object",
      env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", hint="STRING", convert=_template_kwargs, merge=_dict_update,
      shown_default="{}", notes="preserve_reasoning defaults to true"),
    F("--reasoning-format", "reasoning_format", S, "auto", "thought extraction: none, auto, deepseek, "
      "deepseek-legacy", env="LLAMA_ARG_THINK", hint="FORMAT",
      convert=_choice("--reasoning-format", ("none", "auto", "deepseek", "deepseek-legacy"))),
    F("-rea --reasoning", "reasoning", S, "auto", "reasoning on, off or auto", env="LLAMA_ARG_REASONING",
      hint="[on|off|auto]", convert=_tristate("--reasoning")),
    F("--reasoning-budget", "reasoning_budget", I, -1, "thinking token budget (-1 = unlimited)",
      env="LLAMA_ARG_THINK_BUDGET", convert=_int_min(-1, "invalid value")),
    F("--reasoning-budget-message", "reasoning_budget_message", S, None,
      "text injected before the forced end of thinking", env="LLAMA_ARG_THINK_BUDGET_MESSAGE",
      hint="MESSAGE"),
    F("--reasoning-effort", "reasoning_effort", S, None, "template kwarg reasoning_effort",
      env="LLAMA_ARG_REASONING_EFFORT", hint="LEVEL"),
    F("--reasoning-preserve", "reasoning_preserve", B, None, "template kwarg preserve_reasoning",
      neg="--no-reasoning-preserve", env="LLAMA_ARG_REASONING_PRESERVE", shown_default="template default"),
    F("--prefill-assistant", "prefill_assistant", B, True, "prefill a trailing assistant message",
      neg="--no-prefill-assistant", env="LLAMA_ARG_PREFILL_ASSISTANT"),
    F("--skip-chat-parsing", "skip_chat_parsing", B, False, "force a pure content parser",
      neg="--no-skip-chat-parsing", env="LLAMA_ARG_SKIP_CHAT_PARSING"),
    # --- output ---------------------------------------------------------------------------------
    F("-sp --special", "special", V, False, "render special tokens in output text"),
    F("-r --reverse-prompt", "reverse_prompt", S, (), "extra stop string (repeatable)", hint="PROMPT",
      merge=_append_one, notes="escape sequences processed unless --no-escape"),
    F("-e --escape", "escape", B, True, "process escapes (\\n, \\r, \\t, \\', \\\", \\\\) in -r and "
      "--dry-sequence-breaker", neg="--no-escape"),
    F("--spm-infill", "spm_infill", V, False, "suffix/prefix/middle order for /infill"),
    # --- logging --------------------------------------------------------------------------------
    F("-lv --verbosity --log-verbosity", "verbosity", I, 3,
      "log verbosity threshold: 0 output, 1 error, 2 warn, 3 info, 4 trace, 5 debug",
      env="LLAMA_ARG_LOG_VERBOSITY"),
    F("-v --verbose --log-verbose", "verbosity", V, 3, "log everything (verbosity = INT_MAX)",
      const=INT_MAX, shown_default="off"),
    F("--log-disable", "log_disable", V, False, "disable logging"),
    F("--log-file", "log_file", S, None, "also log to this file", env="LLAMA_ARG_LOG_FILE", hint="FNAME"),
    F("--log-prompts-dir", "log_prompts_dir", S, None, "debug: write raw prompts to this directory",
      hint="PATH"),
    F("--log-jsonl", "log_jsonl", V, False, "JSON lines log format", env="LLAMA_ARG_LOG_JSONL"),
    F("--log-colors", "log_colors", S, "auto", "colored logging: on, off or auto", env="LLAMA_ARG_LOG_COLORS",
      hint="[on|off|auto]", convert=_tristate("--log-colors")),
    F("--log-prefix", "log_prefix", B, None, "prefix in log messages", neg="--no-log-prefix",
      env="LLAMA_ARG_LOG_PREFIX", shown_default="unset"),
    F("--log-timestamps", "log_timestamps", B, None, "timestamps in log messages",
      neg="--no-log-timestamps", env="LLAMA_ARG_LOG_TIMESTAMPS", shown_default="unset"),
    # --- embeddings -----------------------------------------------------------------------------
    F("--embedding --embeddings", "embedding", V, False, "enable the embedding endpoints",
      env="LLAMA_ARG_EMBEDDINGS", notes="forces n_batch = n_ubatch when larger"),
    F("--rerank --reranking", "rerank", V, False, "enable /rerank", env="LLAMA_ARG_RERANKING"),
    F("--pooling", "pooling", S, None, "embedding pooling: none, mean, cls, last, rank",
      env="LLAMA_ARG_POOLING", hint="{none,mean,cls,last,rank}", shown_default="model default",
      convert=_choice("--pooling", ("none", "mean", "cls", "last", "rank"))),
    F("--embd-normalize", "embd_normalize", I, 2,
      "embedding normalization: -1 none, 0 max-abs int16, 1 taxicab, 2 L2, >2 p-norm"),
    # --- adapters, multimodal, speculative ------------------------------------------------------
    F("--lora", "lora", S, (), "LoRA adapter paths, comma-separated", hint="FNAME",
      convert=lambda t, w: tuple(parse_csv_row(t)), merge=_append),
    F("--lora-scaled", "lora_scaled", S, (), "LoRA adapters with scale, FNAME:SCALE,...",
      hint="FNAME:SCALE,...", convert=lambda t, w: tuple(parse_csv_row(t)), merge=_append),
    F("--lora-init-without-apply", "lora_init_without_apply", V, False, "load LoRA adapters unapplied"),
    F("-mm --mmproj", "mmproj", S, None, "multimodal projector file", env="LLAMA_ARG_MMPROJ", hint="FILE"),
    F("-mmu --mmproj-url", "mmproj_url", S, None, "multimodal projector URL", env="LLAMA_ARG_MMPROJ_URL",
      hint="URL"),
    F("--mmproj-auto", "mmproj_auto", B, False, "use a multimodal projector when available",
      neg="--no-mmproj --no-mmproj-auto", env="LLAMA_ARG_MMPROJ_AUTO", notes="llama-server default: enabled"),
    F("--media-path", "media_path", S, None, "directory for file:// media", hint="PATH"),
    F("--spec-draft-model -md --model-draft", "model_draft", S, None, "draft model for speculative decoding",
      env="LLAMA_ARG_SPEC_DRAFT_MODEL", hint="FNAME"),
    F("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "hf_repo_draft", S, None, "draft model HF repository",
      env="LLAMA_ARG_SPEC_DRAFT_HF_REPO", hint="<user>/<model>[:quant]"),
    F("--spec-type", "spec_type", S, "none", "speculative decoding types, comma-separated",
      env="LLAMA_ARG_SPEC_TYPE", hint="TYPES"),
    F("--spec-draft-n-max", "spec_draft_n_max", I, 3, "tokens to draft", env="LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    F("--spec-draft-n-min", "spec_draft_n_min", I, 0, "minimum draft tokens",
      env="LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    # --- sampling (dest = the request field name) -----------------------------------------------
    F("--samplers", "samplers", S, DEFAULT_SAMPLERS, "samplers in order, ';'-separated",
      hint="SAMPLERS", convert=_samplers, group=_SMP, shown_default=";".join(DEFAULT_SAMPLERS)),
    F("--sampler-seq --sampling-seq", "samplers", S, DEFAULT_SAMPLERS, "sampler order as chars",
      hint="SEQUENCE", convert=_sampler_seq, group=_SMP, shown_default="edskypmxt"),
    F("-s --seed", "seed", S, LLAMA_DEFAULT_SEED, "RNG seed (-1 = random)", hint="SEED", convert=_seed,
      group=_SMP, shown_default="-1"),
    F("--ignore-eos", "ignore_eos", V, False, "ignore end of stream and keep generating", group=_SMP),
    F("--temp --temperature", "temperature", FL, 0.80, "temperature (negative = 0)",
      env="LLAMA_ARG_TEMPERATURE", convert=_temp, group=_SMP),
    F("--top-k", "top_k", I, 40, "top-k sampling (0 = off)", env="LLAMA_ARG_TOP_K", group=_SMP),
    F("--top-p", "top_p", FL, 0.95, "top-p sampling (1.0 = off)", env="LLAMA_ARG_TOP_P", group=_SMP),
    F("--min-p", "min_p", FL, 0.05, "min-p sampling (0.0 = off)", env="LLAMA_ARG_MIN_P", group=_SMP),
    F("--top-nsigma --top-n-sigma", "top_n_sigma", FL, -1.0, "top-n-sigma sampling (-1 = off)", group=_SMP),
    F("--xtc-probability", "xtc_probability", FL, 0.0, "XTC probability (0.0 = off)", group=_SMP),
    F("--xtc-threshold", "xtc_threshold", FL, 0.10, "XTC threshold (> 0.5 = off)", group=_SMP),
    F("--typical --typical-p", "typical_p", FL, 1.0, "locally typical sampling p (1.0 = off)", group=_SMP),
    F("--repeat-last-n", "repeat_last_n", I, 64, "tokens considered for penalties (0 = off, -1 = ctx)",
      convert=_int_min(-1, "error: invalid repeat-last-n = {value}"), group=_SMP),
    F("--repeat-penalty", "repeat_penalty", FL, 1.0, "repeat penalty (1.0 = off)",
      env="LLAMA_ARG_REPEAT_PENALTY", group=_SMP),
    F("--presence-penalty", "presence_penalty", FL, 0.0, "presence penalty (0.0 = off)",
      env="LLAMA_ARG_PRESENCE_PENALTY", group=_SMP),
    F("--frequency-penalty", "frequency_penalty", FL, 0.0, "frequency penalty (0.0 = off)",
      env="LLAMA_ARG_FREQUENCY_PENALTY", group=_SMP),
    F("--dry-multiplier", "dry_multiplier", FL, 0.0, "DRY multiplier (0.0 = off)", group=_SMP),
    F("--dry-base", "dry_base", FL, 1.75, "DRY base (values below 1 are ignored)", merge=_dry_base,
      group=_SMP),
    F("--dry-allowed-length", "dry_allowed_length", I, 2, "DRY allowed length", group=_SMP),
    F("--dry-penalty-last-n", "dry_penalty_last_n", I, 64, "DRY window (0 = off, -1 = ctx)",
      convert=_int_min(-1, "error: invalid dry-penalty-last-n = {value}"), group=_SMP),
    F("--dry-sequence-breaker", "dry_sequence_breakers", S, ("\n", ":", '"', "*"),
      "add a DRY sequence breaker, clearing the defaults ('none' = no breakers)", hint="STRING",
      merge=_dry_breaker, group=_SMP, shown_default="'\\n', ':', '\"', '*'"),
    F("--mirostat", "mirostat", I, 0, "Mirostat (0 = off, 1 = Mirostat, 2 = Mirostat 2.0)", group=_SMP),
    F("--mirostat-lr", "mirostat_eta", FL, 0.10, "Mirostat learning rate (eta)", group=_SMP),
    F("--mirostat-ent", "mirostat_tau", FL, 5.0, "Mirostat target entropy (tau)", group=_SMP),
    F("--dynatemp-range", "dynatemp_range", FL, 0.0, "dynamic temperature range (0.0 = off)", group=_SMP),
    F("--dynatemp-exp", "dynatemp_exponent", FL, 1.0, "dynamic temperature exponent", group=_SMP),
    F("--adaptive-target", "adaptive_target", FL, -1.0, "adaptive-p target probability (negative = off)",
      group=_SMP),
    F("--adaptive-decay", "adaptive_decay", FL, 0.90, "adaptive-p decay", group=_SMP),
    F("-l --logit-bias", "logit_bias", S, (), "logit bias TOKEN_ID(+/-)BIAS (repeatable)",
      hint="TOKEN_ID(+/-)BIAS", convert=_logit_bias, merge=_append, group=_SMP, shown_default="none"),
    F("--grammar", "grammar", S, None, "BNF-like grammar", hint="GRAMMAR", group=_SMP),
    F("--grammar-file", "grammar_file", S, None, "file to read a grammar from", hint="FNAME", group=_SMP),
    F("-j --json-schema", "json_schema", S, None, "JSON schema to constrain generations", hint="SCHEMA",
      group=_SMP),
    F("-jf --json-schema-file", "json_schema_file", S, None, "file with a JSON schema", hint="FILE",
      group=_SMP),
    F("-bs --backend-sampling", "backend_sampling", V, False, "backend sampling (experimental)",
      env="LLAMA_ARG_BACKEND_SAMPLING", group=_SMP),
    # --- kvserve only ---------------------------------------------------------------------------
    F("--dtype", "dtype", S, "auto", "compute dtype: auto (f32 on CPU, bf16 on CUDA), f32, bf16, f16",
      env="KVSERVE_ARG_DTYPE", hint="{auto,f32,bf16,f16}",
      convert=_choice("--dtype", ("auto", "f32", "bf16", "f16")),
      group="kvserve", kvserve_only=True),
    F("--device", "device", S, "auto", "where the model runs: auto (CUDA when available), cpu, cuda",
      env="KVSERVE_ARG_DEVICE", hint="{auto,cpu,cuda}", convert=_choice("--device", ("auto", "cpu", "cuda")),
      group="kvserve", kvserve_only=True,
      notes="llama.cpp's -dev/--device takes backend device names; kvserve's takes auto/cpu/cuda"),
)


def _with_status(rows: Sequence[FlagSpec]) -> tuple[FlagSpec, ...]:
    out = []
    for spec in rows:
        if spec.dest in REFUSED:
            spec = replace(spec, status=REFUSED_STATUS, reason=REFUSED[spec.dest])
        out.append(spec)
    return tuple(out)


FLAGS: tuple[FlagSpec, ...] = _with_status(_ROWS)


def _build_lookup(flags: Sequence[FlagSpec]) -> dict[str, tuple[FlagSpec, bool]]:
    lookup: dict[str, tuple[FlagSpec, bool]] = {}
    for spec in flags:
        for name in spec.names:
            assert name not in lookup, f"duplicate flag {name}"
            lookup[name] = (spec, True)
        for name in spec.neg_names:
            assert name not in lookup, f"duplicate flag {name}"
            lookup[name] = (spec, False)
    return lookup


_LOOKUP = _build_lookup(FLAGS)


def find_flag(name: str) -> FlagSpec:
    """The row for ``name`` (any alias; ``--a_b`` == ``--a-b``)."""
    if name.startswith("--"):
        name = name.replace("_", "-")
    return _LOOKUP[name][0]


def flags_for_dest(dest: str) -> tuple[FlagSpec, ...]:
    return tuple(s for s in FLAGS if s.dest == dest)


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------
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


def parse_args(argv: Sequence[str], environ: Mapping[str, str] | None = None, *,
               warn: Warn | None = None) -> ParsedArgs:
    """Parse ``argv`` (without the program name) over ``environ`` like llama-server does.

    Raises ``ConfigError`` (exit 1) or ``ExitRequest`` (help/version, exit 0).
    """
    environ = os.environ if environ is None else environ
    state = _State(warn or _default_warn)

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
            elif spec.type is ArgType.VOID:
                state.set(spec, spec.const, arg)
            elif spec.type is ArgType.BOOL:
                state.set(spec, positive, arg)
            else:
                if i + 1 >= len(argv):
                    raise ValueError("expected value for argument")
                i += 1
                state.set(spec, _convert(spec, argv[i], state.warn), arg)
        except ValueError as e:
            raise ConfigError(f'error while handling argument "{arg}": {e}\n\nusage:\n{usage_entry(spec)}\n'
                              "to show complete usage, run with -h") from None
        i += 1

    if help_requested:
        raise ExitRequest(format_usage())
    parsed = ParsedArgs(dict(state.values), dict(state.sources), dict(state.order), tuple(state.warnings))
    check_refusals(parsed)
    return parsed


def check_refusals(parsed: ParsedArgs) -> None:
    """Raise one ``ConfigError`` listing every value kvserve cannot honour."""
    errors: list[str] = []
    done: set[str] = set()
    for spec in FLAGS:
        if spec.action is not None or spec.dest in done:
            continue
        done.add(spec.dest)
        value = parsed.values[spec.dest]
        reason = spec.refusal(value)
        if reason is None:
            continue
        source = parsed.source(spec.dest) or spec.names[-1]
        shown = source
        if spec.status != REFUSED_STATUS and spec.takes_value:  # name the refused value
            sep = " " if source in _LOOKUP else "="  # CLI arg or env var
            shown = f"{source}{sep}{format_value(value)}"
        errors.append(f"error: {shown} is not supported by kvserve: {reason}")
    if errors:
        raise ConfigError("\n".join(errors))


# ---------------------------------------------------------------------------------------------
# Usage, version, compat.md
# ---------------------------------------------------------------------------------------------
def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "enabled" if value else "disabled"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, tuple):
        return ", ".join(format_value(v) for v in value) if value else "none"
    return str(value)


def shown_default(spec: FlagSpec) -> str:
    if spec.shown_default is not None:
        return spec.shown_default
    if spec.type is ArgType.VOID:
        return "off"
    if spec.default == "":
        return '""'
    return format_value(spec.default)


def version_text() -> str:
    return (f"version: kvserve {__version__} (compatible with llama-server {COMPAT_BUILD})\n"
            f"built with Python {platform.python_version()} for {sys.platform}-{platform.machine()}")


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for para in text.split("\n"):
        cur = ""
        for word in para.split(" "):
            if cur and len(cur) + 1 + len(word) > width:
                lines.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}" if cur else word
        lines.append(cur)
    return lines


def usage_entry(spec: FlagSpec) -> str:
    """One option in llama.cpp's help layout: names at column 0, help from column 40."""
    names = list(spec.all_names)
    head = names[0] if len(names) == 1 else (names[0] + ", ").ljust(7) + ", ".join(names[1:])
    if spec.hint:
        head += " " + spec.hint
    parts = [spec.help]
    if spec.action is None:
        parts.append(f"(default: {shown_default(spec)})")
    if spec.envs:
        parts.append(f"(env: {', '.join(spec.envs)})")
    if spec.kvserve_only:
        parts.append("[kvserve only]")
    if spec.status == REFUSED_STATUS:
        parts.append(f"[not supported by kvserve: {spec.reason}]")
    body = _wrap(" ".join(parts), 70)
    pad = " " * 40
    first = head + "\n" + pad if len(head) > 37 else head.ljust(40)
    return first + ("\n" + pad).join(body) + "\n"


def format_usage() -> str:
    sections = (("server params", "server"), ("sampling params", "sampling"),
                ("kvserve-only params", "kvserve"))
    out = [f"usage: kvserve [options]   (llama-server {COMPAT_BUILD} compatible)\n"]
    for title, group in sections:
        out.append(f"\n----- {title} -----\n\n")
        out.extend(usage_entry(s) for s in FLAGS if s.group == group)
    return "".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "\\n")


def _compat_row(spec: FlagSpec) -> str:
    flag = ", ".join(spec.names) + (f" {spec.hint}" if spec.hint else "")
    if spec.neg_names:
        flag += " / " + ", ".join(spec.neg_names)
    env = ", ".join(f"`{e}`" for e in spec.envs) or "-"
    notes = [spec.reason] if spec.status == REFUSED_STATUS else []
    rule = REFUSED_VALUES.get(spec.dest)
    if rule is not None:
        notes.append(rule.doc)
    if spec.notes:
        notes.append(spec.notes)
    default = shown_default(spec).replace("\n", "\\n")
    return (f"| `{_md(flag)}` | {env} | {_md(default)} | {spec.status} | "
            f"{_md('; '.join(notes)) or '-'} |")


_COMPAT_HEADER = f"""# kvserve command-line compatibility

Generated from the flag table in `src/kvserve/args.py` by
`python -m kvserve.args --write-compat docs/compat.md`; do not edit by hand.

kvserve takes llama-server's ({COMPAT_BUILD}) flags, `LLAMA_ARG_*` environment variables and
defaults, parsed with llama.cpp's rules:

- Environment variables are read first; command-line arguments override them, with
  `warn: <ENV> environment variable is set, but will be overwritten by command line argument <arg>`.
  Accumulating flags (`--api-key`, `--api-key-file`, `-a`, `--tags`, `-r`, `-l`,
  `--chat-template-kwargs`) keep the values from both, as llama-server does.
- Boolean env values: `on|enabled|true|1` / `off|disabled|false|0`; anything else is an error.
  For a flag pair, a set `LLAMA_ARG_NO_<NAME>` means false. A valueless flag's env var
  triggers it only when truthy.
- `--flag_name` equals `--flag-name`; `--flag=value` is not accepted (as in llama-server).
- Integers and floats parse like C++ `std::stoi` / `std::stof` (a leading number; the rest is ignored).
- An unknown flag prints `error: invalid argument: <arg>` and exits 1; a repeated flag logs a
  `DEPRECATED` warning and the last value wins.
- INI presets (`/etc/llama.cpp/config.ini`, `~/.config/llama.cpp/config.ini`) are not read;
  kvserve warns when one exists.

**Refused** flags are accepted only at their default value. Any other value, from the command
line or the environment, stops kvserve with `error: <flag> is not supported by kvserve: <reason>`
and exit status 1: kvserve never accepts a setting it would silently ignore. Some implemented
flags refuse particular values (noted below).

Context checkpoints (`--ctx-checkpoints`, `--checkpoint-min-step`): llama-server snapshots the
KV state of SWA and recurrent layers so a later request can resume from a checkpoint. kvserve's
shared paged cache keeps the full KV of every layer for every cached token, so any cached prefix
can be resumed directly and checkpoints are not needed.
"""


def long_name(spec: FlagSpec) -> str:
    """The first ``--`` name (the one llama.cpp documents), else the first name."""
    return next((n for n in spec.names if n.startswith("--")), spec.names[0])


def render_compat() -> str:
    out = [_COMPAT_HEADER]
    sections = (("Server flags", "server"),
                ("Sampling flags (server defaults for request fields)", "sampling"),
                ("kvserve-only flags", "kvserve"))
    for title, group in sections:
        out.append(f"\n## {title}\n\n| Flag | Env | Default | Status | Reason / notes |\n"
                   "|---|---|---|---|---|\n")
        out.extend(_compat_row(s) + "\n" for s in FLAGS if s.group == group)
    refused = sorted({long_name(s) for s in FLAGS if s.status == REFUSED_STATUS})
    out.append(f"\n## Refused flags ({len(refused)})\n\n" + ", ".join(f"`{n}`" for n in refused) + "\n")
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--write-compat":
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(render_compat())
        return 0
    if argv == ["--print-compat"]:
        sys.stdout.write(render_compat())
        return 0
    print("usage: python -m kvserve.args --write-compat PATH | --print-compat", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
