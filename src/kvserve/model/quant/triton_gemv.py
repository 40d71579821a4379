"""CUDA kernels (Triton) over ``cuda_pack.Packed`` weights: a dequantizing GEMV for a few rows
(decode) and a dequantize kernel feeding cuBLAS for many rows (prefill). ``cuda_pack.reference``
is the torch definition both are tested against (under ``TRITON_INTERPRET=1`` without a GPU).

GEMV: each program owns ``BN`` output rows and a slice of the groups along K; per step it loads
a [BN, GB, wpg] tile of int32 words (each row's GB groups are contiguous: wide coalesced loads),
the per-group scales beside it, and the activations of all ``BM`` batch rows, so that one read
of a weight serves the whole batch. Codes become floats through the exponent trick
(``0x4B000000 | u`` is the float 2²³ + u, exact), no integer→float conversion; per group the
kernel accumulates ``scale · Σ (u − zero) · x + offset · Σ x`` in float32 and reduces over the
groups once at the end. With more than one K slice, float32 partials go to a workspace that a
second kernel sums (with the bias, in the output dtype): no atomics, deterministic, and every
launch has fixed shapes, so the decode CUDA graph captures it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .cuda_pack import SUPER, Packed

MAGIC = tl.constexpr(0x4B000000)  # float32 bits of 2**23: OR-ing an integer u < 2**23 gives 2**23 + u
_SUPER = tl.constexpr(SUPER)


@triton.jit
def _scales(s_ptr, o_ptr, d_ptr, dm_ptr, rn, g, mask, G, R: tl.constexpr, TWO_LEVEL: tl.constexpr,
            HAS_O: tl.constexpr):
    """float32 scale and offset [BN, GB] of groups g of rows rn."""
    s = tl.load(s_ptr + rn[:, None] * G + g[None, :], mask=mask, other=0).to(tl.float32)
    if TWO_LEVEL:
        sup = rn[:, None] * (G // R) + (g // R)[None, :]
        s = tl.load(d_ptr + sup, mask=mask, other=0.0).to(tl.float32) * s
    o = tl.zeros_like(s)
    if HAS_O:
        o = tl.load(o_ptr + rn[:, None] * G + g[None, :], mask=mask, other=0).to(tl.float32)
        if TWO_LEVEL:
            o = tl.load(dm_ptr + sup, mask=mask, other=0.0).to(tl.float32) * o
    return s, o


@triton.jit
def _gemv_body(x_ptr, q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, b_ptr, y_ptr,
               M, N, G, stride_xm, stride_ys, stride_ym, STEPS,
               BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
               HAS_O: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
               GB: tl.constexpr):
    """Steps of GB groups per K slice: ``STEPS`` (a run-time loop bound on the GPU)."""
    WPG: tl.constexpr = GS * BITS // 32  # words per group
    CPW: tl.constexpr = 32 // BITS  # codes per word
    MASK: tl.constexpr = (1 << BITS) - 1
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    ww = tl.arange(0, WPG)
    m0 = tl.program_id(2) * BM
    rm = m0 + tl.arange(0, BM)
    mmask = rm < M
    g_begin = pid_s * (STEPS * GB)
    g_end = tl.minimum(g_begin + STEPS * GB, G)
    if BM == 1:
        acc = tl.zeros((BN, GB), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN, GB), dtype=tl.float32)
    for it in range(0, STEPS):  # the last slice may be shorter (masked)
        g = g_begin + it * GB + tl.arange(0, GB)
        gmask = g < g_end
        m2 = nmask[:, None] & gmask[None, :]
        words = tl.load(q_ptr + (rn[:, None, None] * G + g[None, :, None]) * WPG + ww[None, None, :],
                        mask=m2[:, :, None], other=0)
        s, o = _scales(s_ptr, o_ptr, d_ptr, dm_ptr, rn, g, m2, G, _SUPER // GS, TWO_LEVEL, HAS_O)
        if BM == 1:
            dot = tl.zeros((BN, GB), dtype=tl.float32)
            xsum = tl.zeros((GB,), dtype=tl.float32)
            for i in tl.static_range(CPW):
                u = ((words >> (BITS * i)) & MASK) | MAGIC
                c = u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)
                xi = tl.load(x_ptr + m0 * stride_xm + g[:, None] * GS + i * WPG + ww[None, :],
                             mask=gmask[:, None], other=0.0).to(tl.float32)
                dot += tl.sum(c * xi[None, :, :], axis=2)
                xsum += tl.sum(xi, axis=1)
            acc += s * dot + o * xsum[None, :]
        else:
            dot = tl.zeros((BM, BN, GB), dtype=tl.float32)
            xsum = tl.zeros((BM, GB), dtype=tl.float32)
            for i in tl.static_range(CPW):
                u = ((words >> (BITS * i)) & MASK) | MAGIC
                c = u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)
                xi = tl.load(x_ptr + rm[:, None, None] * stride_xm + g[None, :, None] * GS + i * WPG
                             + ww[None, None, :], mask=mmask[:, None, None] & gmask[None, :, None],
                             other=0.0).to(tl.float32)
                dot += tl.sum(c[None, :, :, :] * xi[:, None, :, :], axis=3)
                xsum += tl.sum(xi, axis=2)
            acc += s[None, :, :] * dot + o[None, :, :] * xsum[:, None, :]
    if BM == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = tl.sum(acc, axis=2)
    omask = mmask[:, None] & nmask[None, :]
    if HAS_BIAS:
        out += tl.load(b_ptr + rn, mask=nmask, other=0.0)[None, :]
    dst = y_ptr + pid_s * stride_ys + rm[:, None] * stride_ym + rn[None, :]
    tl.store(dst, out.to(y_ptr.dtype.element_ty), mask=omask)


# Two entry points of one body: Triton's interpreter (the CPU tests) takes loop bounds only as
# compile-time constants, while on the GPU a run-time bound keeps one compilation per layout.
@triton.jit
def _gemv_kernel(x_ptr, q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, b_ptr, y_ptr, M, N, G, stride_xm, stride_ys,
                 stride_ym, steps, BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr,
                 TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr,
                 BN: tl.constexpr, GB: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, b_ptr, y_ptr, M, N, G, stride_xm, stride_ys,
               stride_ym, steps, BITS, GS, ZERO, TWO_LEVEL, HAS_O, HAS_BIAS, BM, BN, GB)


@triton.jit
def _gemv_kernel_const(x_ptr, q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, b_ptr, y_ptr, M, N, G, stride_xm,
                       stride_ys, stride_ym, steps: tl.constexpr, BITS: tl.constexpr,
                       GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GB: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, b_ptr, y_ptr, M, N, G, stride_xm, stride_ys,
               stride_ym, steps, BITS, GS, ZERO, TWO_LEVEL, HAS_O, HAS_BIAS, BM, BN, GB)


@triton.jit
def _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """y[m, n] = Σ_s p[s, m, n] (+ bias[n]), p float32 [S, M, N] contiguous."""
    m = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, S):
        acc += tl.load(p_ptr + (s * M + m) * N + rn, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=mask, other=0.0)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_kernel(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS, BLOCK)


@triton.jit
def _reduce_kernel_const(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S: tl.constexpr, HAS_BIAS: tl.constexpr,
                         BLOCK: tl.constexpr):
    _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS, BLOCK)


_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dequant_kernel(q_ptr, s_ptr, o_ptr, d_ptr, dm_ptr, w_ptr, N, G, stride_wn,
                    BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                    HAS_O: tl.constexpr, BN: tl.constexpr, GB: tl.constexpr):
    WPG: tl.constexpr = GS * BITS // 32
    CPW: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    g = tl.program_id(1) * GB + tl.arange(0, GB)
    ww = tl.arange(0, WPG)
    m2 = (rn < N)[:, None] & (g < G)[None, :]
    words = tl.load(q_ptr + (rn[:, None, None] * G + g[None, :, None]) * WPG + ww[None, None, :],
                    mask=m2[:, :, None], other=0)
    s, o = _scales(s_ptr, o_ptr, d_ptr, dm_ptr, rn, g, m2, G, _SUPER // GS, TWO_LEVEL, HAS_O)
    for i in tl.static_range(CPW):
        u = ((words >> (BITS * i)) & MASK) | MAGIC
        c = u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)
        v = c * s[:, :, None]
        if HAS_O:
            v += o[:, :, None]
        dst = w_ptr + rn[:, None, None] * stride_wn + g[None, :, None] * GS + i * WPG + ww[None, None, :]
        tl.store(dst, v.to(w_ptr.dtype.element_ty), mask=m2[:, :, None])


class Config(NamedTuple):
    bn: int  # output rows per program
    gb: int  # groups per step
    warps: int
    programs: int  # aim for about this many programs per multiprocessor (sets the K split)


def default_config(p: Packed, m: int) -> Config:
    """The fixed configuration of a GEMV over ``p`` at ``m`` batch rows (measured on an H200 by
    ``bench/quant_cuda.py --sweep``): about 2,048 words (8 KiB) in flight per program and step."""
    wpg = p.gs * p.bits // 32
    bn = 64
    gb = max(1, 2048 // (bn * wpg))
    return Config(bn, gb, 4, 4)


_SMS: dict[int, int] = {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def _args(p: Packed) -> tuple[torch.Tensor, ...]:
    dummy = p.s
    return (p.q, p.s, p.o if p.o is not None else dummy, p.d if p.d is not None else dummy,
            p.dm if p.dm is not None else dummy)


def split_of(p: Packed, cfg: Config, device: torch.device) -> tuple[int, int]:
    """(K slices, groups per slice) for ``cfg``."""
    g = p.k // p.gs
    blocks = triton.cdiv(p.n, cfg.bn)
    steps = triton.cdiv(g, cfg.gb)
    want = max(1, min(steps, (cfg.programs * _sms(device)) // blocks))
    gps = triton.cdiv(steps, want) * cfg.gb
    return triton.cdiv(g, gps), gps


def gemv(x: torch.Tensor, p: Packed, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
         cfg: Config | None = None) -> torch.Tensor:
    """out [M, n] (a view with unit column stride; default new, x's dtype) = x [M, k] @ Wᵀ + bias."""
    m, k = x.shape
    assert k == p.k and x.stride(1) == 1
    if out is None:
        out = torch.empty((m, p.n), dtype=x.dtype, device=x.device)
    cfg = cfg or default_config(p, m)
    bm = min(8, triton.next_power_of_2(m))
    splits, gps = split_of(p, cfg, x.device)
    bias_t = bias if bias is not None else out
    grid = (triton.cdiv(p.n, cfg.bn), splits, triton.cdiv(m, bm))
    meta = dict(BITS=p.bits, GS=p.gs, ZERO=p.zero, TWO_LEVEL=p.two_level, HAS_O=p.o is not None,
                BM=bm, BN=cfg.bn, GB=cfg.gb, num_warps=cfg.warps)
    g = p.k // p.gs
    kernel, reduce = (_gemv_kernel_const, _reduce_kernel_const) if _INTERPRET else (_gemv_kernel, _reduce_kernel)
    if splits == 1:
        kernel[grid](x, *_args(p), bias_t, out, m, p.n, g, x.stride(0), 0, out.stride(0), gps // cfg.gb,
                     HAS_BIAS=bias is not None, **meta)
        return out
    part = torch.empty((splits, m, p.n), dtype=torch.float32, device=x.device)
    kernel[grid](x, *_args(p), bias_t, part, m, p.n, g, x.stride(0), m * p.n, p.n, gps // cfg.gb,
                 HAS_BIAS=False, **meta)
    block = 512
    reduce[(triton.cdiv(p.n, block), m)](part, bias_t, out, m, p.n, out.stride(0), splits,
                                         HAS_BIAS=bias is not None, BLOCK=block, num_warps=4)
    return out


def dequantize(p: Packed, out: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
               bn: int = 32, gb: int = 16) -> torch.Tensor:
    """The weights [n, k] in ``dtype`` (into ``out``, a view with unit column stride, if given)."""
    if out is None:
        out = torch.empty((p.n, p.k), dtype=dtype, device=p.q.device)
    g = p.k // p.gs
    grid = (triton.cdiv(p.n, bn), triton.cdiv(g, gb))
    _dequant_kernel[grid](*_args(p), out, p.n, g, out.stride(0), BITS=p.bits, GS=p.gs, ZERO=p.zero,
                          TWO_LEVEL=p.two_level, HAS_O=p.o is not None, BN=bn, GB=gb, num_warps=4)
    return out
