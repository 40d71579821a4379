"""Frozen configuration built once from the parsed flags (see ``kvserve.args``).

Components take the slice they need: ``ServerConfig`` (HTTP side), ``EngineConfig``
(scheduler, cache, runner) and ``SamplingDefaults`` (server defaults for request fields).
Values that depend on the loaded model (``n_ctx_train``) or on the hardware are derived by
the small functions on ``EngineConfig`` (spec §1.3), each a pure function of its inputs.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, NamedTuple

from kvserve.args import (
    FEATURES,
    INT_MAX,
    KV_CACHE_TYPES_SUPPORTED,
    ConfigError,
    ExitRequest,
    ParsedArgs,
    Warn,
    flags_for_dest,
    parse_args,
    parse_csv_row,
    process_escapes,
)
from kvserve.grammar.spec import GrammarSpec
from kvserve.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers
from kvserve.args.ini import config_file_values, config_files
from kvserve.model.config import RopeOverride
from kvserve.model.files import DEFAULT_MODEL_FILE

__all__ = [
    "INT_MAX", "Config", "ConfigError", "CtxPlan", "EngineConfig", "ParallelPlan", "SamplingDefaults",
    "ServerConfig", "build_config", "load_config", "pad_256",
]

KV_PAD = 256  # llama_context pads n_ctx (and per-sequence n_ctx) to a multiple of this


def pad_256(n: int) -> int:
    return (n + KV_PAD - 1) // KV_PAD * KV_PAD


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    api_prefix: str
    api_keys: tuple[str, ...]  # --api-key CSV and --api-key-file lines, in the order given
    cors_origins: str
    cors_methods: str
    cors_headers: str
    cors_credentials: bool
    endpoint_slots: bool
    endpoint_metrics: bool
    endpoint_props: bool
    timeout: int  # seconds, HTTP read and write
    sse_ping_interval: int  # seconds, -1 = off
    threads_http: int  # as given; see resolve_threads_http()
    model_path: str | None  # -m exactly as given; None = no model: kvserve runs as the router
    aliases: tuple[str, ...]  # sorted; never empty (defaults to the model name)
    tags: tuple[str, ...]  # sorted
    verbosity: int  # 0 output .. 5 debug; INT_MAX with -v
    log_disable: bool
    log_file: str | None
    special: bool
    reverse_prompt: tuple[str, ...]  # escapes already processed (unless --no-escape)
    spm_infill: bool
    embedding: bool
    pooling: str | None  # None = model default
    embd_normalize: int
    jinja: bool
    chat_template: str | None  # built-in name or Jinja source (--chat-template-file is read); None = model's
    chat_template_kwargs: Mapping[str, Any]  # decoded JSON values; preserve_reasoning defaults to True
    reasoning_format: str  # none | auto | deepseek | deepseek-legacy (deepseek unless given)
    reasoning: str  # -rea: on | off | auto
    skip_chat_parsing: bool  # chat output is never parsed (content only)
    reasoning_budget: int  # tokens allowed in a thinking block; -1 = unlimited
    reasoning_budget_message: str  # text forced before the end tag when the budget runs out
    slot_save_path: str | None  # existing directory, ends with a separator
    ui: bool  # serve the built-in chat page (or static_path) at api_prefix + "/"
    static_path: str | None = None  # --path: an existing directory served instead of the page
    ui_settings: Any = None  # --ui-config(-file) JSON, as given; /props shows it (None: {})
    prefill_assistant: bool = True
    reuse_port: bool = False
    mcp_proxy: bool = False  # --ui-mcp-proxy or -ag: GET/POST /cors-proxy forwards requests
    tools: tuple[str, ...] = ()  # --tools CSV as given ("all" for -ag); empty = no built-in tools
    tools_runtime: str = ""  # --tools-runtime spec ("" = the host)
    # --mcp-servers-config FILE, then --mcp-servers-json: the MCP servers whose tools /tools serves
    mcp_servers: tuple[McpServerConfig, ...] = ()
    # features enabled by a flag kvserve accepts but lacks: feature -> message for the 400 answer
    unsupported_features: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # --grammar/--grammar-file/-j/-jf: the grammar of every request that sets none
    grammar_default: GrammarSpec | None = None
    # router mode (started without a model): --models-dir, --models-max (0 = no limit), --models-autoload
    models_dir: str | None = None
    models_preset: str | None = None  # --models-preset: INI file of model presets (router/preset.py)
    models_max: int = 4
    models_autoload: bool = True
    # --ssl-key-file and --ssl-cert-file (PEM): HTTPS when both are given (checked at start-up)
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None

    @property
    def model_name(self) -> str:
        """The API model id: the first alias in sorted order."""
        return self.aliases[0]

    def resolve_threads_http(self, n_parallel: int) -> int:
        """Fixed HTTP workers: the flag, or ``max(n_parallel + 4, cpu_count - 1)`` below 1."""
        if self.threads_http >= 1:
            return self.threads_http
        return max(n_parallel + 4, (os.cpu_count() or 1) - 1)


class ParallelPlan(NamedTuple):
    n_parallel: int
    kv_unified: bool


class CtxPlan(NamedTuple):
    """KV sizing for a model with ``n_ctx_train`` (spec §1.3).

    n_ctx       total KV pool in tokens (multiple of 256)
    n_ctx_seq   what one sequence may address in the pool (== n_ctx when unified)
    n_ctx_slot  per-slot context reported by /slots, /props, /v1/models and used for the
                exceed-context check: min(n_ctx_seq, kv_unified_per_slot if > 0, n_ctx_train)
    """

    n_ctx: int
    n_ctx_seq: int
    n_ctx_slot: int
    n_parallel: int
    kv_unified: bool


@dataclass(frozen=True)
class EngineConfig:
    model_path: str | None  # None: build_engine loads the embedded default model (kvserve.model.files)
    dtype: str  # auto | f32 | bf16 | f16; see resolve_dtype()
    device: str  # auto | cpu | cuda; see resolve_device()
    n_ctx: int  # -c as given; 0 = from the model
    n_ctx_explicit: bool  # -c given (even -c 0): --kv-unified-per-slot then does not size the pool
    n_parallel: int  # -np as given; -1 = auto, see resolve_parallel()
    kv_unified: bool  # -kvu as given; auto -np forces it on
    kv_unified_per_slot: int  # 0 = no cap
    n_batch: int  # already lowered to n_ubatch for --embedding
    n_ubatch: int
    cont_batching: bool
    cache_prompt: bool
    cache_reuse: int  # min chunk for KV-shift reuse, 0 = off
    slot_prompt_similarity: float
    cache_ram_mib: int  # -1 = no byte limit, 0 = off
    cache_idle_slots: bool  # already False when cache_ram_mib == 0
    context_shift: bool
    swa_full: bool
    n_keep: int
    n_predict: int
    cache_type_k: str  # f32 | f16 | bf16
    cache_type_v: str
    threads: int | None  # torch intra-op threads; None = torch's default
    threads_batch: int | None  # threads for prompt processing; None = same as threads
    flash_attn: str  # on | off | auto: selects the attention backend
    warmup: bool
    embedding: bool
    sleep_idle_seconds: int = -1  # unload the model after this many idle seconds; -1 = never
    rope: RopeOverride = RopeOverride()  # --rope-freq-base, --rope-freq-scale / --rope-scale, --rope-scaling

    def resolve_parallel(self) -> ParallelPlan:
        """``-np -1`` (auto) means 4 slots and unified KV; an explicit N keeps ``-kvu`` as given."""
        if self.n_parallel < 0:
            return ParallelPlan(4, True)
        return ParallelPlan(self.n_parallel, self.kv_unified)

    def ctx_plan(self, n_ctx_train: int) -> CtxPlan:
        n_par, unified = self.resolve_parallel()
        n_ctx = self.n_ctx
        if n_ctx == 0 and self.kv_unified_per_slot > 0 and not self.n_ctx_explicit:
            n_ctx = n_par * self.kv_unified_per_slot
        if n_ctx == 0:
            n_ctx = n_ctx_train
        n_ctx = pad_256(n_ctx)
        if unified:
            n_ctx_seq = n_ctx
        else:
            n_ctx_seq = pad_256(n_ctx // n_par)
            n_ctx = n_ctx_seq * n_par
        n_ctx_slot = min(n_ctx_seq, n_ctx_train)
        if self.kv_unified_per_slot > 0:
            n_ctx_slot = min(n_ctx_slot, self.kv_unified_per_slot)
        return CtxPlan(n_ctx, n_ctx_seq, n_ctx_slot, n_par, unified)

    def n_ctx_slot(self, n_ctx_train: int) -> int:
        return self.ctx_plan(n_ctx_train).n_ctx_slot

    @property
    def batch_capacity(self) -> int:
        """Tokens the batch buffer holds: ``max(n_batch, n_parallel)``."""
        return max(self.n_batch, self.resolve_parallel().n_parallel)

    def resolve_device(self, cuda_available: bool) -> str:
        if self.device == "cuda" and not cuda_available:
            raise ConfigError("error: --device cuda was requested but CUDA is not available")
        if self.device == "auto":
            return "cuda" if cuda_available else "cpu"
        return self.device

    def resolve_dtype(self, device: str) -> str:
        """Activation dtype: ``auto`` is f32 on CPU and bf16 on CUDA."""
        if self.dtype != "auto":
            return self.dtype
        return "bf16" if device == "cuda" else "f32"

    def resolve_weights(self, device: str) -> str:
        """``quant`` (weights repacked, kept quantized) for ``auto`` on CPU; else ``dense``."""
        return "quant" if self.dtype == "auto" and device == "cpu" else "dense"


@dataclass(frozen=True)
class SamplingDefaults:
    """Server-wide defaults for the per-request sampling fields (field names = request keys)."""

    temperature: float
    dynatemp_range: float
    dynatemp_exponent: float
    top_k: int
    top_p: float
    min_p: float
    top_n_sigma: float
    typical_p: float
    xtc_probability: float
    xtc_threshold: float
    repeat_last_n: int
    repeat_penalty: float
    presence_penalty: float
    frequency_penalty: float
    dry_multiplier: float
    dry_base: float
    dry_allowed_length: int
    dry_penalty_last_n: int
    dry_sequence_breakers: tuple[str, ...]
    mirostat: int
    mirostat_tau: float
    mirostat_eta: float
    adaptive_target: float
    adaptive_decay: float
    seed: int  # uint32; 0xFFFFFFFF (LLAMA_DEFAULT_SEED) = random
    samplers: tuple[str, ...]  # canonical names: penalties, dry, top_n_sigma, top_k, typ_p, ...
    ignore_eos: bool
    logit_bias: tuple[tuple[int, float], ...]  # (token id, bias)

    def as_dict(self) -> dict[str, Any]:
        """Request-field → default, with lists where JSON has arrays."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = [list(v) if isinstance(v, tuple) else v for v in value] if isinstance(
                value, tuple) else value
        return out


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    engine: EngineConfig
    sampling: SamplingDefaults
    warnings: tuple[str, ...] = ()


