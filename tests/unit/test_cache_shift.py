"""Context shift: drop [n_keep, n_keep + n_discard), move the rest left; shared pages copied."""

from __future__ import annotations

import pytest

from kvserve.cache import KVCacheManager, OutOfPages
from kvserve.cache.kv_sim import SimDriver

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("n_keep", [0, 2, 4, 5, 8])
@pytest.mark.parametrize("n_discard", [1, 3, 4, 9])
def test_shift_moves_rows_and_never_writes_shared_pages(n_keep: int, n_discard: int) -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)  # asserts every write hits a private page
    toks = seq(0, 22)
    drv.begin(1, "ns", toks)
    drv.compute(1, toks, 0, 22)  # pages 0..4 published (shared with the index)
    shared = set(mgr.page_table(1)[:5])
    new = drv.shift(1, toks, n_keep, n_discard)  # KVSim checks rows [0, 22 - n_discard)
    pt = mgr.page_table(1)
    assert len(pt) == -(-(22 - n_discard) // PS)
    assert pt[: n_keep // PS] == tuple(sorted(shared))[: n_keep // PS]
    assert not set(pt[n_keep // PS :]) & shared
    mgr.check_integrity()
    new.append(77)  # generation continues at the new end
    drv.compute(1, new, len(new) - 1, len(new))
    mgr.finish(1, new, len(new))
    drv.kv.assert_index(mgr.index)
    mgr.check_integrity()
    # Shifted KV is never donated: the index still holds the 5 pages published before the
    # shift, and the compacted tokens match only up to n_keep.
    assert mgr.lookup_len("ns", toks) == 20
    assert mgr.lookup_len("ns", new) == n_keep


def test_shift_of_private_pages_is_in_place_with_one_move() -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)
    toks = seq(0, 14)
    drv.begin(1, "ns", toks, use_cache=False)  # nothing shared
    drv.compute(1, toks, 0, 14)
    before = mgr.page_table(1)
    moves = mgr.shift(1, 2, 5, 14)
    assert len(moves) == 1
    (mv,) = moves
    assert (mv.delta, mv.n_tokens, mv.src_start, mv.dst_start) == (-5, 7, 7 % PS, 2)
    assert mgr.page_table(1) == before[:3]
    for m in moves:
        drv.kv.apply(m)
    new = toks[:2] + toks[7:]
    drv.kv.assert_seq(mgr.page_table(1), new, 9)
    mgr.publish(1, new, 9)  # no forward since the shift: its sources stay pinned
    assert mgr.pool.n_free == 64 - 4
    drv.compute(1, new + [77], 9, 10)  # the next step proves the moves ran
    assert mgr.pool.n_free == 64 - 3
    mgr.check_integrity()


def test_shift_without_discard_changes_nothing() -> None:
    mgr = KVCacheManager(8, PS)
    drv = SimDriver(mgr)
    drv.begin(1, "ns", seq(0, 6))
    drv.compute(1, seq(0, 6), 0, 6)
    pt = mgr.page_table(1)
    assert mgr.shift(1, 3, 0, 6) == [] and mgr.page_table(1) == pt


def test_shift_out_of_pages_changes_nothing() -> None:
    mgr = KVCacheManager(3, PS)
    drv = SimDriver(mgr)
    toks = seq(0, 12)
    drv.begin(1, "ns", toks)
    drv.compute(1, toks, 0, 12)  # all 3 pages published and held
    with pytest.raises(OutOfPages):
        mgr.shift(1, 1, 2, 12)
    assert len(mgr.page_table(1)) == 3
    mgr.check_integrity()


def test_shared_pages_is_the_shortest_common_prefix_with_the_first_table():
    """``_shared_pages`` against the page-by-page rule it replaced, on random tables."""
    import random

    from kvserve.model.attention import _shared_pages

    def oracle(tables, ps):
        n = min((length - 1) // ps for _, length in tables)
        first = tables[0][0]
        for i in range(n):
            if any(t[i] != first[i] for t, _ in tables[1:]):
                return i
        return n

    rng = random.Random(0)
    for _ in range(2000):
        base = [rng.randint(0, 5) for _ in range(rng.randint(1, 12))]
        tables = []
        for _ in range(rng.randint(2, 6)):
            t = base[: rng.randint(0, len(base))] + [rng.randint(0, 5) for _ in range(rng.randint(0, 4))] or [0]
            tables.append((t, rng.randint(1, len(t) * 4)))
        assert _shared_pages(tables, 4) == oracle(tables, 4), tables
