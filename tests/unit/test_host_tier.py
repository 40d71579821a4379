"""The host tier of the prompt cache: pages the device pool evicts move to host slots within a
strict budget and come back on a prefix hit. Bookkeeping through the real scheduler and cache
on a fake model (rows simulated, ``check_integrity()`` after every step), and the copies on
real KV tensors (``HostKVStore`` over CPU tensors runs the same code as over pinned memory)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from kvserve.cache import KVCacheManager
from kvserve.model.host_kv import HostKVStore
from kvserve.model.kv_store import PagedKVStore
from kvserve.plan import TierCopy

from .scheduler_harness import Harness, reference


def _prompts(n: int, seed: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 50) for _ in range(length)] for _ in range(n)]


@pytest.mark.parametrize("host", [6, 40, None], ids=["small", "roomy", "unbounded"])
def test_evicted_prompts_come_back_from_the_host(host: int | None) -> None:
    """Eight 17-token prompts through a 14-page pool, then the same prompts again: the second
    round finds them (the first ones from the host tier), with the tokens of an uncached run;
    the host never holds more than its budget."""
    h = Harness(n_pages=14, page_size=4, n_slots=2, n_ctx_slot=40, n_batch=16, host=host)
    prompts = _prompts(8, 5, 17)
    peak = 0
    for rnd in range(2):
        for p in prompts:
            _, ev = h.submit(p, 6)
            while h.sch.has_work():
                h.step()
                peak = max(peak, h.mgr.stats().host_pages)
            assert ev.final is not None and ev.final.tokens == reference(p, 6)
            if rnd == 1 and (host is None or host >= 40):
                assert ev.final.n_cached == len(p) - 1  # every page still findable
    st = h.mgr.stats()
    assert st.offloaded_pages > 0 and st.loaded_pages > 0 and st.tokens_loaded > 0
    assert host is None or peak <= host
    if host == 6:
        assert st.host_evictions > 0
    h.assert_idle()


def test_without_host_tier_the_same_run_recomputes() -> None:
    h = Harness(n_pages=14, page_size=4, n_slots=2, n_ctx_slot=40, n_batch=16)
    prompts = _prompts(8, 5, 17)
    for p in prompts + prompts[:1]:
        _, ev = h.submit(p, 6)
        h.run()
    assert ev.final is not None and ev.final.n_cached < 4  # evicted and gone (a common first token at most)
    assert h.mgr.stats().offloaded_pages == 0


def test_copies_of_a_plan_run_before_its_moves_and_in_order() -> None:
    """The scheduler hands the copies it caused to the plan that follows them; a hit on a page
    that was moved out loads it into a fresh device page before the partial-page copy reads it."""
    mgr = KVCacheManager(6, 4, None, host_tier=True, host_limit_pages=8)
    a = list(range(1, 11))  # 10 tokens: pages of 4, 4 and 2
    mgr.begin(1, "ns", a)
    mgr.reserve(1, 10)
    mgr.finish(1, a, 10)
    assert not mgr.take_copies()
    b = list(range(20, 44))  # needs all 6 pages: a's 3 pages move to the host
    mgr.begin(2, "ns", b, n_reserve=24)
    copies = mgr.take_copies()
    assert [c.to_host for c in copies] == [True] * 3 and mgr.stats().host_pages == 3
    mgr.finish(2, b, 0, donate=False)
    adm = mgr.begin(3, "ns", a[:9] + [99])  # hits 9 tokens: two full pages and one row of the third
    loads = mgr.take_copies()
    assert [c.to_host for c in loads] == [False] * 3
    assert adm.n_cached == 9 and adm.page_table[:2] == tuple(c.page for c in loads[:2])
    assert adm.moves and adm.moves[0].src_pages == (loads[2].page,)  # the copy reads the loaded page
    mgr.check_integrity()


DEVS = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _store(device: str, n_pages: int = 6, page_size: int = 4) -> PagedKVStore:
    cfg = SimpleNamespace(n_layer=3, n_head_kv=2, head_dim=8, kv_bytes_per_token=lambda es: 2 * 3 * 2 * 8 * es)
    kv = PagedKVStore(cfg, n_pages, page_size, torch.float32, torch.device(device))  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    kv.k.copy_(torch.randn(kv.k.shape, generator=g))
    kv.v.copy_(torch.randn(kv.v.shape, generator=g))
    return kv


def _page(kv: PagedKVStore, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = slice(p * kv.page_size, (p + 1) * kv.page_size)
    return kv.k[:, rows].clone(), kv.v[:, rows].clone()


@pytest.mark.parametrize("device", DEVS)
def test_host_store_round_trip_keeps_every_layer_and_row(device: str) -> None:
    """On CUDA the host side is pinned and every copy asynchronous: the order still holds."""
    kv = _store(device)
    host = HostKVStore(kv, capacity=4)
    assert host.pin == (device == "cuda")
    host.block_slots = 3  # two blocks: the slot arithmetic across blocks
    want = {p: _page(kv, p) for p in range(6)}
    host.run([TierCopy(True, 1, 3), TierCopy(True, 4, 0), TierCopy(True, 2, 2)])
    kv.k.zero_()
    kv.v.zero_()
    # a load, then an offload reusing its slot, then a load of that: order matters
    host.run([TierCopy(False, 5, 3), TierCopy(True, 0, 3), TierCopy(False, 2, 0), TierCopy(False, 3, 3)])
    for dst, src in ((5, 1), (2, 4)):
        k, v = _page(kv, dst)
        assert torch.equal(k, want[src][0]) and torch.equal(v, want[src][1])
    k, v = _page(kv, 3)  # slot 3 was rewritten with page 0 (zeroed by then)
    assert not k.any() and not v.any()
    assert host.allocated_bytes == 2 * 3 * 2 * kv.k[:, :4].numel() * 4
    with pytest.raises(ValueError):
        host.run([TierCopy(True, 0, 4)])  # beyond the budget


@pytest.mark.parametrize("device", DEVS)
def test_host_store_ranges_across_blocks_and_out_of_order(device: str) -> None:
    """A run of copies in any slot order, spanning two blocks with gaps, lands slot for slot."""
    kv = _store(device, n_pages=8)
    host = HostKVStore(kv, capacity=None)
    host.block_slots = 3
    want = {p: _page(kv, p) for p in range(8)}
    slots = {0: 4, 1: 2, 2: 3, 3: 7, 4: 0, 5: 5, 6: 1}  # page -> slot: blocks 0, 1 and 2
    host.run([TierCopy(True, p, s) for p, s in slots.items()])
    kv.k.zero_()
    kv.v.zero_()
    back = {s: p for p, s in slots.items()}
    dst = [7, 6, 5, 4, 3, 2, 1]  # load every slot into another page, in shuffled order
    order = [3, 0, 6, 1, 5, 2, 4]
    host.run([TierCopy(False, dst[i], list(back)[i]) for i in order])
    for i in range(7):
        k, v = _page(kv, dst[i])
        src = back[list(back)[i]]
        assert torch.equal(k, want[src][0]) and torch.equal(v, want[src][1]), (i, src)