def _threads(parsed: ParsedArgs, dest: str) -> int | None:
    value: int = parsed[dest]
    if value > 0:
        return value
    return (os.cpu_count() or 1) if parsed.explicit(dest) else None


def _unsupported_features(parsed: ParsedArgs) -> dict[str, str]:
    """Features a given flag asks for that kvserve lacks, with the message a request using them gets."""
    out: dict[str, str] = {}
    for feature, (dests, why) in FEATURES.items():
        given = [d for d in dests if parsed.explicit(d) and not flags_for_dest(d)[0].is_default(parsed[d])]
        if given:
            out[feature] = f"{why} (kvserve was started with {parsed.source(given[0])})"
    return out


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        raise ConfigError(f"error: failed to open file '{path}'") from None


def _grammar_default(v: Mapping[str, Any]) -> GrammarSpec | None:
    """The server-wide grammar: a JSON schema (-jf, then -j) wins over a GBNF grammar
    (--grammar-file, then --grammar). A schema that is not JSON stops start-up, as in
    llama.cpp; a grammar that does not parse fails each request that uses it (400)."""
    import json

    for dest, from_file in (("json_schema_file", True), ("json_schema", False)):
        if v.get(dest):
            text = _read_file(v[dest]) if from_file else v[dest]
            try:
                schema = json.loads(text)
            except ValueError as e:
                raise ConfigError(f"error: invalid JSON schema for --{dest.replace('_', '-')}: {e}") from None
            return GrammarSpec("json_schema", json.dumps(schema if schema != {} else {"type": "object"}))
    if v.get("grammar_file"):
        return GrammarSpec("gbnf", _read_file(v["grammar_file"]))
    if v.get("grammar"):
        return GrammarSpec("gbnf", v["grammar"])
    return None


