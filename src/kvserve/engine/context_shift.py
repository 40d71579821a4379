"""Context shift (``--context-shift``): when a generating sequence's slot is full, drop part of
its context after the kept prefix and move the rest into place."""

from __future__ import annotations

import logging
from typing import Any

from .sequence import Sequence

log = logging.getLogger("kvserve.engine")


def context_shift(seq: Sequence, cfg: Any, cache: Any, add_bos: bool) -> None:
    """Keep ``n_keep`` tokens (the prompt when -1; BOS on top), drop ``n_discard`` after them
    (half the rest when 0) and queue the cache's moves with the sequence's next forward.
    ``cfg``: the scheduler's config; may raise ``OutOfPages`` with nothing changed."""
    n_ctx = cfg.n_ctx_slot
    p = seq.req.params
    n_keep = seq.n_prompt if p.n_keep < 0 else p.n_keep
    if add_bos:
        n_keep += 1
    n_keep = max(0, min(n_keep, n_ctx - 4))
    n_left = seq.n_computed - n_keep
    n_discard = p.n_discard if p.n_discard > 0 else n_left // 2
    n_discard = max(0, min(n_discard, n_left - 1))
    if n_discard <= 0:
        return
    moves = cache.shift(seq.id, n_keep, n_discard, seq.n_computed)
    del seq.tokens[n_keep : n_keep + n_discard]
    seq.n_computed -= n_discard
    seq.pending_moves = tuple(seq.pending_moves) + tuple(moves)
    seq.truncated = True
    log.info("task %d: context shift, n_keep = %d, n_discard = %d", seq.id, n_keep, n_discard)
