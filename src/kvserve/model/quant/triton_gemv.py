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
With several K slices, float32 partials go to a workspace; the slice that completes its column
block's count (one atomic counter per block, reset by that slice) sums them in slice order
and writes the output (with the bias, in its dtype): one launch, deterministic, fixed shapes
(CUDA-graph capturable). ``triton_q8`` is the same GEMV on int8-quantized activations.
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
def _sub_fields(gw, j, SUB: tl.constexpr, SIGNED: tl.constexpr, HAS_O: tl.constexpr):
    """(integer sub-scale, integer offset) as floats of group ``j`` (0 … SUB − 1, a constant or a
    tensor) of its scale word ``gw`` (two-level formats: ``cuda_pack``'s SUB groups an entry, 32 /
    SUB bits each; with HAS_O the offset in the high half of a group's bits, the scale in the low;
    without, the offset is 0)."""
    FB: tl.constexpr = 32 // SUB
    if HAS_O:
        HB: tl.constexpr = FB // 2
        v = gw >> (j * FB)
        code = (v & ((1 << HB) - 1)).to(tl.float32)
        offc = ((v >> HB) & ((1 << HB) - 1)).to(tl.float32)
    else:
        if SIGNED:
            v = (gw << (32 - FB - j * FB)) >> (32 - FB)
        else:
            v = (gw >> (j * FB)) & ((1 << FB) - 1)
        code = v.to(tl.float32)
        offc = code * 0.0
    return code, offc


@triton.jit
def _kpos(w: tl.constexpr, i: tl.constexpr, BITS: tl.constexpr):
    """Position in its group of the code in slot ``i`` of word ``w`` (``cuda_pack.slot_positions``)."""
    if BITS == 4:
        return w * 8 + (i % 2) * 4 + i // 2
    return w * 4 + i


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
            k = grp * GS + _kpos(w, i, BITS)
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
def _scale_of(gw, sw, code, offc, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr):
    """(scale, offset − zero·scale) of a group (any shape: one word a column, or a tile of groups)
    from its scale word ``gw``, the super-block word ``sw`` and, for ``TWO_LEVEL`` formats, the
    group's integer sub-scale ``code`` and offset ``offc`` (floats, ``_sub_fields``)."""
    if TWO_LEVEL:
        s = _f16(sw, False) * code
        o = -ZERO * s
        if HAS_O:
            o += _f16(sw, True) * offc
    else:
        s = _f16(gw, False)
        o = -ZERO * s
        if HAS_O:
            o += _f16(gw, True)
    return s, o


@triton.jit
def _scale(gw, sw, J: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr,
           SIGNED: tl.constexpr, SUB: tl.constexpr):
    """(scale, offset − zero·scale) of group ``J`` of the entry."""
    if TWO_LEVEL:
        code, offc = _sub_fields(gw, J, SUB, SIGNED, HAS_O)
    else:  # not read
        code = gw.to(tl.float32)
        offc = code
    return _scale_of(gw, sw, code, offc, ZERO, TWO_LEVEL, HAS_O)


@triton.jit
def _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E, stride_xm, stride_ym, STEPS, S,
               BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
               HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, SB: tl.constexpr):
    """E: gw entries along K (groups / SUB); each of the ``S`` K slices runs ``STEPS`` of them.
    With ``SPLIT`` every slice writes float32 partials p [S, M, N] and counts itself done on
    its (batch block, column block) counter; the slice that completes the count sums all
    partials in slice order (the same sum whichever slice is last), writes y and resets the
    counter to 0 for the next call."""
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
            d0, d1, d2, d3, s0, s1, s2, s3 = _group(x_ptr, q_ptr, e * SUB + j, rn, lmask, valid, N, M,
                                                    m0, stride_xm, BITS, GS, BM, BN)
            sc, off = _scale(gw, sw, j, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB)
            a0 += sc * d0 + off * s0
            if BM > 1:
                a1 += sc * d1 + off * s1
            if BM > 2:
                a2 += sc * d2 + off * s2
                a3 += sc * d3 + off * s3
    _finish(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S,
            HAS_BIAS, BM, BN, SPLIT, SB)


