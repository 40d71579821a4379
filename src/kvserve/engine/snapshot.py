"""Immutable snapshots of the engine's state for the HTTP side (no JSON here).

The engine thread builds an ``EngineSnapshot`` after every step and publishes it by replacing
one reference; ``/health``, ``/metrics``, ``/slots`` and ``/props`` read the latest one without
waiting for the engine (a forward pass can take seconds). Nothing in a snapshot is shared with
the engine's live state. The server renders them in llama-server's shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import MappingProxyType
from collections.abc import Iterator, Sequence
from typing import Any, Mapping

from .sampling_params import SamplingParams


@dataclass(frozen=True)
class NextToken:
    """A slot's generation state after its last sampled token (``/slots`` ``next_token``)."""

    has_next_token: bool = False
    has_new_line: bool = False
    n_remain: int = -1  # tokens left before n_predict; -1 without a limit
    n_decoded: int = 0


IDLE = NextToken()


@dataclass(frozen=True)
class SlotView:
    """One slot. ``id_task`` is -1 until the slot ran a request; the counters below describe
    the running request, or the last one once it ended."""

    id: int
    n_ctx: int
    is_processing: bool
    id_task: int
    n_prompt_tokens: int  # tokens with KV: the running request's n_computed, else the last list
    n_prompt_tokens_processed: int  # prompt tokens run through the model
    n_prompt_tokens_cache: int  # prompt tokens reused from the cache at admission
    sampling: SamplingParams | None  # the request's sampler parameters (None: defaults)
    next_token: NextToken


class SlotViews(Sequence[SlotView]):
    """The slots of a snapshot: their values are copied when the snapshot is built (plain
    tuples, every step), the ``SlotView`` objects made when a reader first looks (rarely:
    ``/slots``, ``/props``, the sleeper), so a decode step of many slots builds no objects."""

    __slots__ = ("_rows", "_views")

    def __init__(self, rows: tuple[tuple[Any, ...], ...]) -> None:
        self._rows = rows
        self._views: tuple[SlotView, ...] | None = None

    def _all(self) -> tuple[SlotView, ...]:
        views = self._views
        if views is None:
            views = self._views = tuple(SlotView(*r) for r in self._rows)
        return views

    def __getitem__(self, i: Any) -> Any:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[SlotView]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return repr(self._all())


