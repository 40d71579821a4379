"""The slice of ``kvserve.config.ServerConfig`` the HTTP layer reads, behind one adapter.

Every config name the server uses appears once below (``_pick`` lists the accepted
spellings, dotted paths look into nested config objects), so a rename in ``config.py`` is a
one-line fix here. Missing values fall back to llama-server's defaults.
"""

from __future__ import annotations

import logging
import os
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

import kvserve
from kvserve.grammar.spec import GrammarSpec
from kvserve.mcp.config import McpServerConfig
from kvserve.server.vertex import VertexSettings, from_env

# Request-field name -> llama-server default (common_params_sampling and task params).
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8,
    "dynatemp_range": 0.0,
    "dynatemp_exponent": 1.0,
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "top_n_sigma": -1.0,
    "typical_p": 1.0,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "repeat_last_n": 64,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "dry_base": 1.75,
    "dry_allowed_length": 2,
    "dry_penalty_last_n": 64,
    "dry_sequence_breakers": ["\n", ":", '"', "*"],
    "mirostat": 0,
    "mirostat_tau": 5.0,
    "mirostat_eta": 0.1,
    "adaptive_target": -1.0,
    "adaptive_decay": 0.9,
    "seed": 0xFFFFFFFF,
    "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
    "ignore_eos": False,
    "n_probs": 0,
    "min_keep": 0,
    "logit_bias": [],
    "backend_sampling": False,
}

_MISSING = object()
log = logging.getLogger("kvserve.server")


def _lookup(cfg: Any, name: str) -> Any:
    obj = cfg
    for part in name.split("."):
        if obj is None:
            return _MISSING
        if isinstance(obj, dict):
            obj = obj.get(part, _MISSING)
        else:
            obj = getattr(obj, part, _MISSING)
        if obj is _MISSING:
            return _MISSING
    return obj


def _pick(cfg: Any, default: Any, *names: str) -> Any:
    """The first of ``names`` found on ``cfg.server``, ``cfg.engine`` or ``cfg`` itself
    (``kvserve.config.Config`` or one of its parts)."""
    roots = [r for r in (getattr(cfg, "server", None), getattr(cfg, "engine", None), cfg) if r is not None]
    for n in names:
        for root in roots:
            v = _lookup(root, n)
            if v is not _MISSING and v is not None:
                return v
    return default