@triton.jit
def _finish(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S,
            HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, SB: tl.constexpr):
    """Write this program's sums a0…a3 (rows m0…, columns rn): directly, or with ``SPLIT`` as
    the partials of K slice ``program_id(2)``, the slice completing the count writing y."""
    _finish_at(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S,
               tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1),
               HAS_BIAS, BM, BN, SPLIT, SB)


@triton.jit
def _finish_at(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S, pm, pn, pk, NB,
               HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, SB: tl.constexpr):
    """``_finish`` of the program at batch block ``pm``, column block ``pn`` (of ``NB``) and K slice
    ``pk`` (a kernel whose grid holds more than one GEMV names its programs' places itself)."""
    if SPLIT:
        done = _publish_slice(a0, a1, a2, a3, p_ptr, c_ptr, rn, nmask, M, N, m0, pm, pn, pk, NB, BM)
        if done == S - 1:
            a0, a1, a2, a3 = _sum_slices(p_ptr, rn, nmask, M, N, m0, S, BM, BN, SB)
            _store_rows(y_ptr, b_ptr, rn, nmask, M, m0, stride_ym, a0, a1, a2, a3, HAS_BIAS, BM, BN)
            tl.atomic_xchg(c_ptr + pm * NB + pn, 0)
    else:
        _store_rows(y_ptr, b_ptr, rn, nmask, M, m0, stride_ym, a0, a1, a2, a3, HAS_BIAS, BM, BN)


@triton.jit
def _publish_slice(a0, a1, a2, a3, p_ptr, c_ptr, rn, nmask, M, N, m0, pm, pn, pk, NB, BM: tl.constexpr):
    """Store K slice ``pk``'s partial sums and count it in: the count of slices before it (S - 1:
    this program is the last and sums them; it resets the count)."""
    part = p_ptr + pk * M * N + rn
    tl.store(part + m0 * N, a0, mask=nmask & (m0 < M))
    if BM > 1:
        tl.store(part + (m0 + 1) * N, a1, mask=nmask & (m0 + 1 < M))
    if BM > 2:
        tl.store(part + (m0 + 2) * N, a2, mask=nmask & (m0 + 2 < M))
        tl.store(part + (m0 + 3) * N, a3, mask=nmask & (m0 + 3 < M))
    tl.debug_barrier()  # every thread's partials are stored before the count is published
    return tl.atomic_add(c_ptr + pm * NB + pn, 1, sem="acq_rel", scope="gpu")


@triton.jit
def _sum_slices(p_ptr, rn, nmask, M, N, m0, S, BM: tl.constexpr, BN: tl.constexpr, SB: tl.constexpr):
    """Σ_s p[s, m0 + r, rn] for r < BM, in slice order; SB slices' loads in flight at a time
    (read past the L1: the other slices' programs wrote them)."""
    a0 = tl.zeros((BN,), dtype=tl.float32)
    a1 = tl.zeros((BN,), dtype=tl.float32)
    a2 = tl.zeros((BN,), dtype=tl.float32)
    a3 = tl.zeros((BN,), dtype=tl.float32)
    for s0 in range(0, S, SB):
        for j in tl.static_range(SB):
            ok = nmask & (s0 + j < S)
            src = p_ptr + (s0 + j) * M * N + rn
            a0 += tl.load(src + m0 * N, mask=ok & (m0 < M), other=0.0, cache_modifier=".cg")
            if BM > 1:
                a1 += tl.load(src + (m0 + 1) * N, mask=ok & (m0 + 1 < M), other=0.0, cache_modifier=".cg")
            if BM > 2:
                a2 += tl.load(src + (m0 + 2) * N, mask=ok & (m0 + 2 < M), other=0.0, cache_modifier=".cg")
                a3 += tl.load(src + (m0 + 3) * N, mask=ok & (m0 + 3 < M), other=0.0, cache_modifier=".cg")
    return a0, a1, a2, a3


