"""CUDA kernels (Triton) over ``cuda_pack.Packed`` weights: a dequantizing GEMV for a few rows
(decode) and a dequantize kernel feeding cuBLAS for many rows (prefill). ``cuda_pack.reference``
is the torch definition both are tested against (under ``TRITON_INTERPRET=1`` without a GPU).

GEMV: a program owns ``BN`` consecutive output columns and a slice of K. Everything it loads
is a row of those columns (code words, the group's scale word, the super-block word: int32,
16 bytes a thread), so all of it shares one register layout and nothing moves through shared
memory; each activation is a scalar every thread reads (one broadcast load), applied to the
codes of up to ``BM`` (≤ 4) batch rows, so one read of a weight serves them all. A code becomes
a float through the exponent trick: ``(word & (mask << s)) | 0x4B000000`` is the float
2²³ + u·2ˢ (exact for s + bits ≤ 23, else the word is shifted first), the 2ˢ is folded into the
activation; per group the kernel adds ``scale · Σ u·x + (offset − zero·scale) · Σ x``.
With several K slices, float32 partials go to a workspace that a second kernel sums (with the
bias, in the output dtype): no atomics, deterministic, fixed shapes (CUDA-graph capturable).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .cuda_pack import SUPER, Packed

MAGIC = tl.constexpr(0x4B000000)  # float32 bits of 2**23: OR-ing an integer v < 2**23 gives 2**23 + v
_SUPER = tl.constexpr(SUPER)


@triton.jit
def _f16(v, HIGH: tl.constexpr):
    if HIGH:
        v = v >> 16
    return (v & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _int(v, HIGH: tl.constexpr, SIGNED: tl.constexpr):
    if SIGNED:
        if HIGH:
            return (v >> 16).to(tl.float32)
        return ((v << 16) >> 16).to(tl.float32)
    if HIGH:
        v = v >> 16
    return (v & 0xFFFF).to(tl.float32)


@triton.jit
def _xload(x_ptr, m, k, M, stride_xm, valid):
    return tl.load(x_ptr + m * stride_xm + k, mask=valid & (m < M), other=0.0).to(tl.float32)


@triton.jit
def _group(x_ptr, q_ptr, grp, rn, lmask, valid, N, M, m0, stride_xm,
           BITS: tl.constexpr, GS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Σ u·x over group ``grp`` (per column, per batch row m0 … m0+3) and Σ x (per row)."""
    WPG: tl.constexpr = GS * BITS // 32
    CPW: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    HI: tl.constexpr = 20 if BITS == 4 else 16  # slots above bit 23 are read from word >> HI
    d0 = tl.zeros((BN,), dtype=tl.float32)
    d1 = tl.zeros((BN,), dtype=tl.float32)
    d2 = tl.zeros((BN,), dtype=tl.float32)
    d3 = tl.zeros((BN,), dtype=tl.float32)
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for w in tl.static_range(WPG):
        word = tl.load(q_ptr + (grp * WPG + w) * N + rn, mask=lmask, other=0)
        hi = word >> HI
        for i in tl.static_range(CPW):
            if BITS * (i + 1) <= 23:
                v = (word & (MASK << (BITS * i))) | MAGIC
                f = 1.0 / (1 << (BITS * i))
            else:
                v = (hi & (MASK << (BITS * i - HI))) | MAGIC
                f = 1.0 / (1 << (BITS * i - HI))
            c = v.to(tl.float32, bitcast=True) - 8388608.0
            k = grp * GS + i * WPG + w
            x = _xload(x_ptr, m0, k, M, stride_xm, valid)
            d0 += c * (x * f)
            s0 += x
            if BM > 1:
                x = _xload(x_ptr, m0 + 1, k, M, stride_xm, valid)
                d1 += c * (x * f)
                s1 += x
            if BM > 2:
                x = _xload(x_ptr, m0 + 2, k, M, stride_xm, valid)
                d2 += c * (x * f)
                s2 += x
                x = _xload(x_ptr, m0 + 3, k, M, stride_xm, valid)
                d3 += c * (x * f)
                s3 += x
    return d0, d1, d2, d3, s0, s1, s2, s3


@triton.jit
def _scale(gw, sw, HIGH: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr,
           SIGNED: tl.constexpr, SUB: tl.constexpr):
    """(scale, offset − zero·scale) of the group in half ``HIGH`` (SUB = 2) or of the entry."""
    if TWO_LEVEL:
        s = _f16(sw, False) * _int(gw, HIGH, SIGNED)
        o = -ZERO * s
        if HAS_O:
            o += _f16(sw, True) * _int(gw, True, SIGNED)
    else:
        s = _f16(gw, False)
        o = -ZERO * s
        if HAS_O:
            o += _f16(gw, True)
    return s, o


