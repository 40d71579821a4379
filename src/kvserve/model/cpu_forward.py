"""A CPU forward pass of the native path as the layers' native calls and nothing else.

With the native kernels (``quant.native``), the native attention (``attn_native``) and the
native layer ops (``ops_cpu``), a decoder layer on the CPU is nine or ten native calls: norm
(with the residual add), the fused Q/K/V product, QK-norm + RoPE + KV write, attention, the
output product, norm, the fused gate/up product, act · up, the down product (Gemma 3: two
more norms). Run through the modules (``arch.llama``, ``layers``, the torch backend), each call
also costs its Python wrappers: their checks, allocations and pointer look-ups are most of a
single-token step's time outside the matrix products. ``CpuForward`` makes the same calls, in
the same order, on the same kernels, with every pointer and size worked out once per model and
buffers reused across layers and steps: the same bits as the modules
(tests/unit/test_cpu_forward.py), a fraction of their Python. The MLP runs a block of rows at
a time, so a prefill's largest activation (gate/up) is a block's, not the step's.

It runs a model whose blocks are the llama or Gemma 3 blocks with fused Q/K/V and gate/up on
the native kernels, in steps of the torch backend with native attention; anything else (other
weight layouts, ``KVSERVE_NATIVE=0``, a missing extension) runs the modules.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from . import attn_native, ops_cpu
from .quant import native
from .quant.native import FORMATS, NativeLinear

# The MLP runs this many rows at a time (gate/up → act · up → down): its gate/up output is the
# largest activation of a step (Qwen2.5-0.5B: 9,728 floats a row), and the kernels compute each
# row alone, so the blocks give the rows' bits whatever their size. A multiple of 16 (the
# kernels' row groups).
_MLP_ROWS = 64
# A forward of up to this many rows (the default -ub) keeps its buffers, grown to the largest
# step seen, for every later step: a prefill's activations are allocated once, not per step.
_KEEP_ROWS = 512


def _segments(lin: nn.Module) -> tuple[tuple[int, int, int, int], ...]:
    """(format, weight pointer, columns, byte offset of the first column) per run of a format."""
    return tuple((FORMATS[s.qtype], s.raw.data_ptr(), s.n, 4 * s.n0) for s in lin.segments)


class _Layer:
    """One block's constants: weight pointers, sizes, eps, window, rope key."""

    __slots__ = ("norm1", "qkv", "bias", "qn", "kn", "rope", "window", "o", "post1", "norm2", "gate_up",
                 "down", "post2", "eps", "kind")

    def __init__(self, block: nn.Module, rope: tuple[float, float], window: int, gemma: bool) -> None:
        attn, mlp = block.attn, block.mlp
        self.eps = block.attn_norm.eps
        self.norm1 = block.attn_norm.weight.data_ptr()
        self.qkv = _segments(attn.qkv)
        self.bias = 0 if attn.qkv.bias is None else attn.qkv.bias.data_ptr()
        self.qn = attn.q_norm.weight.data_ptr() if attn.cfg.qk_norm else 0
        self.kn = attn.k_norm.weight.data_ptr() if attn.cfg.qk_norm else 0
        self.rope, self.window = rope, window
        self.o = _segments(attn.o)
        self.norm2 = block.ffn_norm.weight.data_ptr()
        self.gate_up, self.down = _segments(mlp.gate_up), _segments(mlp.down)
        self.kind = ops_cpu.ACTS[mlp.act]
        self.post1 = block.post_attn_norm.weight.data_ptr() if gemma else 0
        self.post2 = block.post_ffn_norm.weight.data_ptr() if gemma else 0


