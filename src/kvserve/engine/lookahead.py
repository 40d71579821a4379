"""The next decode step planned before the previous one's tokens have reached the host.

Overlap (``pipeline``) needs step N+1 launched while the host commits step N. At that moment
step N's sampled tokens exist only on the device, so N+1 is a plan of *fed* chunks
(``Plan.feed``): each decoding sequence's next token is "row r of step N's samples", at the
position after step N's. Only the steady state is planned this way:

    every running sequence is decoding and was sampled in step N on the fast path
    nothing waits (no queued request, no cancellation, no pending KV move)
    no row needs its token on the host first: no grammar, no reasoning budget (either may
        change the token the host keeps), no penalties (their counts include step N's token)
    every page it needs is free now: nothing is preempted, no context shift is due

Anything else returns None and the engine commits step N before it plans again, exactly as
without overlap. A sequence whose step-N token is its last by ``n_predict`` gets no chunk; one
that ends for another reason (end of generation, a stop string) is found out at step N's commit,
and its row of step N+1 is dropped there: one wasted row, never a wrong token. Its pages are
released at that commit while step N+1 may still be running on the device; the device runs
steps in order, so the pages are reused only by work queued after step N+1.

Page accounting: step N's chunk wrote position ``n_computed`` (counters advance at the commit),
so N+1's chunk is at ``n_computed + 1`` and the pages are reserved for ``n_computed + 2``
positions; a sequence that then ends frees them with the rest.
"""

from __future__ import annotations

from typing import Any

from ..cache.page_pool import OutOfPages
from ..plan import FED, Plan, SeqChunk
from .records import maker
from .sequence import SeqState

_FED_TOKENS = (FED,)


_chunk = maker(SeqChunk)  # every field, in order (records.py)


def plan_ahead(sch: Any, launched: Any) -> Plan | None:
    """The decode step after ``launched`` (a ``scheduler.Launched`` whose sampling is still on
    the device), or None when it must wait for that step's commit. ``sch``: the Scheduler."""
    tokens = getattr(launched.job, "tokens", None)
    if tokens is None or sch.waiting or sch.cancelled or not launched.due:
        return None
    running = sch.running
    rows = {seq.id: i for i, seq in enumerate(launched.due)}
    if len(rows) != len(running):
        return None
    cfg = sch.cfg
    n_ctx_slot, n_predict_default = cfg.n_ctx_slot, cfg.n_predict
    reserve = sch.cache.reserve
    decode = SeqState.DECODE
    chunks: list[SeqChunk] = []
    feed: list[int] = []
    for seq in running.values():
        row = rows.get(seq.id)
        sampler = seq.sampler
        # a grammar, a reasoning budget or penalties: the row needs its token on the host first
        if row is None or seq.state is not decode or seq.cancelled or seq.pending_moves \
                or sampler.grammar is not None or sampler.budget is not None \
                or sampler.plan[:1] == ("penalties",):
            return None
        n_predict = seq.req.params.n_predict
        if n_predict == -1:
            n_predict = n_predict_default
        if n_predict >= 0 and seq.n_decoded + 1 >= max(1, n_predict):
            continue  # the token in flight is its last
        start = seq.n_computed + 1
        if start + 1 >= n_ctx_slot:
            return None  # the slot's end: a context shift or a stop, decided after the commit
        try:
            table = tuple(reserve(seq.id, start + 1))
        except OutOfPages:
            return None  # pages only by preemption: decided after the commit
        chunks.append(_chunk(seq.id, _FED_TOKENS, start, table, "last"))  # SeqChunk
        feed.append(row)
    if not chunks:
        return None
    # host-tier copies issued by these reservations (evictions) run before the step, as always
    return Plan(tuple(chunks), (), sch.cache.take_copies(), feed=tuple(feed))
