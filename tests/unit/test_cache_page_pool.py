from __future__ import annotations

import pytest

from kvserve.cache.page_pool import OutOfPages, PagePool


def test_alloc_is_lifo_and_all_or_nothing() -> None:
    pool = PagePool(4, 16)
    assert pool.alloc(2) == [0, 1]
    with pytest.raises(OutOfPages):
        pool.alloc(3)
    assert pool.n_free == 2
    pool.decref(0)
    assert pool.alloc(1) == [0]  # the most recently freed page comes back first


def test_refcounts_and_retained_tally() -> None:
    pool = PagePool(4, 16)
    (p,) = pool.alloc(1)
    pool.index_hold(p, 5)  # seq + index
    assert pool.ref(p) == 2 and not pool.is_retained(p) and not pool.is_private(p)
    assert pool.decref(p) is False  # the sequence lets go: retained
    assert pool.is_retained(p) and pool.n_retained == 1 and pool.n_retained_tokens == 5
    pool.incref(p)  # a lookup takes it again
    assert pool.n_retained == 0
    pool.decref(p)
    assert pool.index_release(p) is True
    assert pool.n_retained == 0 and pool.n_retained_tokens == 0 and pool.n_free == 4


def test_misuse_is_refused() -> None:
    pool = PagePool(2, 4)
    with pytest.raises(ValueError):
        pool.incref(0)
    with pytest.raises(ValueError):
        pool.decref(0)
    (p,) = pool.alloc(1)
    pool.index_hold(p, 4)
    pool.decref(p)
    with pytest.raises(ValueError):
        pool.decref(p)  # would drop the index's reference
    with pytest.raises(ValueError):
        pool.index_hold(p, 4)
