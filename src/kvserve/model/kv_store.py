"""The paged KV pool: the only place KV tensors live.

Layout per K and V: [n_layer, n_pages * page_size, n_head_kv, head_dim] (views of one tensor). Row
``page * page_size + r`` holds the token at row r of that page. Page bookkeeping (who owns which
page, what it caches) is pure Python in ``kvserve.cache``; this class only moves numbers.
Memory is allocated with ``torch.empty``: pages never written are never touched, so resident
memory follows the pages actually used. One more page than ``n_pages``, the scratch page (zeroed),
takes the writes of padding rows in fixed-size (CUDA graph) batches; no sequence owns it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..plan import KVMove
from .config import ModelConfig
from .rope import rope_shift


class PagedKVStore:
    def __init__(
        self, cfg: ModelConfig, n_pages: int, page_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.cfg = cfg
        self.n_pages = n_pages
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.scratch_page = n_pages
        # K and V of a layer side by side in one allocation ([n_layer, 2, rows, Hkv, D]): ``k`` and
        # ``v`` are views with the layout above (each layer's K, or V, contiguous), and one copy or
        # gather of ``kv_layers[layer]`` moves both (the CPU decode step reads them together)
        rows = (n_pages + 1) * page_size
        self.kv = torch.empty((cfg.n_layer, 2, rows, cfg.n_head_kv, cfg.head_dim), dtype=dtype, device=device)
        self.k, self.v = self.kv[:, 0], self.kv[:, 1]
        self.kv[:, :, n_pages * page_size :].zero_()
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views
        self.kv_layers = self.kv.unbind(0)  # [2, rows, Hkv, D] per layer

    @property
    def bytes_per_page(self) -> int:
        return self.cfg.kv_bytes_per_token(self.k.element_size()) * self.page_size

    def rows(self, page_table: Sequence[int], start: int, n: int) -> torch.Tensor:
        """Flat row ids of positions [start, start + n) of a sequence with this page table."""
        pos = torch.arange(start, start + n, dtype=torch.int64)
        pt = torch.as_tensor(page_table, dtype=torch.int64)
        return (pt[pos // self.page_size] * self.page_size + pos % self.page_size).to(self.device)

    def write(self, layer: int, rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_layers[layer].index_copy_(0, rows, k if k.dtype == self.dtype else k.to(self.dtype))
        self.v_layers[layer].index_copy_(0, rows, v if v.dtype == self.dtype else v.to(self.dtype))

    def apply_moves(self, moves: Sequence[KVMove]) -> None:
        """Execute copies / shifts in order. Each move reads all its source rows before writing.

        Consecutive plain copies (``delta == 0``: copy-on-write of shared partial pages, one per
        request that adopts a cached prefix) run as one gather and one scatter over all layers,
        as long as none reads or overwrites a row an earlier one of the group writes (then the
        order could matter; the group ends there). Row indices reach the device in one
        non-blocking copy per group: no host wait."""
        cfg = self.cfg
        group: list[tuple[list[int], list[int]]] = []
        written: set[int] = set()
        for mv in moves:
            if mv.n_tokens <= 0:
                continue
            if mv.delta:
                self._copy_rows(group)
                group, written = [], set()
                src = self._device_rows(self._host_rows(mv.src_pages, mv.src_start, mv.n_tokens))
                dst = self._device_rows(self._host_rows(mv.dst_pages, mv.dst_start, mv.n_tokens))
                for layer in range(cfg.n_layer):
                    base, scale = cfg.layer_rope(layer)
                    keys = rope_shift(self.k[layer].index_select(0, src), mv.delta, cfg.rope_dim, base, scale,
                                      cfg.rope_style)
                    self.k[layer].index_copy_(0, dst, keys)
                    self.v[layer].index_copy_(0, dst, self.v[layer].index_select(0, src))
                continue
            src_h = self._host_rows(mv.src_pages, mv.src_start, mv.n_tokens)
            dst_h = self._host_rows(mv.dst_pages, mv.dst_start, mv.n_tokens)
            if written.intersection(src_h) or written.intersection(dst_h):
                self._copy_rows(group)
                group, written = [], set()
            group.append((src_h, dst_h))
            written.update(dst_h)
        self._copy_rows(group)

    def _host_rows(self, pages: Sequence[int], start: int, n: int) -> list[int]:
        ps = self.page_size
        return [pages[p // ps] * ps + p % ps for p in range(start, start + n)]

    def _device_rows(self, rows: list[int]) -> torch.Tensor:
        t = torch.tensor(rows, dtype=torch.int64)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _copy_rows(self, group: list[tuple[list[int], list[int]]]) -> None:
        """Plain copies of every layer's K and V rows (sources all read before any write)."""
        if not group:
            return
        both = self._device_rows([r for src, _ in group for r in src] + [r for _, dst in group for r in dst])
        n = both.shape[0] // 2
        src, dst = both[:n], both[n:]
        self.k.index_copy_(1, dst, self.k.index_select(1, src))
        self.v.index_copy_(1, dst, self.v.index_select(1, src))
