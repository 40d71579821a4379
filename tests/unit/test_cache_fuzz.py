"""Oracle fuzz: random scheduler-like call sequences against a brute-force model.

The model is a set of donated token keys per namespace (one key = all tokens from the start
of a sequence to the end of one page, full or partial), updated by the same donation rules
stated in ``prefix_index`` (covered partial pages are skipped, a longer page replaces the
shorter partial pages it covers) and by the evictions the index reports. Every lookup must
return ``max(LCP(key, tokens))`` over the namespace's keys. After every step:
``check_integrity()``; and a KV simulator (each row = the (token, position) it holds, moves
applied lazily at the sequence's next step, as late as a real plan could run them) must read
every running sequence's tokens at their positions and every index page's tokens at its depth.

With a host tier, evicted pages move to host slots and stay findable (the oracle's keys stay);
only host evictions and drops remove keys. The host-tier copies run lazily too: before the
next operation that touches KV rows (a forward, a move, a check), in the order issued.
"""

from __future__ import annotations

import random
from collections.abc import Hashable
from dataclasses import dataclass, field

import pytest

from kvserve.cache import KVCacheManager, OutOfPages
from kvserve.cache.kv_sim import KVSim
from kvserve.cache.prefix_index import lcp
from kvserve.plan import KVMove

INF = 1 << 62
Key = tuple[int, ...]


class Model:
    def __init__(self, page_size: int) -> None:
        self.ps = page_size
        self.keys: dict[Hashable, set[Key]] = {}

    def hit(self, ns: Hashable, tokens: list[int]) -> int:
        return max((lcp(k, tokens) for k in self.keys.get(ns, ())), default=0)

    def add(self, ns: Hashable, key: Key) -> None:
        keys = self.keys.setdefault(ns, set())
        if any(len(j) >= len(key) and j[: len(key)] == key for j in keys):
            return  # already present, or a partial page covered by a sibling
        page_start = (len(key) - 1) // self.ps * self.ps
        assert page_start == 0 or key[:page_start] in keys, "donation must extend a cached path"
        for j in [j for j in keys if page_start < len(j) < len(key) and key[: len(j)] == j]:
            keys.remove(j)  # shorter partial page in the same slot: superseded
        keys.add(key)

    def donate(self, ns: Hashable, tokens: list[int], n: int, partial: bool) -> None:
        for end in range(self.ps, n + 1, self.ps):
            self.add(ns, tuple(tokens[:end]))
        if partial and n % self.ps:
            self.add(ns, tuple(tokens[:n]))

    def evicted(self, ns: Hashable, key: Key) -> None:
        keys = self.keys[ns]
        assert key in keys, f"evicted a key the model does not hold: {key}"
        assert not any(len(j) > len(key) and j[: len(key)] == key for j in keys), "evicted a non-leaf"
        keys.remove(key)


@dataclass
class Seq:
    ns: Hashable
    tokens: list[int]
    n_prompt: int
    share: bool
    n_computed: int = 0
    n_exact: int = INF
    pending: list[KVMove] = field(default_factory=list)


