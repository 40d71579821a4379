"""Paged KV bookkeeping: pool, prefix index, --cache-reuse planning. Pure Python, no tensors."""

from kvserve.cache.manager import KVCacheManager, SeqState
from kvserve.cache.page_pool import OutOfPages, PagePool
from kvserve.cache.prefix_index import Match, Node, PrefixIndex
from kvserve.cache.reuse import ReuseChunk, plan_chunk_reuse
from kvserve.cache.types import Admission, CacheStats, StopReason

__all__ = [
    "Admission",
    "CacheStats",
    "KVCacheManager",
    "Match",
    "Node",
    "OutOfPages",
    "PagePool",
    "PrefixIndex",
    "ReuseChunk",
    "SeqState",
    "StopReason",
    "plan_chunk_reuse",
]
