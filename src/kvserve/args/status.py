"""Flag statuses, the one place to flip: ``REFUSED`` (whole flag) and ``REFUSED_VALUES``.

A flag listed in ``REFUSED`` is accepted only at its default value; an implemented flag with a
``REFUSED_VALUES`` rule refuses the values its rule names. Flipping a flag to implemented means
deleting its line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Reasons shared by several flags. Both tables are keyed by dest.
_DOWNLOAD = "kvserve never downloads models; pass a local GGUF with -m"
_MULTIMODAL = "multimodal input (projectors, media files) is not supported"
_CHECKPOINTS = (
    "the shared paged cache keeps full KV for SWA layers, so checkpoints are not needed; see compat.md"
)
_REASONING = "reasoning budgets (forcing the end of a thinking block) are not implemented"
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
    "reasoning_budget": _REASONING,
    "reasoning_budget_message": _REASONING,
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
    "flash_attn": "the attention backend is chosen by the device (torch SDPA on CPU)",
    "threads_batch": "one torch thread pool serves prompt and generation; use -t",
    "threads_http": "HTTP is served by one asyncio event loop, not a thread pool",
}

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
