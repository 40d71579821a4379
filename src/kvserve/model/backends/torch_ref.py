"""The torch backend: per-step metadata from ``attention.build_meta`` and torch SDPA.

The readable reference for every other backend and the CPU path. RoPE angles come from tables
precomputed per position (``RopeTables``), identical to computing them per step.

On the CPU, float32 attention runs in float64 and is rounded to float32 once: a query's output
then has the same bits whichever path computed it (a causal prefill chunk, a masked chunk after
a cached prefix, a padded or cascade decode batch, any batch width), where float32 SDPA differs
between them by an ulp or two. The quantized path rounds every linear layer's input and output
to bf16 (``quant.int4``), and one flipped bf16 rounding grows through the layers to ~0.1 in the
logits; with attention batch-invariant, a cached prefix gives the logits of an uncached run.
"""

from __future__ import annotations

import torch

from ..attention import AttnMeta, build_meta, paged_attention
from ..config import ModelConfig
from ..kv_store import PagedKVStore
from ..rope import RopeTables, apply_rope, apply_rope_full, full_tables
from .base import AttentionBackend, AttentionStep, StepSeq


class TorchStep(AttentionStep):
    def __init__(self, cfg: ModelConfig, kv: PagedKVStore, meta: AttnMeta, rope: dict) -> None:
        self.cfg = cfg
        self.kv = kv
        self.meta = meta
        self.positions = meta.positions
        self.rope = rope
        self._full: dict = {}  # rope key → (C, S) of apply_rope_full, built on first use

    def _rope(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        key = cfg.layer_rope(layer)
        cos, sin = self.rope[key]
        if cos.shape[-1] * 2 != x.shape[-1] or x.dtype != torch.float32:
            return apply_rope(x, cos, sin, cfg.rope_style)
        t = self._full.get(key)
        if t is None:
            t = self._full[key] = full_tables(cos, sin, cfg.rope_style)
        return apply_rope_full(x, t[0], t[1], cfg.rope_style)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q = self._rope(layer, q)
        k = self._rope(layer, k)
        cfg = self.cfg
        self.kv.write(layer, self.meta.write_rows, k, v)
        wide = q.device.type == "cpu" and q.dtype == torch.float32
        o = paged_attention(
            q.double() if wide else q, self.kv.k_layers[layer], self.kv.v_layers[layer], self.meta,
            cfg.layer_window(layer), cfg.attn_scale,
        )
        return o.to(q.dtype) if wide else o


class TorchBackend(AttentionBackend):
    name = "torch"

    def __init__(self, cfg: ModelConfig, kv: PagedKVStore, rope: RopeTables) -> None:
        self.cfg = cfg
        self.kv = kv
        self.rope = rope
        self.device = kv.device

    def prepare(self, seqs: list[StepSeq], ids: list[int]) -> tuple[torch.Tensor, AttentionStep]:
        meta = build_meta([(s.start, s.n, list(s.page_table)) for s in seqs], self.kv.page_size, self.device)
        self.rope.ensure(max(s.start + s.n for s in seqs))
        ids_t = torch.tensor(ids, dtype=torch.int64, device=self.device)
        return ids_t, TorchStep(self.cfg, self.kv, meta, self.rope.lookup(meta.positions))
