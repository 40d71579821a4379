"""``GET /metrics``: Prometheus text in llama-server's names, order and HELP strings, then
kvserve's own cache metrics.

The engine's ``metrics_snapshot()`` gives llama-server names without the ``llamacpp:`` prefix
(missing ones read 0) and kvserve metrics as ``kvserve:<name>`` or
``kvserve:<name>{label="value"}``. Labels must come from small fixed sets (a stop reason, a
tier) -- never a request id, a tenant or text -- so the series count stays bounded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4"

# (name, type, help) in llama-server's order (server_task_result_metrics::to_metrics).
LLAMA_METRICS: tuple[tuple[str, str, str], ...] = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("n_decode_total", "counter",
     "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "counter",
     "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)

# Known kvserve metrics; others still render, typed by their suffix.
KVSERVE_HELP: dict[str, str] = {
    "cache_lookups_total": "Prefix-cache lookups (one per admitted prompt)",
    "cache_hits_total": "Prefix-cache lookups that reused at least one token",
    "cache_tokens_reused_total": "Prompt tokens reused, by source (prefix match, KV shift, host RAM)",
    "cache_evictions_total": "KV pages evicted from the prefix cache",
    "cache_retained_bytes": "Bytes of KV kept by the prefix cache for reuse",
    "cache_retained_tokens": "Tokens of KV kept by the prefix cache for reuse",
    "cache_budget_bytes": "Byte budget of the prefix cache (--cache-ram; -1 = unlimited)",
    "cache_tier_bytes": "Bytes of reusable KV kept per tier (device pool, host RAM)",
    "cache_tier_tokens": "Tokens of reusable KV kept per tier (device pool, host RAM)",
    "cache_tier_budget_bytes": "Byte budget per tier (-1 = bounded only by the pool or unlimited; 0 = no such tier)",
    "cache_host_offloads_total": "KV pages moved from the device pool to host RAM on eviction",
    "cache_host_loads_total": "KV pages brought back from host RAM on a prefix hit",
    "cache_host_evictions_total": "KV pages dropped from host RAM to stay within --cache-ram",
    "kv_pages_free": "Free KV pages",
    "kv_pages_in_use": "KV pages held by running sequences",
    "kv_page_tokens": "Tokens per KV page",
    "kv_preemptions_total": "Sequences whose KV pages were taken back when the pool ran out (recomputed)",
    "scheduler_seconds_total": "Engine thread time outside runner.run (scheduling, commit, sampling glue)",
    "forward_seconds_total": "Engine thread time in runner.run (on CUDA: until the step is queued)",
    "device_wait_seconds_total": "Of scheduler_seconds_total: waiting for the device's sampled tokens",
    "first_tokens_total": "Requests that got their first token (those first_token_seconds_total sums over)",
    "first_token_seconds_total": "Time to a request's first token by stage: intake (validation and tokenization, "
                                 "up to the engine's queue), queue (until admitted to a slot), prefill (until the "
                                 "first token is sampled)",
}

_SERIES = re.compile(r"^kvserve:([a-zA-Z_][a-zA-Z0-9_]*)(\{.*\})?$")


def _num(v: Any) -> str:
    f = float(v)
    if not math.isfinite(f):
        return "0"
    return str(int(f)) if f.is_integer() and abs(f) < 2**53 else repr(f)


def render(snapshot: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for name, typ, help_ in LLAMA_METRICS:
        full = "llamacpp:" + name
        lines += [f"# HELP {full} {help_}", f"# TYPE {full} {typ}", f"{full} {_num(snapshot.get(name, 0))}"]
    per_pos = sorted((k, v) for k, v in snapshot.items()
                     if k.startswith("spec_decode_num_accepted_tokens_per_pos_total{"))
    if per_pos:
        full = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {full} Speculative: accepted draft tokens per draft position",
                  f"# TYPE {full} counter"]
        lines += [f"llamacpp:{k} {_num(v)}" for k, v in per_pos]

    groups: dict[str, list[tuple[str, Any]]] = {}
    for key, v in snapshot.items():
        m = _SERIES.match(key)
        if m:
            groups.setdefault(m.group(1), []).append((m.group(2) or "", v))
    for name in sorted(groups):
        full = "kvserve:" + name
        typ = "counter" if name.endswith("_total") else "gauge"
        lines += [f"# HELP {full} {KVSERVE_HELP.get(name, 'kvserve ' + name.replace('_', ' '))}",
                  f"# TYPE {full} {typ}"]
        lines += [f"{full}{labels} {_num(v)}" for labels, v in sorted(groups[name], key=lambda x: x[0])]
    return "\n".join(lines) + "\n"
