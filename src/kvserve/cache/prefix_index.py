"""Radix tree over token pages, one tree per namespace (cache identity key).

A node is one KV page (``radix_node``) at a fixed depth: its tokens sit at positions
``[depth * page_size, ...)`` of every sequence following the path to it. Nodes are either
*full* (``page_size`` tokens) or *partial* (``1 .. page_size - 1`` tokens); a partial node
is always a leaf.

Rules kept here:
  * Lookups never remove anything; with ``touch`` they refresh LRU stamps along the hit.
  * Siblings never repeat a key: inserting a page whose tokens already exist under the same
    parent adds nothing (the caller keeps, or drops, its own reference).
  * A partial node that is a prefix of a sibling's tokens is redundant: it is not added, and
    adding a longer sibling removes the shorter partial ones it covers.
  * Only leaves whose page is held by nobody but the index ("retained") are evicted, least
    recently used first.

The index owns one page reference per device-resident node (``PagePool.index_hold`` /
``index_release``).

Host tier (optional, ``HostTier``): evicting a device page then moves it to a host slot
(``TierCopy`` device → host, queued in ``copies``) and the node stays in the tree, so a
lookup still finds it; only when no slot can be had is the node dropped. Rules added:
  * the device-resident nodes form the top of each tree: a device node's parent is a device
    node (or the root), so a host node's children are host nodes. Device eviction therefore
    takes retained nodes without device children; host eviction takes host leaves, least
    recently used first, and removes them from the index (``on_evict``);
  * ``promote`` brings a host node back into a device page the caller allocated (``TierCopy``
    host → device), root to leaf along a lookup's path; an admission ``pin_host``s the host
    nodes it is about to load so that its own allocations cannot evict them;
  * a full page inserted where a host node holds the same tokens takes that node's place on
    the device (its host slot is freed; no copy: the caller's page holds the same KV).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence

from kvserve.cache.host_tier import HostTier
from kvserve.cache.page_pool import PagePool
from kvserve.cache.radix_node import Inserted, Match, Node, Tokens, lcp
from kvserve.cache.types import StopReason
from kvserve.plan import TierCopy

__all__ = ["EvictHook", "Inserted", "Match", "Node", "PrefixIndex", "lcp"]

EvictHook = Callable[[Hashable, Tokens], None]


class PrefixIndex:
    def __init__(self, pool: PagePool, host: HostTier | None = None) -> None:
        self.pool = pool
        self.host = host
        self._node_of_host: dict[int, Node] = {}
        self._host_heap: list[tuple[int, int, Node]] = []  # lazy LRU heap of host leaves
        self._pinned: set[int] = set()  # uids of host nodes an admission is loading
        self.copies: list[TierCopy] = []  # issued, not yet handed to the runner
        self.n_offloaded = 0  # device pages moved to the host
        self.n_loaded = 0  # host pages brought back
        self.n_tokens_loaded = 0
        self.n_host_evicted = 0  # host pages dropped from the index
        self._host_tokens = 0  # tokens the host nodes cover
        self.page_size = pool.page_size
        self._roots: dict[Hashable, Node] = {}
        self._node_of_page: dict[int, Node] = {}
        self._clock = 0
        self._uids = itertools.count(1)
        self._heap: list[tuple[int, int, Node]] = []  # lazy LRU heap of eviction candidates
        self.n_evicted = 0
        self.on_evict: EvictHook | None = None  # (namespace, node key) after each eviction
        self._n_dropped = 0  # nodes removed so far (a remembered walk is valid while it holds)
        # the last keyed lookup's walk: (namespace, _n_dropped then, its key, positions the
        # full-page nodes cover, those nodes)
        self._walk: tuple[Hashable, int, bytes, int, list[Node]] = ((), -1, b"", 0, [])

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        """Device-resident nodes."""
        return len(self._node_of_page)

    @property
    def n_host_nodes(self) -> int:
        return len(self._node_of_host)

    @property
    def n_host_tokens(self) -> int:
        return self._host_tokens

    def node_of_page(self, page: int) -> Node | None:
        return self._node_of_page.get(page)

    def node_of_host(self, slot: int) -> Node | None:
        return self._node_of_host.get(slot)

    def iter_nodes(self) -> Iterator[Node]:
        """Device-resident nodes."""
        return iter(list(self._node_of_page.values()))

    def iter_host_nodes(self) -> Iterator[Node]:
        return iter(list(self._node_of_host.values()))

    @property
    def pinned(self) -> frozenset[int]:
        return frozenset(self._pinned)

    def root(self, ns: Hashable, create: bool = True) -> Node | None:
        r = self._roots.get(ns)
        if r is None and create:
            r = Node((), -1, None, ns, 0)
            self._roots[ns] = r
        return r

    def lookup(
        self, ns: Hashable, tokens: Sequence[int], touch: bool = True, key: bytes | None = None
    ) -> Match:
        """Longest cached prefix of ``tokens`` (token granular). Never removes entries.

        ``key``: ``tokens`` as 4-byte integers (``engine.slots.token_bytes``) when the caller
        has them: the walk then starts from the pages it shares with the last keyed lookup's
        walk (found with one byte comparison; a burst over one document walks the same ~125
        nodes per prompt, and comparing distinct int objects costs about what the walk does)."""
        ps = self.page_size
        node = self._roots.get(ns)
        if node is None or not tokens:
            return Match(0, (), "miss")
        path, pos = self._remembered(ns, key) if key is not None else ([], 0)
        if path:
            node = path[-1]
        n_tok = len(tokens)
        while n_tok - pos >= ps:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            path.append(child)
            node = child
            pos += ps
        if key is not None:
            self._walk = (ns, self._n_dropped, key, pos, path[:])
        reason: StopReason
        if pos == n_tok:
            reason = "end_of_prompt"
        else:
            best, k = self._best_partial(node, tokens[pos : pos + ps])
            if best is None:
                reason = "diverged" if node.children else "end_of_cache"
            else:
                path.append(best)
                pos += k
                if pos == n_tok:
                    reason = "end_of_prompt"
                elif k == len(best.tokens):
                    reason = "end_of_cache"
                else:
                    reason = "diverged"
        if pos == 0:
            reason = "miss"
        if touch and path:
            self._touch_path(path)
        return Match(pos, tuple(path), reason)

    def _remembered(self, ns: Hashable, key: bytes) -> tuple[list[Node], int]:
        """The full-page nodes of the last keyed walk that ``key``'s tokens share with it, and
        the positions they cover. They are what a walk from the root finds: the namespace is
        the same, the tokens agree page by page, and nothing has been removed since (removal
        is the only change that can make a key's child another node or none)."""
        ns_w, n_dropped, seen, n_seen, nodes = self._walk
        if ns_w != ns or n_dropped != self._n_dropped or not nodes:
            return [], 0
        ps = self.page_size
        k = min(n_seen, len(key) // 4) // ps  # pages both cover
        step = 4 * ps
        if key[: k * step] != seen[: k * step]:  # the pages in common: a binary search
            lo, hi = 0, k
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if key[: mid * step] == seen[: mid * step]:
                    lo = mid
                else:
                    hi = mid
            k = lo
        return nodes[:k], k * ps

    def _best_partial(self, node: Node, window: Sequence[int]) -> tuple[Node | None, int]:
        """Child sharing the most leading tokens with ``window`` (ties: most recently used)."""
        best: Node | None = None
        best_k = 0
        for c in node.by_first.get(window[0], ()):
            k = lcp(c.tokens, window)
            if k > best_k or (best is not None and k == best_k and _mru_key(c) > _mru_key(best)):
                best, best_k = c, k
        return best, best_k

    def continuation(self, ns: Hashable, match: Match) -> list[Node]:
        """The cached path beyond ``match``, for --cache-reuse: nodes for pages
        ``[match.n_hit // page_size, ...)``, following the most recently used child each step.

        Starts with the partially matched node when ``n_hit`` is not page aligned.
        """
        ps = self.page_size
        n_full = match.n_hit // ps
        out: list[Node] = []
        if match.n_hit % ps:
            out.append(match.nodes[n_full])
        else:
            start = match.nodes[n_full - 1] if n_full else self._roots.get(ns)
            if start is None or not start.children:
                return out
            out.append(max(start.children.values(), key=_mru_key))
        while out[-1].children:
            out.append(max(out[-1].children.values(), key=_mru_key))
        return out

    # -- mutations -------------------------------------------------------------------------
    def touch(self, nodes: Sequence[Node]) -> None:
        self._clock += 1
        for n in nodes:
            n.last_used = self._clock
            self._push(n)

    def _touch_path(self, path: Sequence[Node]) -> None:
        """``touch`` of a root-to-leaf chain. A node whose child on the chain is on the device
        cannot be evicted, so only the others are offered to the eviction heaps (a lookup
        over a 2,000-token prompt touches 125 nodes and would push each)."""
        self._clock += 1
        clock = self._clock
        last = len(path) - 1
        if self.host is None:  # every node is on the device: only the last one can be evicted
            for n in path:
                n.last_used = clock
            self._push(path[last])
            return
        for i, n in enumerate(path):
            n.last_used = clock
            if i == last or path[i + 1].page < 0:
                self._push(n)

    def pin_host(self, nodes: Sequence[Node]) -> None:
        """Keep these host nodes from host eviction until ``promote``d or ``unpin_host``ed."""
        self._pinned.update(n.uid for n in nodes)

    def unpin_host(self, nodes: Sequence[Node]) -> None:
        for n in nodes:
            self._pinned.discard(n.uid)
            self._push(n)

    def promote(self, node: Node, page: int) -> None:
        """Bring host node ``node`` back into device ``page`` (allocated, held by the caller):
        queues the host → device copy; the index takes its own reference on ``page``. Its
        parent must be on the device already (promote root to leaf)."""
        if node.host < 0 or not node.alive:
            raise ValueError(f"{node} is not on the host")
        parent = node.parent
        if parent is not None and parent.parent is not None and parent.page < 0:
            raise ValueError("promote the parent first")
        self.copies.append(TierCopy(False, page, node.host))
        self._claim(node, page)
        self.n_loaded += 1
        self.n_tokens_loaded += len(node.tokens)

    def insert(self, ns: Hashable, parent: Node | None, tokens: Tokens, page: int) -> Inserted:
        """Add ``page`` (held by the caller) as the child of ``parent`` (None = root) covering
        ``tokens``, unless a sibling already holds them (same full tokens: that sibling is
        returned; a partial page that is a prefix of a sibling: None). The caller's own
        reference is never touched.
        """
        ps = self.page_size
        if not 0 < len(tokens) <= ps:
            raise ValueError("a node holds 1..page_size tokens")
        if parent is None:
            parent = self.root(ns)
            assert parent is not None
        elif not parent.alive or len(parent.tokens) != ps:
            raise ValueError("parent must be a live full node")
        existing = parent.children.get(tokens)
        if existing is not None and existing.host >= 0:  # the same KV, back on the device
            self._claim(existing, page)
            self.touch([existing])
            return Inserted(existing, True)
        if existing is None and len(tokens) < ps:
            for c in parent.by_first.get(tokens[0], ()):
                if c.tokens[: len(tokens)] == tokens:
                    existing = c
                    break
        if existing is not None:
            self.touch([existing])
            return Inserted(existing if len(tokens) == ps else None, False)
        # Shorter partial siblings this page covers are now redundant.
        for c in list(parent.by_first.get(tokens[0], ())):
            if len(c.tokens) < len(tokens) and tokens[: len(c.tokens)] == c.tokens:
                self._remove(c)
        node = Node(tokens, page, parent, ns, next(self._uids))
        parent.children[tokens] = node
        parent.by_first.setdefault(tokens[0], []).append(node)
        self._node_of_page[page] = node
        self.pool.index_hold(page, len(tokens))
        self.touch([node])
        return Inserted(node, True)

    def note_released(self, page: int) -> None:
        """A holder other than the index dropped ``page``; it may now be evictable."""
        node = self._node_of_page.get(page)
        if node is not None:
            self._push_if_evictable(node)

    def evict(self, n_pages: int) -> int:
        """Free up to ``n_pages`` device pages of retained nodes without device children,
        least recently used first: moved to the host tier when it has (or can make) room,
        else dropped with whatever of their subtree is on the host."""
        freed = 0
        while freed < n_pages and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if stamp != node.last_used or not self._evictable(node):
                continue  # stale entry
            parent = node.parent
            if not self._offload(node):
                self._remove_subtree(node)
            freed += 1
            self.n_evicted += 1
            self._after_removal(parent)
        return freed

    def erase_namespace(self, ns: Hashable) -> int:
        root = self._roots.pop(ns, None)
        if root is None:
            return 0
        stack = list(root.children.values())
        removed = 0
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            n.children.clear()
            n.by_first.clear()
            self._drop(n)
            removed += 1
        return removed

    def clear(self) -> int:
        return sum(self.erase_namespace(ns) for ns in list(self._roots))

    # -- internals -------------------------------------------------------------------------
    def _evictable(self, node: Node) -> bool:
        return (node.alive and node.page >= 0 and self.pool.is_retained(node.page)
                and not any(c.page >= 0 for c in node.children.values()))

    def _host_evictable(self, node: Node) -> bool:
        return node.alive and node.host >= 0 and not node.children and node.uid not in self._pinned

    def _push(self, node: Node) -> None:
        if node.host >= 0:
            self._push_host_if_evictable(node)
        else:
            self._push_if_evictable(node)

    def _push_if_evictable(self, node: Node) -> None:
        if self._evictable(node):
            heapq.heappush(self._heap, (node.last_used, node.uid, node))
            if len(self._heap) > 2 * len(self._node_of_page) + 64:
                self._heap = [
                    (n.last_used, n.uid, n) for n in self._node_of_page.values() if self._evictable(n)
                ]
                heapq.heapify(self._heap)

    def _push_host_if_evictable(self, node: Node) -> None:
        if self._host_evictable(node):
            heapq.heappush(self._host_heap, (node.last_used, node.uid, node))
            if len(self._host_heap) > 2 * len(self._node_of_host) + 64:
                self._host_heap = [
                    (n.last_used, n.uid, n) for n in self._node_of_host.values() if self._host_evictable(n)
                ]
                heapq.heapify(self._host_heap)

    def _offload(self, node: Node) -> bool:
        """Move device node ``node``'s page to a host slot (evicting host leaves for room)."""
        if self.host is None:
            return False
        slot = self.host.alloc()
        while slot is None and self._evict_host_leaf():
            slot = self.host.alloc()
        if slot is None:
            return False
        page = node.page
        self.copies.append(TierCopy(True, page, slot))
        del self._node_of_page[page]
        self.pool.index_release(page)
        node.page, node.host = -1, slot
        self._node_of_host[slot] = node
        self._host_tokens += len(node.tokens)
        self.n_offloaded += 1
        self._push_host_if_evictable(node)
        return True

    def _evict_host_leaf(self) -> bool:
        while self._host_heap:
            stamp, _, node = heapq.heappop(self._host_heap)
            if stamp != node.last_used or not self._host_evictable(node):
                continue
            parent = node.parent
            self._remove_subtree(node)
            self._after_removal(parent)
            return True
        return False

    def _claim(self, node: Node, page: int) -> None:
        """Host node ``node`` now lives in device ``page`` (the caller holds a reference)."""
        slot = node.host
        del self._node_of_host[slot]
        self._host_tokens -= len(node.tokens)
        assert self.host is not None
        self.host.free(slot)
        self._pinned.discard(node.uid)
        node.host, node.page = -1, page
        self._node_of_page[page] = node
        self.pool.index_hold(page, len(node.tokens))

    def _remove_subtree(self, node: Node) -> None:
        """Remove ``node`` and its descendants (all on the host), leaves first."""
        order: list[Node] = []
        stack = [node]
        while stack:
            n = stack.pop()
            order.append(n)
            stack.extend(n.children.values())
        for n in reversed(order):  # children before their parent
            key = n.key() if self.on_evict is not None else ()
            self._remove(n)
            if n.page < 0:
                self.n_host_evicted += 1
            if self.on_evict is not None:
                self.on_evict(n.ns, key)

    def _after_removal(self, parent: Node | None) -> None:
        """``parent`` lost a device child or a child: it may be evictable now."""
        if parent is None:
            return
        if parent.parent is not None:
            self._push(parent)
        elif not parent.children and self._roots.get(parent.ns) is parent:
            del self._roots[parent.ns]  # an emptied namespace costs nothing

    def _remove(self, node: Node) -> None:
        """Unlink a leaf from its parent and release its page."""
        assert not node.children, "only leaves are removed"
        parent = node.parent
        assert parent is not None
        del parent.children[node.tokens]
        sibs = parent.by_first[node.tokens[0]]
        sibs.remove(node)
        if not sibs:
            del parent.by_first[node.tokens[0]]
        self._drop(node)

    def _drop(self, node: Node) -> None:
        node.alive = False
        self._n_dropped += 1
        self._pinned.discard(node.uid)
        if node.host >= 0:
            del self._node_of_host[node.host]
            self._host_tokens -= len(node.tokens)
            assert self.host is not None
            self.host.free(node.host)
            return
        del self._node_of_page[node.page]
        self.pool.index_release(node.page)


def _mru_key(n: Node) -> tuple[int, int]:
    return (n.last_used, n.uid)
