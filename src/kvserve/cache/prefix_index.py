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

The index owns one page reference per node (``PagePool.index_hold`` / ``index_release``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence

from kvserve.cache.page_pool import PagePool
from kvserve.cache.radix_node import Inserted, Match, Node, Tokens, lcp
from kvserve.cache.types import StopReason

__all__ = ["EvictHook", "Inserted", "Match", "Node", "PrefixIndex", "lcp"]

EvictHook = Callable[[Hashable, Tokens], None]


class PrefixIndex:
    def __init__(self, pool: PagePool) -> None:
        self.pool = pool
        self.page_size = pool.page_size
        self._roots: dict[Hashable, Node] = {}
        self._node_of_page: dict[int, Node] = {}
        self._clock = 0
        self._uids = itertools.count(1)
        self._heap: list[tuple[int, int, Node]] = []  # lazy LRU heap of eviction candidates
        self.n_evicted = 0
        self.on_evict: EvictHook | None = None  # (namespace, node key) after each eviction

    # -- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._node_of_page)

    def node_of_page(self, page: int) -> Node | None:
        return self._node_of_page.get(page)

    def iter_nodes(self) -> Iterator[Node]:
        return iter(list(self._node_of_page.values()))

    def root(self, ns: Hashable, create: bool = True) -> Node | None:
        r = self._roots.get(ns)
        if r is None and create:
            r = Node((), -1, None, ns, 0)
            self._roots[ns] = r
        return r

    def lookup(self, ns: Hashable, tokens: Sequence[int], touch: bool = True) -> Match:
        """Longest cached prefix of ``tokens`` (token granular). Never removes entries."""
        ps = self.page_size
        node = self._roots.get(ns)
        if node is None or not tokens:
            return Match(0, (), "miss")
        path: list[Node] = []
        pos = 0
        n_tok = len(tokens)
        while n_tok - pos >= ps:
            child = node.children.get(tuple(tokens[pos : pos + ps]))
            if child is None:
                break
            path.append(child)
            node = child
            pos += ps
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
            self.touch(path)
        return Match(pos, tuple(path), reason)

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
            self._push_if_evictable(n)

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
        """Free up to ``n_pages`` retained leaves, least recently used first."""
        freed = 0
        while freed < n_pages and self._heap:
            stamp, _, node = heapq.heappop(self._heap)
            if stamp != node.last_used or not self._evictable(node):
                continue  # stale entry
            key = node.key() if self.on_evict is not None else ()
            parent = node.parent
            self._remove(node)
            freed += 1
            self.n_evicted += 1
            if self.on_evict is not None:
                self.on_evict(node.ns, key)
            if parent is None:
                continue
            if parent.parent is not None:
                self._push_if_evictable(parent)
            elif not parent.children and self._roots.get(parent.ns) is parent:
                del self._roots[parent.ns]  # an emptied namespace costs nothing
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
        return node.alive and not node.children and self.pool.is_retained(node.page)

    def _push_if_evictable(self, node: Node) -> None:
        if self._evictable(node):
            heapq.heappush(self._heap, (node.last_used, node.uid, node))
            if len(self._heap) > 2 * len(self._node_of_page) + 64:
                self._heap = [
                    (n.last_used, n.uid, n) for n in self._node_of_page.values() if self._evictable(n)
                ]
                heapq.heapify(self._heap)

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
        del self._node_of_page[node.page]
        self.pool.index_release(node.page)


def _mru_key(n: Node) -> tuple[int, int]:
    return (n.last_used, n.uid)