def _rope_override(parsed: ParsedArgs) -> RopeOverride:
    """llama.cpp's ``params.rope_*``: --rope-scale N and --rope-freq-scale both set the frequency
    scale (1/N and N, in float32); the one set last wins."""
    v = parsed.values
    freq_scale = 0.0
    scale_dests = [d for d in ("rope_freq_scale", "rope_scale") if v[d] is not None]
    if scale_dests:
        last = max(scale_dests, key=lambda d: parsed.order.get(d, -1))
        freq_scale = _f32(v[last]) if last == "rope_freq_scale" else _f32(1.0 / _f32(v[last]))
    return RopeOverride(freq_base=_f32(v["rope_freq_base"] or 0.0), freq_scale=freq_scale,
                        scaling=v["rope_scaling"] or None)


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _tls_files(key: str | None, cert: str | None, note: Callable[[str], None]
               ) -> tuple[str | None, str | None]:
    """HTTPS needs both files, as in llama-server (one alone: plain HTTP, here with a warning);
    a key and certificate that do not load stop start-up."""
    if not key or not cert:
        if key or cert:
            note("warn: HTTPS needs both --ssl-key-file and --ssl-cert-file; serving plain HTTP")
        return None, None
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile=cert, keyfile=key)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"error: failed to load the SSL certificate '{cert}' and key '{key}': {e}") from None
    return key, cert


