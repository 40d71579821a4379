"""Linear layers over weights kept in a compact layout; ``forward(x)`` is all a model sees.

``QuantLinear`` runs 4-bit planes (see ``int4``): the int4 kernel for a few rows (decode), a
dequantize-then-bf16-GEMM for many rows (prefill), where the kernel's cost grows with rows.
``DenseLinear`` holds a bf16 (or float32) matrix for formats without an exact grouped path.
Several GGUF tensors with the same input (Q/K/V, gate/up) can be fused into one module whose
output is their outputs side by side. Activations enter and leave in their own dtype; the
matrix product itself runs on bf16 inputs with float32 accumulation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import int4

# Up to this many rows per plane the int4 kernel (cost ∝ rows × planes) beats dequantize + bf16
# GEMM (cost ≈ the dequantization, planes combined, and its memory traffic): in a whole model's
# prefill the crossover lies near 100 rows for one plane (SmolLM2 Q4_1) and 50 for two (Qwen2.5
# Q5_0/Q8_0); bench/quant_linear.py times the two paths per layer, where caches are warm.
GEMV_MAX_ROWS = 96
DEQUANT_CHUNK = 2**20  # weights dequantized at a time for a prefill GEMM (2 MiB of bf16: in L2)


class QuantLinear(nn.Module):
    """y = x @ W.T + b, W = the row-wise concatenation of ``parts`` kept as int4 planes.

    Kernel output rows: first planes of all parts (N rows, in part order), then the second
    planes of the parts that have one; those are added onto their parts' columns.
    """

    path = "int4"

    def __init__(self, parts: Sequence[int4.GroupSource], bias: torch.Tensor | None = None) -> None:
        super().__init__()
        k = parts[0].rows(0, 1).codes.shape[1]
        hi_cols = []
        col = 0
        for g in parts:
            if int4.n_planes(g.bits) == 2:
                hi_cols.append(torch.arange(col, col + g.n_rows))
            col += g.n_rows
        self.in_features, self.out_features = k, col
        # planes() lists the high plane first: the low (or only) plane is the last one
        first = [int4.plane_rows(g, int4.n_planes(g.bits) - 1) for g in parts]
        second = [int4.plane_rows(g, 0) for g in parts if int4.n_planes(g.bits) == 2]
        n_rows = col + sum(g.n_rows for g in parts if int4.n_planes(g.bits) == 2)
        packed, sz, rows = int4.pack(itertools.chain(*first, *second), n_rows)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("scale_zero", sz, persistent=False)
        self.n_rows = rows
        self.all_two = len(second) == len(parts)
        self.hi_cols = torch.cat(hi_cols) if hi_cols and not self.all_two else None
        self.n_second = rows - col
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)
        self.combined = self._combinable(sz, col)
        self.chunk_blocks = max(1, DEQUANT_CHUNK // (int4.ROW_BLOCK * k))
        self.gemv_max_rows = GEMV_MAX_ROWS // (2 if self.n_second and self.combined else 1)

    def _combinable(self, sz: torch.Tensor, n: int) -> bool:
        """Whether prefill can dequantize each weight in one rounding (``int4.dequantize_t``):
        one plane, or two planes whose row blocks line up, with 16× scales and a combined
        offset that is a bf16 number (Q8_0: 0, Q5_0: −16× the scale)."""
        if self.n_second == 0:
            return True
        if not self.all_two or n % int4.ROW_BLOCK:
            return False
        nb = n // int4.ROW_BLOCK
        z = int4.combined_offsets(sz, 0, nb, nb)
        return torch.equal(sz[:, n : 2 * n, 0].float(), 16 * sz[:, :n, 0].float()) and torch.equal(
            z.to(torch.bfloat16).float(), z
        )

    def _dequant_gemm(self, xb: torch.Tensor) -> torch.Tensor:
        """float32 [M, N]: xb @ W.T, W dequantized a chunk of rows at a time (planes combined),
        each chunk's bf16 GEMM output converted once, into its columns of the result."""
        n = self.out_features
        nb = -(-n // int4.ROW_BLOCK)
        hi = nb if self.n_second else None
        ys = []
        for b in range(0, nb, self.chunk_blocks):
            e = min(b + self.chunk_blocks, nb)
            hb = None if hi is None else hi + b
            wt = int4.dequantize_t(self.packed, self.scale_zero, self.in_features, b, e, hb)
            ys.append(torch.mm(xb, wt))
        if ys[-1].shape[1] > n - (len(ys) - 1) * ys[0].shape[1]:  # padding rows of the last block
            ys[-1] = ys[-1][:, : n - (len(ys) - 1) * ys[0].shape[1]]
        return torch.cat(ys, dim=1, out=torch.empty(xb.shape[0], n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Few ops on purpose: at decode every one costs about as much as a small kernel.
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        xb = x2.to(torch.bfloat16)
        n = self.out_features
        if x2.shape[0] > self.gemv_max_rows and self.combined:
            out = self._dequant_gemm(xb)
        else:
            if x2.shape[0] <= self.gemv_max_rows:
                y = int4.matmul(xb, self.packed, self.scale_zero)  # bf16 [M, R_pad]
            else:
                y = F.linear(xb, int4.dequantize(self.packed, self.scale_zero, self.in_features))
            if self.all_two:  # rows [0, n) first planes, [n, 2n) second planes: sum them in f32
                out = y[:, : 2 * n].view(-1, 2, n).sum(1, dtype=torch.float32)
            else:
                out = (y if y.shape[1] == n else y[:, :n]).float()
                if self.hi_cols is not None:
                    out.index_add_(1, self.hi_cols, y[:, n : n + self.n_second].float())
        if self.bias is not None:
            out += self.bias
        if out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], n)

    def weight_bytes(self) -> int:
        return self.packed.nbytes + self.scale_zero.nbytes + (0 if self.bias is None else self.bias.nbytes)

    def dequantized(self) -> torch.Tensor:
        """float32 [out, in]: the weight exactly as ``forward`` applies it (for tests)."""
        w = int4.dequantize(self.packed, self.scale_zero, self.in_features, torch.float32)[: self.n_rows]
        n = self.out_features
        out = w[:n].clone()
        if self.all_two:
            out += w[n : 2 * n]
        elif self.hi_cols is not None:
            out.index_add_(0, self.hi_cols, w[n:])
        return out


class DenseLinear(nn.Module):
    """y = x @ W.T + b with W stored dense (bf16 by default; the matmul runs in W's dtype)."""

    path = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.register_buffer("weight", weight.contiguous(), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def weight_bytes(self) -> int:
        return self.weight.nbytes + (0 if self.bias is None else self.bias.nbytes)

    def dequantized(self) -> torch.Tensor:
        return self.weight.float()
