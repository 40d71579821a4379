"""``PagePool.incref_all`` / ``decref_all`` against ``incref`` / ``decref`` one page at a time:
the same references, free list, retained tally, errors, and the pages left to the index."""

from __future__ import annotations

import random

import pytest

from kvserve.cache.page_pool import PagePool


def _state(pool: PagePool) -> tuple:
    return (list(pool._ref), list(pool._free), list(pool._indexed_tokens),
            pool.n_retained, pool.n_retained_tokens)


def _pools(seed: int) -> tuple[PagePool, PagePool, list[int]]:
    rng = random.Random(seed)
    pools = []
    for _ in range(2):
        r = random.Random(seed)
        pool = PagePool(40, 4)
        pages = pool.alloc(30)
        for p in pages:
            if r.random() < 0.6:
                pool.index_hold(p, r.randrange(1, 5))
            for _ in range(r.randrange(3)):
                pool.incref(p)
        pools.append(pool)
    return pools[0], pools[1], rng.sample(range(30), rng.randrange(1, 30))


@pytest.mark.parametrize("seed", range(20))
def test_bulk_ops_equal_one_at_a_time(seed: int) -> None:
    a, b, pages = _pools(seed)
    a.incref_all(pages)
    for p in pages:
        b.incref(p)
    assert _state(a) == _state(b)
    for _ in range(3):
        try:
            got = a.decref_all(pages)
        except ValueError as e:
            got = e
        want = []
        try:
            for p in pages:
                b.decref(p)
                if b.is_retained(p):
                    want.append(p)
        except ValueError as e:
            want = e
        if isinstance(want, ValueError):
            assert isinstance(got, ValueError) and str(got) == str(want)
        else:
            assert got == want
        assert _state(a) == _state(b)