@triton.jit
def _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, M, N, E, stride_xm, stride_ys, stride_ym, STEPS,
               BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
               HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr):
    """E: gw entries along K (groups / SUB); each program runs ``STEPS`` of them."""
    m0 = tl.program_id(0) * BM
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    nmask = rn < N
    pid_s = tl.program_id(2)
    a0 = tl.zeros((BN,), dtype=tl.float32)
    a1 = tl.zeros((BN,), dtype=tl.float32)
    a2 = tl.zeros((BN,), dtype=tl.float32)
    a3 = tl.zeros((BN,), dtype=tl.float32)
    for t in range(0, STEPS):
        e = pid_s * STEPS + t
        valid = e < E
        lmask = nmask & valid
        gw = tl.load(gw_ptr + e * N + rn, mask=lmask, other=0)
        sw = gw
        if TWO_LEVEL:
            sw = tl.load(sw_ptr + ((e * SUB * GS) // _SUPER) * N + rn, mask=lmask, other=0)
        for j in tl.static_range(SUB):
            d0, d1, d2, d3, s0, s1, s2, s3 = _group(x_ptr, q_ptr, e * SUB + j, rn, lmask, valid, N, M, m0,
                                                    stride_xm, BITS, GS, BM, BN)
            sc, off = _scale(gw, sw, j == 1, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB)
            a0 += sc * d0 + off * s0
            if BM > 1:
                a1 += sc * d1 + off * s1
            if BM > 2:
                a2 += sc * d2 + off * s2
                a3 += sc * d3 + off * s3
    bias = tl.zeros((BN,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    dst = y_ptr + pid_s * stride_ys + rn
    ty = y_ptr.dtype.element_ty
    tl.store(dst + m0 * stride_ym, (a0 + bias).to(ty), mask=nmask & (m0 < M))
    if BM > 1:
        tl.store(dst + (m0 + 1) * stride_ym, (a1 + bias).to(ty), mask=nmask & (m0 + 1 < M))
    if BM > 2:
        tl.store(dst + (m0 + 2) * stride_ym, (a2 + bias).to(ty), mask=nmask & (m0 + 2 < M))
        tl.store(dst + (m0 + 3) * stride_ym, (a3 + bias).to(ty), mask=nmask & (m0 + 3 < M))


# Two entry points of one body: Triton's interpreter (the CPU tests) takes loop bounds only as
# compile-time constants, while on the GPU a run-time bound keeps one compilation per layout.
@triton.jit
def _gemv_kernel(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, M, N, E, stride_xm, stride_ys, stride_ym, steps,
                 BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                 HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, M, N, E, stride_xm, stride_ys, stride_ym, steps,
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN)


@triton.jit
def _gemv_kernel_const(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, M, N, E, stride_xm, stride_ys, stride_ym,
                       steps: tl.constexpr, BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr,
                       TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, M, N, E, stride_xm, stride_ys, stride_ym, steps,
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN)


@triton.jit
def _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                 SB: tl.constexpr):
    """y[m, n] = Σ_s p[s, m, n] (+ bias[n]), p float32 [S, M, N] contiguous; SB slices per load."""
    m = tl.program_id(1)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = rn < N
    rs = tl.arange(0, SB)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s0 in range(0, S, SB):
        ptrs = p_ptr + ((s0 + rs)[:, None] * M + m) * N + rn[None, :]
        acc += tl.sum(tl.load(ptrs, mask=((s0 + rs) < S)[:, None] & mask[None, :], other=0.0), axis=0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=mask, other=0.0)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_kernel(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
                   SB: tl.constexpr):
    _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS, BLOCK, SB)


@triton.jit
def _reduce_kernel_const(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S: tl.constexpr, HAS_BIAS: tl.constexpr,
                         BLOCK: tl.constexpr, SB: tl.constexpr):
    _reduce_body(p_ptr, b_ptr, y_ptr, M, N, stride_ym, S, HAS_BIAS, BLOCK, SB)


_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _dequant_kernel(q_ptr, gw_ptr, sw_ptr, w_ptr, N, stride_wk,
                    BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                    HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, BN: tl.constexpr):
    """Wᵀ[k, n] for the SUB groups of gw entry ``program_id(1)``: (u − zero)·scale + offset,
    rounded as gguf rounds (run without FMA contraction)."""
    WPG: tl.constexpr = GS * BITS // 32
    CPW: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    rn = tl.program_id(0) * BN + tl.arange(0, BN)
    nmask = rn < N
    e = tl.program_id(1)
    gw = tl.load(gw_ptr + e * N + rn, mask=nmask, other=0)
    sw = gw
    if TWO_LEVEL:
        sw = tl.load(sw_ptr + ((e * SUB * GS) // _SUPER) * N + rn, mask=nmask, other=0)
    for j in tl.static_range(SUB):
        if TWO_LEVEL:
            s = _f16(sw, False) * _int(gw, j == 1, SIGNED)
            o = _f16(sw, True) * _int(gw, True, SIGNED)
        else:
            s = _f16(gw, False)
            o = _f16(gw, True)
        grp = e * SUB + j
        for w in tl.static_range(WPG):
            word = tl.load(q_ptr + (grp * WPG + w) * N + rn, mask=nmask, other=0)
            for i in tl.static_range(CPW):
                u = ((word >> (BITS * i)) & MASK) | MAGIC
                c = u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)
                v = c * s
                if HAS_O:
                    v = v + o
                k = grp * GS + i * WPG + w
                tl.store(w_ptr + k * stride_wk + rn, v.to(w_ptr.dtype.element_ty), mask=nmask)


class Config(NamedTuple):
    bn: int  # output columns per program: 4 per thread (one 16-byte load) × 32 × warps × repeats
    warps: int
    programs: int  # aim for about this many programs per multiprocessor (sets the K split)


# The fastest configurations of ``bench/quant_cuda.py --sweep`` at batch 1 on an H200 for the
# Llama-3-8B Q4_K_M tensors, by weight bytes: 9-13 MB (Q+K, V, O) want many small programs and
# K slices; 67-600 MB (gate/up, down, output) wide programs of 16 columns a thread.
BIG = 32 << 20
CONFIGS = {"small": Config(128, 1, 8), "big": Config(4096, 8, 2)}


def default_config(p: Packed, m: int) -> Config:
    """The fixed configuration of a GEMV over ``p`` (any batch rows ``m``: the weight read dominates)."""
    return CONFIGS["big" if p.nbytes >= BIG else "small"]


_SMS: dict[int, int] = {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def _meta(p: Packed) -> dict:
    return dict(BITS=p.bits, GS=p.gs, ZERO=p.zero, TWO_LEVEL=p.two_level, HAS_O=p.has_o, SIGNED=p.signed,
                SUB=p.sub)


def entries(p: Packed) -> int:
    """gw entries along K (the GEMV's unit of work)."""
    return int(p.gw.shape[0])


def split_of(p: Packed, cfg: Config, device: torch.device) -> tuple[int, int]:
    """(K slices, gw entries per slice) for ``cfg``."""
    e = entries(p)
    blocks = triton.cdiv(p.n, cfg.bn)
    want = max(1, min(e, (cfg.programs * _sms(device)) // blocks))
    steps = triton.cdiv(e, want)
    return triton.cdiv(e, steps), steps


def gemv(x: torch.Tensor, p: Packed, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
         cfg: Config | None = None) -> torch.Tensor:
    """out [M, n] (a view with unit column stride; default new, x's dtype) = x [M, k] @ Wᵀ + bias."""
    m, k = x.shape
    assert k == p.k and x.stride(1) == 1
    if out is None:
        out = torch.empty((m, p.n), dtype=x.dtype, device=x.device)
    cfg = cfg or default_config(p, m)
    bm = min(4, triton.next_power_of_2(m))
    splits, steps = split_of(p, cfg, x.device)
    bias_t = bias if bias is not None else out
    sw = p.sw if p.sw is not None else p.gw
    grid = (triton.cdiv(m, bm), triton.cdiv(p.n, cfg.bn), splits)  # batch blocks first: they share weights in L2
    meta = dict(_meta(p), BM=bm, BN=cfg.bn, num_warps=cfg.warps)
    kernel, reduce = (_gemv_kernel_const, _reduce_kernel_const) if _INTERPRET else (_gemv_kernel, _reduce_kernel)
    if splits == 1:
        kernel[grid](x, p.q, p.gw, sw, bias_t, out, m, p.n, entries(p), x.stride(0), 0, out.stride(0), steps,
                     HAS_BIAS=bias is not None, **meta)
        return out
    part = torch.empty((splits, m, p.n), dtype=torch.float32, device=x.device)
    kernel[grid](x, p.q, p.gw, sw, bias_t, part, m, p.n, entries(p), x.stride(0), m * p.n, p.n, steps,
                 HAS_BIAS=False, **meta)
    block = 128  # many small programs, each with up to 32 slices' loads in flight
    sb = min(32, triton.next_power_of_2(splits))
    reduce[(triton.cdiv(p.n, block), m)](part, bias_t, out, m, p.n, out.stride(0), splits,
                                         HAS_BIAS=bias is not None, BLOCK=block, SB=sb, num_warps=4)
    return out


def dequantize_t(p: Packed, out: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
                 bn: int = 512) -> torch.Tensor:
    """Wᵀ [k, n] in ``dtype`` (into ``out``, a view with unit column stride, if given), the
    values of ``cuda_pack.reference`` rounded once."""
    if out is None:
        out = torch.empty((p.k, p.n), dtype=dtype, device=p.q.device)
    sw = p.sw if p.sw is not None else p.gw
    grid = (triton.cdiv(p.n, bn), entries(p))
    _dequant_kernel[grid](p.q, p.gw, sw, out, p.n, out.stride(0), BN=bn, num_warps=4, enable_fp_fusion=False,
                          **_meta(p))
    return out
