from __future__ import annotations

from kvserve.cache.page_pool import PagePool
from kvserve.cache.prefix_index import PrefixIndex
from kvserve.engine.slots import token_bytes

PS = 4


def make() -> tuple[PagePool, PrefixIndex]:
    pool = PagePool(32, PS)
    return pool, PrefixIndex(pool)


def add_path(pool: PagePool, index: PrefixIndex, ns: object, tokens: list[int]) -> list[int]:
    """Insert ``tokens`` page by page as a donating sequence would, then let go of the pages."""
    parent = None
    pages = []
    for i in range(0, len(tokens), PS):
        (p,) = pool.alloc(1)
        res = index.insert(ns, parent, tuple(tokens[i : i + PS]), p)
        pool.decref(p)
        if res.created:
            index.note_released(p)
        pages.append(res.node.page if res.node else -1)
        parent = res.node
    return pages


def test_stop_reasons_and_token_granular_hit() -> None:
    pool, index = make()
    add_path(pool, index, "a", list(range(10)))  # pages [0-3] [4-7] [8,9]
    m = index.lookup("a", [50, 51])
    assert (m.n_hit, m.stop_reason) == (0, "miss")
    m = index.lookup("a", [0, 1, 2, 3, 4, 5, 99, 98, 97])
    assert (m.n_hit, m.stop_reason, len(m.nodes)) == (6, "diverged", 2)
    m = index.lookup("a", list(range(12)))
    assert (m.n_hit, m.stop_reason, len(m.nodes)) == (10, "end_of_cache", 3)
    m = index.lookup("a", list(range(7)))
    assert (m.n_hit, m.stop_reason) == (7, "end_of_prompt")
    m = index.lookup("a", list(range(8)))
    assert (m.n_hit, m.stop_reason, len(m.nodes)) == (8, "end_of_prompt", 2)
    assert index.lookup("b", list(range(8))).stop_reason == "miss"  # namespaces are separate


def test_siblings_share_the_common_prefix_and_dedupe() -> None:
    pool, index = make()
    a = add_path(pool, index, "a", list(range(8)) + [10, 11, 12, 13])
    b = add_path(pool, index, "a", list(range(8)) + [20, 21, 22, 23])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(index) == 4 and pool.n_retained == 4


def test_partial_leaves_are_superseded_or_skipped() -> None:
    pool, index = make()
    add_path(pool, index, "a", [1, 2, 3, 4, 5, 6])  # [1-4] [5,6]
    add_path(pool, index, "a", [1, 2, 3, 4, 5])  # [5] is a prefix of [5,6]: not added
    assert len(index) == 2
    add_path(pool, index, "a", [1, 2, 3, 4, 5, 6, 7, 8])  # full [5-8] replaces [5,6]
    assert len(index) == 2 and pool.n_retained == 2
    assert index.lookup("a", [1, 2, 3, 4, 5, 6, 7, 8, 9]).n_hit == 8


def test_lru_eviction_takes_oldest_leaves_first() -> None:
    pool, index = make()
    add_path(pool, index, "a", [1, 1, 1, 1, 2, 2, 2, 2])
    add_path(pool, index, "a", [1, 1, 1, 1, 3, 3, 3, 3])
    index.lookup("a", [1, 1, 1, 1, 2, 2])  # touch the first branch
    evicted: list[tuple[int, ...]] = []
    index.on_evict = lambda ns, key: evicted.append(key)
    assert index.evict(1) == 1
    assert evicted == [(1, 1, 1, 1, 3, 3, 3, 3)]
    assert index.evict(5) == 2  # then the other leaf, then the now-leaf root page
    assert len(index) == 0 and pool.n_free == 32


def test_lookup_without_touch_keeps_lru_order() -> None:
    pool, index = make()
    add_path(pool, index, "a", [1, 1, 1, 1])
    add_path(pool, index, "a", [2, 2, 2, 2])
    index.lookup("a", [1, 1, 1, 1], touch=False)
    evicted: list[tuple[int, ...]] = []
    index.on_evict = lambda ns, key: evicted.append(key)
    index.evict(1)
    assert evicted == [(1, 1, 1, 1)]


