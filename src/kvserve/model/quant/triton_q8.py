"""The dequantizing GEMV on int8 activations (Triton, CUDA): what llama.cpp's CUDA backend does
for a few rows (its MMVQ kernels over q8_1 activations), on the ``cuda_pack`` layouts.

``quantize_x`` turns activations x [M, K] into int8 codes per block of 32 (scale d = max|x|/127,
q = x/d rounded half away from zero), the scales, and the exact float32 sum of x per 16 columns.
The GEMV then multiplies 4 weight codes by 4 activation codes per instruction (``dp4a``): a
word of 4-bit codes gives two operands (``word & 0x0F0F0F0F`` and ``(word >> 4) & 0x0F0F0F0F``,
the layout puts 4 consecutive columns in the low nibbles and the next 4 in the high ones), a
word of 8-bit codes one. Per group and output column

    y += scale · d · Σ u·q + (offset − zero·scale) · Σ x

with Σ u·q an exact integer: about a quarter of the instructions per weight of the float32
kernel (``triton_gemv``), whose result this one equals up to the rounding of x to int8.
``reference`` is the torch definition; Triton's interpreter (the CPU tests) runs ``dp4a`` as
four multiply-adds. K slices, batch blocks and the completion count as in ``triton_gemv``.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import cuda_pack, pdl
from .cuda_pack import SUPER, Packed
from .pdl import gdc_launch_dependents, gdc_wait
from .triton_gemv import _INTERPRET, Config, _finish, _meta, _scale, entries, launch_setup

_SUPER = tl.constexpr(SUPER)
_ASM = tl.constexpr(not _INTERPRET)


class QuantX(NamedTuple):
    """Activations [M, K] as ``quantize_x`` gives them."""

    q: torch.Tensor  # int32 [M, K/4]: 4 int8 codes a word, column order
    d: torch.Tensor  # float32 [M, K/32]: scale per block of 32
    s: torch.Tensor  # float32 [M, K/16]: Σ x per 16 columns (of x itself, not of its codes)


@triton.jit
def _pdl_start(WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    """Under ``KVSERVE_QUANT_GEMV_PDL`` (``pdl``): ``TRIGGER`` lets the GEMV after launch now (its first
    weights load while this kernel runs); ``WAIT`` (this kernel a dependent launch itself) waits
    for the kernel before, whose output is read after this."""
    if WAIT:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()


def _pdl_args(device: torch.device, asked: int | None) -> dict:
    """Launch arguments of a quantizing kernel at the PDL level of ``device``: from 1 it triggers
    its dependents at its start, at 2 it is a dependent launch that waits first."""
    lv = pdl.level(device, asked)
    return dict(WAIT=lv > 1, TRIGGER=lv > 0, **({"launch_pdl": True} if lv > 1 else {}))


@triton.jit
def _quant_x_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, stride_xm, NB: tl.constexpr, WAIT: tl.constexpr,
                    TRIGGER: tl.constexpr):
    """Blocks of 32 columns NB·pid(1) … of row pid(0) (K a multiple of 32). ``WAIT`` / ``TRIGGER``:
    ``_pdl_start``."""
    _pdl_start(WAIT, TRIGGER)
    m = tl.program_id(0)
    blk = tl.program_id(1) * NB + tl.arange(0, NB)
    col = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    ok = col < K
    x = tl.load(x_ptr + m * stride_xm + col, mask=ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    v = x * inv[:, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(0.5 - v))
    tl.store(q_ptr + m * K + col, q.to(tl.int8), mask=ok)
    nb = K // 32
    tl.store(d_ptr + m * nb + blk, amax / 127.0, mask=blk < nb)
    s = tl.sum(tl.reshape(x, (NB, 2, 16)), axis=2)
    half = blk[:, None] * 2 + tl.arange(0, 2)[None, :]
    tl.store(s_ptr + m * (2 * nb) + half, s, mask=half < 2 * nb)


def quantize_x(x: torch.Tensor, pdl_level: int | None = None) -> QuantX:
    """x [M, K] (rows with unit stride, K a multiple of 32) → ``QuantX``. ``pdl_level``: ``pdl``
    (default ``KVSERVE_QUANT_GEMV_PDL``; the same values with any)."""
    m, k = x.shape
    assert k % 32 == 0 and x.stride(1) == 1
    q = torch.empty((m, k), dtype=torch.int8, device=x.device)
    d = torch.empty((m, k // 32), dtype=torch.float32, device=x.device)
    s = torch.empty((m, k // 16), dtype=torch.float32, device=x.device)
    nb = 16
    _quant_x_kernel[(m, triton.cdiv(k // 32, nb))](x, q, d, s, k, x.stride(0), NB=nb, num_warps=4,
                                                    **_pdl_args(x.device, pdl_level))
    return QuantX(q.view(torch.int32), d, s)


@triton.jit
def _store_quant(h, q_ptr, d_ptr, s_ptr, m, K, blk0, NB: tl.constexpr, live=True):
    """``_quant_x_kernel``'s arithmetic on h [NB·32] (float32 values of the activations' dtype),
    blocks of 32 blk0 … of row m (nothing stored where ``live`` is false)."""
    x = tl.reshape(h, (NB, 32))
    blk = blk0 + tl.arange(0, NB)
    col = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    ok = (col < K) & live
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / tl.maximum(amax, 1e-30), 0.0)
    v = x * inv[:, None]
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(0.5 - v))
    tl.store(q_ptr + m * K + col, q.to(tl.int8), mask=ok)
    nb = K // 32
    tl.store(d_ptr + m * nb + blk, amax / 127.0, mask=(blk < nb) & live)
    sm = tl.sum(tl.reshape(x, (NB, 2, 16)), axis=2)
    half = blk[:, None] * 2 + tl.arange(0, 2)[None, :]
    tl.store(s_ptr + m * (2 * nb) + half, sm, mask=(half < 2 * nb) & live)


@triton.jit
def _act_mul(g, u, like_ptr, GELU: tl.constexpr):
    """act(g) · u on float32 g, u (values of ``like_ptr``'s dtype), rounded as the act·mul kernel
    rounds: act(g) to the dtype, then the product."""
    ty = like_ptr.dtype.element_ty
    if GELU:  # tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 * tl.sigmoid(2.0 * z))
    else:
        a = g * tl.sigmoid(g)
    return (a.to(ty).to(tl.float32) * u).to(ty).to(tl.float32)


@triton.jit
def _norm_quant_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, q_ptr, d_ptr, s_ptr, K, eps, BLOCK: tl.constexpr,
                       WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    """Row pid(0): sum = x + r (in x's dtype), h = rms_norm(sum) · w (rounded to the dtype, as
    the RMSNorm kernel rounds its output), h quantized as ``quantize_x`` quantizes it. The norm's
    weights w are read before ``_pdl_start``."""
    m = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    ok = c < K
    ty = x_ptr.dtype.element_ty
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    _pdl_start(WAIT, TRIGGER)
    xv = tl.load(x_ptr + m * K + c, mask=ok, other=0.0).to(tl.float32)
    rv = tl.load(r_ptr + m * K + c, mask=ok, other=0.0).to(tl.float32)
    sv = (xv + rv).to(ty)
    tl.store(sum_ptr + m * K + c, sv, mask=ok)
    sf = sv.to(tl.float32)
    y = sf * tl.rsqrt(tl.sum(sf * sf, 0) / K + eps)
    h = (y * w).to(ty).to(tl.float32)
    _store_quant(h, q_ptr, d_ptr, s_ptr, m, K, 0, BLOCK // 32)


@triton.jit
def _act_quant_kernel(gu_ptr, q_ptr, d_ptr, s_ptr, n_ff, stride_row, GELU: tl.constexpr, BLOCK: tl.constexpr,
                      WAIT: tl.constexpr, TRIGGER: tl.constexpr):
    """Columns BLOCK·pid(1) … of row pid(0): h = act(g) · u rounded as the act·mul kernel rounds
    (act(g) to the dtype, then the product), quantized as ``quantize_x`` quantizes it."""
    _pdl_start(WAIT, TRIGGER)
    m = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = c < n_ff
    g = tl.load(gu_ptr + m * stride_row + c, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + m * stride_row + n_ff + c, mask=ok, other=0.0).to(tl.float32)
    h = _act_mul(g, u, gu_ptr, GELU)
    _store_quant(h, q_ptr, d_ptr, s_ptr, m, n_ff, tl.program_id(1) * (BLOCK // 32), BLOCK // 32)


def _empty_quant(m: int, k: int, device: torch.device) -> QuantX:
    return QuantX(torch.empty((m, k), dtype=torch.int8, device=device),
                  torch.empty((m, k // 32), dtype=torch.float32, device=device),
                  torch.empty((m, k // 16), dtype=torch.float32, device=device))


def norm_quantize_x(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, eps: float, pdl_level: int | None = None
                    ) -> tuple[QuantX, torch.Tensor]:
    """(``quantize_x(rms_norm(x + r) · w)``, x + r) in one launch; x, r [M, K] contiguous, one
    dtype, K a multiple of 32: the RMSNorm before Q/K/V and gate/up hands the GEMV its codes."""
    m, k = x.shape
    assert k % 32 == 0 and x.is_contiguous() and r.is_contiguous() and r.dtype == x.dtype
    xq = _empty_quant(m, k, x.device)
    s = torch.empty_like(x)
    block = triton.next_power_of_2(k)
    _norm_quant_kernel[(m,)](x, r, w, s, xq.q, xq.d, xq.s, k, eps, BLOCK=block,
                             num_warps=min(16, max(1, block // 256)), **_pdl_args(x.device, pdl_level))
    return QuantX(xq.q.view(torch.int32), xq.d, xq.s), s


def act_quantize_x(gu: torch.Tensor, n_ff: int, act: str, pdl_level: int | None = None) -> QuantX:
    """``quantize_x(act(gu[:, :n_ff]) · gu[:, n_ff:])`` in one launch (act = silu | gelu_tanh;
    n_ff a multiple of 32, rows of gu contiguous): act·mul hands the down projection its codes."""
    m = gu.shape[0]
    assert n_ff % 32 == 0 and gu.stride(1) == 1
    xq = _empty_quant(m, n_ff, gu.device)
    block = min(1024, triton.next_power_of_2(n_ff))
    _act_quant_kernel[(m, triton.cdiv(n_ff, block))](gu, xq.q, xq.d, xq.s, n_ff, gu.stride(0),
                                                      GELU=act == "gelu_tanh", BLOCK=block, num_warps=4,
                                                      **_pdl_args(gu.device, pdl_level))
    return QuantX(xq.q.view(torch.int32), xq.d, xq.s)


def quantize_x_reference(x: torch.Tensor) -> QuantX:
    """``quantize_x`` in torch."""
    m, k = x.shape
    xb = x.float().view(m, k // 32, 32)
    amax = xb.abs().amax(dim=2, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax.clamp_min(1e-30), torch.zeros_like(amax))
    v = xb * inv
    q = torch.where(v >= 0, torch.floor(v + 0.5), -torch.floor(0.5 - v)).to(torch.int8).view(m, k)
    s = x.float().view(m, k // 16, 16).sum(dim=2)
    return QuantX(q.contiguous().view(torch.int32), (amax / 127.0).view(m, k // 32), s)


def reference(xq: QuantX, p: Packed) -> torch.Tensor:
    """float32 [M, n] on x's device: Σ over groups of scale·d·Σ u·q + (offset − zero·scale)·Σ x,
    computed on the CPU in float64 (the integer dot products exact: |Σ u·q| < 2**53)."""
    device = xq.q.device
    xq = QuantX(*(t.cpu() for t in xq))
    p = p.to(torch.device("cpu"))
    m = xq.q.shape[0]
    q = xq.q.view(torch.int8).view(m, -1).double()  # [M, K]
    u = cuda_pack.codes(p).double()  # [n, K]
    g = p.k // p.gs
    dot = torch.einsum("mgk,ngk->mng", q.view(m, g, p.gs), u.view(p.n, g, p.gs))
    scale, off = cuda_pack.scales(p)  # [n, groups]
    off_t = -p.zero * scale.double() + (0 if off is None else off.double())
    d = xq.d.double().repeat_interleave(32 // p.gs, dim=1) if p.gs < 32 else xq.d.double()  # [M, groups]
    s = xq.s.double().view(m, g, p.gs // 16).sum(dim=2)
    y = (scale.double()[None] * d[:, None, :] * dot).sum(dim=2) + s @ off_t.t()
    return y.float().to(device)


@triton.jit
def _dot4(a, b, c):
    """c + Σ_j a_j · b_j over the 4 bytes of a (unsigned) and b (signed), per element."""
    if _ASM:
        return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    for j in tl.static_range(4):
        c += ((a >> (8 * j)) & 0xFF) * ((b << (24 - 8 * j)) >> 24)
    return c


@triton.jit
def _xword(xq_ptr, m, i, M, stride_qm, valid, BN: tl.constexpr):
    v = tl.load(xq_ptr + m * stride_qm + i, mask=valid & (m < M), other=0)
    return v + tl.zeros((BN,), dtype=tl.int32)


@triton.jit
def _qdot(word, xq_ptr, i, M, m0, stride_qm, valid, d0, d1, d2, d3, BM: tl.constexpr, BN: tl.constexpr):
    """d_r += the dot product of the 4 codes in ``word`` with x-word ``i`` of row m0 + r."""
    d0 = _dot4(word, _xword(xq_ptr, m0, i, M, stride_qm, valid, BN), d0)
    if BM > 1:
        d1 = _dot4(word, _xword(xq_ptr, m0 + 1, i, M, stride_qm, valid, BN), d1)
    if BM > 2:
        d2 = _dot4(word, _xword(xq_ptr, m0 + 2, i, M, stride_qm, valid, BN), d2)
        d3 = _dot4(word, _xword(xq_ptr, m0 + 3, i, M, stride_qm, valid, BN), d3)
    return d0, d1, d2, d3


@triton.jit
def _qgroup(xq_ptr, q_ptr, grp, rn, lmask, valid, N, M, m0, stride_qm,
            BITS: tl.constexpr, GS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """Σ u·q over group ``grp`` per column and batch row (int32)."""
    WPG: tl.constexpr = GS * BITS // 32
    d0 = tl.zeros((BN,), dtype=tl.int32)
    d1 = tl.zeros((BN,), dtype=tl.int32)
    d2 = tl.zeros((BN,), dtype=tl.int32)
    d3 = tl.zeros((BN,), dtype=tl.int32)
    for w in tl.static_range(WPG):
        word = tl.load(q_ptr + (grp * WPG + w) * N + rn, mask=lmask, other=0)
        if BITS == 4:  # columns 8w … 8w+3 in the low nibbles, 8w+4 … 8w+7 in the high ones
            i = grp * (GS // 4) + 2 * w
            d0, d1, d2, d3 = _qdot(word & 0x0F0F0F0F, xq_ptr, i, M, m0, stride_qm, valid, d0, d1, d2, d3, BM, BN)
            d0, d1, d2, d3 = _qdot((word >> 4) & 0x0F0F0F0F, xq_ptr, i + 1, M, m0, stride_qm, valid,
                                   d0, d1, d2, d3, BM, BN)
        else:
            i = grp * (GS // 4) + w
            d0, d1, d2, d3 = _qdot(word, xq_ptr, i, M, m0, stride_qm, valid, d0, d1, d2, d3, BM, BN)
    return d0, d1, d2, d3


@triton.jit
def _xsum(xd_ptr, xs_ptr, m, grp, M, stride_dm, stride_sm, valid, GS: tl.constexpr):
    """(d of the group's block of 32, Σ x over the group) of row m."""
    ok = valid & (m < M)
    d = tl.load(xd_ptr + m * stride_dm + (grp * GS) // 32, mask=ok, other=0.0)
    s = tl.load(xs_ptr + m * stride_sm + (grp * GS) // 16, mask=ok, other=0.0)
    if GS == 32:
        s += tl.load(xs_ptr + m * stride_sm + (grp * GS) // 16 + 1, mask=ok, other=0.0)
    return d, s


@triton.jit
def _q8_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E,
             stride_qm, stride_dm, stride_sm, stride_ym, STEPS, S,
             BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
             HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
             BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, SB: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    m0 = pid_m * BM
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    pid_s = tl.program_id(2)
    a0 = tl.zeros((BN,), dtype=tl.float32)
    a1 = tl.zeros((BN,), dtype=tl.float32)
    a2 = tl.zeros((BN,), dtype=tl.float32)
    a3 = tl.zeros((BN,), dtype=tl.float32)
    for t in tl.range(0, STEPS, num_stages=STAGES):
        e = pid_s * STEPS + t
        valid = e < E
        lmask = nmask & valid
        gw = tl.load(gw_ptr + e * N + rn, mask=lmask, other=0)
        sw = gw
        if TWO_LEVEL:
            sw = tl.load(sw_ptr + ((e * SUB * GS) // _SUPER) * N + rn, mask=lmask, other=0)
        for j in tl.static_range(SUB):
            grp = e * SUB + j
            d0, d1, d2, d3 = _qgroup(xq_ptr, q_ptr, grp, rn, lmask, valid, N, M, m0, stride_qm, BITS, GS, BM, BN)
            sc, off = _scale(gw, sw, j, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB)
            xd, xs = _xsum(xd_ptr, xs_ptr, m0, grp, M, stride_dm, stride_sm, valid, GS)
            a0 += sc * (xd * d0.to(tl.float32)) + off * xs
            if BM > 1:
                xd, xs = _xsum(xd_ptr, xs_ptr, m0 + 1, grp, M, stride_dm, stride_sm, valid, GS)
                a1 += sc * (xd * d1.to(tl.float32)) + off * xs
            if BM > 2:
                xd, xs = _xsum(xd_ptr, xs_ptr, m0 + 2, grp, M, stride_dm, stride_sm, valid, GS)
                a2 += sc * (xd * d2.to(tl.float32)) + off * xs
                xd, xs = _xsum(xd_ptr, xs_ptr, m0 + 3, grp, M, stride_dm, stride_sm, valid, GS)
                a3 += sc * (xd * d3.to(tl.float32)) + off * xs
    _finish(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S,
            HAS_BIAS, BM, BN, SPLIT, SB)


@triton.jit
def _q8_kernel(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E,
               stride_qm, stride_dm, stride_sm, stride_ym, steps, S,
               BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
               HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, SB: tl.constexpr):
    _q8_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E,
             stride_qm, stride_dm, stride_sm, stride_ym, steps, S,
             BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, SPLIT, STAGES, SB)


@triton.jit
def _q8_kernel_const(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E,
                     stride_qm, stride_dm, stride_sm, stride_ym, steps: tl.constexpr, S: tl.constexpr,
                     BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                     HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr,
                     SB: tl.constexpr):
    _q8_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E,
             stride_qm, stride_dm, stride_sm, stride_ym, steps, S,
             BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, SPLIT, STAGES, SB)


# The fastest configurations at batch 1 on an H200 of ``bench/quant_cuda.py --sweep`` over the
# Llama-3-8B Q4_K_M tensors, by weight bytes (each within 3 % of its tensor's best): one warp of
# 128 columns a program throughout, K split to about 2 (V, 4.6 MiB), 8 (Q+K, O, 10-13 MiB) or
# 16 (gate/up, down, output: 64-600 MiB) programs a multiprocessor.
CONFIGS = [(8 << 20, Config(128, 1, 2)), (32 << 20, Config(128, 1, 8)), (None, Config(128, 1, 16))]


def _tuning() -> dict[int, Config]:
    """``KVSERVE_GEMV_TUNING``: a JSON file {weight bytes: [bn, warps, programs, stages]}, as
    ``bench/quant_cuda.py --sweep --best FILE`` writes it: the configuration of tensors of
    exactly those bytes (a way to try a sweep's result before it goes into ``CONFIGS``)."""
    path = os.environ.get("KVSERVE_GEMV_TUNING")
    if not path:
        return {}
    with open(path) as f:
        return {int(k): Config(*v) for k, v in json.load(f).items()}


TUNING = _tuning()


def default_config(p: Packed, m: int) -> Config:
    cfg = TUNING.get(p.nbytes)
    if cfg is not None:
        return cfg
    return next(c for below, c in CONFIGS if below is None or p.nbytes < below)


def gemv(xq: QuantX, p: Packed, out: torch.Tensor, bias: torch.Tensor | None = None,
         cfg: Config | None = None) -> torch.Tensor:
    """out [M, n] (a view with unit column stride) = the GEMV of ``xq`` (``quantize_x``) by Wᵀ, + bias."""
    m = xq.q.shape[0]
    assert xq.q.shape[1] * 4 == p.k and out.shape == (m, p.n) and out.stride(1) == 1
    cfg = cfg or default_config(p, m)
    bm, splits, steps, grid, sw, bias_t, part, cnt = launch_setup(p, m, cfg, out, bias)
    kernel = _q8_kernel_const if _INTERPRET else _q8_kernel
    kernel[grid](xq.q, xq.d, xq.s, p.q, p.gw, sw, bias_t, out, part, cnt, m, p.n, entries(p),
                 xq.q.stride(0), xq.d.stride(0), xq.s.stride(0), out.stride(0), steps, splits,
                 HAS_BIAS=bias is not None, BM=bm, BN=cfg.bn, SPLIT=splits > 1, STAGES=cfg.stages,
                 SB=min(8, triton.next_power_of_2(splits)), num_warps=cfg.warps, **_meta(p))
    return out
