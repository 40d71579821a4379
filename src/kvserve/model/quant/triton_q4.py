"""4-bit grouped weights on CUDA: a Triton dequantizing GEMV for decode, dequantize-then-GEMM
for prefill. The torch functions in ``reference`` are the CPU definition both are tested
against (under ``TRITON_INTERPRET=1`` on machines without a GPU).

Layout (from exact ``Groups`` of 4-bit codes: Q4_0, Q4_1, Q4_K):

    q   uint8 [N, K/2]     byte j of row n: code of column 2j (low nibble), 2j+1 (high nibble)
    s   f16   [N, K/32]    scale of each group of 32 columns
    o   f16   [N, K/32]    offset:  W[n, k] = code · s[n, k//32] + o[n, k//32]

4 bits + 1 bit of scales per weight; the scales are rounded once to f16 (relative 2⁻¹¹).
The GEMV reads each weight byte once: y[m, n] = Σ_g s·(Σ code·x) + o·(Σ x) over the groups,
split over K into ``split_k`` slices whose float32 partial sums are added atomically.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .groups import GROUP, Groups


def pack(g: Groups) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, s, o) on the CPU, from groups with 4-bit codes."""
    assert g.bits == 4
    c = g.codes
    q = (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)
    return (torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(g.scale).half(),
            torch.from_numpy(g.offset).half())


def reference(q: torch.Tensor, s: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """float32 [N, K]: the weights the kernels apply."""
    n = q.shape[0]
    codes = torch.stack([q & 0x0F, q >> 4], dim=-1).view(n, -1, GROUP).float()
    return (codes * s.float()[..., None] + o.float()[..., None]).view(n, -1)


@triton.jit
def _gemv_kernel(x_ptr, q_ptr, s_ptr, o_ptr, y_ptr, N, K, G, stride_xm, stride_ym,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PER_SPLIT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m = tl.program_id(2)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    half = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for i in range(0, K_PER_SPLIT // BLOCK_K):
        cols = (k_start + i * BLOCK_K) // 2 + half  # byte columns
        kmask = cols < K // 2
        bmask = nmask[:, None] & kmask[None, :]
        b = tl.load(q_ptr + rn[:, None] * (K // 2) + cols[None, :], mask=bmask, other=0)
        lo = (b & 0x0F).to(tl.float32)
        hi = (b >> 4).to(tl.float32)
        xe = tl.load(x_ptr + m * stride_xm + 2 * cols, mask=kmask, other=0.0).to(tl.float32)
        xo = tl.load(x_ptr + m * stride_xm + 2 * cols + 1, mask=kmask, other=0.0).to(tl.float32)
        g = (2 * cols) // 32
        gm = nmask[:, None] & kmask[None, :]
        s = tl.load(s_ptr + rn[:, None] * G + g[None, :], mask=gm, other=0.0).to(tl.float32)
        o = tl.load(o_ptr + rn[:, None] * G + g[None, :], mask=gm, other=0.0).to(tl.float32)
        acc += tl.sum(s * (lo * xe[None, :] + hi * xo[None, :]) + o * (xe + xo)[None, :], axis=1)
    tl.atomic_add(y_ptr + m * stride_ym + rn, acc, mask=nmask)


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, o_ptr, w_ptr, N, K, G, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    mask = (rn < N)[:, None] & (cols < K // 2)[None, :]
    b = tl.load(q_ptr + rn[:, None] * (K // 2) + cols[None, :], mask=mask, other=0)
    g = (2 * cols) // 32
    s = tl.load(s_ptr + rn[:, None] * G + g[None, :], mask=mask, other=0.0).to(tl.float32)
    o = tl.load(o_ptr + rn[:, None] * G + g[None, :], mask=mask, other=0.0).to(tl.float32)
    lo = (b & 0x0F).to(tl.float32) * s + o
    hi = (b >> 4).to(tl.float32) * s + o
    base = w_ptr + rn[:, None] * K + 2 * cols[None, :]
    tl.store(base, lo.to(w_ptr.dtype.element_ty), mask=mask)
    tl.store(base + 1, hi.to(w_ptr.dtype.element_ty), mask=mask)


def gemv(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, o: torch.Tensor,
         block_n: int = 32, block_k: int = 256, split_k: int | None = None) -> torch.Tensor:
    """x [M, K] (any float dtype) @ W.T → float32 [M, N]."""
    m, k = x.shape
    n = q.shape[0]
    x = x.contiguous()
    if split_k is None:  # about four programs per multiprocessor at batch 1
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        split_k = max(1, min(k // block_k, (4 * sms) // max(1, triton.cdiv(n, block_n))))
    k_per = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    split_k = triton.cdiv(k, k_per)
    y = torch.zeros((m, n), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, block_n), split_k, m)
    _gemv_kernel[grid](x, q, s, o, y, n, k, k // GROUP, x.stride(0), y.stride(0),
                       BLOCK_N=block_n, BLOCK_K=block_k, K_PER_SPLIT=k_per)
    return y


def dequantize(q: torch.Tensor, s: torch.Tensor, o: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
               block_n: int = 64, block_k: int = 128) -> torch.Tensor:
    n, k = q.shape[0], q.shape[1] * 2
    w = torch.empty((n, k), dtype=dtype, device=q.device)
    grid = (triton.cdiv(n, block_n), triton.cdiv(k, block_k))
    _dequant_kernel[grid](q, s, o, w, n, k, k // GROUP, BLOCK_N=block_n, BLOCK_K=block_k)
    return w
