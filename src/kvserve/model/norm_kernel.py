"""Fused elementwise kernels in Triton (CUDA): RMSNorm, RMSNorm with the residual add before it,
and the gated MLP's act(gate) * up. Their torch versions in ``layers`` take several kernels per
call, which at decode batch sizes costs more in launches than in bytes.

Same arithmetic as the reference: float32 inside, rounded to the activations' dtype where torch
rounds (the residual sum before it is normed; act(gate) before the product). One program per
row (per row and column block for act_mul). Triton is imported on first use, so CPU-only runs
never load it; ``TRITON_INTERPRET=1`` runs the kernels on the CPU (tests).
"""

from __future__ import annotations

from types import ModuleType

import torch

_mod: ModuleType | None | bool = None  # the kernel module once loaded, False when triton is missing


def _kernels() -> ModuleType | None:
    global _mod
    if _mod is None:
        try:
            from . import _norm_triton

            _mod = _norm_triton
        except ImportError:
            _mod = False
    return _mod or None


def available(x: torch.Tensor) -> bool:
    return x.is_cuda and x.is_contiguous() and _kernels() is not None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] contiguous, w [n]: the normalized x in x's dtype."""
    k = _kernels()
    assert k is not None, "triton is not installed"
    return k.rms_norm(x, w, eps)


def add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + r) * w, x + r); x and r contiguous, same shape and dtype."""
    k = _kernels()
    assert k is not None, "triton is not installed"
    return k.add_rms_norm(x, r, w, eps)


def act_mul(gu: torch.Tensor, n_ff: int, act: str) -> torch.Tensor:
    """act(gu[:, :n_ff]) * gu[:, n_ff:] for a 2-D gu whose rows are contiguous; act = silu | gelu_tanh."""
    k = _kernels()
    assert k is not None, "triton is not installed"
    return k.act_mul(gu, n_ff, act == "gelu_tanh")
