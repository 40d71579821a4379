"""``Q4Linear``: 4-bit grouped weights (Q4_0, Q4_1, Q4_K) kept quantized on CUDA."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import triton_q4
from .groups import Groups

# Up to this many rows the dequantizing GEMV (cost ∝ rows) beats dequantize + cuBLAS GEMM.
GEMV_MAX_ROWS = 8


class Q4Linear(nn.Module):
    """y = x @ W.T + b with W = the row-wise concatenation of ``parts`` (4-bit groups)."""

    path = "q4-triton"

    def __init__(self, parts: Sequence[Groups], bias: torch.Tensor | None, device: torch.device) -> None:
        super().__init__()
        packs = [triton_q4.pack(g) for g in parts]
        self.register_buffer("q", torch.cat([p[0] for p in packs]).to(device), persistent=False)
        self.register_buffer("s", torch.cat([p[1] for p in packs]).to(device), persistent=False)
        self.register_buffer("o", torch.cat([p[2] for p in packs]).to(device), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float().to(device), persistent=False)
        self.out_features, self.in_features = self.q.shape[0], self.q.shape[1] * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        if x2.shape[0] <= GEMV_MAX_ROWS:
            y = triton_q4.gemv(x2, self.q, self.s, self.o)
        else:
            w = triton_q4.dequantize(self.q, self.s, self.o, torch.bfloat16)
            y = F.linear(x2.to(torch.bfloat16), w)
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        bias = 0 if self.bias is None else self.bias.nbytes
        return sum(t.nbytes for t in (self.q, self.s, self.o)) + bias

    def dequantized(self) -> torch.Tensor:
        return triton_q4.reference(self.q, self.s, self.o)
