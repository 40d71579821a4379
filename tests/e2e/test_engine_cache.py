"""Prompt cache end to end on SmolLM2: exact reuse counts and identical greedy output."""

from __future__ import annotations

import pytest

from .engine_harness import assert_idle, make_engine, run, submit

from ..conftest import TEXTS


@pytest.fixture(scope="module")
def tok(smollm):
    from kvserve.model.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm.metadata)


def test_same_prompt_twice_reuses_n_minus_1_and_matches_uncached(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    ids = tok.encode(TEXTS[0], add_special=True, parse_special=False)
    _, a = submit(eng, ids, cache_prompt=False)
    run(eng, [a])
    _, b = submit(eng, ids)
    run(eng, [b])
    _, c = submit(eng, ids)
    run(eng, [c])
    assert a.final.n_cached == 0
    assert b.final.n_cached == 0  # a had cache_prompt false: nothing was donated
    assert c.final.n_cached == len(ids) - 1
    assert a.final.content == b.final.content == c.final.content
    assert a.final.tokens == c.final.tokens
    assert_idle(eng)


def test_siblings_share_the_common_prefix_exactly(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    base = tok.encode(TEXTS[2], add_special=True, parse_special=False)
    p1 = base + tok.encode(" Question: how long to bake?", add_special=False, parse_special=False)
    p2 = base[:-3] + tok.encode(" What flour?", add_special=False, parse_special=False)
    _, a = submit(eng, p1)
    run(eng, [a])
    _, b = submit(eng, p2)
    run(eng, [b])
    common = next(i for i, (x, y) in enumerate(zip(p1, p2)) if x != y)
    assert b.final.n_cached == common and common % 16 != 0 or b.final.n_cached == common
    # The uncached answer is the same.
    _, c = submit(eng, p2, cache_prompt=False)
    run(eng, [c])
    assert c.final.content == b.final.content
    assert_idle(eng)


def test_generated_tokens_are_donated_for_multiturn(smollm, tok):
    eng = make_engine(smollm, n_slots=1)
    p1 = tok.encode(TEXTS[1], add_special=True, parse_special=False)
    _, a = submit(eng, p1, n_predict=20)
    run(eng, [a])
    p2 = p1 + a.final.tokens + tok.encode("\n# next", add_special=False, parse_special=False)
    _, b = submit(eng, p2)
    run(eng, [b])
    # KV holds the prompt and all generated tokens but the last (never evaluated).
    assert b.final.n_cached == len(p1) + len(a.final.tokens) - 1
    assert a.final.tokens_cached == len(p1) + len(a.final.tokens) - 1
    _, cold = submit(eng, p2, cache_prompt=False)
    run(eng, [cold])
    assert cold.final.tokens == b.final.tokens  # the second turn answers the same from cache
    assert_idle(eng)


def test_burst_on_a_new_document_computes_it_once(smollm, tok):
    eng = make_engine(smollm, n_slots=8, n_batch=512)
    doc = tok.encode(" ".join(TEXTS), add_special=True, parse_special=False)
    cols = []
    for i in range(8):
        q = tok.encode(f"\nQuestion {i}: summarise part {i}.", add_special=False, parse_special=False)
        col = submit(eng, doc + q, n_predict=4)[1]
        col.prompt = doc + q
        cols.append(col)
    run(eng, cols)
    evaluated = eng.scheduler.stats.prompt_tokens_total
    suffixes = sum(c.final.n_prompt - c.final.n_cached for c in cols[1:])
    assert evaluated == len(doc) + (cols[0].final.n_prompt - len(doc)) + suffixes
    assert evaluated < len(doc) + 8 * 40, evaluated  # not 8 x the document
    assert all(c.final.n_cached >= (len(doc) // 16) * 16 for c in cols[1:])
    for i in (1, 6):  # answers equal those of uncached runs of the same prompts
        _, cold = submit(eng, list(cols[i].prompt), n_predict=4, cache_prompt=False)
        run(eng, [cold])
        assert cold.final.tokens == cols[i].final.tokens
    assert_idle(eng)


def test_tenants_never_share(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    ids = tok.encode(TEXTS[0], add_special=True, parse_special=False)
    _, a = submit(eng, ids, tenant="key-a")
    run(eng, [a])
    _, b = submit(eng, ids, tenant="key-b")
    run(eng, [b])
    _, c = submit(eng, ids, tenant="key-a")
    run(eng, [c])
    assert b.final.n_cached == 0
    assert c.final.n_cached == len(ids) - 1
    assert_idle(eng)


def test_cache_ram_zero_retains_nothing(smollm, tok):
    eng = make_engine(smollm, n_slots=1, cache_ram_mib=0)
    ids = tok.encode(TEXTS[0], add_special=True, parse_special=False)
    _, a = submit(eng, ids)
    run(eng, [a])
    _, b = submit(eng, ids)
    run(eng, [b])
    assert b.final.n_cached == 0 and a.final.content == b.final.content
    assert eng.cache.stats().retained_pages == 0
    assert_idle(eng)


def test_gemma3_sliding_window_prefix_reuse_beyond_the_window(gemma):
    """Gemma 3 (SWA window 512): reuse of a prefix longer than the window gives the same
    greedy output as a cold run."""
    from kvserve.model.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(gemma.metadata)
    eng = make_engine(gemma, n_slots=2, n_ctx=2048, n_batch=512)
    doc = tok.encode(" ".join(TEXTS * 2), add_special=True, parse_special=False)
    assert len(doc) > 600
    p1 = doc + tok.encode(" In one word, the topic is", add_special=False, parse_special=False)
    _, a = submit(eng, p1, n_predict=8)
    run(eng, [a])
    _, b = submit(eng, p1, n_predict=8)
    run(eng, [b])
    _, c = submit(eng, p1, n_predict=8, cache_prompt=False)
    run(eng, [c])
    assert b.final.n_cached == len(p1) - 1
    assert a.final.tokens == b.final.tokens == c.final.tokens
    assert_idle(eng)


def test_cache_reuse_moves_a_shifted_chunk(smollm, tok):
    """--cache-reuse: a cached chunk that reappears later in the prompt is shifted into place."""
    eng = make_engine(smollm, n_slots=1)
    head = tok.encode("Header A.", add_special=True, parse_special=False)
    body = tok.encode(" " + TEXTS[0], add_special=False, parse_special=False)
    _, a = submit(eng, head + body, n_predict=2)
    run(eng, [a])
    # The new prompt drops two header tokens: the body moved left.
    p2 = head[:-2] + body + tok.encode(" Summary:", add_special=False, parse_special=False)
    _, b = submit(eng, p2, n_predict=2, n_cache_reuse=32)
    run(eng, [b])
    st = eng.cache.stats()
    assert st.tokens_reused_shift >= len(body) - 1
    assert b.final.n_cached >= len(head) - 2 + len(body) - 1
    _, c = submit(eng, p2, n_predict=2, n_cache_reuse=0)
    run(eng, [c])
    assert c.final.n_cached == len(head) - 2  # without reuse only the common prefix is reused
    assert_idle(eng)


def test_retained_pages_never_exceed_the_budget_under_churn(smollm, tok):
    # A budget of 1 MiB: ~14 pages of SmolLM2 f16 KV (16 tokens x 30 layers x 2 x 3 x 64 x 2 B).
    eng = make_engine(smollm, n_slots=2, cache_ram_mib=1)
    limit = eng.cache.retain_limit_pages
    assert 0 < limit < 40
    peak = 0

    def watch(e):
        nonlocal peak
        peak = max(peak, e.cache.stats().retained_pages)

    for i in range(8):
        _, col = submit(eng, tok.encode(f"Churn {i}: " + TEXTS[i % 3], add_special=True, parse_special=False), n_predict=2)
        run(eng, [col], on_step=watch)
    assert 0 < peak <= limit
    assert eng.cache.stats().evictions > 0
    assert_idle(eng)


def test_no_cache_idle_slots_keeps_kv_to_its_slot(smollm, tok):
    """--no-cache-idle-slots: a finished request's KV is reused by its own slot only."""
    eng = make_engine(smollm, n_slots=2, cache_idle_slots=False)
    ids = tok.encode(TEXTS[0], add_special=True, parse_special=False)
    _, a = submit(eng, ids, id_slot=0)
    run(eng, [a])
    _, other = submit(eng, ids, id_slot=1)
    run(eng, [other])
    _, same = submit(eng, ids, id_slot=0)
    run(eng, [same])
    assert other.final.n_cached == 0
    assert same.final.n_cached == len(ids) - 1
    assert a.final.content == other.final.content == same.final.content
    assert_idle(eng)


def test_host_tier_brings_evicted_prompts_back_with_the_same_answers(smollm, tok):
    """A pool of a few prompts' worth of pages and a host tier: later prompts push the first
    one's pages out to host memory; asked again, it is found there, loaded back, and answered
    exactly as from scratch. /metrics and /props count both tiers."""
    eng = make_engine(smollm, n_slots=1, n_ctx=128, host_tier=True, cache_ram_mib=64)  # 12 pages
    assert eng.cache.host is not None and eng.runner.host_kv is not None
    prompts = [tok.encode(t, add_special=True, parse_special=False)[:100] for t in TEXTS[:3]]
    first = []
    for p in prompts:
        _, c = submit(eng, p, n_predict=8)
        run(eng, [c])
        first.append(c.final)
    st = eng.cache.stats()
    assert st.offloaded_pages > 0 and st.host_pages > 0
    _, again = submit(eng, prompts[0], n_predict=8)
    run(eng, [again])
    assert again.final.n_cached == len(prompts[0]) - 1
    assert again.final.tokens == first[0].tokens
    st = eng.cache.stats()
    assert st.loaded_pages >= 4 and st.tokens_loaded >= 64
    m = eng.metrics_snapshot()
    assert m['kvserve:cache_tokens_reused_total{source="host"}'] == st.tokens_loaded
    assert m["kvserve:cache_host_offloads_total"] == st.offloaded_pages
    assert m['kvserve:cache_tier_bytes{tier="host"}'] == st.host_pages * eng.page_bytes
    info = eng.cache_info()
    host = info["tiers"]["host"]
    assert info["cache_ram_budget_bytes"] == host["budget_bytes"] == (64 << 20) // eng.page_bytes * eng.page_bytes
    assert host["loaded_pages"] == st.loaded_pages and host["bytes"] <= host["budget_bytes"]
    assert eng.memory_info()["host_tier_allocated_bytes"] > 0
    _, cold = submit(eng, prompts[0], n_predict=8, cache_prompt=False)
    run(eng, [cold])
    assert cold.final.tokens == first[0].tokens
    assert_idle(eng)
