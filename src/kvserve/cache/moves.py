"""Build ``KVMove``s from absolute positions in page lists.

A page list maps position ``p`` to (``pages[p // page_size]``, row ``p % page_size``). A move
names only the pages it touches: positions ``[start, start + n)`` of a list become the slice
``pages[start // ps : ceil((start + n) / ps)]`` with ``start % ps`` as the first row.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvserve.plan import KVMove


def span(pages: Sequence[int], start: int, n: int, page_size: int) -> tuple[tuple[int, ...], int]:
    """Pages covering positions ``[start, start + n)`` and the row of ``start`` in the first."""
    first = start // page_size
    last = (start + n + page_size - 1) // page_size  # exclusive
    if n <= 0 or last > len(pages):
        raise ValueError(f"positions [{start}, {start + n}) outside a {len(pages)}-page list")
    return tuple(pages[first:last]), start % page_size


def move(
    src_pages: Sequence[int],
    src_pos: int,
    dst_pages: Sequence[int],
    dst_pos: int,
    n: int,
    page_size: int,
) -> KVMove:
    """Copy positions ``[src_pos, src_pos + n)`` of ``src_pages`` to ``[dst_pos, dst_pos + n)``
    of ``dst_pages``; ``delta = dst_pos - src_pos`` re-rotates the keys."""
    sp, s0 = span(src_pages, src_pos, n, page_size)
    dp, d0 = span(dst_pages, dst_pos, n, page_size)
    return KVMove(sp, s0, dp, d0, n, dst_pos - src_pos)
