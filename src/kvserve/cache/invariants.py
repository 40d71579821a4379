"""``check_integrity``: the cache's invariants as code, cheap enough to run after every test step.

Raises AssertionError on the first violation. Checked:
  * every page is exactly one of free / in use (held by a sequence) / retained (index only),
    and free + in use + retained == n_pages; no page both free and referenced;
  * every ref count equals its number of holders (page-table entries, pins, index nodes);
  * the pool's retained counters match a recount; retained <= retain_limit_pages;
  * tree shape: nodes hold 1..page_size tokens, partial nodes are leaves, every node is
    filed under its own tokens in its parent, depths are consecutive;
  * a sequence's published path is a chain from the root and path[i].page == pages[i];
  * closure: a node held by a sequence has a parent held by a sequence (so every retained
    page can be evicted leaf by leaf, and the budget can always be met);
  * host tier: each host node sits in its own slot (page -1), free + used slots == slots
    handed out, within the budget; device nodes have device parents (or the root); no host
    node is left pinned between calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from typing import Protocol

from kvserve.cache.page_pool import PagePool
from kvserve.cache.prefix_index import Node, PrefixIndex


class SeqPages(Protocol):
    """What a sequence holds: its namespace, page table, published path and move pins."""

    ns: Hashable
    pages: list[int]
    path: list[Node]
    pins: list[int]


class CacheParts(Protocol):
    """The state ``check_integrity`` reads (``KVCacheManager`` has it)."""

    pool: PagePool
    index: PrefixIndex
    page_size: int
    seqs: Mapping[int, SeqPages]
    retain_limit_pages: int | None


def check_integrity(mgr: CacheParts) -> None:
    pool, index, ps = mgr.pool, mgr.index, mgr.page_size
    free = pool.free_pages()
    assert len(set(free)) == len(free), "duplicate page on the free list"
    free_set = set(free)

    seq_holds: Counter[int] = Counter()
    for sid, seq in mgr.seqs.items():
        assert len(set(seq.pages)) == len(seq.pages), f"seq {sid}: page twice in its table"
        seq_holds.update(seq.pages)
        seq_holds.update(seq.pins)
        assert len(seq.path) <= len(seq.pages), f"seq {sid}: path longer than page table"
        parent = None
        for i, node in enumerate(seq.path):
            assert node.alive, f"seq {sid}: dead node on its path"
            assert node.page == seq.pages[i], f"seq {sid}: path[{i}] is not page_table[{i}]"
            assert node.depth == i and len(node.tokens) == ps, f"seq {sid}: bad path node {i}"
            assert node.parent is (parent if parent is not None else index.root(seq.ns, False))
            parent = node

    nodes = list(index.iter_nodes())
    node_pages = Counter(n.page for n in nodes)
    assert all(c == 1 for c in node_pages.values()), "page held by two index nodes"
    n_retained = n_retained_tokens = 0
    for node in nodes:
        p = node.page
        assert node.alive and index.node_of_page(p) is node
        assert 0 < len(node.tokens) <= ps, f"node on page {p}: {len(node.tokens)} tokens"
        assert pool.is_indexed(p), f"node page {p} not marked indexed"
        parent = node.parent
        assert parent is not None and parent.children.get(node.tokens) is node, "node not under its key"
        assert node in parent.by_first[node.tokens[0]], "node missing from by_first"
        assert node.depth == parent.depth + 1
        if parent.parent is not None:
            assert len(parent.tokens) == ps, "child under a partial node"
            if seq_holds[p]:
                assert seq_holds[parent.page], f"closure: page {p} held, its parent is not"
        if len(node.tokens) < ps:
            assert not node.children, "partial node with children"
        if not seq_holds[p]:
            n_retained += 1
            n_retained_tokens += len(node.tokens)

    in_use = 0
    for p in range(pool.n_pages):
        holders = seq_holds[p] + node_pages[p]
        assert pool.ref(p) == holders, f"page {p}: ref {pool.ref(p)} != {holders} holders"
        if p in free_set:
            assert holders == 0, f"page {p} free and referenced"
        else:
            assert holders > 0, f"page {p} leaked (not free, no holder)"
            if not node_pages[p]:
                assert not pool.is_indexed(p), f"page {p} marked indexed without a node"
        in_use += seq_holds[p] > 0
    assert len(free) + in_use + n_retained == pool.n_pages, "free + in use + retained != total"
    assert pool.n_retained == n_retained, f"retained counter {pool.n_retained} != {n_retained}"
    assert pool.n_retained_tokens == n_retained_tokens, "retained token counter drifted"
    limit = mgr.retain_limit_pages
    assert limit is None or n_retained <= limit, f"retained {n_retained} > budget {limit}"
    _check_host_tier(index, nodes)


def _check_host_tier(index: PrefixIndex, device_nodes: list[Node]) -> None:
    host_nodes = list(index.iter_host_nodes())
    for node in device_nodes:
        assert node.host == -1, f"{node}: on the device and on the host"
        parent = node.parent
        assert parent is not None and (parent.parent is None or parent.page >= 0), \
            f"{node}: device node under a host node"
    tier = index.host
    if tier is None:
        assert not host_nodes, "host nodes without a host tier"
        return
    slots = [n.host for n in host_nodes]
    assert len(set(slots)) == len(slots), "host slot held by two nodes"
    free = tier.free_slots()
    assert len(set(free)) == len(free) and not set(free) & set(slots), "host slot both free and used"
    assert len(free) + len(slots) == tier.n_slots_touched, "host slots leaked"
    assert tier.n_used == len(slots), f"host tier counts {tier.n_used} used, {len(slots)} nodes"
    assert tier.capacity is None or len(slots) <= tier.capacity, "host tier over its budget"
    for node in host_nodes:
        assert node.alive and node.page == -1 and index.node_of_host(node.host) is node
        assert 0 < len(node.tokens) <= index.page_size
        parent = node.parent
        assert parent is not None and parent.children.get(node.tokens) is node, "host node not under its key"
        assert node.depth == parent.depth + 1
    assert not index.pinned, f"host nodes left pinned: {sorted(index.pinned)}"
    assert index.n_host_tokens == sum(len(n.tokens) for n in host_nodes), "host token counter drifted"
