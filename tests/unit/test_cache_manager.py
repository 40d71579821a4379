"""KVCacheManager rules, one test each. SimDriver checks KV rows after every step."""

from __future__ import annotations

import pytest

from kvserve.cache import KVCacheManager, OutOfPages
from kvserve.cache.kv_sim import SimDriver

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def setup(n_pages: int = 64, limit: int | None = None) -> tuple[KVCacheManager, SimDriver]:
    mgr = KVCacheManager(n_pages, PS, limit)
    return mgr, SimDriver(mgr)


@pytest.mark.parametrize("n_common", [1, 3, 4, 5, 7, 8, 9])
def test_token_granular_hit_copies_the_partial_page(n_common: int) -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 10))
    prompt = seq(0, n_common) + [99, 98, 97]
    adm = drv.begin(2, "ns", prompt)
    assert adm.n_cached == adm.n_hit == n_common
    full, r = divmod(n_common, PS)
    assert len(adm.page_table) == full + (r > 0)
    assert [m.n_tokens for m in adm.moves] == ([r] if r else [])
    assert all(m.delta == 0 for m in adm.moves)
    if r:  # the copy goes to a private page, never into the shared one
        assert mgr.pool.is_private(adm.page_table[-1])
        assert adm.moves[0].src_pages[0] != adm.page_table[-1]
    assert mgr.stats().cow_copies == (r > 0)
    mgr.check_integrity()


@pytest.mark.parametrize("n", [1, 4, 6, 8])
def test_full_match_evaluates_the_last_token(n: int) -> None:
    _mgr, drv = setup()
    drv.request(1, "ns", seq(0, n))
    adm = drv.request(2, "ns", seq(0, n))
    assert (adm.n_hit, adm.n_cached, adm.stop_reason) == (n, n - 1, "end_of_prompt")


def test_stop_reasons() -> None:
    _mgr, drv = setup()
    assert drv.request(1, "ns", seq(0, 6)).stop_reason == "miss"
    assert drv.request(2, "ns", seq(0, 6) + [50]).stop_reason == "end_of_cache"
    assert drv.request(3, "ns", seq(0, 3) + [60]).stop_reason == "diverged"
    assert drv.request(4, "ns", seq(0, 5), use_cache=False).stop_reason == "disabled"


def test_siblings_share_prefix_pages() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 8) + [10, 11, 12, 13])
    drv.request(2, "ns", seq(0, 8) + [20, 21, 22, 23])
    assert len(mgr.index) == 4  # two shared prefix pages + one page per branch
    a = drv.begin(3, "ns", seq(0, 8) + [10, 11, 12, 13, 5])
    b = drv.begin(4, "ns", seq(0, 8) + [20, 21, 22, 23, 5])
    assert a.page_table[:2] == b.page_table[:2] and a.page_table[2] != b.page_table[2]
    assert a.n_cached == b.n_cached == 12 and not a.moves


def test_generated_tokens_are_donated() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 6), generated=[70, 71, 72, 73])
    # The last sampled token (73) was never computed; everything before it is cached.
    assert mgr.lookup_len("ns", seq(0, 6) + [70, 71, 72, 73, 5]) == 9
    adm = drv.request(2, "ns", seq(0, 6) + [70, 71, 72, 5])
    assert adm.n_cached == 9


def test_cache_off_request_neither_looks_up_nor_donates() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 9))
    before = (mgr.stats(), sorted(n.page for n in mgr.index.iter_nodes()))
    adm = drv.request(2, "ns", seq(0, 9) + [40, 41, 42, 43, 44], use_cache=False)
    assert (adm.n_cached, adm.stop_reason) == (0, "disabled")
    after = mgr.stats()
    assert (after.lookups, after.pages_donated) == (before[0].lookups, before[0].pages_donated)
    assert sorted(n.page for n in mgr.index.iter_nodes()) == before[1]
    assert drv.request(3, "ns", seq(0, 9)).n_cached == 8  # an identical request still hits