def build_config(parsed: ParsedArgs, *, warn: Warn | None = None) -> Config:
    """Turn parsed flag values into the frozen config, applying the startup rules of spec §1.3."""
    emit = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        emit(message)

    v = parsed.values
    esc = process_escapes if v["escape"] else (lambda s: s)

    model_path: str | None = v["model"] or None
    aliases: tuple[str, ...] = tuple(v["aliases"]) or (model_path or DEFAULT_MODEL_FILE,)
    kwargs = dict(v["chat_template_kwargs"])
    if v["reasoning"] in ("on", "off"):  # -rea on/off also sets the template's enable_thinking
        kwargs["enable_thinking"] = v["reasoning"] == "on"
    if v["reasoning_effort"] == "default":
        kwargs.pop("reasoning_effort", None)
    elif v["reasoning_effort"]:
        kwargs["reasoning_effort"] = v["reasoning_effort"]
    if v["reasoning_preserve"] is not None:
        kwargs["preserve_reasoning"] = bool(v["reasoning_preserve"])
    kwargs.setdefault("preserve_reasoning", True)

    # --reranking is --embedding with rank pooling (llama-server sets both)
    embedding = bool(v["embedding"] or v["rerank"])
    pooling = "rank" if v["rerank"] else v["pooling"]
    n_batch, n_ubatch = v["n_batch"], v["n_ubatch"]
    if embedding and n_batch > n_ubatch:
        note(f"warn: embeddings enabled with n_batch ({n_batch}) > n_ubatch ({n_ubatch}); "
             f"setting n_batch = n_ubatch = {n_ubatch}")
        n_batch = n_ubatch
    kv_k, kv_v = (t if t in KV_CACHE_TYPES_SUPPORTED else "f16"  # quantized types warn (status.py)
                  for t in (v["cache_type_k"], v["cache_type_v"]))
    cors_origins = v["cors_origins"]
    if (v["tools"] or v["agent"] or v["mcp_servers_config"] or v["mcp_servers_json"]) and not parsed.explicit(
            "cors_origins"):
        cors_origins = "localhost"  # llama-server's post-parse rule for tools and MCP servers
        note("warn: server tools or MCP servers are enabled, using localhost as default CORS origin "
             "(change via --cors-origins)")
    cache_idle_slots = v["cache_idle_slots"]
    if cache_idle_slots and v["cache_ram_mib"] == 0:
        note("warn: --cache-idle-slots requires --cache-ram (it is 0); disabling --cache-idle-slots")
        cache_idle_slots = False

    try:
        mcp_servers = load_mcp_servers(v["mcp_servers_config"] or None, v["mcp_servers_json"] or None,
                                       lambda m: note(f"warn: {m}"))
    except McpConfigError as e:
        raise ConfigError(f"error: MCP starting failed: {e}") from None

    ssl_key_file, ssl_cert_file = _tls_files(v["ssl_key_file"], v["ssl_cert_file"], note)
    static_path: str | None = v["static_path"] or None
    if v["ui"] and static_path and not os.path.isdir(static_path):
        raise ConfigError(f"error: static assets path not found: {static_path}")
    ui_settings: Any = None
    if v["ui_config"]:
        try:
            ui_settings = json.loads(v["ui_config"])
        except ValueError as e:
            raise ConfigError(f"error: failed to parse UI config: {e}") from None

    server = ServerConfig(
        host=v["host"], port=v["port"], api_prefix=v["api_prefix"], api_keys=tuple(v["api_keys"]),
        cors_origins=cors_origins, cors_methods=v["cors_methods"], cors_headers=v["cors_headers"],
        cors_credentials=v["cors_credentials"], endpoint_slots=v["endpoint_slots"],
        endpoint_metrics=v["endpoint_metrics"], endpoint_props=v["endpoint_props"], timeout=v["timeout"],
        sse_ping_interval=v["sse_ping_interval"], threads_http=v["threads_http"], model_path=model_path,
        aliases=tuple(sorted(aliases)), tags=tuple(v["tags"]), verbosity=v["verbosity"],
        log_disable=v["log_disable"], log_file=v["log_file"] or None, special=v["special"],
        reverse_prompt=tuple(esc(s) for s in v["reverse_prompt"]), spm_infill=v["spm_infill"],
        embedding=embedding, pooling=pooling,
        embd_normalize=v["embd_normalize"],
        jinja=v["jinja"], chat_template=v["chat_template"] or None,
        chat_template_kwargs=MappingProxyType(kwargs), slot_save_path=v["slot_save_path"] or None,
        reasoning_format=v["reasoning_format"] if parsed.explicit("reasoning_format") else "deepseek",
        reasoning=v["reasoning"], skip_chat_parsing=v["skip_chat_parsing"],
        reasoning_budget=v["reasoning_budget"], reasoning_budget_message=v["reasoning_budget_message"] or "",
        ui=v["ui"], static_path=static_path, ui_settings=ui_settings,
        prefill_assistant=v["prefill_assistant"], reuse_port=v["reuse_port"],
        mcp_proxy=bool(v["ui_mcp_proxy"] or v["agent"]),
        tools=("all",) if v["agent"] else tuple(t for t in parse_csv_row(v["tools"] or "") if t),
        tools_runtime=v["tools_runtime"] or "",
        mcp_servers=mcp_servers,
        unsupported_features=MappingProxyType(_unsupported_features(parsed)),
        grammar_default=_grammar_default(v),
        models_dir=v["models_dir"] or None, models_preset=v["models_preset"] or None,
        models_max=v["models_max"], models_autoload=v["models_autoload"],
        ssl_key_file=ssl_key_file, ssl_cert_file=ssl_cert_file,
    )
    engine = EngineConfig(
        model_path=model_path, dtype=v["dtype"], device=v["device"], n_ctx=v["n_ctx"],
        n_ctx_explicit=parsed.explicit("n_ctx"), n_parallel=v["n_parallel"], kv_unified=v["kv_unified"],
        kv_unified_per_slot=v["kv_unified_per_slot"], n_batch=n_batch, n_ubatch=n_ubatch,
        cont_batching=v["cont_batching"], cache_prompt=v["cache_prompt"], cache_reuse=v["cache_reuse"],
        slot_prompt_similarity=v["slot_prompt_similarity"], cache_ram_mib=v["cache_ram_mib"],
        cache_idle_slots=cache_idle_slots, context_shift=v["context_shift"], swa_full=v["swa_full"],
        n_keep=v["n_keep"], n_predict=v["n_predict"], cache_type_k=kv_k,
        cache_type_v=kv_v, threads=_threads(parsed, "threads"),
        threads_batch=_threads(parsed, "threads_batch"), flash_attn=v["flash_attn"], warmup=v["warmup"],
        embedding=embedding, sleep_idle_seconds=v["sleep_idle_seconds"], rope=_rope_override(parsed),
    )
    sampling = SamplingDefaults(**{
        f.name: v[f.name] for f in fields(SamplingDefaults) if f.name != "dry_sequence_breakers"
    }, dry_sequence_breakers=tuple(esc(s) for s in v["dry_sequence_breakers"]))
    return Config(server, engine, sampling, tuple(parsed.warnings) + tuple(warnings))


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None, *,
                warn: Warn | None = None) -> Config:
    """Parse ``argv`` (without the program name) over ``environ`` into a ``Config``.

    Raises ``ConfigError`` for anything fatal (``__main__`` prints it and exits 1). For
    ``-h``/``--version`` it prints the text and raises ``SystemExit(0)``.
    """
    environ = os.environ if environ is None else environ
    emit = warn or (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        parsed = parse_args(argv, environ, warn=emit, config=config_file_values(config_files(environ), emit))
    except ExitRequest as req:
        stream = sys.stdout if req.stream == "stdout" else sys.stderr
        stream.write(req.text if req.text.endswith("\n") else req.text + "\n")
        stream.flush()
        raise SystemExit(req.code) from None
    return build_config(parsed, warn=emit)
