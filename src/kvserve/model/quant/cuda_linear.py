"""``CudaQuantLinear``: GGUF weights kept in their codes on CUDA (``cuda_pack`` layouts).

Tensors sharing an input (Q/K/V, gate/up) form one module even when their formats differ (a
Q4_K_M file stores V as Q6_K next to Q4_K Q and K): members of one layout are concatenated into
one segment, and each segment's kernel writes its columns of the shared output. Up to
``GEMV_MAX_ROWS`` rows run the dequantizing GEMV (cost ∝ weight bytes, once for all rows); above
it every segment is dequantized into one bf16 matrix for a cuBLAS GEMM (prefill).

The GEMV's activations (``KVSERVE_GEMV_ACTIVATIONS``): ``int8`` (the default) quantizes x once
per module to int8 blocks of 32 as llama.cpp's CUDA backend does (``triton_q8``: integer dot
products, about a quarter of the float32 kernel's instructions per weight); ``float`` keeps x
in float32 (``triton_gemv``: the dequantized weights applied exactly). The int8 GEMV
(``KVSERVE_GEMV_KERNEL``) loads a tile of groups a loop step (``triton_q8_tile``, the default)
or one group a step (``triton_q8``); the tiled GEMVs of a module's two segments are one launch
(``triton_q8_pair``, ``KVSERVE_GEMV_PAIR``). With int8 activations
the kernel before the module quantizes its own output where the layers let it
(``forward_normed``: the RMSNorm before Q/K/V and gate/up; ``forward_act``: act(gate)·up before
down), so that a decode layer launches no quantizer of its own for them; and the gate/up GEMV
quantizes act(gate)·up for down in its own programs where it can (``forward_normed_act``); the
output and down projections do the first half of the RMSNorm after them and Q/K/V and gate/up the
second (``forward_quantized_into``, ``forward_prenormed``: no norm kernel between them). The
tiled GEMVs and those quantizing kernels are programmatic dependent launches on sm90 (``pdl``,
``KVSERVE_QUANT_GEMV_PDL``): each GEMV's first weights load while the kernel before still runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from .. import norm_kernel
from ..prenormed import Prenormed
from . import triton_gemv, triton_q8, triton_q8_norm, triton_q8_pair, triton_q8_tile
from .cuda_pack import Packed, cat

GEMV_MAX_ROWS = 8
ACTIVATIONS = os.environ.get("KVSERVE_GEMV_ACTIVATIONS", "int8")
if ACTIVATIONS not in ("int8", "float"):
    raise ValueError(f"KVSERVE_GEMV_ACTIVATIONS={ACTIVATIONS!r}: int8 or float")
# ``KVSERVE_GEMV_KERNEL``: the int8 GEMV with a tile of groups a loop step (``triton_q8_tile``,
# ``tile``) or one group a step (``triton_q8``, ``group``)
KERNEL = os.environ.get("KVSERVE_GEMV_KERNEL", "tile")
if KERNEL not in ("tile", "group"):
    raise ValueError(f"KVSERVE_GEMV_KERNEL={KERNEL!r}: tile or group")
# ``KVSERVE_Q6K_PLANES=1``: Q6_K weights packed as 6-bit codes in two planes (6.625 bits a weight
# instead of 8.625; ``cuda_pack``), which only the tiled kernel reads: with the int8 tiled GEMV only.
# Off: on an H200 the 8B Q4_K_M decode step reads 12 % fewer bytes and is no faster (the kernel's
# integer work limits it then; docs/benchmarks.md)
Q6K_PLANES = os.environ.get("KVSERVE_Q6K_PLANES", "0") == "1"


def q6_planes() -> bool:
    """Whether the loader packs Q6_K in planes (``cuda_pack.pack(..., q6_planes=...)``)."""
    return Q6K_PLANES and ACTIVATIONS == "int8" and KERNEL == "tile"


# ``KVSERVE_GEMV_ACT_EPILOGUE=0``: the down projection's input quantized by its own kernel (act·mul
# + quantize) instead of by the gate/up GEMV's programs (``forward_normed_act``)
ACT_EPILOGUE = os.environ.get("KVSERVE_GEMV_ACT_EPILOGUE", "1") != "0"
# ``KVSERVE_GEMV_PAIR=0``: a module's two segments as two tiled GEMVs (on two streams unless
# ``KVSERVE_GEMV_STREAMS=0``) instead of one launch of both (``triton_q8_pair``)
PAIR_SEGMENTS = os.environ.get("KVSERVE_GEMV_PAIR", "1") != "0"
# ``KVSERVE_GEMV_NORM_SPLIT=0``: the RMSNorm after the output and down projections as a kernel of
# its own (norm + quantize) instead of split between those GEMVs and the GEMVs after the norm
# (``triton_q8_norm``: ``forward_quantized_into``, ``forward_prenormed``)
NORM_SPLIT = os.environ.get("KVSERVE_GEMV_NORM_SPLIT", "1") != "0"
# ``KVSERVE_GEMV_STREAMS=0``: a module's segments one after the other on one stream
PARALLEL_SEGMENTS = os.environ.get("KVSERVE_GEMV_STREAMS", "1") != "0"
_SIDE: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The second stream of a module's parallel segments (one per device, made on first use: the
    decode graphs' warm-up runs before their capture)."""
    s = _SIDE.get(device)
    if s is None:
        s = _SIDE[device] = torch.cuda.Stream(device)
    return s



