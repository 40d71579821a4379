"""Results the cache hands back: what a lookup found, what a sequence was admitted with, counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvserve.plan import KVMove

# Why a prefix lookup stopped (observability; also feeds the per-request log line).
#   disabled       no lookup was made (use_cache false, or retain_limit_pages == 0)
#   miss           nothing matched: hit length 0
#   diverged       the cache continues along the prompt's path, but with other tokens
#   end_of_cache   the prompt continues, the cache has nothing beyond the hit
#   end_of_prompt  every prompt token matched (the caller still evaluates the last one)
StopReason = Literal["disabled", "miss", "diverged", "end_of_cache", "end_of_prompt"]


@dataclass(frozen=True)
class Admission:
    """What ``KVCacheManager.begin`` set up for a new sequence.

    Positions ``[0, n_cached)`` hold valid KV once ``moves`` have run (in list order, before
    the first forward of this sequence); ``page_table`` covers those positions
    (``ceil(n_cached / page_size)`` pages), or ``[0, n_reserve)`` when that is more. The caller evaluates tokens from ``n_cached`` on.

        [0, n_reused_prefix)           prefix match: shared index pages + one copied page
        [n_reused_prefix, n_cached)    --cache-reuse chunks moved into place (delta <= 0)

    ``n_hit`` is the raw matched prefix before the "evaluate at least one token" rule;
    ``n_cached = n_reused_prefix + n_reused_shift <= max(0, len(tokens) - 1)``.
    """

    seq_id: int
    n_cached: int
    page_table: tuple[int, ...]
    moves: tuple[KVMove, ...]
    stop_reason: StopReason
    n_hit: int
    n_reused_prefix: int
    n_reused_shift: int


@dataclass(frozen=True)
class CacheStats:
    """Cumulative counters (since construction) plus current gauges, for /metrics and logs."""

    lookups: int  # begin() calls that looked up the index
    hits: int  # of those, the ones with n_cached > 0
    tokens_reused_prefix: int
    tokens_reused_shift: int
    tokens_looked_up: int  # sum of len(tokens) over lookups (hit-rate denominator)
    cow_copies: int  # pages copied because a shared page had to be extended
    pages_donated: int  # pages that became index nodes (publish + finish)
    evictions: int  # retained pages evicted (LRU)
    retained_pages: int  # gauge: pages held only by the index
    retained_tokens: int  # gauge: tokens those pages cover
    free_pages: int  # gauge
    in_use_pages: int  # gauge: pages held by at least one sequence
    index_nodes: int  # gauge: pages findable by lookups (retained + shared with sequences)
    # host tier (all 0 without one)
    host_pages: int = 0  # gauge: pages resident in host slots (findable by lookups)
    host_tokens: int = 0  # gauge: tokens those pages cover
    host_limit_pages: int = 0  # host slots the budget allows (-1: unbounded)
    offloaded_pages: int = 0  # device pages moved to the host on eviction
    loaded_pages: int = 0  # host pages brought back on a prefix hit
    tokens_loaded: int = 0  # tokens those pages cover
    host_evictions: int = 0  # host pages dropped (LRU) to stay within the budget
    host_slots_touched: int = 0  # gauge: slots ever used (host memory the runner allocated)