class CpuForward:
    """``forward(x, step)``: the model's final-normed hidden states from its embedded tokens x
    (float32 [T, n_embd], used as the residual stream: overwritten), as ``LlamaModel.forward``."""

    def __init__(self, model: nn.Module) -> None:
        from .arch.gemma3 import Gemma3Block

        cfg = model.cfg
        self.cfg = cfg
        self.n = cfg.n_embd
        self.h, self.hkv, self.d = cfg.n_head, cfg.n_head_kv, cfg.head_dim
        self.n_qkv = (self.h + 2 * self.hkv) * self.d
        self.n_ff = model.layers[0].mlp.n_ff
        self.layers = [_Layer(b, cfg.layer_rope(i), cfg.layer_window(i), isinstance(b, Gemma3Block))
                       for i, b in enumerate(model.layers)]
        self.gemma = isinstance(model.layers[0], Gemma3Block)
        self.final = model.norm.weight.data_ptr()
        self.final_eps = model.norm.eps
        self.keys = sorted({layer.rope for layer in self.layers})
        self.neox = int(cfg.rope_style == "neox")
        # the tensors whose pointers the layers hold, kept alive with them
        self._params = [p for p in model.parameters()] + [b for b in model.buffers()]
        self._bufs: tuple[int, tuple[torch.Tensor, ...]] = (0, ())  # the last step's rows and buffers
        self.mlp_rows = _MLP_ROWS  # (the kept buffers hold blocks of this many rows)
        self._held = threading.Lock()  # held while a forward uses the kept buffers
        self.matmul = native._qmm.matmul  # (bench/engine.py --split replaces it to time the rest)

    @staticmethod
    def build(model: nn.Module) -> CpuForward | None:
        """The model's native forward, or None where it does not apply (the modules run)."""
        from .arch.gemma3 import Gemma3Block
        from .arch.llama import LlamaBlock

        if not (ops_cpu.ENABLED and attn_native.available() and native.available()):
            return None
        kinds = {type(b) for b in model.layers}
        if not kinds or not kinds <= {LlamaBlock, Gemma3Block} or len(kinds) != 1:
            return None
        f32 = torch.float32
        for b in model.layers:
            lins = (b.attn.qkv, b.attn.o, b.mlp.gate_up, b.mlp.down)
            if not all(isinstance(lin, NativeLinear) for lin in lins):
                return None
            if any(p.dtype != f32 or p.device.type != "cpu" for p in b.parameters()):
                return None
            if b.attn.qkv.bias is not None and b.attn.qkv.bias.dtype != f32:
                return None
            if any(lin.bias is not None for lin in lins[1:]):
                return None
        if model.norm.weight.dtype != f32:
            return None
        return CpuForward(model)

    @staticmethod
    def runs(step, x: torch.Tensor) -> bool:  # noqa: ANN001
        """Whether this step's attention is the native kernel's (a torch-backend step over a KV
        pool it can read) and x a float32 row-major [T, n]."""
        return (getattr(step, "_native", None) is not None and x.dtype is torch.float32 and x.dim() == 2
                and x.is_contiguous() and step._be.kv.kv.is_contiguous())

    def _alloc(self, rows: int) -> tuple[torch.Tensor, ...]:
        """Buffers for steps of up to ``rows`` rows: h / attention output (one buffer: h is dead
        once Q/K/V are computed, the attention output once the output product is), Q/K/V, o /
        down (o is dead once normed), post-norm (Gemma 3), then gate/up and act · up for one
        block of MLP rows."""
        n, m = self.n, min(rows, self.mlp_rows)
        shapes = ((rows, max(n, self.h * self.d)), (rows, self.n_qkv), (rows, n), (rows, n if self.gemma else 0),
                  (m, 2 * self.n_ff), (m, self.n_ff))
        return tuple(torch.empty(s) for s in shapes)

    def _buffers(self, t: int, keep: bool) -> tuple[torch.Tensor, ...]:
        """The step's buffers: the kept ones (``keep``), grown first where they have fewer than t
        rows, or, for a step larger than ``_KEEP_ROWS`` or while another forward holds the kept
        ones, the step's own."""
        if not keep or t > _KEEP_ROWS:
            return self._alloc(t)
        if self._bufs[0] < t:
            self._bufs = (0, ())  # the smaller ones go first
            rows = min(_KEEP_ROWS, -(-t // 16) * 16)
            self._bufs = (rows, self._alloc(rows))
        return self._bufs[1]

    def forward(self, x: torch.Tensor, step) -> torch.Tensor:  # noqa: ANN001 (a torch_ref.TorchStep)
        # one forward at a time uses the kept buffers (another thread's, meanwhile, its own)
        keep = self._held.acquire(blocking=False)
        try:
            return self._forward(x, step, self._buffers(x.shape[0], keep))
        finally:
            if keep:
                self._held.release()

    def _forward(self, x: torch.Tensor, step, bufs: tuple[torch.Tensor, ...]) -> torch.Tensor:  # noqa: ANN001
        be, keys = step._be, step._native
        t, n = x.shape
        h, qkv, o, p, gu, a = (b.data_ptr() for b in bufs)
        att, d = h, o
        threads = torch.get_num_threads()
        rows_threads = threads if t > 1 else 1
        kv = be.kv.kv
        kv0, el = kv.data_ptr(), kv.element_size()
        s = kv.stride()  # [layer, K|V, rows, Hkv, D]
        kv_type = ops_cpu.KV_TYPES[kv.dtype]
        f16 = int(kv.dtype == torch.float16)
        pos, rows = step.positions.data_ptr(), step.meta.write_rows.data_ptr()
        info, n_seq, tables, page = keys._ptrs
        rope = {k: (be.rope.cos[k].data_ptr(), be.rope.sin[k].data_ptr()) for k in self.keys}
        rd = 2 * be.rope.cos[self.keys[0]].shape[-1]
        scale = be.attn_scale
        hh, hkv, hd, nq, nff = self.h, self.hkv, self.d, self.n_qkv, self.n_ff
        mm, norm, rope_kv, act = self.matmul, ops_cpu._ops_cpu.rms_norm, ops_cpu._ops_cpu.rope_kv, \
            ops_cpu._ops_cpu.act_mul
        attend, attn_isa, isa = attn_native._attn.attend, attn_native._ISA, native._ISA
        gemma, neox = self.gemma, self.neox
        mlp_rows = self.mlp_rows
        r = x.data_ptr()
        xin = 0  # the previous block's output (0: the first block normalizes the residual alone)
        for i, L in enumerate(self.layers):
            norm(xin or r, n, r if xin else 0, n, r, n, L.norm1, h, n, t, n, L.eps, rows_threads)
            for f, w, cols, off in L.qkv:
                mm(f, h, t, n, w, cols, qkv + off, nq, threads, isa)
            k = kv0 + i * s[0] * el
            v = k + s[1] * el
            c, sn = rope[L.rope]
            rope_kv(qkv, t, nq, hh, hkv, hd, rd, c, sn, pos, rows, k, v, kv_type, neox, L.qn, L.kn,
                    L.eps, rows_threads, L.bias)
            attend(qkv, nq, hh, hkv, hd, k, v, s[2], f16, info, n_seq, tables, page, L.window, att, hh * hd,
                   scale, 0.0, threads, attn_isa)
            for f, w, cols, off in L.o:
                mm(f, att, t, hh * hd, w, cols, o + off, n, threads, isa)
            if gemma:
                norm(o, n, 0, 0, 0, 0, L.post1, p, n, t, n, L.eps, rows_threads)
                norm(p, n, r, n, r, n, L.norm2, h, n, t, n, L.eps, rows_threads)
            else:
                norm(o, n, r, n, r, n, L.norm2, h, n, t, n, L.eps, rows_threads)
            for b0 in range(0, t, mlp_rows):  # (one block unless t > _MLP_ROWS)
                m = min(mlp_rows, t - b0)
                for f, w, cols, off in L.gate_up:
                    mm(f, h + 4 * b0 * n, m, n, w, cols, gu + off, 2 * nff, threads, isa)
                act(gu, 2 * nff, gu + 4 * nff, 2 * nff, nff, a, nff, m, L.kind, rows_threads)
                for f, w, cols, off in L.down:
                    mm(f, a, m, nff, w, cols, d + 4 * b0 * n + off, n, threads, isa)
            if gemma:
                norm(d, n, 0, 0, 0, 0, L.post2, p, n, t, n, L.eps, rows_threads)
                xin = p
            else:
                xin = d
        out = torch.empty(t, n)
        norm(xin, n, r, n, r, n, self.final, out.data_ptr(), n, t, n, self.final_eps, rows_threads)
        return out