def test_held_pages_are_not_evicted() -> None:
    pool, index = make()
    add_path(pool, index, "a", [1, 1, 1, 1])
    node = index.lookup("a", [1, 1, 1, 1]).nodes[0]
    pool.incref(node.page)
    assert index.evict(1) == 0
    pool.decref(node.page)
    index.note_released(node.page)
    assert index.evict(1) == 1


def test_continuation_follows_most_recent_branch() -> None:
    pool, index = make()
    add_path(pool, index, "a", [1, 1, 1, 1, 2, 2, 2, 2, 4])
    add_path(pool, index, "a", [1, 1, 1, 1, 3, 3, 3, 3])
    m = index.lookup("a", [1, 1, 1, 1, 9])
    assert [n.tokens for n in index.continuation("a", m)] == [(3, 3, 3, 3)]
    index.lookup("a", [1, 1, 1, 1, 2])
    m = index.lookup("a", [1, 1, 9], touch=False)
    assert [n.tokens for n in index.continuation("a", m)] == [(1, 1, 1, 1), (2, 2, 2, 2), (4,)]


def test_erase_namespace() -> None:
    pool, index = make()
    add_path(pool, index, "a", list(range(8)))
    add_path(pool, index, "b", list(range(8)))
    assert index.erase_namespace("a") == 2
    assert index.lookup("a", list(range(8))).n_hit == 0
    assert index.lookup("b", list(range(8))).n_hit == 8
    assert pool.n_free == 30


def _keyed(index: PrefixIndex, ns: object, tokens: list[int], touch: bool = False) -> tuple[int, tuple, str]:
    m = index.lookup(ns, tokens, touch=touch, key=token_bytes(tokens))
    return m.n_hit, m.nodes, m.stop_reason


def _walked(index: PrefixIndex, ns: object, tokens: list[int]) -> tuple[int, tuple, str]:
    """Without the key: every page looked up from the root (and the remembered walk kept)."""
    m = index.lookup(ns, tokens, touch=False)
    return m.n_hit, m.nodes, m.stop_reason


def test_remembered_walk_gives_the_trees_answer() -> None:
    """Keyed lookups, which start from the previous keyed lookup's walk, find what a walk from
    the root finds, through inserts, evictions, erasures, other namespaces and shorter prompts."""
    import random

    rng = random.Random(5)
    pool = PagePool(48, PS)
    index = PrefixIndex(pool)
    base = [[rng.randrange(6) for _ in range(rng.randrange(8, 24))] for _ in range(2)]
    docs = [b[: rng.randrange(len(b))] + [rng.randrange(6) for _ in range(rng.randrange(9))]
            for b in base for _ in range(3)]
    for step in range(800):
        op = rng.random()
        ns = rng.choice("ab")
        doc = rng.choice(docs)
        tokens = doc[: rng.randrange(1, len(doc) + 1)] + [rng.randrange(6) for _ in range(rng.randrange(3))]
        if op < 0.2 and pool.n_free >= -(-len(tokens) // PS):
            add_path(pool, index, ns, tokens)
        elif op < 0.3:
            index.evict(rng.randrange(1, 4))
        elif op < 0.32:
            index.erase_namespace(ns)
        elif op < 0.6:
            _keyed(index, rng.choice("ab"), rng.choice(docs), touch=True)  # another walk kept
        # the walk kept before the change above
        res = _keyed(index, ns, tokens)
        assert res == _walked(index, ns, tokens), step
        assert all(n.alive for n in res[1])


def test_remembered_walk_forgets_removed_nodes() -> None:
    pool, index = make()
    add_path(pool, index, "a", list(range(12)))
    assert _keyed(index, "a", list(range(12)))[0] == 12
    index.evict(1)  # the last page
    n_hit, nodes, _ = _keyed(index, "a", list(range(12)))
    assert n_hit == 8 and len(nodes) == 2
    index.evict(2)
    assert _keyed(index, "a", list(range(12)))[2] == "miss"
    add_path(pool, index, "a", list(range(4)))  # a new node under a new root
    n_hit, nodes, _ = _keyed(index, "a", list(range(12)))
    assert n_hit == 4 and nodes[0].alive
    assert _keyed(index, "b", list(range(12)))[2] == "miss"  # another namespace: nothing remembered