def _csv(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(s.strip() for s in v.split(",") if s.strip())
    return tuple(str(s) for s in v)


def _media_marker() -> str:
    env = os.environ.get("LLAMA_MEDIA_MARKER")
    if env:
        return env
    alphabet = string.ascii_letters + string.digits
    return "<__media_" + "".join(secrets.choice(alphabet) for _ in range(32)) + "__>"


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_prefix: str = ""
    api_keys: tuple[str, ...] = ()
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    endpoint_slots: bool = True
    endpoint_metrics: bool = False
    endpoint_props: bool = False
    ui: bool = True
    static_path: str = ""
    ui_settings: Any = field(default_factory=dict)  # --ui-config JSON, shown in /props
    slot_save_path: str = ""
    timeout: int = 3600
    sse_ping_interval: int = 30
    verbosity: int = 3
    model_name: str = "model"
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    model_path: str = ""
    special: bool = False
    reverse_prompt: tuple[str, ...] = ()
    embedding: bool = False
    reranking: bool = False
    pooling: str = "mean"
    embd_normalize: int = 2
    n_predict: int = -1
    n_keep: int = 0
    cache_prompt: bool = True
    cache_reuse: int = 0
    n_batch: int = 2048
    n_parallel: int = 1
    spm_infill: bool = False
    prefill_assistant: bool = True
    reasoning_format: str = "deepseek"
    reasoning: str = "auto"  # -rea: on | off | auto
    reasoning_budget: int = -1  # --reasoning-budget: tokens inside a thinking block (-1 = unlimited)
    reasoning_budget_message: str = ""  # --reasoning-budget-message
    skip_chat_parsing: bool = False
    jinja: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    sampling_defaults: dict[str, Any] = field(default_factory=lambda: dict(SAMPLING_DEFAULTS))
    build_info: str = "b1-kvserve-" + kvserve.__version__
    media_marker: str = field(default_factory=_media_marker)
    slots_debug: bool = False
    reuse_port: bool = False
    ssl_key_file: str = ""  # with ssl_cert_file: HTTPS (both checked by config.py at start-up)
    ssl_cert_file: str = ""
    mcp_proxy: bool = False  # --ui-mcp-proxy / -ag: /cors-proxy forwards (server/cors_proxy.py)
    tools: tuple[str, ...] = ()  # --tools names ("all"; -ag): built-in agent tools (server/agent_tools/)
    tools_runtime: str = ""  # --tools-runtime spec: the isolate the tools run in
    mcp_servers: tuple[McpServerConfig, ...] = ()  # --mcp-servers-*: their tools are served by /tools
    unsupported_features: dict[str, str] = field(default_factory=dict)
    grammar: GrammarSpec | None = None  # --grammar/--grammar-file/-j/-jf: every request's default
    vertex: VertexSettings | None = None  # AIP_MODE=PREDICTION: the Vertex AI predict route (server/vertex.py)

    @property
    def tls(self) -> dict[str, str]:
        """uvicorn's TLS arguments: both files, or none (plain HTTP)."""
        if self.ssl_key_file and self.ssl_cert_file:
            return {"ssl_keyfile": self.ssl_key_file, "ssl_certfile": self.ssl_cert_file}
        return {}

    @property
    def model_id(self) -> str:
        """The API model id: the first alias in sorted order (llama-server's std::set)."""
        return self.aliases[0] if self.aliases else self.model_name

    @staticmethod
    def from_config(cfg: Any, n_slots: int | None = None) -> ServerSettings:
        """``cfg``: ``kvserve.config.Config`` (server/engine/sampling parts), a ``ServerConfig``,
        or any object/dict with these names."""
        d = ServerSettings()
        sampling = dict(SAMPLING_DEFAULTS)
        raw = _pick(cfg, None, "sampling_defaults", "sampling")
        if isinstance(raw, dict):
            sampling.update({k: v for k, v in raw.items() if v is not None})
        elif raw is not None:
            for k in SAMPLING_DEFAULTS:
                v = getattr(raw, k, None)
                if v is not None:
                    sampling[k] = v
        model_name = str(_pick(cfg, d.model_name, "model_name", "alias", "model_alias", "model"))
        embedding = bool(_pick(cfg, False, "embedding", "embeddings"))
        pooling = str(_pick(cfg, d.pooling, "pooling", "pooling_type"))
        aliases = tuple(sorted(set(_csv(_pick(cfg, (), "aliases"))))) or (model_name,)
        kwargs = _pick(cfg, {}, "chat_template_kwargs")
        if isinstance(kwargs, str):
            import json

            kwargs = json.loads(kwargs) if kwargs.strip() else {}
        port = int(_pick(cfg, d.port, "port"))
        vertex = from_env()
        if vertex is not None and vertex.http_port != port:
            log.warning("Vertex AI (AIP_MODE=PREDICTION): overriding server port %d with AIP_HTTP_PORT %d",
                        port, vertex.http_port)
            port = vertex.http_port
        return ServerSettings(
            host=str(_pick(cfg, d.host, "host")),
            port=port,
            api_prefix=str(_pick(cfg, d.api_prefix, "api_prefix")).rstrip("/"),
            api_keys=_csv(_pick(cfg, (), "api_keys", "api_key")),
            cors_origins=str(_pick(cfg, d.cors_origins, "cors_origins")),
            cors_methods=str(_pick(cfg, d.cors_methods, "cors_methods")),
            cors_headers=str(_pick(cfg, d.cors_headers, "cors_headers")),
            cors_credentials=bool(_pick(cfg, d.cors_credentials, "cors_credentials")),
            endpoint_slots=bool(_pick(cfg, d.endpoint_slots, "endpoint_slots", "slots")),
            endpoint_metrics=bool(_pick(cfg, d.endpoint_metrics, "endpoint_metrics", "metrics")),
            endpoint_props=bool(_pick(cfg, d.endpoint_props, "endpoint_props", "props")),
            ui=bool(_pick(cfg, d.ui, "ui")),
            static_path=str(_pick(cfg, "", "static_path") or ""),
            ui_settings=_pick(cfg, {}, "ui_settings"),
            slot_save_path=str(_pick(cfg, "", "slot_save_path") or ""),
            timeout=int(_pick(cfg, d.timeout, "timeout")),
            sse_ping_interval=int(_pick(cfg, d.sse_ping_interval, "sse_ping_interval")),
            verbosity=int(_pick(cfg, d.verbosity, "verbosity", "log_verbosity")),
            model_name=aliases[0],
            aliases=aliases,
            tags=_csv(_pick(cfg, (), "tags")),
            model_path=str(_pick(cfg, model_name, "model_path", "model")),
            special=bool(_pick(cfg, False, "special")),
            reverse_prompt=_csv_list(_pick(cfg, (), "reverse_prompt", "antiprompt")),
            embedding=embedding,
            reranking=bool(_pick(cfg, embedding and pooling == "rank", "reranking")),
            pooling=pooling,
            embd_normalize=int(_pick(cfg, d.embd_normalize, "embd_normalize")),
            n_predict=int(_pick(cfg, d.n_predict, "n_predict")),
            n_keep=int(_pick(cfg, d.n_keep, "n_keep", "keep")),
            cache_prompt=bool(_pick(cfg, d.cache_prompt, "cache_prompt")),
            cache_reuse=int(_pick(cfg, d.cache_reuse, "cache_reuse", "n_cache_reuse")),
            n_batch=int(_pick(cfg, d.n_batch, "n_batch", "batch_size")),
            n_parallel=int(n_slots if n_slots is not None else _pick(cfg, d.n_parallel, "n_parallel")),
            spm_infill=bool(_pick(cfg, False, "spm_infill")),
            prefill_assistant=bool(_pick(cfg, True, "prefill_assistant")),
            reasoning_format=str(_pick(cfg, d.reasoning_format, "reasoning_format")),
            reasoning=str(_pick(cfg, d.reasoning, "reasoning")),
            reasoning_budget=int(_pick(cfg, d.reasoning_budget, "reasoning_budget")),
            reasoning_budget_message=str(_pick(cfg, "", "reasoning_budget_message") or ""),
            skip_chat_parsing=bool(_pick(cfg, False, "skip_chat_parsing")),
            jinja=bool(_pick(cfg, True, "jinja")),
            chat_template_kwargs=dict(kwargs),
            sampling_defaults=sampling,
            build_info=str(_pick(cfg, d.build_info, "build_info")),
            reuse_port=bool(_pick(cfg, False, "reuse_port")),
            ssl_key_file=str(_pick(cfg, "", "ssl_key_file") or ""),
            ssl_cert_file=str(_pick(cfg, "", "ssl_cert_file") or ""),
            mcp_proxy=bool(_pick(cfg, False, "mcp_proxy")),
            tools=_csv(_pick(cfg, (), "tools")),
            tools_runtime=str(_pick(cfg, "", "tools_runtime") or ""),
            mcp_servers=tuple(_pick(cfg, (), "mcp_servers")),
            unsupported_features=dict(_pick(cfg, {}, "unsupported_features")),
            slots_debug=os.environ.get("LLAMA_SERVER_SLOTS_DEBUG", "0") not in ("", "0"),
            grammar=_pick(cfg, None, "grammar_default", "sampling.grammar_default"),
            vertex=vertex,
        )


def _csv_list(v: Any) -> tuple[str, ...]:
    """Reverse prompts are not CSV (a prompt may contain commas): a list or one string."""
    if isinstance(v, str):
        return (v,) if v else ()
    return tuple(str(s) for s in v if s)
