"""Building blocks shared by the architecture files (submodules called through ``.forward``, as
in ``arch.llama``).

On the CPU with float32 activations the native ops of ``ops_cpu`` run them (one call each, with
llama.cpp's arithmetic; ``KVSERVE_NATIVE=0`` or an unbuilt extension keeps the torch code below,
the readable reference); on CUDA the Triton kernels of ``norm_kernel``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import norm_kernel, ops_cpu
from .prenormed import Prenormed


class RMSNorm(nn.Module):
    """x / rms(x) * w, computed in float32. GGUF norm weights are used as stored
    (Gemma's ``1 + w`` is already folded in by the converter).

    ``norm(x, residual)`` first adds the residual stream (in x's dtype) and returns
    ``(norm(x + residual), x + residual)``: one kernel on CUDA instead of an add and a norm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps
        self._consts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # (dtype, device) → (n, eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):  # type: ignore[override]
        if ops_cpu.enabled(x):
            return ops_cpu.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        if norm_kernel.available(x) and residual.is_contiguous() and residual.dtype == x.dtype:
            return norm_kernel.add_rms_norm(x, residual, self.weight, self.eps)
        s = torch.add(x, residual)
        return self._norm(s), s

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if norm_kernel.available(x):
            return norm_kernel.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            # F.rms_norm's arithmetic (bit for bit) in fewer operations: on the CPU it runs as a
            # composite of ~14 aten calls, and a decode step's cost is mostly per-call overhead
            # (mean on the CPU is this sum and division, which F.rms_norm calls through it). The
            # row length and eps as 0-dim float32 tensors: the same operands a Python number
            # becomes, without the four aten calls that convert one on every in-place op
            c = self._consts.get((x.dtype, x.device))
            if c is None:
                c = self._consts[(x.dtype, x.device)] = (
                    torch.tensor(float(x.shape[-1]), dtype=x.dtype, device=x.device),
                    torch.tensor(self.eps, dtype=x.dtype, device=x.device),
                )
            r = torch.sum(x * x, -1, keepdim=True).div_(c[0]).add_(c[1]).rsqrt_()
            return torch.mul(x, r).mul_(self.weight)
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
        self.gate_up: nn.Module | None = None  # gate and up fused at load (replaces the two)
        self.n_ff = n_ff
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            return self.from_gate_up(self.gate_up.forward(x))
        g, u = self.gate.forward(x), self.up.forward(x)
        if ops_cpu.enabled(g):
            return self.down.forward(ops_cpu.act_mul(g, self.n_ff, self.act, u))
        g = F.silu(g) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down.forward(torch.mul(g, u))

    def forward_normed(self, norm: RMSNorm, x: torch.Tensor | Prenormed, residual: torch.Tensor | None,
                       next_norm: RMSNorm | None = None) -> tuple[torch.Tensor | Prenormed, torch.Tensor | None]:
        """(self(norm(x + residual)), x + residual) with gate and up fused (x a ``Prenormed``: its
        sum, residual not read): where the gate/up module's GEMV can hand the down projection its
        quantized input (the CUDA quantized modules at decode sizes) one kernel fewer, else
        ``norm_linear`` then ``from_gate_up``. With ``next_norm`` (the RMSNorm after this block)
        the down projection may return ``(Prenormed of its output + the sum, None)`` instead
        (``CudaQuantLinear.forward_quantized_into``): the pair's sum is then the Prenormed's."""
        # looked up on the classes: a miss on an nn.Module instance costs ~2 µs (its __getattr__),
        # once a layer a token on every other backend
        if (getattr(type(self.gate_up), "forward_normed_act", None) is not None
                and getattr(type(self.down), "quant_input", None) is not None):
            if isinstance(x, Prenormed):
                xq, s = self.gate_up.forward_prenormed_act(x, norm, self.n_ff, self.act, self.down.quant_input), x.s
                got = None if xq is None else (xq, s)
            else:
                got = self.gate_up.forward_normed_act(x, residual, norm, self.n_ff, self.act,
                                                      self.down.quant_input)
            if got is not None:
                xq, s = got
                if next_norm is not None:
                    pre = self.down.forward_quantized_into(xq, s.dtype, s, next_norm)
                    if pre is not None:
                        return pre, None
                return self.down.forward_quantized(xq, s.dtype), s
        gu, s = norm_linear(norm, self.gate_up, x, residual)
        return self.from_gate_up(gu), s

    def from_gate_up(self, gu: torch.Tensor) -> torch.Tensor:
        """down(act(g) * u) of the fused projection's output gu = [g | u] (this call's own)."""
        if ops_cpu.enabled(gu):
            return self.down.forward(ops_cpu.act_mul(gu, self.n_ff, self.act))
        if gu.dim() == 2 and gu.stride(-1) == 1 and norm_kernel.available(gu):
            fused = getattr(self.down, "forward_act", None)  # dense_gemv.GemvLinear: one launch
            if fused is not None:
                return fused(gu, self.n_ff, self.act)
            return self.down.forward(norm_kernel.act_mul(gu, self.n_ff, self.act))
        n = self.n_ff
        g, u = gu[..., :n], gu[..., n:]
        # act(gate) in place: gu is this call's own output
        g = F.silu(g, inplace=True) if self.act == "silu" else F.gelu(g, approximate="tanh")
        return self.down.forward(torch.mul(g, u))


def norm_linear(norm: RMSNorm, lin: nn.Module, x: torch.Tensor | Prenormed, residual: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(lin(norm(x + residual)), x + residual): one kernel where ``lin`` fuses the norm into its
    GEMV (``dense_gemv.GemvLinear`` on CUDA), else the norm's kernel and then ``lin``. x a
    ``Prenormed`` (residual not read): its sum, the norm's second half in ``lin``'s GEMVs where
    it takes one (``CudaQuantLinear.forward_prenormed``)."""
    if isinstance(x, Prenormed):
        if getattr(type(lin), "forward_prenormed", None) is not None:
            return lin.forward_prenormed(x, norm), x.s
        return lin.forward(norm.forward(x.s)), x.s
    fused = getattr(lin, "forward_normed", None)
    if fused is not None:
        return fused(x, residual, norm)
    h, s = norm.forward(x, residual)
    return lin.forward(h), s
