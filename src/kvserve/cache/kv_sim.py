"""A stand-in for the KV tensors, for tests of anything that hands page tables and moves to
the runner: each row stores the ``(token, position)`` whose key/value it holds.

A forward writes ``(tokens[p], p)`` at position ``p``; a ``KVMove`` gathers its source rows,
adds ``delta`` to their positions (the rope shift) and scatters them. A sequence is correct
when rows ``[0, n)`` read ``(tokens[p], p)``, and an index node at depth ``d`` is correct when
its rows ``[0, len(tokens))`` read ``(tokens[r], d * page_size + r)`` — in its device page, or
in its host slot for a node on the host tier (``TierCopy`` records move whole pages between
the two).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from kvserve.cache.manager import KVCacheManager
from kvserve.cache.prefix_index import PrefixIndex
from kvserve.cache.types import Admission
from kvserve.plan import KVMove, TierCopy

Row = tuple[int, int] | None


class KVSim:
    def __init__(self, n_pages: int, page_size: int, writable: Callable[[int], bool] | None = None):
        """``writable(page)``: asserted before every write (e.g. ``pool.is_private``)."""
        self.page_size = page_size
        self.rows: list[list[Row]] = [[None] * page_size for _ in range(n_pages)]
        self.host: dict[int, list[Row]] = {}  # host slot -> its rows
        self.writable = writable

    def copy(self, c: TierCopy) -> None:
        """A host-tier copy of a whole page."""
        if c.to_host:
            self.host[c.slot] = list(self.rows[c.page])
        else:
            assert c.slot in self.host, f"load from host slot {c.slot}, never written"
            self.rows[c.page] = list(self.host[c.slot])

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
        for node in index.iter_host_nodes():
            for r, tok in enumerate(node.tokens):
                want = (tok, node.depth * ps + r)
                got = self.host[node.host][r]
                assert got == want, f"host slot {node.host} row {r}: {got} != {want}"


class SimDriver:
    """Drives a ``KVCacheManager`` the way the scheduler does, checking rows with ``KVSim``:
    after ``begin`` (moves applied) and after every computed chunk, the sequence's rows must
    read its tokens at their positions, and writes may only hit private pages."""

    def __init__(self, mgr: KVCacheManager) -> None:
        self.mgr = mgr
        self.kv = KVSim(mgr.pool.n_pages, mgr.page_size, writable=mgr.pool.is_private)

    def sync(self) -> None:
        """Run the host-tier copies issued so far (before anything touches KV rows)."""
        for c in self.mgr.take_copies():
            self.kv.copy(c)

    def begin(
        self, seq_id: int, ns: Hashable, tokens: Sequence[int], use_cache: bool = True, n_cache_reuse: int = 0
    ) -> Admission:
        adm = self.mgr.begin(seq_id, ns, tokens, use_cache, n_cache_reuse)
        self.sync()
        for mv in adm.moves:
            self.kv.apply(mv)
        self.kv.assert_seq(adm.page_table, tokens, adm.n_cached)
        return adm

    def compute(self, seq_id: int, tokens: Sequence[int], start: int, end: int, publish: bool = True) -> None:
        """One step: reserve, forward positions ``[start, end)``, then publish."""
        self.mgr.reserve(seq_id, end)
        self.sync()
        pt = self.mgr.page_table(seq_id)
        self.kv.forward(pt, tokens, start, end)
        self.kv.assert_seq(pt, tokens, end)
        if publish:
            self.mgr.publish(seq_id, tokens, end)
            self.kv.assert_seq(self.mgr.page_table(seq_id), tokens, end)

    def shift(self, seq_id: int, tokens: list[int], n_keep: int, n_discard: int) -> list[int]:
        """Context shift of a sequence whose ``len(tokens)`` positions are all computed;
        returns the compacted token list."""
        moves = self.mgr.shift(seq_id, n_keep, n_discard, len(tokens))
        self.sync()
        for mv in moves:
            self.kv.apply(mv)
        new = tokens[:n_keep] + tokens[n_keep + n_discard :]
        self.kv.assert_seq(self.mgr.page_table(seq_id), new, len(new))
        return new

    def request(
        self,
        seq_id: int,
        ns: Hashable,
        prompt: Sequence[int],
        generated: Sequence[int] = (),
        use_cache: bool = True,
        n_cache_reuse: int = 0,
        chunk: int = 0,
    ) -> Admission:
        """A whole request: prompt (in chunks of ``chunk`` tokens, 0 = at once), then one step
        per generated token (the last sampled token is never computed), then finish."""
        adm = self.begin(seq_id, ns, prompt, use_cache, n_cache_reuse)
        toks = list(prompt)
        pos = adm.n_cached
        while pos < len(toks):
            end = len(toks) if chunk <= 0 else min(len(toks), pos + chunk)
            self.compute(seq_id, toks, pos, end)
            pos = end
        for t in generated:
            toks.append(t)
            if len(toks) - 1 > pos:
                self.compute(seq_id, toks, pos, len(toks) - 1)
                pos = len(toks) - 1
        self.mgr.finish(seq_id, toks, pos, donate=use_cache)
        self.sync()
        self.kv.assert_index(self.mgr.index)
        self.mgr.check_integrity()
        return adm
