"""Admission's shortcuts against the plain scan: the prompt's bytes for the cache lookup, the
list of sequences still computing a shared prefix (instead of every running one), and slot
choice over an index synced once per admission round. Bursts over shared documents, waves of
arrivals, cancellations and page pressure give the same plans, slots and events either way."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvserve.cache.manager import KVCacheManager
from kvserve.engine.scheduler import Scheduler
from kvserve.engine.slot_choice import SlotChooser

from .scheduler_harness import Harness


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shortcut off: no keys, the scan over every running sequence, a sync per choice."""
    try_begin, choose = Scheduler._try_begin, SlotChooser.choose
    begin, lookup_len = KVCacheManager.begin, KVCacheManager.lookup_len

    def plain_try_begin(self: Scheduler, seq: Any) -> None:
        self._sharers = None
        try_begin(self, seq)

    monkeypatch.setattr(Scheduler, "_try_begin", plain_try_begin)
    monkeypatch.setattr(SlotChooser, "choose", lambda self, *a, **k: choose(self, *a[:4], None, True))
    monkeypatch.setattr(KVCacheManager, "begin", lambda self, *a: begin(self, *a[:6]))
    monkeypatch.setattr(KVCacheManager, "lookup_len",
                        lambda self, ns, toks, key=None: lookup_len(self, ns, toks))


def _run(seed: int, n_pages: int) -> list[Any]:
    rng = random.Random(seed)
    h = Harness(n_pages=n_pages, page_size=4, n_slots=6, n_ctx_slot=64, n_batch=16)
    docs = [[rng.randrange(1, 50) for _ in range(rng.randrange(12, 30))] for _ in range(2)]
    record: list[Any] = []
    schedule = h.sch.schedule

    def recorded() -> Any:
        plan = schedule()
        record.append(None if plan is None else [(c.seq_id, c.tokens, c.start_pos, c.page_table)
                                                 for c in plan.chunks])
        record.append([(s.id, s.seq_id) for s in h.sch.slots])
        return plan

    h.sch.schedule = recorded  # type: ignore[method-assign]
    subs = []
    for step in range(400):
        if step % 7 == 0 and len(subs) < 40:
            for _ in range(rng.randrange(1, 8)):  # a burst over a document
                d = rng.choice(docs)
                prompt = d[: rng.randrange(len(d) // 2, len(d) + 1)] + [rng.randrange(1, 50)
                                                                        for _ in range(rng.randrange(4))]
                subs.append(h.submit(prompt, rng.randrange(1, 8)))
        for rid, _ in subs:
            if rng.random() < 0.004:
                h.sch.cancel(rid)
        if not h.sch.has_work() and len(subs) >= 40:
            break
        h.step()
    h.run()
    for _, ev in subs:
        record.append([(type(e).__name__, getattr(e, "tokens", None), getattr(e, "n_cached", None))
                       for e in ev.events])
    h.assert_idle()
    return record


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("n_pages", [24, 200])
def test_admission_shortcuts_change_nothing(seed: int, n_pages: int, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _run(seed, n_pages)
    _plain(monkeypatch)
    assert _run(seed, n_pages) == fast


def test_intake_takes_a_submitted_prompt_key_and_checks_its_range() -> None:
    from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
    from kvserve.engine.slots import token_bytes

    from tests.events import GREEDY, Collector

    h = Harness(n_pages=64, page_size=4, n_slots=2, n_ctx_slot=64)

    def add(prompt: list[int], key: bytes | None) -> tuple[GenerationRequest, Collector]:
        ev = Collector()
        req = GenerationRequest(len(h.sch.waiting) + 100, prompt, RequestParams(n_predict=2, sampling=GREEDY),
                                CacheIdentity(), prompt_key=key)
        h.sch.add(req, ev)
        return req, ev

    made = token_bytes([1, 2, 3])
    req, ev = add([1, 2, 3], made)
    assert req.prompt_key is made and not ev.events  # taken as it is
    _, ev = add([1, 2, 3], token_bytes([1, 2, 99]))  # its range is read from the key given
    assert ev.error is not None and ev.error.code == 400 and ev.error.message == "Prompt contains invalid tokens"
    req, ev = add([4, 5, 6, 7], made)  # not this prompt's length: made again from the tokens
    assert req.prompt_key == token_bytes([4, 5, 6, 7]) and not ev.events
    _, ev = add([4, 5, 99], None)  # none given: the tokens' own check
    assert ev.error is not None and ev.error.code == 400
