"""The torch backend: per-step metadata from ``attention.build_meta`` and torch SDPA.

The readable reference for every other backend and the CPU path. RoPE angles come from tables
precomputed per position (``RopeTables``), identical to computing them per step.

On the CPU, float32 attention of a step of up to ``WIDE_MAX_ROWS`` tokens and ``WIDE_MAX_KEYS``
keys runs in float64 and is rounded to float32 once: a query's output then has the same bits whichever path
computed it (a causal prefill chunk, a masked chunk after a cached prefix, a padded or cascade
decode batch, any batch width), where float32 SDPA differs between them by an ulp or two. The
quantized path rounds every linear layer's input and output to bf16 (``quant.int4``), and one
flipped bf16 rounding grows through the layers to ~0.1 in the logits; with attention
batch-invariant, a cached prefix gives the logits of an uncached run.
"""

from __future__ import annotations

import torch

from ..attention import AttnMeta, build_meta, paged_attention
from ..config import ModelConfig
from ..kv_store import PagedKVStore
from ..quant.linear import GEMV_MAX_ROWS
from ..rope import RopeTables, apply_rope, apply_rope_full, full_tables
from .base import AttentionBackend, AttentionStep, StepSeq


# Float32 attention on the CPU runs in float64 in steps of at most WIDE_MAX_ROWS tokens whose
# longest context is at most WIDE_MAX_KEYS keys. The row bound: such steps' quantized linear
# layers run the int4 kernel (row-independent), where batch invariance holds end to end; longer
# prefills dequantize into a bf16 GEMM whose rounding differs from the kernel's anyway. The key
# bound: converting the gathered float16 KV to float64 costs ~3x the float32 conversion; SmolLM2's
# decode ran at 0.87x (batch 1) and 0.77x (batch 4) with float64 at 480 keys, 0.67x (batch 1) at
# 1024 (bench/engine.py --cpu-attention both; docs/benchmarks.md §6).
# WIDE_MAX_ROWS = 0 turns it off.
WIDE_MAX_ROWS = GEMV_MAX_ROWS
WIDE_MAX_KEYS = 256


class TorchStep(AttentionStep):
    def __init__(
        self, cfg: ModelConfig, kv: PagedKVStore, meta: AttnMeta, rope: dict, wide: bool = False
    ) -> None:
        self.cfg = cfg
        self.kv = kv
        self.meta = meta
        self.wide = wide  # float32 attention computed in float64 (see WIDE_MAX_ROWS)
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
        wide = self.wide and q.dtype == torch.float32
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
        n_keys = max(s.start + s.n for s in seqs)
        wide = self.device.type == "cpu" and len(ids) <= WIDE_MAX_ROWS and n_keys <= WIDE_MAX_KEYS
        return ids_t, TorchStep(self.cfg, self.kv, meta, self.rope.lookup(meta.positions), wide)