def test_kill_switch_retains_nothing() -> None:
    mgr, drv = setup(limit=0)
    drv.request(1, "ns", seq(0, 9), generated=[1, 2])
    assert drv.request(2, "ns", seq(0, 9)).stop_reason == "disabled"
    assert len(mgr.index) == 0 and mgr.stats().lookups == 0 and mgr.pool.n_free == 64


def test_namespaces_are_isolated() -> None:
    mgr, drv = setup()
    drv.request(1, ("tenant-a",), seq(0, 9))
    assert drv.request(2, ("tenant-b",), seq(0, 9)).n_cached == 0
    assert mgr.lookup_len(("tenant-a",), seq(0, 9)) == 9
    mgr.erase_namespace(("tenant-a",))
    assert mgr.lookup_len(("tenant-a",), seq(0, 9)) == 0
    assert mgr.lookup_len(("tenant-b",), seq(0, 9)) == 9
    mgr.check_integrity()


def test_retention_budget_evicts_least_recently_used() -> None:
    mgr, drv = setup(limit=4)
    for i in range(6):
        drv.request(i, "ns", seq(100 * i, 8))
        assert mgr.pool.n_retained <= 4
    assert mgr.stats().evictions == 8
    assert mgr.lookup_len("ns", seq(500, 8)) == 8 and mgr.lookup_len("ns", seq(400, 8)) == 8
    assert mgr.lookup_len("ns", seq(300, 8)) == 0
    drv.request(10, "ns", seq(400, 8))  # refresh 400 ...
    drv.request(11, "ns", seq(600, 8))  # ... so 500 goes, not 400
    assert mgr.lookup_len("ns", seq(400, 8)) == 8 and mgr.lookup_len("ns", seq(500, 8)) == 0


def test_cancel_donates_what_was_computed() -> None:
    mgr, drv = setup()
    prompt = seq(0, 20)
    drv.begin(1, "ns", prompt)
    drv.compute(1, prompt, 0, 6)
    mgr.finish(1, prompt, 6)
    assert mgr.lookup_len("ns", prompt) == 6  # one full page plus a partial one
    mgr.check_integrity()


def test_cancel_before_the_first_step_donates_nothing() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 10))
    nodes = sorted(n.page for n in mgr.index.iter_nodes())
    prompt = seq(0, 6) + [50, 51, 52]
    adm = mgr.begin(2, "ns", prompt)  # its copy move never runs
    assert adm.n_cached == 6 and adm.moves
    mgr.finish(2, prompt, adm.n_cached)
    assert sorted(n.page for n in mgr.index.iter_nodes()) == nodes
    assert mgr.lookup_len("ns", prompt) == 6
    mgr.check_integrity()


def test_move_sources_stay_pinned_until_a_forward_ran() -> None:
    mgr, drv = setup(limit=10)
    drv.request(1, "ns", seq(0, 6))  # pages [0-3] [4,5]
    adm = mgr.begin(2, "ns", seq(0, 5) + [9])
    (src,) = adm.moves[0].src_pages
    mgr.publish(2, seq(0, 5) + [9], 5)  # no forward yet: still pinned
    assert mgr.pool.ref(src) == 2
    drv.kv.apply(adm.moves[0])
    drv.compute(2, seq(0, 5) + [9], 5, 6)  # n_computed 6 > 5: released
    assert mgr.pool.ref(src) == 1
    mgr.check_integrity()


def test_publish_lets_a_concurrent_request_hit() -> None:
    mgr, drv = setup()
    doc = seq(0, 30)
    drv.begin(1, "ns", doc + [1])
    drv.compute(1, doc + [1], 0, 13)  # first chunk of the prefill, published
    assert mgr.lookup_len("ns", doc + [2]) == 12  # full pages only
    adm = drv.begin(2, "ns", doc + [2])
    assert adm.n_cached == 12 and adm.page_table == mgr.page_table(1)[:3]
    drv.compute(1, doc + [1], 13, 31)
    mgr.check_integrity()
    mgr.finish(2, doc + [2], 12)
    mgr.finish(1, doc + [1], 31)
    mgr.check_integrity()
    assert mgr.lookup_len("ns", doc + [1]) == 31


