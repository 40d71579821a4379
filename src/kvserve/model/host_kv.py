"""The host tier's KV: pinned host memory holding whole pages the device pool evicted.

``kvserve.cache`` decides which page goes to which host slot and back (``plan.TierCopy``);
this class only executes those copies, in order, on the current stream. Slot ``s`` holds one
page of K and of V for every layer, contiguous ([n_layer, page_size, n_head_kv, head_dim] each),
so consecutive slots of one allocation block are one contiguous range: the copies of a run are
ordered by slot and every range of consecutive slots moves in one transfer per tensor (a device
gather or scatter of the run's pages beside it); with pinned memory they are asynchronous (the host goes on while they run; the device runs
them before the plan's forward, which is queued after them). Memory is allocated in blocks of
slots on first use, so an unused budget costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..plan import TierCopy
from .kv_store import PagedKVStore

_BLOCK_BYTES = 64 << 20  # host memory is allocated in blocks of about this size


class HostKVStore:
    def __init__(self, kv: PagedKVStore, capacity: int | None) -> None:
        """``capacity``: slots at most (None: unbounded)."""
        self.kv = kv
        self.capacity = capacity
        cfg = kv.cfg
        self.slot_shape = (cfg.n_layer, kv.page_size, cfg.n_head_kv, cfg.head_dim)
        self.pin = kv.device.type == "cuda"
        per_block = max(1, _BLOCK_BYTES // max(1, kv.bytes_per_page))
        self.block_slots = per_block if capacity is None else max(1, min(per_block, capacity))
        self._k: list[torch.Tensor] = []  # blocks [block_slots, *slot_shape]
        self._v: list[torch.Tensor] = []
        # the pool viewed as pages: [n_layer, n_pages + 1, page_size, n_head_kv, head_dim]
        L, rows, h, d = kv.k.shape
        self._kp = kv.k.view(L, rows // kv.page_size, kv.page_size, h, d)
        self._vp = kv.v.view(L, rows // kv.page_size, kv.page_size, h, d)

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._k + self._v)

    def _slot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.capacity is not None and not 0 <= slot < self.capacity:
            raise ValueError(f"host slot {slot} beyond the budget of {self.capacity}")
        b, i = divmod(slot, self.block_slots)
        while len(self._k) <= b:
            shape = (self.block_slots, *self.slot_shape)
            self._k.append(torch.empty(shape, dtype=self.kv.dtype, pin_memory=self.pin))
            self._v.append(torch.empty(shape, dtype=self.kv.dtype, pin_memory=self.pin))
        return self._k[b][i], self._v[b][i]

    def run(self, copies: Sequence[TierCopy]) -> None:
        """Execute ``copies`` in order: runs of the same direction go together (one gather
        or scatter on the device for the run), a run ends where a page or slot repeats."""
        i = 0
        while i < len(copies):
            j, pages, slots = i, set(), set()
            while (j < len(copies) and copies[j].to_host == copies[i].to_host
                   and copies[j].page not in pages and copies[j].slot not in slots):
                pages.add(copies[j].page)
                slots.add(copies[j].slot)
                j += 1
            run = copies[i:j]
            (self._offload if run[0].to_host else self._load)(run)
            i = j

    def _ranges(self, run: Sequence[TierCopy]) -> list[tuple[int, int, int]]:
        """(block, first index in it, count) of consecutive slots; ``run`` sorted by slot."""
        out: list[tuple[int, int, int]] = []
        for c in run:
            self._slot(c.slot)  # allocates its block on first use
            b, i = divmod(c.slot, self.block_slots)
            if out and out[-1][0] == b and out[-1][1] + out[-1][2] == i:
                out[-1] = (b, out[-1][1], out[-1][2] + 1)
            else:
                out.append((b, i, 1))
        return out

    def _offload(self, run: Sequence[TierCopy]) -> None:
        run = sorted(run, key=lambda c: c.slot)  # a run has distinct pages and slots: any order
        idx = torch.tensor([c.page for c in run], dtype=torch.int64).to(self.kv.device, non_blocking=True)
        ranges = self._ranges(run)
        for pool, blocks in ((self._kp, self._k), (self._vp, self._v)):
            staged = pool.index_select(1, idx).transpose(0, 1).contiguous()  # [n, L, ps, h, d]
            j = 0
            for b, i, n in ranges:
                blocks[b][i : i + n].copy_(staged[j : j + n], non_blocking=self.pin)
                j += n

    def _load(self, run: Sequence[TierCopy]) -> None:
        dev = self.kv.device
        run = sorted(run, key=lambda c: c.slot)
        idx = torch.tensor([c.page for c in run], dtype=torch.int64).to(dev, non_blocking=True)
        ranges = self._ranges(run)
        for pool, blocks in ((self._kp, self._k), (self._vp, self._v)):
            staged = torch.empty((len(run), *self.slot_shape), dtype=self.kv.dtype, device=dev)
            j = 0
            for b, i, n in ranges:
                staged[j : j + n].copy_(blocks[b][i : i + n], non_blocking=self.pin)
                j += n
            pool.index_copy_(1, idx, staged.transpose(0, 1))