class _Segment(nn.Module):
    """One ``Packed`` matrix as buffers (columns ``col`` … ``col + n`` of the module's output)."""

    def __init__(self, p: Packed, col: int, members: list[int]) -> None:
        super().__init__()
        self.register_buffer("q", p.q, persistent=False)
        self.register_buffer("gw", p.gw, persistent=False)
        self.register_buffer("sw", p.sw, persistent=False)
        self.fields = p[3:]
        self.bits = p.bits
        self.col, self.n, self.members = col, p.n, members

    def packed(self) -> Packed:
        return Packed(self.q, self.gw, self.sw, *self.fields)


class CudaQuantLinear(nn.Module):
    """y = x @ W.T + b with W = the row-wise concatenation of ``parts``."""

    path = "cuda-quant"

    def __init__(self, parts: Sequence[Packed], bias: torch.Tensor | None, device: torch.device) -> None:
        super().__init__()
        k = parts[0].k
        assert all(p.k == k for p in parts)
        offsets = [sum(p.n for p in parts[:i]) for i in range(len(parts))]
        by_layout: dict[tuple, list[int]] = {}
        for i, p in enumerate(parts):
            by_layout.setdefault(p.layout, []).append(i)
        segs = []
        order = []  # output columns: members of each segment, side by side
        for idx in by_layout.values():
            segs.append(_Segment(cat([parts[i].to(device) for i in idx]), len(order), idx))
            for i in idx:
                order.extend(range(offsets[i], offsets[i] + parts[i].n))
        self.segments = nn.ModuleList(segs)
        self.in_features, self.out_features = k, len(order)
        # columns come out grouped by segment; ``perm`` restores the members' order (None: identity)
        perm = torch.tensor(order)
        self.perm = None if torch.equal(perm, torch.arange(len(order))) else torch.argsort(perm).to(device)
        if bias is not None:
            bias = bias.float()[perm].to(device)
        self.register_buffer("bias", bias, persistent=False)

    def _q8(self, xq: triton_q8.QuantX, dtype: torch.dtype) -> torch.Tensor:
        """The GEMVs of every segment on int8 activations, in the members' column order. Two
        segments (Q4_K Q/K and Q6_K V) are one launch of the tiled kernel (``triton_q8_pair``);
        otherwise, on CUDA, the segments after the first run on a second stream, beside the first
        (in a captured graph: parallel branches): a small projection's GEMV is mostly latency, so
        the two take about as long as the longer of them."""
        m = xq.q.shape[0]
        y = torch.empty((m, self.out_features), dtype=dtype, device=xq.q.device)
        segs = list(self.segments)
        if len(segs) == 2 and PAIR_SEGMENTS and KERNEL == "tile":  # one launch of both
            triton_q8_pair.gemv_pair(xq, *(self._operands(s, y) for s in segs))
        elif len(segs) > 1 and y.is_cuda and PARALLEL_SEGMENTS:
            main = torch.cuda.current_stream(y.device)
            side = _side_stream(y.device)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                for s in segs[1:]:
                    self._segment_q8(xq, s, y)
            self._segment_q8(xq, segs[0], y)
            main.wait_stream(side)
        else:
            for s in segs:
                self._segment_q8(xq, s, y)
        return y if self.perm is None else y[:, self.perm]

    def _operands(self, s: _Segment, y: torch.Tensor) -> tuple:
        """(weights, its columns of ``y``, its bias) of segment ``s``."""
        return s.packed(), y[:, s.col : s.col + s.n], None if self.bias is None else self.bias[s.col : s.col + s.n]

    def _segment_q8(self, xq: triton_q8.QuantX, s: _Segment, y: torch.Tensor) -> None:
        gemv = triton_q8_tile.gemv if KERNEL == "tile" or s.bits == 6 else triton_q8.gemv
        gemv(xq, *self._operands(s, y))

    def _fusable(self, x: torch.Tensor) -> bool:
        return (ACTIVATIONS == "int8" and x.dim() == 2 and (x.is_cuda or triton_gemv._INTERPRET)
                and 1 <= x.shape[0] <= GEMV_MAX_ROWS and x.is_contiguous())

    def forward_normed(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual), ``norm`` an RMSNorm: at decode sizes the norm
        kernel also quantizes its output for the GEMV (one launch instead of two)."""
        if (self._fusable(x) and residual.is_contiguous() and residual.dtype == x.dtype
                and self.in_features % 32 == 0):
            xq, s = triton_q8.norm_quantize_x(x, residual, norm.weight, norm.eps)
            return self._q8(xq, x.dtype), s
        h, s = norm.forward(x, residual)
        return self.forward(h), s

    def forward_normed_act(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module, n_ff: int,
                           act: str, quant_input) -> tuple[triton_q8.QuantX, torch.Tensor] | None:
        """(``quantize_x(act(g) · u)`` for [g | u] = self(norm(x + residual)), x + residual) where
        this gate/up module's GEMV quantizes the product itself into ``quant_input(rows,
        device)`` (the down projection's buffers; ``triton_q8_tile.fuses_act``): no act·mul
        kernel between the two GEMVs. None where it does not (the caller runs the kernels)."""
        m = x.shape[0] if x.dim() == 2 else 0
        if not (self._fusable(x) and residual.is_contiguous() and residual.dtype == x.dtype
                and self.in_features % 32 == 0):
            return None
        sink = self._act_sink(m, n_ff, act, quant_input, x.device)
        if sink is None:
            return None
        xq, s = triton_q8.norm_quantize_x(x, residual, norm.weight, norm.eps)
        y = torch.empty((m, self.out_features), dtype=x.dtype, device=x.device)
        triton_q8_tile.gemv(xq, self.segments[0].packed(), y, self.bias, act_out=(sink, n_ff, act))
        return sink, s

    def _act_sink(self, m: int, n_ff: int, act: str, quant_input, device: torch.device) -> triton_q8.QuantX | None:
        """``quant_input``'s buffers where this gate/up module's GEMV at ``m`` rows can quantize
        act(g) · u into them itself (``triton_q8_tile.fuses_act``), else None."""
        if not (ACT_EPILOGUE and KERNEL == "tile" and len(self.segments) == 1 and self.perm is None
                and self.out_features == 2 * n_ff and act in triton_q8_tile.ACTS
                and triton_q8_tile.fuses_act(self.segments[0].packed(), m, n_ff)):
            return None
        return quant_input(m, device)

    def forward_quantized_into(self, xq: triton_q8.QuantX, dtype: torch.dtype, residual: torch.Tensor,
                               norm: nn.Module) -> Prenormed | None:
        """s = self(x) + residual for x given as ``quantize_x(x)``, with what the GEMV after
        ``norm`` (an RMSNorm) needs of it (``forward_prenormed``): the first half of the norm in
        this GEMV's programs (``triton_q8_norm``). None where this module cannot (a second
        segment, a bias, the group-at-a-time kernel, ``KVSERVE_GEMV_NORM_SPLIT=0``)."""
        m = xq.q.shape[0]
        if not (NORM_SPLIT and KERNEL == "tile" and len(self.segments) == 1 and self.perm is None
                and self.bias is None and self.out_features % 32 == 0 and 1 <= m <= GEMV_MAX_ROWS
                and residual.shape == (m, self.out_features) and residual.is_contiguous()
                and residual.dtype == dtype and norm.weight.numel() == self.out_features):
            return None
        p = self.segments[0].packed()
        cfg = triton_q8_tile.default_config(p, m)
        if cfg.bn % 32:
            return None
        pre = triton_q8_norm.empty_prenormed(m, p.n, triton_q8_tile.norm_blocks(p, m, cfg), dtype, xq.q.device)
        triton_q8_tile.gemv(xq, p, pre.s, cfg=cfg, norm_out=(residual, norm.weight, pre))
        return pre

    def _takes_prenormed(self, pre: Prenormed) -> bool:
        return KERNEL == "tile" and pre.s.shape[1] == self.in_features and pre.s.shape[0] <= GEMV_MAX_ROWS

    def forward_prenormed(self, pre: Prenormed, norm: nn.Module) -> torch.Tensor:
        """self(norm(s)) for ``pre`` from a ``forward_quantized_into``: the second half of the norm
        in this module's GEMVs (each row's sums scaled by its 1 / rms)."""
        if not self._takes_prenormed(pre):
            return self.forward(norm.forward(pre.s))
        y = torch.empty((pre.s.shape[0], self.out_features), dtype=pre.s.dtype, device=pre.s.device)
        segs = list(self.segments)
        if len(segs) == 2 and PAIR_SEGMENTS:
            triton_q8_pair.gemv_pair(pre.xq, *(self._operands(s, y) for s in segs), rscale=(pre, norm.eps))
        else:
            for s in segs:
                triton_q8_tile.gemv(pre.xq, *self._operands(s, y), rscale=(pre, norm.eps))
        return y if self.perm is None else y[:, self.perm]

    def forward_prenormed_act(self, pre: Prenormed, norm: nn.Module, n_ff: int, act: str,
                              quant_input) -> triton_q8.QuantX | None:
        """``forward_normed_act`` for ``pre`` from a ``forward_quantized_into``: the quantized
        act(g) · u of [g | u] = self(norm(s)) in ``quant_input``'s buffers, or None (the caller
        runs ``forward_prenormed`` and the kernels after it)."""
        m = pre.s.shape[0]
        sink = self._act_sink(m, n_ff, act, quant_input, pre.s.device) if self._takes_prenormed(pre) else None
        if sink is None:
            return None
        y = torch.empty((m, self.out_features), dtype=pre.s.dtype, device=pre.s.device)
        triton_q8_tile.gemv(pre.xq, self.segments[0].packed(), y, self.bias, act_out=(sink, n_ff, act),
                            rscale=(pre, norm.eps))
        return sink

    def forward_act(self, gu: torch.Tensor, n_ff: int, act: str) -> torch.Tensor:
        """self(act(gu[:, :n_ff]) · gu[:, n_ff:]): at decode sizes one kernel computes and quantizes
        the product for the GEMV."""
        if self._fusable(gu) and n_ff == self.in_features and n_ff % 32 == 0:
            return self._q8(triton_q8.act_quantize_x(gu, n_ff, act), gu.dtype)
        return self.forward(norm_kernel.act_mul(gu, n_ff, act))

    def quant_input(self, rows: int, device: torch.device) -> triton_q8.QuantX | None:
        """Empty int8-activation buffers for ``forward_quantized`` of ``rows`` rows, where this
        module would quantize its input for the int8 GEMV (None: it would not)."""
        if not (ACTIVATIONS == "int8" and 1 <= rows <= GEMV_MAX_ROWS and self.in_features % 32 == 0
                and (device.type == "cuda" or triton_gemv._INTERPRET)):
            return None
        xq = triton_q8._empty_quant(rows, self.in_features, device)
        return triton_q8.QuantX(xq.q.view(torch.int32), xq.d, xq.s)

    def forward_quantized(self, xq: triton_q8.QuantX, dtype: torch.dtype) -> torch.Tensor:
        """self(x) for x given as ``quantize_x(x)`` (``quant_input``'s buffers, filled): [rows, out]."""
        return self._q8(xq, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).contiguous()
        m = x2.shape[0]
        planes = any(s.bits == 6 for s in self.segments)  # read by the int8 tiled GEMV only
        if m <= GEMV_MAX_ROWS and (ACTIVATIONS == "int8" or planes):
            return self._q8(triton_q8.quantize_x(x2), x.dtype).view(*x.shape[:-1], self.out_features)
        if m <= GEMV_MAX_ROWS:
            y = torch.empty((m, self.out_features), dtype=x.dtype, device=x.device)
            for s in self.segments:
                b = None if self.bias is None else self.bias[s.col : s.col + s.n]
                triton_gemv.gemv(x2, s.packed(), y[:, s.col : s.col + s.n], b)
        else:
            y = x2.to(torch.bfloat16) @ self.dequantized_t(torch.bfloat16)
            if self.bias is not None:
                y = y + self.bias
            y = y.to(x.dtype)
        if self.perm is not None:
            y = y[:, self.perm]
        return y.view(*x.shape[:-1], self.out_features)

    def dequantized_t(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights transposed, [in, out], in the kernels' column order (before ``perm``)."""
        w = torch.empty((self.in_features, self.out_features), dtype=dtype, device=self.segments[0].q.device)
        for s in self.segments:
            triton_gemv.dequantize_t(s.packed(), w[:, s.col : s.col + s.n])
        return w

    def weight_bytes(self) -> int:
        return sum(s.packed().nbytes for s in self.segments) + (0 if self.bias is None else self.bias.nbytes)

    def summary(self) -> list[tuple[str, list[int], int]]:
        """(path, member indices, bytes) per segment, for the load log line."""
        return [(f"q{s.bits}-cuda", s.members, s.packed().nbytes) for s in self.segments]