def slot_views(slots: Any, running: Any) -> SlotViews:
    """``slots``: the scheduler's ``Slot`` list; ``running``: request id -> ``Sequence``."""
    rows = []
    for s in slots:
        seq = running.get(s.seq_id) if s.seq_id is not None else None
        if seq is not None:
            n_tokens, n_processed = seq.n_computed, seq.n_evaluated_prompt
        else:
            n_tokens, n_processed = len(s.prompt_tokens), s.n_prompt_processed
        # SlotView's field order
        rows.append((s.id, s.n_ctx, s.seq_id is not None, s.id_task, n_tokens, n_processed, s.n_prompt_cache,
                     s.sampling, s.next_token))
    return SlotViews(tuple(rows))


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine at the end of one step.

    ``metrics``: llama-server metric names without the ``llamacpp:`` prefix (cumulative ones
    and gauges; the two throughput gauges are the scraper's, from ``rates``) and kvserve cache
    counters as ``kvserve:<name>`` or ``kvserve:<name>{label="value"}``.
    ``rates``: cumulative (prompt tokens, prompt s, decode steps, decode s) behind those gauges.
    ``cache``: the prompt cache's budget and state, for /props.
    """

    slots: Sequence[SlotView]
    metrics: Mapping[str, float]
    rates: tuple[int, float, int, float]
    cache: Mapping[str, Any]
    t_built: float


def build_snapshot(scheduler: Any, cache: Any, page_bytes: int) -> EngineSnapshot:
    """``scheduler``: the Scheduler; ``cache``: its KVCacheManager. Engine thread only."""
    st = scheduler.stats
    c = cache.stats()
    limit = cache.retain_limit_pages
    device_budget = -1 if limit is None else limit * page_bytes
    host = cache.host is not None
    host_budget = -1 if c.host_limit_pages < 0 else c.host_limit_pages * page_bytes
    budget = host_budget if host else device_budget  # what --cache-ram bounds
    m: dict[str, float] = st.counters()
    m.update({
        "requests_processing": sum(1 for s in scheduler.slots if s.busy),
        "requests_deferred": scheduler.n_deferred,
        "t_start": st.t_start,
        "kvserve:cache_lookups_total": c.lookups,
        "kvserve:cache_hits_total": c.hits,
        'kvserve:cache_tokens_reused_total{source="prefix"}': c.tokens_reused_prefix,
        'kvserve:cache_tokens_reused_total{source="shift"}': c.tokens_reused_shift,
        'kvserve:cache_tokens_reused_total{source="host"}': c.tokens_loaded,
        "kvserve:cache_evictions_total": c.evictions,
        "kvserve:cache_retained_bytes": c.retained_pages * page_bytes,
        "kvserve:cache_retained_tokens": c.retained_tokens,
        "kvserve:cache_budget_bytes": budget,
        'kvserve:cache_tier_bytes{tier="device"}': c.retained_pages * page_bytes,
        'kvserve:cache_tier_bytes{tier="host"}': c.host_pages * page_bytes,
        'kvserve:cache_tier_tokens{tier="device"}': c.retained_tokens,
        'kvserve:cache_tier_tokens{tier="host"}': c.host_tokens,
        'kvserve:cache_tier_budget_bytes{tier="device"}': device_budget,
        'kvserve:cache_tier_budget_bytes{tier="host"}': host_budget if host else 0,
        "kvserve:cache_host_offloads_total": c.offloaded_pages,
        "kvserve:cache_host_loads_total": c.loaded_pages,
        "kvserve:cache_host_evictions_total": c.host_evictions,
        "kvserve:kv_pages_free": c.free_pages,
        "kvserve:kv_pages_in_use": c.in_use_pages,
        "kvserve:kv_page_tokens": cache.page_size,
        "kvserve:kv_preemptions_total": st.preemptions,
        "kvserve:scheduler_seconds_total": st.scheduler_s,
        "kvserve:forward_seconds_total": st.forward_s,
        "kvserve:device_wait_seconds_total": st.device_wait_s,
        "kvserve:first_tokens_total": st.first_tokens,
    })
    for stage, secs in st.stage_s.items():
        m[f'kvserve:first_token_seconds_total{{stage="{stage}"}}'] = secs
    info = {
        "page_tokens": cache.page_size,
        "page_bytes": page_bytes,
        "pool_pages": cache.pool.n_pages,
        "cache_ram_budget_bytes": budget,
        "retained_bytes": c.retained_pages * page_bytes,
        "retained_tokens": c.retained_tokens,
        "in_use_pages": c.in_use_pages,
        "free_pages": c.free_pages,
        "tiers": {
            "device": {"budget_bytes": device_budget, "retained_bytes": c.retained_pages * page_bytes,
                       "retained_tokens": c.retained_tokens, "pages": cache.pool.n_pages},
            "host": None if not host else {
                "budget_bytes": host_budget, "bytes": c.host_pages * page_bytes, "tokens": c.host_tokens,
                "pages": c.host_pages, "allocated_pages": c.host_slots_touched,
                "offloaded_pages": c.offloaded_pages, "loaded_pages": c.loaded_pages,
                "loaded_tokens": c.tokens_loaded, "evicted_pages": c.host_evictions,
            },
        },
    }
    return EngineSnapshot(
        slots=slot_views(scheduler.slots, scheduler.running),
        metrics=MappingProxyType(m),
        rates=st.rates(),
        cache=MappingProxyType(info),
        t_built=time.time(),
    )
