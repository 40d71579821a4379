"""What a new sequence can take from the index: prefix match, then --cache-reuse chunks.

Pure planning over the index (the lookup touches LRU stamps, nothing else changes); the
manager takes the references, allocates the private pages and turns the plan into moves.

    positions of the new sequence
    [0, n_full * ps)              shared: the matched index pages themselves
    [n_full * ps, n_prefix)       copied (delta 0) from the partially matched node
    [n_prefix, n_cached)          reuse chunks moved from later cache positions (delta < 0)
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvserve.cache.moves import move
from kvserve.cache.prefix_index import Match, Node, PrefixIndex
from kvserve.cache.reuse import ReuseChunk, plan_chunk_reuse, trim_to
from kvserve.plan import KVMove


@dataclass(frozen=True)
class AdmissionPlan:
    match: Match
    n_prefix: int  # matched prefix after the "evaluate at least one token" rule
    chunks: list[ReuseChunk]
    # The cache path the moves read: cache_nodes[i] holds cache positions [i * ps, ...).
    # It equals match.nodes up to the matched page and then follows the most recent branch.
    cache_nodes: list[Node]
    page_size: int

    @property
    def n_shift(self) -> int:
        return sum(c.n for c in self.chunks)

    @property
    def n_cached(self) -> int:
        return self.n_prefix + self.n_shift

    @property
    def n_full(self) -> int:
        """Pages shared as they are: [0, n_full)."""
        return self.n_prefix // self.page_size

    @property
    def n_private(self) -> int:
        """Pages the sequence needs for itself to hold [n_full * ps, n_cached)."""
        return -(-self.n_cached // self.page_size) - self.n_full

    def shared_nodes(self) -> list[Node]:
        return list(self.match.nodes[: self.n_full])

    def source_nodes(self) -> list[Node]:
        """Cache nodes the moves read, contiguous from page ``n_full``: every one's parent is
        either another source node or a shared node, so pinning them keeps closure."""
        ps = self.page_size
        if self.chunks:
            last = (max(c.src + c.n for c in self.chunks) - 1) // ps
        else:
            last = self.n_full if self.n_prefix % ps else self.n_full - 1
        return self.cache_nodes[self.n_full : last + 1]

    def moves(self, pages: Sequence[int]) -> list[KVMove]:
        """Copy of the partial page, then the chunks, into the page table ``pages``."""
        ps = self.page_size
        r = self.n_prefix % ps
        if not r and not self.chunks:
            return []
        src = [n.page for n in self.cache_nodes]
        out: list[KVMove] = []
        if r:
            out.append(move(src, self.n_full * ps, pages, self.n_full * ps, r, ps))
        out += [move(src, c.src, pages, c.dst, c.n, ps) for c in self.chunks]
        return out


def plan_admission(
    index: PrefixIndex, ns: Hashable, tokens: Sequence[int], n_cache_reuse: int, key: bytes | None = None
) -> AdmissionPlan:
    """Requires ``len(tokens) >= 1``. ``key``: see ``PrefixIndex.lookup``."""
    ps = index.page_size
    m = index.lookup(ns, tokens, touch=True, key=key)
    cache_nodes = list(m.nodes)
    chunks: list[ReuseChunk] = []
    if n_cache_reuse > 0 and m.n_hit < len(tokens):
        cache_nodes = cache_nodes[: m.n_hit // ps] + index.continuation(ns, m)
        cache_tokens = [t for n in cache_nodes for t in n.tokens]
        chunks = plan_chunk_reuse(cache_tokens, tokens, m.n_hit, n_cache_reuse)
    n_prefix, chunks = trim_to(chunks, m.n_hit, len(tokens) - 1)  # evaluate >= 1 token
    return AdmissionPlan(m, n_prefix, chunks, cache_nodes, ps)
