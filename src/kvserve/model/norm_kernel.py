"""RMSNorm as one Triton kernel (CUDA): the torch version in ``layers.RMSNorm`` takes about
eight kernels per call, which at decode batch sizes costs more in launches than in bytes.

Same arithmetic as the reference: x in float32, x * rsqrt(mean(x²) + eps) * w, rounded once to
x's dtype. One program per row. Triton is imported on first use, so CPU-only runs never load it.
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
