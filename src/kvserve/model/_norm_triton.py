"""The Triton RMSNorm kernel behind ``norm_kernel`` (imported only when it is used)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    n = x.shape[-1]
    y = torch.empty_like(x)
    rows = x.numel() // n if n else 0
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](x, w, y, n, eps, BLOCK=block, num_warps=min(16, max(1, block // 256)))
    return y
