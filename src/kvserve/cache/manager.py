"""``KVCacheManager``: the one object the scheduler talks to about KV pages.

Life of a sequence (all calls on the engine thread, between runner steps)::

    adm = begin(seq_id, ns, prompt, use_cache, n_cache_reuse)   # adm.moves run first
    reserve(seq_id, n)            # before each step: page table covers positions [0, n)
    ... runner step (moves, then forward) ...
    publish(seq_id, tokens, n_computed)   # after each committed step: share full pages,
                                          # release the sources pinned for earlier moves
    shift(seq_id, n_keep, n_discard, n)   # context shift: returns moves for the next plan
    finish(seq_id, tokens, n_computed, donate)   # end/cancel: donate, drop every reference

Move contract (``Admission.moves`` and ``shift``'s result): the runner executes the moves of
a plan in list order before any forward of that plan, and each move reads all its source
rows before writing its destination rows (gather, then scatter). A sequence's moves must
run no later than its next forward (in that plan or an earlier one). Their source pages
stay pinned (eviction cannot recycle them) until ``publish``/``finish`` reports
``n_computed`` beyond the length the sequence had when the moves were issued: that proves a
forward, and so the moves, ran. Until then nothing new of the sequence is published or
donated (a request cancelled right after ``begin`` donates nothing, whatever ``n_computed``
says).

Written pages: a sequence writes only pages that are private to it (ref 1, not indexed).
Positions below its published prefix are never written again; a shared page that must be
extended is copied first (``cow_copies``).

Host tier (``host_tier``): evicted pages move to host slots within ``host_limit_pages``
(None: unbounded) and stay findable; an admission that hits them loads them back. The copies
both ways are ``TierCopy`` records that ``take_copies`` hands over, in issue order, for the
next plan: the runner executes them before that plan's moves and forward, and nothing may
read or write KV pages before the copies issued so far have run.

Donation covers KV that equals a from-scratch computation of its tokens: a sequence whose
KV was shifted (``--cache-reuse`` chunks, context shift) donates only the exact prefix
before the first shifted position, unless ``donate_approximate`` is set.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvserve.cache.admission import plan_admission
from kvserve.cache.host_tier import HostTier
from kvserve.cache.invariants import check_integrity
from kvserve.cache.page_pool import OutOfPages, PagePool
from kvserve.cache.prefix_index import Node, PrefixIndex
from kvserve.cache.shift import plan_shift
from kvserve.cache.types import Admission, CacheStats
from kvserve.plan import KVMove, TierCopy

_NO_LIMIT = 1 << 62


@dataclass
class SeqState:
    ns: Hashable
    share: bool  # lookups, publish and donation allowed
    pages: list[int] = field(default_factory=list)  # page table; one ref per entry
    path: list[Node] = field(default_factory=list)  # published: path[i].page == pages[i]
    pins: list[int] = field(default_factory=list)  # move sources; one ref per entry
    n_exact: int = _NO_LIMIT  # KV of positions [0, n_exact) is exact (donatable)
    # Moves issued when the sequence had this many valid positions have not provably run
    # yet (-1: none pending). A later n_computed above it proves a forward (hence the
    # moves before it) ran; until then pins stay and nothing new is published or donated.
    moves_at: int = -1


class KVCacheManager:
    def __init__(
        self,
        n_pages: int,
        page_size: int,
        retain_limit_pages: int | None = None,
        donate_approximate: bool = False,
        host_tier: bool = False,
        host_limit_pages: int | None = None,
    ) -> None:
        """``retain_limit_pages``: None = unbounded, 0 = kill switch (no lookup, publish or
        donation: behaves exactly like a server without prefix caching). ``host_tier``: keep
        evicted pages in up to ``host_limit_pages`` host slots (None: unbounded)."""
        self.pool = PagePool(n_pages, page_size)
        on = host_tier and retain_limit_pages != 0
        self.host = HostTier(host_limit_pages) if on else None
        self.index = PrefixIndex(self.pool, self.host)
        self.page_size = page_size
        self.retain_limit_pages = retain_limit_pages
        self.donate_approximate = donate_approximate
        self.seqs: dict[int, SeqState] = {}
        self._c = {k: 0 for k in ("lookups", "hits", "prefix", "shift", "looked_up", "cow", "donated")}

    @property
    def enabled(self) -> bool:
        return self.retain_limit_pages != 0

    # -- admission -------------------------------------------------------------------------
    def begin(
        self,
        seq_id: int,
        namespace: Hashable,
        tokens: Sequence[int],
        use_cache: bool = True,
        n_cache_reuse: int = 0,
        n_reserve: int = 0,
        key: bytes | None = None,
    ) -> Admission:
        """Register a sequence and set up its cached prefix; with ``n_reserve``, its page table
        also covers positions ``[0, n_reserve)`` (the admission reserves what the sequence
        needs). All or nothing: raises ``OutOfPages`` (nothing changed, no counter moved)
        when the pages cannot be found. ``key``: ``token_bytes(tokens)`` when the caller has
        it (a faster lookup, the same answer: ``PrefixIndex.lookup``)."""
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} already active")
        share = use_cache and self.enabled
        n_res_pages = -(-n_reserve // self.page_size)
        if not share or not tokens:
            pages = self._alloc(n_res_pages)
            self.seqs[seq_id] = SeqState(namespace, share, pages)
            return Admission(seq_id, 0, tuple(pages), (), "disabled" if not share else "miss", 0, 0, 0)
        plan = plan_admission(self.index, namespace, tokens, n_cache_reuse, key)
        shared = plan.shared_nodes()
        sources = plan.source_nodes()
        # shared + sources is one path from the root: its device nodes, then its host nodes
        path = shared + sources
        if self.host is None:  # all on the device
            on_host: list[Node] = []
            held = [n.page for n in path]
        else:
            on_host = [n for n in path if n.host >= 0]
            held = [n.page for n in path if n.host < 0]
        self.pool.incref_all(held)
        self.index.pin_host(on_host)
        try:
            fresh = self._alloc(len(on_host) + max(plan.n_private, n_res_pages - len(shared)))
        except OutOfPages:
            self.index.unpin_host(on_host)
            for p in held:
                self._release(p)
            raise
        for node, page in zip(on_host, fresh):  # root to leaf; the allocation's ref becomes ours
            self.index.promote(node, page)
        fresh = fresh[len(on_host):]
        pages = (held[: len(shared)] if not on_host else [n.page for n in shared]) + fresh
        moves = plan.moves(pages)
        if sources:
            self.index.touch(sources)
        pins = held[len(shared):] if not on_host else [n.page for n in sources]
        seq = SeqState(namespace, True, pages, shared, pins)
        n_cached, n_prefix, n_shift = plan.n_cached, plan.n_prefix, plan.n_shift
        if moves:
            seq.moves_at = n_cached
        if n_shift and not self.donate_approximate:
            seq.n_exact = n_prefix
        self.seqs[seq_id] = seq
        c = self._c
        c["lookups"] += 1
        c["hits"] += n_cached > 0
        c["prefix"] += n_prefix
        c["shift"] += n_shift
        c["looked_up"] += len(tokens)
        c["cow"] += n_prefix % self.page_size > 0
        m = plan.match
        return Admission(
            seq_id, n_cached, tuple(pages), tuple(moves), m.stop_reason, m.n_hit, n_prefix, n_shift
        )

    def reserve(self, seq_id: int, n_total_tokens: int) -> list[int]:
        """Grow the page table to cover positions ``[0, n_total_tokens)`` (never shrinks);
        evicts LRU retained pages if needed. Raises ``OutOfPages`` with nothing changed."""
        seq = self.seqs[seq_id]
        need = -(-n_total_tokens // self.page_size) - len(seq.pages)
        if need > 0:
            seq.pages += self._alloc(need)
        return list(seq.pages)

    def page_table(self, seq_id: int) -> tuple[int, ...]:
        """Current page table; re-read it for every plan (publish may swap in shared pages)."""
        return tuple(self.seqs[seq_id].pages)

    # -- sharing ---------------------------------------------------------------------------
    def publish(self, seq_id: int, tokens: Sequence[int], n_computed: int) -> int:
        """After a committed step: make the full pages of positions ``[0, n_computed)``
        findable, and release the sources pinned for this sequence's earlier moves.
        Idempotent; O(new pages). ``tokens`` is the sequence's token list (prompt +
        generated, compacted after a shift). Returns the number of published pages.

        A page whose tokens are already indexed under the same parent (another sequence
        published it first) is replaced in the page table by the indexed page (same KV),
        and the private copy is freed.
        """
        seq = self.seqs[seq_id]
        if self._settle(seq, n_computed) and seq.share:
            self._publish_full(seq, tokens, n_computed)
        self._enforce_budget()
        return len(seq.path)

    def finish(self, seq_id: int, tokens: Sequence[int], n_computed: int, donate: bool = True) -> int:
        """End (or cancel) a sequence: donate positions ``[0, n_computed)`` (prompt and
        generated tokens, the last partial page too) unless ``donate`` is false, then drop
        all its references. Returns the number of pages that became new index nodes."""
        seq = self.seqs.pop(seq_id)
        settled = self._settle(seq, n_computed)
        self._unpin(seq)
        before = self._c["donated"]
        if donate and seq.share and settled:
            n = self._publish_full(seq, tokens, n_computed)
            i, r = divmod(n, self.page_size)
            if r and len(seq.path) == i and self.pool.is_private(seq.pages[i]):
                parent = seq.path[-1] if seq.path else None
                part = tuple(tokens[i * self.page_size : n])
                self._c["donated"] += self.index.insert(seq.ns, parent, part, seq.pages[i]).created
        self._release_all(seq.pages)
        self._enforce_budget()
        return self._c["donated"] - before

    def shift(self, seq_id: int, n_keep: int, n_discard: int, n_tokens: int) -> list[KVMove]:
        """Context shift of positions ``[0, n_tokens)``: drop ``[n_keep, n_keep + n_discard)``
        and move the rest left by ``n_discard``. Returns the moves for the next plan; the
        page table then covers ``n_tokens - n_discard`` positions. Raises ``OutOfPages``
        (nothing changed) when shared pages cannot be copied."""
        seq = self.seqs[seq_id]
        self._settle(seq, n_tokens)
        plan = plan_shift(
            seq.pages, n_keep, n_discard, n_tokens, self.page_size, self.pool.is_private, self._alloc
        )
        if n_discard == 0:
            return []  # nothing moves; the page table is unchanged
        self._c["cow"] += plan.n_fresh
        seq.pins += plan.dropped  # their page-table references become pins
        if plan.moves:
            seq.moves_at = n_tokens - n_discard
        seq.pages = plan.pages
        del seq.path[n_keep // self.page_size :]
        if not self.donate_approximate:
            seq.n_exact = min(seq.n_exact, n_keep)
        self._enforce_budget()
        return plan.moves

    def lookup_len(self, namespace: Hashable, tokens: Sequence[int], key: bytes | None = None) -> int:
        """Matched prefix length (raw, before the n-1 rule); no refs taken, no LRU touch.
        ``key``: as for ``begin``."""
        if not self.enabled:
            return 0
        return self.index.lookup(namespace, tokens, touch=False, key=key).n_hit

    def erase_namespace(self, namespace: Hashable) -> int:
        """Forget every indexed page of ``namespace``; running sequences keep their pages."""
        for seq in self.seqs.values():
            if seq.ns == namespace:
                seq.path.clear()
        return self.index.erase_namespace(namespace)

    def clear(self) -> int:
        for seq in self.seqs.values():
            seq.path.clear()
        return self.index.clear()

    # -- observability ---------------------------------------------------------------------
    def stats(self) -> CacheStats:
        c, pool = self._c, self.pool
        in_use = pool.n_pages - pool.n_free - pool.n_retained
        return CacheStats(
            c["lookups"],
            c["hits"],
            c["prefix"],
            c["shift"],
            c["looked_up"],
            c["cow"],
            c["donated"],
            self.index.n_evicted,
            pool.n_retained,
            pool.n_retained_tokens,
            pool.n_free,
            in_use,
            len(self.index),
            self.index.n_host_nodes,
            self.index.n_host_tokens,
            -1 if self.host is None or self.host.capacity is None else self.host.capacity,
            self.index.n_offloaded,
            self.index.n_loaded,
            self.index.n_tokens_loaded,
            self.index.n_host_evicted,
            0 if self.host is None else self.host.n_slots_touched,
        )

    def check_integrity(self) -> None:
        check_integrity(self)

    def take_copies(self) -> tuple[TierCopy, ...]:
        """The host-tier copies issued since the last call, in order (for the next plan)."""
        copies, self.index.copies = self.index.copies, []
        return tuple(copies)

    # -- internals -------------------------------------------------------------------------
    def _alloc(self, n: int) -> list[int]:
        if n <= 0:
            return []
        if self.pool.n_free < n:
            if self.pool.n_free + self.pool.n_retained < n:
                raise OutOfPages(n, self.pool.n_free + self.pool.n_retained)
            self.index.evict(n - self.pool.n_free)
        return self.pool.alloc(n)

    def _release(self, page: int) -> None:
        self.pool.decref(page)
        if self.pool.is_retained(page):
            self.index.note_released(page)

    def _release_all(self, pages: list[int]) -> None:
        """``_release`` of each page: the references dropped, then the pages left to the index
        offered to eviction (a page's retained state depends on its own references only)."""
        for p in self.pool.decref_all(pages):
            self.index.note_released(p)

    def _settle(self, seq: SeqState, n_computed: int) -> bool:
        """True when no moves are pending; releases the pins of moves that provably ran."""
        if seq.moves_at >= 0 and n_computed > seq.moves_at:
            seq.moves_at = -1
            self._unpin(seq)
        return seq.moves_at < 0

    def _unpin(self, seq: SeqState) -> None:
        pins, seq.pins = seq.pins, []
        for p in pins:
            self._release(p)

    def _publish_full(self, seq: SeqState, tokens: Sequence[int], n_computed: int) -> int:
        """Index full pages of ``[0, n)``, n = min(n_computed, n_exact); returns n."""
        ps = self.page_size
        n = min(n_computed, seq.n_exact)
        if n > len(tokens) or n > len(seq.pages) * ps:
            raise ValueError(f"n_computed={n_computed} beyond the sequence's tokens or pages")
        for i in range(len(seq.path), n // ps):
            parent = seq.path[-1] if seq.path else None
            node, created = self.index.insert(
                seq.ns, parent, tuple(tokens[i * ps : (i + 1) * ps]), seq.pages[i]
            )
            assert node is not None
            if created:
                self._c["donated"] += 1
            elif node.page != seq.pages[i]:  # same tokens already indexed: share that page
                self.pool.incref(node.page)
                old, seq.pages[i] = seq.pages[i], node.page
                self._release(old)
            seq.path.append(node)
        return n

    def _enforce_budget(self) -> None:
        limit = self.retain_limit_pages
        if limit is not None and self.pool.n_retained > limit:
            self.index.evict(self.pool.n_retained - limit)