@triton.jit
def _store_rows(y_ptr, b_ptr, rn, nmask, M, m0, stride_ym, a0, a1, a2, a3, HAS_BIAS: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    bias = tl.zeros((BN,), dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    dst = y_ptr + rn
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
def _gemv_kernel(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E, stride_xm, stride_ym,
                 steps, S, BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                 HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr, SB: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E, stride_xm, stride_ym, steps, S,
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, SPLIT, STAGES, SB)


@triton.jit
def _gemv_kernel_const(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E, stride_xm, stride_ym,
                       steps: tl.constexpr, S: tl.constexpr, BITS: tl.constexpr, GS: tl.constexpr,
                       ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr, HAS_O: tl.constexpr, SIGNED: tl.constexpr,
                       SUB: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       SPLIT: tl.constexpr, STAGES: tl.constexpr, SB: tl.constexpr):
    _gemv_body(x_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, E, stride_xm, stride_ym, steps, S,
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, SPLIT, STAGES, SB)


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
            code, offc = _sub_fields(gw, j, SUB, SIGNED, HAS_O)
            s = _f16(sw, False) * code
            o = _f16(sw, True) * offc
        else:
            s = _f16(gw, False)
            o = _f16(gw, True)
        grp = e * SUB + j
        if BITS == 6:  # Q6_K in planes (cuda_pack): low 4 bits in words 0-1, high 2 bits in word 2
            w0 = tl.load(q_ptr + (grp * 3) * N + rn, mask=nmask, other=0)
            w1 = tl.load(q_ptr + (grp * 3 + 1) * N + rn, mask=nmask, other=0)
            hw = tl.load(q_ptr + (grp * 3 + 2) * N + rn, mask=nmask, other=0)
            for c in tl.static_range(16):
                if c < 8:
                    wd = w0
                else:
                    wd = w1
                i = 2 * ((c % 8) % 4) + (c % 8) // 4  # the 4-bit slot of column c % 8
                u = ((wd >> (4 * i)) & 15) | (((hw >> (8 * (c % 4) + 2 * (c // 4))) & 3) << 4) | MAGIC
                v = (u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)) * s
                tl.store(w_ptr + (grp * GS + c) * stride_wk + rn, v.to(w_ptr.dtype.element_ty), mask=nmask)
        else:
            for w in tl.static_range(WPG):
                word = tl.load(q_ptr + (grp * WPG + w) * N + rn, mask=nmask, other=0)
                for i in tl.static_range(CPW):
                    u = ((word >> (BITS * i)) & MASK) | MAGIC
                    c = u.to(tl.float32, bitcast=True) - (8388608.0 + ZERO)
                    v = c * s
                    if HAS_O:
                        v = v + o
                    k = grp * GS + _kpos(w, i, BITS)
                    tl.store(w_ptr + k * stride_wk + rn, v.to(w_ptr.dtype.element_ty), mask=nmask)


class Config(NamedTuple):
    bn: int  # output columns per program: 4 per thread (one 16-byte load) × 32 × warps × repeats
    warps: int
    programs: int  # aim for about this many programs per multiprocessor (sets the K split)
    stages: int = 1  # software-pipelining depth of the K loop (``tl.range(num_stages=...)``)


# Fast configurations of ``bench/quant_cuda.py --sweep --sweep-act float`` at batch 1 on an H200
# for the Llama-3-8B Q4_K_M tensors, by weight bytes: 9-13 MB (Q+K, V, O) one warp of 128
# columns, 8 programs a multiprocessor, a 2-stage K loop; 67 MB of 4-bit codes (gate/up)
# programs of 512 columns; 8-bit codes (down, output) one warp, 16 programs (wider column
# blocks leave few blocks for many K slices, whose partials the last slice sums in turn).
BIG = 32 << 20
CONFIGS = {"small": Config(128, 1, 8, 2), "big4": Config(512, 2, 16), "big8": Config(128, 1, 16)}


def default_config(p: Packed, m: int) -> Config:
    """The fixed configuration of a GEMV over ``p`` (any batch rows ``m``: the weight read dominates)."""
    if p.nbytes < BIG:
        return CONFIGS["small"]
    return CONFIGS["big4" if p.bits == 4 else "big8"]


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


# Completion counters of split GEMVs, one int32 per (batch block, column block), zero between
# calls (the last slice of a call resets its counter). Kept per weight tensor, so that GEMVs
# over different weights never share a counter. Sized up front for the most blocks any
# configuration gives at up to 8 batch rows (2 batch blocks of 4, columns in blocks of 16), so
# that a module's GEMVs at every decode batch size, each captured in its own CUDA graph, share
# one counter tensor that is never replaced (a replaced tensor would leave a graph captured
# before pointing at freed memory).
MIN_BN = 16
_COUNTERS: dict[tuple[torch.device, int, str], torch.Tensor] = {}


def _counters(p: Packed, n: int, kind: str = "slices") -> torch.Tensor:
    """The counters of ``p``'s GEMVs: ``kind`` "slices" (the K slices' completion count) or another
    count of a kernel's own (its own tensor, never shared with the slices' count)."""
    key = (p.q.device, p.q.data_ptr(), kind)
    c = _COUNTERS.get(key)
    if c is None or c.numel() < n:
        if c is not None and p.q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"GEMV counters for {n} blocks replaced during CUDA graph capture "
                               f"(sized for {c.numel()})")
        c = torch.zeros(max(n, 64, 2 * triton.cdiv(p.n, MIN_BN)), dtype=torch.int32, device=p.q.device)
        _COUNTERS[key] = c
    return c


def launch_setup(p: Packed, m: int, cfg: Config, out: torch.Tensor, bias: torch.Tensor | None):
    """What every GEMV launch over ``p`` derives the same way: the batch block, the K split, the grid
    (batch blocks first: they share weights in L2), the super-block words, the bias operand and,
    with several K slices, the float32 partials and the slices' done counters."""
    bm = min(4, triton.next_power_of_2(m))
    splits, steps = split_of(p, cfg, out.device)
    bias_t = bias if bias is not None else out
    sw = p.sw if p.sw is not None else p.gw
    grid = (triton.cdiv(m, bm), triton.cdiv(p.n, cfg.bn), splits)
    if splits > 1:
        part = torch.empty((splits, m, p.n), dtype=torch.float32, device=out.device)
        cnt = _counters(p, grid[0] * grid[1])
    else:
        part, cnt = out, p.gw  # not read
    return bm, splits, steps, grid, sw, bias_t, part, cnt


def gemv(x: torch.Tensor, p: Packed, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
         cfg: Config | None = None) -> torch.Tensor:
    """out [M, n] (a view with unit column stride; default new, x's dtype) = x [M, k] @ Wᵀ + bias.
    One launch: with several K slices the last one to finish sums the partials (``_gemv_body``)."""
    m, k = x.shape
    assert k == p.k and x.stride(1) == 1
    if out is None:
        out = torch.empty((m, p.n), dtype=x.dtype, device=x.device)
    cfg = cfg or default_config(p, m)
    bm, splits, steps, grid, sw, bias_t, part, cnt = launch_setup(p, m, cfg, out, bias)
    kernel = _gemv_kernel_const if _INTERPRET else _gemv_kernel
    kernel[grid](x, p.q, p.gw, sw, bias_t, out, part, cnt, m, p.n, entries(p), x.stride(0), out.stride(0),
                 steps, splits, HAS_BIAS=bias is not None, BM=bm, BN=cfg.bn, SPLIT=splits > 1,
                 STAGES=cfg.stages, SB=min(8, triton.next_power_of_2(splits)), num_warps=cfg.warps, **_meta(p))
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