def test_publish_of_duplicate_pages_swaps_in_the_indexed_copy() -> None:
    mgr, drv = setup()
    doc = seq(0, 16)
    drv.begin(1, "ns", doc + [1])
    drv.begin(2, "ns", doc + [2])  # both miss: computed twice
    drv.compute(1, doc + [1], 0, 17)
    free_before = mgr.pool.n_free
    drv.compute(2, doc + [2], 0, 17)  # publish finds doc's pages indexed already
    assert mgr.page_table(2)[:4] == mgr.page_table(1)[:4]
    assert mgr.pool.n_free == free_before - 5 + 4  # 5 pages reserved, the 4 copies freed
    assert mgr.publish(2, doc + [2], 17) == 4  # idempotent
    mgr.check_integrity()


def test_reserve_evicts_and_raises_when_nothing_is_left() -> None:
    mgr, drv = setup(n_pages=6)
    drv.request(1, "ns", seq(0, 16))  # 4 retained pages
    drv.begin(2, "ns", seq(100, 8))
    assert len(mgr.reserve(2, 8)) == 2 and mgr.stats().evictions == 0
    assert len(mgr.reserve(2, 20)) == 5 and mgr.stats().evictions == 3
    with pytest.raises(OutOfPages):
        mgr.reserve(2, 32)
    assert len(mgr.page_table(2)) == 5  # unchanged
    mgr.check_integrity()


def test_begin_is_all_or_nothing_when_pages_run_out() -> None:
    mgr, drv = setup(n_pages=4)
    drv.request(1, "ns", seq(0, 7))  # pages [0-3] [4-6]
    drv.begin(2, "ns", seq(50, 8))
    mgr.reserve(2, 8)  # the only other free pages are held; 2 retained remain
    drv.begin(3, "ns", seq(60, 4))
    mgr.reserve(3, 4)  # evicts the partial leaf
    with pytest.raises(OutOfPages):
        mgr.begin(4, "ns", seq(0, 3) + [9])  # needs a private page for the copy
    assert 4 not in mgr.seqs
    mgr.check_integrity()


def test_lookup_len_does_not_touch_lru() -> None:
    mgr, drv = setup(limit=2)
    drv.request(1, "ns", seq(0, 4))
    drv.request(2, "ns", seq(10, 4))
    mgr.lookup_len("ns", seq(0, 4))
    drv.request(3, "ns", seq(20, 4))
    assert mgr.lookup_len("ns", seq(0, 4)) == 0 and mgr.lookup_len("ns", seq(10, 4)) == 4


def test_erase_while_running_keeps_the_sequence_valid() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 12))
    drv.begin(2, "ns", seq(0, 12) + [5])
    drv.begin(3, "ns", seq(0, 12) + [6])
    assert mgr.clear() == 3
    mgr.check_integrity()
    drv.compute(2, seq(0, 12) + [5], 12, 13)  # republishes its pages from the root
    drv.compute(3, seq(0, 12) + [6], 12, 13)
    mgr.finish(2, seq(0, 12) + [5], 13)
    mgr.finish(3, seq(0, 12) + [6], 13)
    mgr.check_integrity()
    assert mgr.lookup_len("ns", seq(0, 12) + [6]) == 13


def test_stats_counters() -> None:
    mgr, drv = setup()
    drv.request(1, "ns", seq(0, 10))
    drv.request(2, "ns", seq(0, 10))
    s = mgr.stats()
    assert (s.lookups, s.hits, s.tokens_reused_prefix, s.tokens_looked_up) == (2, 1, 9, 20)
    assert (s.retained_pages, s.retained_tokens, s.index_nodes, s.in_use_pages) == (3, 10, 3, 0)
    assert s.free_pages == 61
