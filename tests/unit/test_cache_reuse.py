"""--cache-reuse (llama-server §3.4): the greedy chunk algorithm and the moves it becomes."""

from __future__ import annotations

from kvserve.cache import KVCacheManager
from kvserve.cache.kv_sim import SimDriver
from kvserve.cache.reuse import ReuseChunk, plan_chunk_reuse, trim_to
from kvserve.plan import KVMove

PS = 4


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


P, X, A, Y, B = seq(100, 6), seq(200, 5), seq(300, 7), seq(400, 3), seq(500, 9)


def test_deleted_middle_chunk_moves_left() -> None:
    cache, prompt = P + X + A + Y, P + A + [1, 2]
    assert plan_chunk_reuse(cache, prompt, len(P), 4) == [ReuseChunk(11, 6, 7)]
    assert ReuseChunk(11, 6, 7).delta == -5


def test_two_chunks_get_growing_negative_deltas() -> None:
    cache, prompt = P + X + A + Y + B, P + A + B
    chunks = plan_chunk_reuse(cache, prompt, len(P), 3)
    assert chunks == [ReuseChunk(11, 6, 7), ReuseChunk(21, 13, 9)]
    assert [c.delta for c in chunks] == [-5, -8]


def test_prompt_cursor_only_advances_on_a_match() -> None:
    # A is shorter than n_min: the prompt cursor stays on A[0] and B is never reached.
    cache, prompt = P + X + A + Y + B, P + A + B
    assert plan_chunk_reuse(cache, prompt, len(P), 8) == []
    # An insertion in the prompt blocks reuse the same way.
    assert plan_chunk_reuse(P + A, P + [7] + A, len(P), 2) == []
    assert plan_chunk_reuse(P + A, P + A, len(P), 0) == []  # 0 = off


def test_trim_keeps_one_prompt_token_to_evaluate() -> None:
    chunks = plan_chunk_reuse(P + X + A, P + A, len(P), 4)
    assert chunks == [ReuseChunk(11, 6, 7)]
    assert trim_to(chunks, 6, 12) == (6, [ReuseChunk(11, 6, 6)])
    assert trim_to([ReuseChunk(11, 6, 1)], 6, 6) == (6, [])
    assert trim_to([], 13, 12) == (12, [])


def absolute(mv: KVMove, table: tuple[int, ...]) -> int:
    """Absolute destination position of a move into a sequence's page table."""
    return table.index(mv.dst_pages[0]) * PS + mv.dst_start


def test_manager_moves_chunks_into_private_pages() -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)
    drv.request(1, "ns", P + X + A + Y + B, [9, 9])
    shared_before = {n.page for n in mgr.index.iter_nodes()}
    prompt = P + A + B + [7, 7]
    adm = drv.begin(2, "ns", prompt, n_cache_reuse=3)  # KVSim checks every row here
    assert (adm.n_hit, adm.n_reused_prefix, adm.n_reused_shift) == (6, 6, 16)
    assert adm.n_cached == 22 and len(adm.page_table) == 6
    cow, m1, m2 = adm.moves
    assert (cow.n_tokens, cow.delta, cow.src_start, cow.dst_start) == (2, 0, 0, 0)  # rows 4,5
    assert (m1.n_tokens, m1.delta, absolute(m1, adm.page_table)) == (7, -5, 6)
    assert (m2.n_tokens, m2.delta, absolute(m2, adm.page_table)) == (9, -8, 13)
    # Sources are the cached pages at positions 11 and 21; destinations are never shared.
    assert m1.src_pages[0] in shared_before and m1.src_start == 11 % PS
    assert m2.src_start == 21 % PS
    for mv in adm.moves:
        assert not set(mv.dst_pages) & shared_before
    assert mgr.stats().tokens_reused_shift == 16
    drv.compute(2, prompt, 22, len(prompt))
    mgr.finish(2, prompt, len(prompt))
    mgr.check_integrity()


def test_manager_whole_prompt_from_chunks_still_evaluates_last_token() -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)
    drv.request(1, "ns", P + X + A, [])
    adm = drv.begin(2, "ns", P + A, n_cache_reuse=4)
    assert adm.n_cached == len(P + A) - 1 and adm.n_reused_shift == len(A) - 1
    assert adm.moves[-1].delta == -len(X)


def test_reused_kv_is_not_donated_beyond_the_exact_prefix() -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)
    drv.request(1, "ns", P + X + A, [])
    drv.request(2, "ns", P + A + [5, 5, 5], [], n_cache_reuse=4)
    assert mgr.lookup_len("ns", P + A) == len(P)  # A at shifted positions stays private
    loose = KVCacheManager(64, PS, donate_approximate=True)
    drv = SimDriver(loose)
    drv.request(1, "ns", P + X + A, [])
    drv.request(2, "ns", P + A + [5, 5, 5], [], n_cache_reuse=4)
    assert loose.lookup_len("ns", P + A) == len(P + A)


def test_reuse_without_a_prefix_hit_and_after_a_page_aligned_hit() -> None:
    mgr = KVCacheManager(64, PS)
    drv = SimDriver(mgr)
    drv.request(1, "ns", seq(0, 8) + X + A, [])
    adm = drv.begin(2, "ns", seq(0, 8) + A + [1], n_cache_reuse=4)  # hit ends on a page edge
    assert (adm.n_reused_prefix, adm.n_reused_shift) == (8, 7) and adm.moves[0].delta == -5
    mgr.finish(2, [], 0)
    adm = drv.begin(3, "ns", A + [1], n_cache_reuse=4)  # no common prefix at all
    assert (adm.n_hit, adm.n_reused_shift, adm.moves[0].delta) == (0, 7, -13)
    mgr.finish(3, [], 0)
    mgr.check_integrity()
