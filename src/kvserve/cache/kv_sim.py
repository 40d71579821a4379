"""A stand-in for the KV tensors, for tests of anything that hands page tables and moves to
the runner: each row stores the ``(token, position)`` whose key/value it holds.

A forward writes ``(tokens[p], p)`` at position ``p``; a ``KVMove`` gathers its source rows,
adds ``delta`` to their positions (the rope shift) and scatters them. A sequence is correct
when rows ``[0, n)`` read ``(tokens[p], p)``, and an index node at depth ``d`` is correct when
its rows ``[0, len(tokens))`` read ``(tokens[r], d * page_size + r)``.
"""

from __future__ import annotations

from typing import Callable, Sequence

from kvserve.cache.prefix_index import PrefixIndex
from kvserve.engine.plan import KVMove

Row = tuple[int, int] | None


class KVSim:
    def __init__(self, n_pages: int, page_size: int, writable: Callable[[int], bool] | None = None):
        """``writable(page)``: asserted before every write (e.g. ``pool.is_private``)."""
        self.page_size = page_size
        self.rows: list[list[Row]] = [[None] * page_size for _ in range(n_pages)]
        self.writable = writable

    def _loc(self, pages: Sequence[int], pos: int) -> tuple[int, int]:
        q, r = divmod(pos, self.page_size)
        return pages[q], r

    def _check_write(self, page: int) -> None:
        if self.writable is not None:
            assert self.writable(page), f"write to shared page {page}"

    def apply(self, mv: KVMove) -> None:
        src = []
        for i in range(mv.n_tokens):
            page, row = self._loc(mv.src_pages, mv.src_start + i)
            val = self.rows[page][row]
            assert val is not None, f"move reads an unwritten row ({page}, {row})"
            src.append(val)
        for i, (tok, pos) in enumerate(src):  # scatter after the full gather
            page, row = self._loc(mv.dst_pages, mv.dst_start + i)
            self._check_write(page)
            self.rows[page][row] = (tok, pos + mv.delta)

    def forward(self, page_table: Sequence[int], tokens: Sequence[int], start: int, end: int) -> None:
        """Compute positions ``[start, end)`` of a sequence."""
        for p in range(start, end):
            page, row = self._loc(page_table, p)
            self._check_write(page)
            self.rows[page][row] = (tokens[p], p)

    def read(self, page_table: Sequence[int], start: int, end: int) -> list[Row]:
        return [self.rows[pg][r] for pg, r in (self._loc(page_table, p) for p in range(start, end))]

    def assert_seq(self, page_table: Sequence[int], tokens: Sequence[int], n: int) -> None:
        got = self.read(page_table, 0, n)
        want = [(tokens[p], p) for p in range(n)]
        if got != want:
            bad = next(p for p in range(n) if got[p] != want[p])
            raise AssertionError(f"position {bad}: row holds {got[bad]}, want {want[bad]}")

    def assert_index(self, index: PrefixIndex) -> None:
        ps = self.page_size
        for node in index.iter_nodes():
            for r, tok in enumerate(node.tokens):
                want = (tok, node.depth * ps + r)
                got = self.rows[node.page][r]
                assert got == want, f"index page {node.page} row {r}: {got} != {want}"
