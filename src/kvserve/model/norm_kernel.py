"""RMSNorm as one Triton kernel (CUDA): the torch version in ``layers.RMSNorm`` takes about
eight kernels per call, which at decode batch sizes costs more in launches than in bytes.

Same arithmetic as the reference: x in float32, x * rsqrt(mean(x²) + eps) * w, rounded once to
x's dtype. One program per row.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


def available(x: torch.Tensor) -> bool:
    return triton is not None and x.is_cuda and x.is_contiguous()


if triton is not None:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, BLOCK)
        m = c < n_cols
        x = tl.load(x_ptr + r * n_cols + c, mask=m, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
        w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + r * n_cols + c, (y * w).to(y_ptr.dtype.element_ty), mask=m)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] contiguous, w [n]: the normalized x in x's dtype."""
    n = x.shape[-1]
    y = torch.empty_like(x)
    rows = x.numel() // n if n else 0
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](x, w, y, n, eps, BLOCK=block, num_warps=min(16, max(1, block // 256)))
    return y
