"""Step state that lives on the device: the page table and the per-step input buffer.

``PageTable``: an int32 [n_rows, max_pages] device tensor; each sequence the runner sees gets a
row (least recently used rows are reused), mirrored on the host. A step sends only the entries
that changed since the row was last sent (usually none, or one new page). The last row is the
scratch row: every entry points at the scratch page, so padded batch rows write there.

``StepBuffer``: the step's int32 inputs are packed into one pinned host buffer and sent in one
non-blocking copy; a small ring of buffers keeps a copy in flight from being overwritten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch


class PageTable:
    def __init__(self, n_rows: int, max_pages: int, scratch_page: int, device: torch.device) -> None:
        self.n_rows = n_rows
        self.max_pages = max_pages
        self.device = device
        self.table = torch.full((n_rows + 1, max_pages), scratch_page, dtype=torch.int32, device=device)
        self.scratch_row = n_rows
        self._rows: OrderedDict[int, int] = OrderedDict()  # seq_id -> row, least recent first
        self._free = list(range(n_rows - 1, -1, -1))
        self._host: list[tuple[int, ...]] = [()] * n_rows
        self._last: tuple[list[int], list[tuple[int, ...]], list[int]] | None = None  # (ids, tables, rows)

    def assign(self, seq_ids: Sequence[int], tables: Sequence[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
        """Rows of these sequences, and the (flat index, page) updates that bring the device
        table up to date with ``tables``. Sequences of one step never share a row.

        A step of the same sequences with the same tables as the call before (most decode
        steps: a page is added every ``page_size`` tokens) changes nothing: its rows come back
        without the per-sequence walk (the recency order it would set is the one it has)."""
        last = self._last
        if last is not None and last[0] == seq_ids and last[1] == tables:
            return list(last[2]), [], []
        rows, idx, val = self._assign(seq_ids, tables)
        self._last = (list(seq_ids), list(tables), list(rows))
        return rows, idx, val

    def _assign(self, seq_ids: Sequence[int], tables: Sequence[tuple[int, ...]]) -> tuple[list[int], list[int], list[int]]:
        rows: list[int] = []
        idx: list[int] = []
        val: list[int] = []
        in_step = set(seq_ids)
        for sid, pt in zip(seq_ids, tables):
            if len(pt) > self.max_pages:
                raise ValueError(f"page table of {len(pt)} pages exceeds the device table's {self.max_pages}")
            row = self._rows.get(sid)
            if row is None:
                if self._free:
                    row = self._free.pop()
                else:
                    for old in self._rows:  # least recently used, not in this step
                        if old not in in_step:
                            row = self._rows.pop(old)
                            break
                    else:
                        raise ValueError(f"more than {self.n_rows} sequences in one step")
                self._host[row] = ()
            else:
                self._rows.move_to_end(sid)
            self._rows[sid] = row
            old_pt = self._host[row]
            if old_pt != pt:
                k = len(old_pt) if pt[: len(old_pt)] == old_pt else 0
                base = row * self.max_pages
                idx.extend(range(base + k, base + len(pt)))
                val.extend(pt[k:])
                self._host[row] = pt
            rows.append(row)
        return rows, idx, val

    def forget(self, seq_id: int) -> None:
        self._last = None
        row = self._rows.pop(seq_id, None)
        if row is not None:
            self._host[row] = ()
            self._free.append(row)

    def apply(self, idx: torch.Tensor, val: torch.Tensor) -> None:
        """Write updates (device int32 tensors) into the table."""
        if idx.numel():
            self.table.view(-1).index_copy_(0, idx.long(), val)


def _up4(n: int) -> int:
    return (n + 3) & ~3


class StepBuffer:
    """A ring of pinned int32 host buffers and one device buffer of the same size."""

    def __init__(self, n: int, device: torch.device, ring: int = 4) -> None:
        self.device = device
        self.n = 0
        self._ring = ring
        self._grow(n)

    def _grow(self, n: int) -> None:
        self.n = n
        pin = self.device.type == "cuda"
        self.host = [torch.empty(n, dtype=torch.int32, pin_memory=pin) for _ in range(self._ring)]
        self.events: list[torch.cuda.Event | None] = [None] * self._ring
        self.dev = torch.empty(n, dtype=torch.int32, device=self.device)
        self.i = 0

    def pack(self, parts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """Pack ``parts`` into the next host buffer; returns it and each part's (offset, length).
        Parts start at multiples of 4 values (16 bytes), so the kernels that read them always see
        equally aligned pointers (Triton compiles one variant per alignment)."""
        total = sum(_up4(len(p)) for p in parts)
        if total > self.n:
            self._grow(max(total, 2 * self.n))
        self.i = (self.i + 1) % self._ring
        ev = self.events[self.i]
        if ev is not None:
            ev.synchronize()  # the copy that last read this buffer has finished
        buf = self.host[self.i]
        spans = []
        off = 0
        flat: list[int] = []
        for p in parts:
            spans.append((off, len(p)))
            flat.extend(p)
            pad = _up4(len(p)) - len(p)
            flat.extend([0] * pad)
            off += len(p) + pad
        if flat:  # through numpy: a list of ints into the buffer ~4x faster than via a tensor
            buf.numpy()[: len(flat)] = flat
        return buf, spans

    def send(self, buf: torch.Tensor, n: int, dst: torch.Tensor | None = None) -> torch.Tensor:
        """One non-blocking copy of the first n values to ``dst`` (default: the device buffer)."""
        dst = self.dev if dst is None else dst
        dst[:n].copy_(buf[:n], non_blocking=True)
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self.events[self.i] = ev
        return dst
