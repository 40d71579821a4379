"""Context shift on a paged sequence: drop ``[n_keep, n_keep + n_discard)``, move the rest left.

    old positions   [0, n_keep) | [n_keep, n_keep+n_discard) | [n_keep+n_discard, n_tokens)
    new positions   [0, n_keep) |        (dropped)          | [n_keep, n_tokens-n_discard)

Pages ``[0, n_keep // ps)`` are untouched and stay in the table (shared or not). Every later
page of the new table must be private, because it is written (by the shift, or by the next
forward at position ``n_tokens - n_discard``): a private old page is rewritten in place, a
shared one is replaced by a fresh page (copy on write of its first ``n_keep % ps`` rows
when ``n_keep`` is not page aligned).

The shift itself is one ``KVMove`` with ``delta = -n_discard``; its source and destination
rows may overlap on pages rewritten in place, so the runner must gather all source rows
of a move before scattering them (see ``KVCacheManager`` for the move contract).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvserve.cache.moves import move
from kvserve.plan import KVMove


class ShiftPlan(NamedTuple):
    pages: list[int]  # new page table, ceil((n_tokens - n_discard) / ps) pages
    moves: list[KVMove]  # run in order, before the next forward of the sequence
    dropped: list[int]  # old pages not in the new table; still read by ``moves``
    n_fresh: int  # pages taken from ``alloc``


def plan_shift(
    pages: Sequence[int],
    n_keep: int,
    n_discard: int,
    n_tokens: int,
    page_size: int,
    is_private: Callable[[int], bool],
    alloc: Callable[[int], list[int]],
) -> ShiftPlan:
    """Pure planning plus one ``alloc`` call (all or nothing; it may raise OutOfPages, and
    then nothing has changed)."""
    ps = page_size
    if n_keep < 0 or n_discard < 0 or n_keep + n_discard > n_tokens or n_tokens > len(pages) * ps:
        raise ValueError(f"bad shift: keep={n_keep} discard={n_discard} n_tokens={n_tokens}")
    if n_discard == 0:
        return ShiftPlan(list(pages), [], [], 0)
    new_len = n_tokens - n_discard
    n_new = -(-new_len // ps)
    first = n_keep // ps  # first page whose rows may change
    replace = [j for j in range(first, n_new) if not is_private(pages[j])]
    fresh = alloc(len(replace)) if replace else []
    new_pages = list(pages[:n_new])
    for j, p in zip(replace, fresh):
        new_pages[j] = p
    moves: list[KVMove] = []
    r = n_keep % ps
    if r and replace and replace[0] == first:
        moves.append(move(pages, first * ps, new_pages, first * ps, r, ps))  # COW, delta 0
    if new_len > n_keep:
        moves.append(move(pages, n_keep + n_discard, new_pages, n_keep, new_len - n_keep, ps))
    dropped = [pages[j] for j in replace] + list(pages[n_new:])
    return ShiftPlan(new_pages, moves, dropped, len(fresh))