@dataclass
class Fuzz:
    rng: random.Random
    mgr: KVCacheManager
    model: Model
    kv: KVSim
    docs: list[list[int]]
    seqs: dict[int, Seq] = field(default_factory=dict)
    log: list[tuple[Hashable, Key]] = field(default_factory=list)
    next_id: int = 0
    max_len: int = 28  # a generating sequence at this length is context-shifted

    def flush_evictions(self) -> None:
        for ns, key in self.log:
            self.model.evicted(ns, key)
        self.log.clear()

    def prompt(self) -> list[int]:
        r = self.rng
        base = r.choice(self.docs)
        toks = base[: r.randint(0, len(base))]
        return toks + [r.randint(0, 3) for _ in range(r.randint(0 if toks else 1, 8))]

    # -- operations ------------------------------------------------------------------------
    def begin(self) -> None:
        r, mgr = self.rng, self.mgr
        ns = r.choice(["a", "b"])
        toks = self.prompt()
        use_cache = r.random() < 0.85
        reuse = r.choice([0, 0, 0, 1, 2, 3])
        expect = self.model.hit(ns, toks)
        sid = self.next_id
        try:
            adm = mgr.begin(sid, ns, toks, use_cache, reuse)
        except OutOfPages:
            self.flush_evictions()
            assert sid not in mgr.seqs
            return
        self.flush_evictions()
        self.next_id += 1
        share = use_cache and mgr.enabled
        if share:
            assert adm.n_hit == expect, (adm, expect)
            assert adm.n_reused_prefix == min(expect, len(toks) - 1)
            assert adm.n_cached <= len(toks) - 1
            if not reuse:
                assert adm.n_reused_shift == 0
        else:
            assert adm.n_cached == 0 and adm.stop_reason == "disabled"
        s = Seq(ns, list(toks), len(toks), share, adm.n_cached, pending=list(adm.moves))
        if adm.n_reused_shift:
            s.n_exact = adm.n_reused_prefix
        self.seqs[sid] = s

    def step(self, sid: int) -> None:
        r, s, mgr = self.rng, self.seqs[sid], self.mgr
        if s.n_computed >= s.n_prompt and len(s.tokens) >= self.max_len:
            return self.shift(sid)
        if s.n_computed < s.n_prompt:
            end = min(s.n_prompt, s.n_computed + r.randint(1, 9))
        else:
            s.tokens.append(r.randint(0, 3))  # the token sampled last step
            end = len(s.tokens)
        before = mgr.page_table(sid)
        try:
            mgr.reserve(sid, end)
        except OutOfPages:
            self.flush_evictions()
            assert mgr.page_table(sid) == before
            if end > s.n_prompt:
                s.tokens.pop()
            return
        self.flush_evictions()
        self.run_moves(s)
        pt = mgr.page_table(sid)
        self.kv.forward(pt, s.tokens, s.n_computed, end)
        s.n_computed = end
        self.kv.assert_seq(pt, s.tokens, end)
        if r.random() < 0.9:
            mgr.publish(sid, s.tokens, end)
            if s.share:
                self.model.donate(s.ns, s.tokens, min(end, s.n_exact), partial=False)
            self.flush_evictions()
            self.kv.assert_seq(mgr.page_table(sid), s.tokens, end)

    def sync(self) -> None:
        for c in self.mgr.take_copies():
            self.kv.copy(c)

    def run_moves(self, s: Seq) -> None:
        self.sync()
        for mv in s.pending:
            self.kv.apply(mv)
        s.pending.clear()
        self.kv.assert_seq(self.mgr.page_table(self.sid_of(s)), s.tokens, s.n_computed)

    def sid_of(self, s: Seq) -> int:
        return next(k for k, v in self.seqs.items() if v is s)

    def shift(self, sid: int) -> None:
        r, s = self.rng, self.seqs[sid]
        n = s.n_computed
        n_keep = r.randint(0, n // 2)
        n_discard = r.randint(1, n - n_keep)
        self.run_moves(s)
        try:
            moves = self.mgr.shift(sid, n_keep, n_discard, n)
        except OutOfPages:
            self.flush_evictions()
            return
        self.flush_evictions()
        s.tokens = s.tokens[:n_keep] + s.tokens[n_keep + n_discard :]
        s.n_computed = len(s.tokens)
        s.n_prompt = min(s.n_prompt, s.n_computed)
        s.n_exact = min(s.n_exact, n_keep)
        s.pending = list(moves)

    def finish(self, sid: int) -> None:
        r, s = self.rng, self.seqs[sid]
        donate = r.random() < 0.85
        n = s.n_computed
        if not s.pending and r.random() < 0.3 and s.n_computed >= s.n_prompt:
            s.tokens.append(r.randint(0, 3))  # a sampled token that was never computed
        self.mgr.finish(sid, s.tokens, n, donate)
        if s.share and donate and not s.pending:  # pending moves: nothing provably computed
            self.model.donate(s.ns, s.tokens, min(n, s.n_exact), partial=True)
        self.flush_evictions()
        del self.seqs[sid]
        if s.n_prompt >= 4:
            self.docs.append(s.tokens[: r.randint(1, len(s.tokens))])
            if len(self.docs) > 12:
                self.docs.pop(0)

    def check(self) -> None:
        self.mgr.check_integrity()
        if self.mgr.host is None or self.rng.random() < 0.3:  # else copies pile up across calls
            self.sync()
            self.kv.assert_index(self.mgr.index)
            for sid, s in self.seqs.items():
                if not s.pending:
                    self.kv.assert_seq(self.mgr.page_table(sid), s.tokens, s.n_computed)
        toks = self.prompt()
        for ns in ("a", "b"):
            want = self.model.hit(ns, toks) if self.mgr.enabled else 0
            assert self.mgr.lookup_len(ns, toks) == want


def run_fuzz(seed: int, n_pages: int, page_size: int, limit: int | None, steps: int,
             host: int | None | bool = False) -> KVCacheManager:
    """``host``: False = no host tier, else its limit in pages (None: unbounded)."""
    rng = random.Random(seed)
    mgr = KVCacheManager(n_pages, page_size, limit, host_tier=host is not False,
                         host_limit_pages=None if host is False else host)
    model = Model(page_size)
    f = Fuzz(
        rng,
        mgr,
        model,
        KVSim(n_pages, page_size, writable=mgr.pool.is_private),
        docs=[[rng.randint(0, 3) for _ in range(rng.randint(4, 30))] for _ in range(6)],
    )
    mgr.index.on_evict = lambda ns, key: f.log.append((ns, key))
    for _ in range(steps):
        x = rng.random()
        if x < 0.2 and len(f.seqs) < 5:
            f.begin()
        elif x < 0.9 and f.seqs:
            f.step(rng.choice(list(f.seqs)))
        elif x < 0.97 and f.seqs:
            f.finish(rng.choice(list(f.seqs)))
        elif x < 0.98:
            mgr.index.evict(rng.randint(1, 4))  # memory pressure from outside
            f.flush_evictions()
        elif x < 0.985:
            mgr.erase_namespace("a")
            model.keys.pop("a", None)
        elif x < 0.99:
            mgr.clear()
            model.keys.clear()
        f.check()
    for sid in list(f.seqs):
        f.finish(sid)
    f.sync()
    f.check()
    f.kv.assert_index(mgr.index)
    assert mgr.stats().in_use_pages == 0
    if limit != 0:
        assert mgr.stats().hits > 0
    return mgr


@pytest.mark.parametrize(
    "seed,n_pages,page_size,limit",
    [
        (1, 64, 4, None),  # roomy pool: few evictions
        (2, 36, 4, 10),  # tight pool and budget: eviction and OutOfPages on most steps
        (3, 48, 3, None),  # odd page size
        (4, 40, 2, 6),
        (5, 24, 5, 0),  # kill switch
        (6, 30, 1, 8),  # one token per page
    ],
)
def test_fuzz_against_oracle(seed: int, n_pages: int, page_size: int, limit: int | None) -> None:
    run_fuzz(seed, n_pages, page_size, limit, steps=3000)  # about 0.5 s each


@pytest.mark.parametrize(
    "seed,n_pages,page_size,limit,host",
    [
        (11, 36, 4, 10, 8),  # tight pool and device budget, small host tier: host evictions
        (12, 30, 4, None, 40),  # the pool is the device budget (as on CUDA), roomy host tier
        (13, 24, 2, None, None),  # unbounded host tier
        (14, 40, 3, 6, 1),  # one host slot
        (15, 30, 1, 8, 5),  # one token per page
        (16, 24, 5, 0, 8),  # kill switch: no host tier either
    ],
)
def test_fuzz_with_host_tier(seed: int, n_pages: int, page_size: int, limit: int | None, host: int | None) -> None:
    mgr = run_fuzz(seed, n_pages, page_size, limit, steps=3000, host=host)
    st = mgr.stats()
    if limit == 0:
        assert mgr.host is None and st.offloaded_pages == 0
        return
    assert st.offloaded_pages > 0 and st.loaded_pages > 0 and st.tokens_loaded > 0
    assert host is None or st.host_pages <= host
    if host is not None and host < 10:
        assert st.host_evictions > 0
