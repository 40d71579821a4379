"""The paged KV pool: the only place KV tensors live.

Layout per K and V: one tensor [n_layer, n_pages * page_size, n_head_kv, head_dim]. Row
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
        shape = (cfg.n_layer, (n_pages + 1) * page_size, cfg.n_head_kv, cfg.head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        scratch = slice(n_pages * page_size, (n_pages + 1) * page_size)
        self.k[:, scratch].zero_()
        self.v[:, scratch].zero_()
        self.k_layers, self.v_layers = self.k.unbind(0), self.v.unbind(0)  # per-layer views

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
        """Execute copies / shifts in order. Each move reads all its source rows before writing."""
        cfg = self.cfg
        for mv in moves:
            if mv.n_tokens <= 0:
                continue
            src = self.rows(mv.src_pages, mv.src_start, mv.n_tokens)
            dst = self.rows(mv.dst_pages, mv.dst_start, mv.n_tokens)
            for layer in range(cfg.n_layer):
                keys = self.k[layer].index_select(0, src)
                if mv.delta:
                    base, scale = cfg.layer_rope(layer)
                    keys = rope_shift(keys, mv.delta, cfg.rope_dim, base, scale, cfg.rope_style)
                self.k[layer].index_copy_(0, dst, keys)
                self.v[layer].index_copy_(0, dst, self.v[layer].index_select(0, src))

