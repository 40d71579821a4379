"""The torch backend: per-step metadata from ``attention.build_meta`` and torch SDPA.

The readable reference for every other backend and the CPU path. RoPE angles come from tables
precomputed per position (``RopeTables``), identical to computing them per step.

On the CPU, where the native attention kernel is built and the CPU has AVX-512 (``attn_native``:
llama.cpp's CPU flash-attention arithmetic, one call per layer reading the pages through the page
tables), it computes every step's attention: a row's output depends on nothing but its own query
and keys, so cached and uncached evaluations, batch widths and chunkings agree bit for bit at any
length. ``KVSERVE_NATIVE=0`` (or ``KVSERVE_NATIVE_ATTN=0``) keeps SDPA, as does a build without it:

There, float32 attention of a step of up to ``WIDE_MAX_ROWS`` tokens and ``WIDE_MAX_KEYS`` keys
runs in float64 and is rounded to float32 once: a query's output then has the same bits whichever
path computed it (a causal prefill chunk, a masked chunk after a cached prefix, a padded or cascade
decode batch, any batch width), where float32 SDPA differs between them by an ulp or two. The
quantized path rounds every linear layer's input and output to bf16 (``quant.int4``), and one
flipped bf16 rounding grows through the layers to ~0.1 in the logits; with attention
batch-invariant, a cached prefix gives the logits of an uncached run.

A step of one sequence decoding one token (single-stream decode) has its own few-operation path:
its tensors are built straight from the page table, its keys read as a view of the cache when
its pages are consecutive (else gathered a page at a time), and ``attention.one_query_attention``
replaces the padded batch and its mask; the step's buffers (``attention.Scratch``) serve every
layer. On the CPU a decode step's cost outside the linear layers is mostly the fixed cost of
each torch call, not its arithmetic.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import attn_native, ops_cpu
from ..attention import AttnMeta, Scratch, SeqKeys, build_meta, one_query_attention, paged_attention
from ..config import ModelConfig
from ..kv_store import PagedKVStore
from ..quant import native
from ..quant.linear import GEMV_MAX_ROWS
from ..rope import RopeTables, apply_rope, apply_rope_full, apply_rope_full_
from .base import AttentionBackend, AttentionStep, StepSeq


# Float32 attention on the CPU runs in float64 in steps of at most WIDE_MAX_ROWS tokens whose
# longest context is at most WIDE_MAX_KEYS keys. The row bound: such steps' quantized linear
# layers run the int4 kernel (row-independent), where batch invariance holds end to end; longer
# prefills dequantize into a bf16 GEMM whose rounding differs from the kernel's anyway. The key
# bound: converting the gathered float16 KV to float64 costs ~3x the float32 conversion; SmolLM2's
# decode ran at 0.87x (batch 1) and 0.77x (batch 4) with float64 at 480 keys, 0.67x (batch 1) at
# 1024 (bench/engine.py --cpu-attention both; docs/benchmarks.md §6).
# With the native kernels (quant.native) every quantized linear layer is row-independent at any
# row count, so only the key bound applies (a step's rows never exceed its keys); the cost is
# float64 attention for prefills of up to 256 tokens (docs/benchmarks.md §6).
# WIDE_MAX_ROWS = 0 turns it off.
WIDE_MAX_KEYS = 256
WIDE_MAX_ROWS = WIDE_MAX_KEYS if native.available() else GEMV_MAX_ROWS


class TorchStep(AttentionStep):
    def __init__(
        self, be: TorchBackend, meta: AttnMeta, wide: bool = False, one: SeqKeys | None = None, pos: int = -1,
        row: int = -1, native: attn_native.NativeKeys | None = None, one_token: bool = False,
    ) -> None:
        self.cfg = be.cfg
        self.kv = be.kv
        self.meta = meta
        self.wide = wide  # float32 attention computed in float64 (see WIDE_MAX_ROWS)
        self.positions = meta.positions
        self._be = be
        self._tables: dict = {}  # rope key → this step's rows of its tables, gathered on first use
        self._scratch = Scratch()
        # One sequence decoding one token (``TorchBackend.prepare``): its keys, read without
        # the generic path's masks, padding and batch-row gathers; ``meta`` then has no groups.
        self._one = one
        self._pos = pos  # that token's position
        self._row = row  # and its KV row
        self._native = native  # the step's sequences for the native attention kernel (attn_native)
        self._in_place = one is not None or one_token  # one token: q, k rotated and k, v written in place

    def _rope(self, layer: int, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """x rotated (``inplace``: x itself, overwritten)."""
        be = self._be
        key = be.layer_rope[layer]
        t = self._tables.get(key)
        if t is None:
            if x.shape[-1] == self.cfg.rope_dim and x.dtype == torch.float32:
                c, s = be.rope.full(key, self.cfg.rope_style)
                p = self._pos
                if p >= 0:  # one token: views of its rows
                    t = ("full", c[p : p + 1], s[p : p + 1])
                else:
                    t = ("full", c.index_select(0, self.positions), s.index_select(0, self.positions))
            else:
                pos = self.positions
                t = ("half", be.rope.cos[key].index_select(0, pos), be.rope.sin[key].index_select(0, pos))
            self._tables[key] = t
        if t[0] == "full" and x.dtype == torch.float32 and x.shape[-1] == t[1].shape[-1]:
            return (apply_rope_full_ if inplace else apply_rope_full)(x, t[1], t[2], self.cfg.rope_style)
        if t[0] == "full":  # (a layer of another dtype than the one that built the tables)
            pos = self.positions
            t = ("half", be.rope.cos[key].index_select(0, pos), be.rope.sin[key].index_select(0, pos))
        out = apply_rope(x, t[1], t[2], self.cfg.rope_style)
        return x.copy_(out) if inplace else out

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self._attend(layer, self._rope(layer, q), self._rope(layer, k), v)

    def attend_qkv(self, layer: int, qkv: torch.Tensor, n_head: int, n_head_kv: int,
                   qk_norm: tuple[nn.Module, nn.Module] | None = None) -> torch.Tensor:
        """q and k rotated together (one set of elementwise ops for both: the same values). One
        token of one sequence: rotated in place in the projection's output, where k and v then
        lie side by side and go into the pool's row in one copy. With the native ops
        (``ops_cpu``): QK-norm, RoPE and the KV write in one call, in place in the output."""
        if ops_cpu.enabled(qkv):
            be = self._be
            key = be.layer_rope[layer]
            qw = kw = None
            eps = 0.0
            if qk_norm is not None:
                qw, kw, eps = qk_norm[0].weight, qk_norm[1].weight, qk_norm[0].eps
            x = ops_cpu.rope_kv(qkv, n_head, n_head_kv, self.cfg.head_dim, be.rope.cos[key], be.rope.sin[key],
                                self.positions, self.meta.write_rows, be.kv_layers[layer], be.neox, qw, kw,
                                eps)
            return self._attention(layer, x[:, :n_head])
        if qk_norm is not None:
            return super().attend_qkv(layer, qkv, n_head, n_head_kv, qk_norm)
        t = qkv.shape[0]
        x = qkv.view(t, n_head + 2 * n_head_kv, -1)
        if self._in_place:
            self._rope(layer, x[:, : n_head + n_head_kv], inplace=True)
            kv = x[:, n_head:].view(1, 2, n_head_kv, x.shape[-1]).transpose(0, 1)  # [2, 1, Hkv, D]
            self._be.kv_layers[layer].narrow(1, self._row, 1).copy_(kv)
            return self._attention(layer, x[:, :n_head])
        qk = self._rope(layer, x[:, : n_head + n_head_kv])
        return self._attend(layer, qk[:, :n_head], qk[:, n_head:], x[:, n_head + n_head_kv :])

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        be = self._be
        kc, vc = be.k_layers[layer], be.v_layers[layer]
        if kc.dtype == k.dtype:
            kc.index_copy_(0, self.meta.write_rows, k)
            vc.index_copy_(0, self.meta.write_rows, v)
        else:  # rounded to the pool's dtype in this step's buffers, then written
            sc = self._scratch
            kc.index_copy_(0, self.meta.write_rows, sc.get("kw", tuple(k.shape), kc.dtype, k.device).copy_(k))
            vc.index_copy_(0, self.meta.write_rows, sc.get("vw", tuple(v.shape), vc.dtype, v.device).copy_(v))
        return self._attention(layer, q)

    def _attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """Attention of q over the pool (this step's K/V written)."""
        be = self._be
        if self._native is not None:
            out = self._scratch.get("o", tuple(q.shape), torch.float32, q.device)
            o = attn_native.attend(q, be.kv_layers[layer], self._native, be.layer_window[layer], be.attn_scale, out)
            return o if q.dtype == torch.float32 else o.to(q.dtype)
        wide = self.wide and q.dtype == torch.float32
        if self._one is not None:
            dt = torch.float64 if wide else q.dtype
            o = one_query_attention(q, be.kv_layers[layer], self._one, be.attn_scale, dt, self._scratch)
            if o.dtype == q.dtype:
                return o
            # rounded into a buffer of the step: the caller's output projection reads it at once
            return self._scratch.get("o", tuple(o.shape), q.dtype, o.device).copy_(o)
        o = paged_attention(
            q.double() if wide else q.contiguous(), be.k_layers[layer], be.v_layers[layer], self.meta,
            be.layer_window[layer], be.attn_scale, be.kv_layers[layer],
        )
        return o.to(q.dtype) if wide else o


class TorchBackend(AttentionBackend):
    name = "torch"

    def __init__(self, cfg: ModelConfig, kv: PagedKVStore, rope: RopeTables) -> None:
        self.cfg = cfg
        self.kv = kv
        self.rope = rope
        self.device = kv.device
        # per-layer constants, looked up once instead of every layer of every step
        self.layer_rope = [cfg.layer_rope(i) for i in range(cfg.n_layer)]
        self.layer_window = [cfg.layer_window(i) for i in range(cfg.n_layer)]
        self.attn_scale = cfg.attn_scale
        self.neox = cfg.rope_style == "neox"
        self.k_layers, self.v_layers, self.kv_layers = kv.k_layers, kv.v_layers, kv.kv_layers
        self.min_window = min((w for w in self.layer_window if w > 0), default=0)
        # CPU attention in one native call per layer where the extension is built (attn_native)
        self.native = attn_native.supports(kv.dtype, kv.device)

    def prepare(self, seqs: list[StepSeq], ids: list[int]) -> tuple[torch.Tensor, AttentionStep]:
        if self.native:
            return self._prepare_native(seqs, ids)
        if len(seqs) == 1 and seqs[0].n == 1:
            s = seqs[0]
            n_keys = s.start + 1
            if self.min_window <= 0 or n_keys <= self.min_window:  # every key visible in every layer
                return self._prepare_one(s, ids[0], n_keys)
        meta = build_meta([(s.start, s.n, s.page_table) for s in seqs], self.kv.page_size, self.device)
        n_keys = max(s.start + s.n for s in seqs)
        self.rope.ensure(n_keys)
        ids_t = torch.tensor(ids, dtype=torch.int64, device=self.device)
        wide = self.device.type == "cpu" and len(ids) <= WIDE_MAX_ROWS and n_keys <= WIDE_MAX_KEYS
        return ids_t, TorchStep(self, meta, wide)

    def _prepare_one(self, s: StepSeq, token: int, n_keys: int) -> tuple[torch.Tensor, AttentionStep]:
        """One token of one sequence: the step's few tensors straight from the page table."""
        ps = self.kv.page_size
        pos = s.start
        row = s.page_table[pos // ps] * ps + pos % ps
        t = torch.tensor([token, pos, row], dtype=torch.int64, device=self.device)
        self.rope.ensure(n_keys)
        meta = AttnMeta(positions=t[1:2], write_rows=t[2:3], page_size=ps)
        keys = SeqKeys.of(s.page_table, n_keys, ps, self.device)
        wide = self.device.type == "cpu" and 1 <= WIDE_MAX_ROWS and n_keys <= WIDE_MAX_KEYS
        return t[0:1], TorchStep(self, meta, wide, keys, pos, row)

    def _prepare_native(self, seqs: list[StepSeq], ids: list[int]) -> tuple[torch.Tensor, AttentionStep]:
        """The step's token ids, positions and KV rows in one tensor, and its sequences for the
        native kernel (no masks, padding or gathers: it reads the pages through the tables)."""
        ps = self.kv.page_size
        pos = [p for s in seqs for p in range(s.start, s.start + s.n)]
        rows = [s.page_table[p // ps] * ps + p % ps for s in seqs for p in range(s.start, s.start + s.n)]
        t = torch.tensor([ids, pos, rows], dtype=torch.int64, device=self.device)
        self.rope.ensure(max(s.start + s.n for s in seqs))
        meta = AttnMeta(positions=t[1], write_rows=t[2], page_size=ps)
        native = attn_native.NativeKeys([(s.start, s.n, s.page_table) for s in seqs], ps)
        if len(seqs) == 1 and seqs[0].n == 1:  # one token: rotated and written in place (attend_qkv)
            return t[0], TorchStep(self, meta, pos=pos[0], row=rows[0], native=native, one_token=True)
        return t[0], TorchStep(self, meta, native=native)
