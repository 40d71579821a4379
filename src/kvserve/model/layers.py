"""Building blocks shared by the architecture files."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * w, computed in float32. GGUF norm weights are used as stored
    (Gemma's ``1 + w`` is already folded in by the converter)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); act = SiLU (llama, qwen) or GELU-tanh (gemma)."""

    def __init__(self, n_embd: int, n_ff: int, act: str = "silu") -> None:
        super().__init__()
        self.gate = nn.Linear(n_embd, n_ff, bias=False)
        self.up = nn.Linear(n_embd, n_ff, bias=False)
        self.down = nn.Linear(n_ff, n_embd, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.gate(x)
        g = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down(g * self.up(x))
