"""The Triton kernels behind ``norm_kernel`` (imported only when they are used)."""

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


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """s = x + r (rounded to x's dtype, as torch's add), y = rms_norm(s) * w."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < n_cols
    x = tl.load(x_ptr + row * n_cols + c, mask=m, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * n_cols + c, mask=m, other=0.0).to(tl.float32)
    s = (x + r).to(s_ptr.dtype.element_ty)
    tl.store(s_ptr + row * n_cols + c, s, mask=m)
    sf = s.to(tl.float32)
    y = sf * tl.rsqrt(tl.sum(sf * sf, 0) / n_cols + eps)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n_cols + c, (y * w).to(y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _act_mul_kernel(gu_ptr, y_ptr, n_ff, stride_row, GELU: tl.constexpr, BLOCK: tl.constexpr):
    """y = act(g) * u for gu = [g | u] per row; act rounded to the dtype first, as in torch."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < n_ff
    g = tl.load(gu_ptr + row * stride_row + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_row + n_ff + c, mask=m, other=0.0)
    if GELU:  # tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 * tl.sigmoid(2.0 * z))
    else:
        a = g * tl.sigmoid(g)
    a = a.to(y_ptr.dtype.element_ty).to(tl.float32)
    tl.store(y_ptr + row * n_ff + c, (a * u.to(tl.float32)).to(y_ptr.dtype.element_ty), mask=m)


def _warps(block: int) -> int:
    return min(16, max(1, block // 256))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    n = x.shape[-1]
    y = torch.empty_like(x)
    rows = x.numel() // n if n else 0
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](x, w, y, n, eps, BLOCK=block, num_warps=_warps(block))
    return y


def add_rms_norm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    y, s = torch.empty_like(x), torch.empty_like(x)
    rows = x.numel() // n if n else 0
    if rows:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(rows,)](x, r, w, y, s, n, eps, BLOCK=block, num_warps=_warps(block))
    return y, s


def act_mul(gu: torch.Tensor, n_ff: int, gelu: bool) -> torch.Tensor:
    rows = gu.shape[0]
    y = torch.empty((rows, n_ff), dtype=gu.dtype, device=gu.device)
    if rows:
        block = min(1024, triton.next_power_of_2(n_ff))
        _act_mul_kernel[(rows, triton.cdiv(n_ff, block))](gu, y, n_ff, gu.stride(0), GELU=gelu, BLOCK=block,
                                                          num_warps=4)
    return y
