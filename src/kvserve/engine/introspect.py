"""Read-only views of the engine for /metrics and /models (no tensors, no waiting)."""

from __future__ import annotations

from typing import Any

from ..model.loader import LoadedModel

FTYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
          11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
          17: "Q5_K_M", 18: "Q6_K", 32: "BF16"}


def model_info(loaded: LoadedModel, tokenizer: Any) -> dict[str, Any]:
    cfg = loaded.cfg
    return {
        "vocab_type": tokenizer.vocab_type,
        "n_vocab": cfg.n_vocab,
        "n_ctx_train": cfg.n_ctx_train,
        "n_embd": cfg.n_embd,
        "n_params": loaded.n_params,
        "size": loaded.file_size,
        "ftype": FTYPES.get(cfg.file_type, str(cfg.file_type)),
        "path": loaded.path,
    }


def metrics_snapshot(engine: Any) -> dict[str, float]:
    sch = engine.scheduler
    m: dict[str, float] = dict(sch.stats.snapshot(reset_buckets=True))
    m["requests_processing"] = sum(1 for s in sch.slots if s.busy)
    m["requests_deferred"] = sch.n_deferred
    m["t_start"] = sch.stats.t_start
    c = engine.cache.stats()
    page_tokens = engine.cache.page_size
    m.update(
        {
            "kvserve:cache_lookups_total": c.lookups,
            "kvserve:cache_hits_total": c.hits,
            'kvserve:cache_tokens_reused_total{source="prefix"}': c.tokens_reused_prefix,
            'kvserve:cache_tokens_reused_total{source="shift"}': c.tokens_reused_shift,
            'kvserve:cache_tokens_reused_total{source="host"}': 0,
            "kvserve:cache_evictions_total": c.evictions,
            "kvserve:cache_retained_bytes": c.retained_pages * engine.page_bytes,
            "kvserve:cache_retained_tokens": c.retained_tokens,
            "kvserve:cache_budget_bytes": (
                -1 if engine.cache.retain_limit_pages is None else engine.cache.retain_limit_pages * engine.page_bytes
            ),
            "kvserve:kv_pages_free": c.free_pages,
            "kvserve:kv_pages_in_use": c.in_use_pages,
            "kvserve:kv_page_tokens": page_tokens,
            "kvserve:scheduler_seconds_total": sch.stats.scheduler_s,
            "kvserve:forward_seconds_total": sch.stats.forward_s,
        }
    )
    return m
