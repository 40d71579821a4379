"""The int8-activation GEMV of ``triton_q8`` with a tile of groups per loop step (Triton, CUDA).

Same layout (``cuda_pack``), same arithmetic: per group and output column the exact integer
Σ u·q of ``dp4a`` over the group's code words, then ``scale · d · Σ u·q + (offset − zero·scale)
· Σ x``. What differs is how much a program asks of memory at a time: ``triton_q8`` loads one
group (4–8 code words a column) per step of its K loop and waits for it before it asks for the
next; here a step loads ``G`` consecutive groups at once — a [G, words a group, BN] tile of code
words, their [G, BN] scale words and the super-block word: 16-byte loads, all of them issued
before any is used — so each thread has up to 512 bytes in flight instead of 64. The whole tile
lies in the registers of the threads of its columns (every reduction over groups and words is
inside a thread), the activations are broadcast loads as in ``triton_q8``. The float32 terms of
a tile are summed over its groups before they join the column's sum: the same terms as
``triton_q8``, added in another order (within float32 rounding of it; both are tested
against ``triton_q8.reference``).

K slices and the completion count as in ``triton_gemv``; a slice is a run of whole tiles.

It also reads Q6_K packed in planes (``cuda_pack.pack(..., q6_planes=True)``, 6-bit codes: a
[G, 2, BN] tile of the low 4 bits as 4-bit codes and a [G, BN] tile of the high 2 bits,
Σ u·q = Σ low·q + 16 · Σ high·q, exact), which no other GEMV reads.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .cuda_pack import SUPER, Packed
from .triton_gemv import _INTERPRET, _counters, _finish_at, _meta, _scale_of, _sms, _sub_fields
from . import pdl
from .pdl import gdc_launch_dependents, gdc_wait
from .triton_q8 import QuantX, _act_mul, _dot4, _store_quant
from .triton_q8_norm import Prenormed, _finish_norm, _row_factors, rscale_args

_SUPER = tl.constexpr(SUPER)


class TileConfig(NamedTuple):
    bn: int  # output columns per program: 4 per thread (one 16-byte load) × 32 × warps × repeats
    warps: int
    programs: int  # aim for about this many programs per multiprocessor (sets the K split)
    words: int  # code words per column per loop step (the tile: words / words a group groups)
    stages: int = 1  # software-pipelining depth of the K loop


@triton.jit
def _nibble_dot(words, xq_ptr, m, grp, ok, stride_qm, XPG: tl.constexpr, G: tl.constexpr, W: tl.constexpr,
                BN: tl.constexpr):
    """Σ u·q per group [G, BN] of 4-bit code words [G, W, BN]: low nibbles pair with x word 2w of
    the group, high nibbles with 2w + 1."""
    shape: tl.constexpr = (G, W, BN)
    xi = grp[:, None] * XPG + 2 * tl.arange(0, W)[None, :]
    xlo = tl.load(xq_ptr + m * stride_qm + xi, mask=ok[:, None], other=0)
    xhi = tl.load(xq_ptr + m * stride_qm + xi + 1, mask=ok[:, None], other=0)
    dot = _dot4(words & 0x0F0F0F0F, tl.broadcast_to(xlo[:, :, None], shape), tl.zeros(shape, dtype=tl.int32))
    dot = _dot4((words >> 4) & 0x0F0F0F0F, tl.broadcast_to(xhi[:, :, None], shape), dot)
    return tl.sum(dot, axis=1)


@triton.jit
def _tile_row(words, hiw, sc, off, xq_ptr, xd_ptr, xs_ptr, m, grp, gok, M, stride_qm, stride_dm, stride_sm,
              BITS: tl.constexpr, GS: tl.constexpr, G: tl.constexpr, WPG: tl.constexpr, BN: tl.constexpr):
    """Σ over the tile's groups of scale·d·Σ u·q + offset'·Σ x, per column, for batch row m."""
    XPG: tl.constexpr = GS // 4  # activation words (4 int8 codes each) per group
    ok = gok & (m < M)
    if BITS == 4:
        d = _nibble_dot(words, xq_ptr, m, grp, ok, stride_qm, XPG, G, WPG, BN)
    elif BITS == 6:  # Σ u·q = Σ low·q + 16 · Σ high·q; high bits of x word j: (hiw >> 2j) & 0x03030303
        d = _nibble_dot(words, xq_ptr, m, grp, ok, stride_qm, XPG, G, 2, BN)
        j = tl.arange(0, 4)
        hshape: tl.constexpr = (G, 4, BN)
        xj = tl.load(xq_ptr + m * stride_qm + grp[:, None] * XPG + j[None, :], mask=ok[:, None], other=0)
        hc = (hiw[:, None, :] >> (2 * j)[None, :, None]) & 0x03030303
        dh = _dot4(hc, tl.broadcast_to(xj[:, :, None], hshape), tl.zeros(hshape, dtype=tl.int32))
        d += 16 * tl.sum(dh, axis=1)
    else:
        shape: tl.constexpr = (G, WPG, BN)
        xi = grp[:, None] * XPG + tl.arange(0, WPG)[None, :]
        xw = tl.load(xq_ptr + m * stride_qm + xi, mask=ok[:, None], other=0)
        dot = _dot4(words, tl.broadcast_to(xw[:, :, None], shape), tl.zeros(shape, dtype=tl.int32))
        d = tl.sum(dot, axis=1)  # [G, BN]: Σ u·q per group, exact
    xd = tl.load(xd_ptr + m * stride_dm + (grp * GS) // 32, mask=ok, other=0.0)
    xs = tl.load(xs_ptr + m * stride_sm + (grp * GS) // 16, mask=ok, other=0.0)
    if GS == 32:
        xs += tl.load(xs_ptr + m * stride_sm + (grp * GS) // 16 + 1, mask=ok, other=0.0)
    return tl.sum(sc * (xd[:, None] * d.to(tl.float32)) + off * xs[:, None], axis=0)


@triton.jit
def _tile_load(q_ptr, gw_ptr, sw_ptr, g0, rn, nmask, N, NG, BITS: tl.constexpr, GS: tl.constexpr,
               TWO_LEVEL: tl.constexpr, SUB: tl.constexpr, G: tl.constexpr):
    """The weights of the tile of G groups from group g0: code words [G, words, BN] (6-bit: the low
    plane, and the high plane [G, BN]), scale words [G, BN], super-block words [1 or G, BN]."""
    WPG: tl.constexpr = GS * BITS // 32  # code words per group and column
    LW: tl.constexpr = 2 if BITS == 6 else WPG  # of them in the [G, LW, BN] tile (6-bit: the low plane)
    grp = g0 + tl.arange(0, G)  # [G]
    gok = grp < NG
    row = grp[:, None] * WPG + tl.arange(0, LW)[None, :]  # [G, LW]: word rows of the tile
    words = tl.load(q_ptr + row[:, :, None] * N + rn[None, None, :],
                    mask=gok[:, None, None] & nmask[None, None, :], other=0)
    smask = gok[:, None] & nmask[None, :]
    hiw = words  # not read below 6 bits
    if BITS == 6:  # the high plane: word 2 of each group
        hiw = tl.load(q_ptr + (grp * WPG + 2)[:, None] * N + rn[None, :], mask=smask, other=0)
    gw = tl.load(gw_ptr + (grp // SUB)[:, None] * N + rn[None, :], mask=smask, other=0)
    sw = gw
    if TWO_LEVEL:
        if G * GS <= _SUPER:  # a tile never crosses a super-block (tiles are aligned)
            sw = tl.load(sw_ptr + ((g0 * GS) // _SUPER) * N + rn, mask=nmask & (g0 < NG), other=0)
            sw = sw[None, :]
        else:
            sw = tl.load(sw_ptr + ((grp * GS) // _SUPER)[:, None] * N + rn[None, :], mask=smask, other=0)
    return words, hiw, gw, sw


@triton.jit
def _tile_add(a0, a1, a2, a3, words, hiw, gw, sw, g0, xq_ptr, xd_ptr, xs_ptr, m0, M, NG, stride_qm, stride_dm,
              stride_sm, BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
              HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              G: tl.constexpr):
    """a_r += the tile's terms of batch row m0 + r (its activations are read here)."""
    WPG: tl.constexpr = GS * BITS // 32
    grp = g0 + tl.arange(0, G)
    gok = grp < NG
    if TWO_LEVEL:  # which of its entry's groups a group is
        code, offc = _sub_fields(gw, (grp % SUB)[:, None], SUB, SIGNED, HAS_O)
    else:  # not read
        code = gw.to(tl.float32)
        offc = code
    sc, off = _scale_of(gw, sw, code, offc, ZERO, TWO_LEVEL, HAS_O)
    a0 += _tile_row(words, hiw, sc, off, xq_ptr, xd_ptr, xs_ptr, m0, grp, gok, M, stride_qm, stride_dm,
                    stride_sm, BITS, GS, G, WPG, BN)
    if BM > 1:
        a1 += _tile_row(words, hiw, sc, off, xq_ptr, xd_ptr, xs_ptr, m0 + 1, grp, gok, M, stride_qm,
                        stride_dm, stride_sm, BITS, GS, G, WPG, BN)
    if BM > 2:
        a2 += _tile_row(words, hiw, sc, off, xq_ptr, xd_ptr, xs_ptr, m0 + 2, grp, gok, M, stride_qm,
                        stride_dm, stride_sm, BITS, GS, G, WPG, BN)
        a3 += _tile_row(words, hiw, sc, off, xq_ptr, xd_ptr, xs_ptr, m0 + 3, grp, gok, M, stride_qm,
                        stride_dm, stride_sm, BITS, GS, G, WPG, BN)
    return a0, a1, a2, a3


@triton.jit
def _tile_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, NG,
               stride_qm, stride_dm, stride_sm, stride_ym, STEPS, S, aq_ptr, ad_ptr, as_ptr, pc_ptr, NFF,
               rs_ptr, NRS, RS_K, RS_EPS, nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr,
               pm, pn, pk, NB, BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
               HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr,
               STAGES: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr,
               TRIGGER: tl.constexpr, ACT: tl.constexpr, RSCALE: tl.constexpr, NRSP: tl.constexpr,
               NORM_OUT: tl.constexpr):
    """NG groups along K; K slice ``pk`` runs ``STEPS`` tiles of ``G`` groups (the program of batch
    block ``pm``, column block ``pn`` of ``NB``: its place in the grid, which the kernel names).

    ``PRE``: the slice's first tile of weights is loaded before anything the kernels before
    write (activations, partials, counters) is read, and with ``GDC`` (a programmatic dependent
    launch, compiled kernels only) before ``gdc_wait``: its loads are in flight while the kernel
    before finishes. The same terms in the same order as without (the same bits). ``TRIGGER``
    (with ``GDC``): the next kernel may launch once every program has passed its wait.

    ``RSCALE`` / ``NORM_OUT``: the consumer's and the producer's halves of the RMSNorm between two
    GEMVs (``triton_q8_norm``): the sums scaled by the rows' 1 / rms from ``rs_ptr``'s partial sums
    (read after the wait); the finished columns written as the norm's sum, its partial Σ s² and
    the codes of s · w (``nr``: the residual, ``nw``: the norm's weights, ``nq/nd/ns/nss``: out)."""
    s0 = pk * STEPS
    m0 = pm * BM
    rn = pn * BN + tl.arange(0, BN)
    nmask = rn < N
    a0 = tl.zeros((BN,), dtype=tl.float32)
    a1 = tl.zeros((BN,), dtype=tl.float32)
    a2 = tl.zeros((BN,), dtype=tl.float32)
    a3 = tl.zeros((BN,), dtype=tl.float32)
    FIRST: tl.constexpr = 1 if PRE else 0  # tiles done before the loop
    if PRE:
        words, hiw, gw, sw = _tile_load(q_ptr, gw_ptr, sw_ptr, s0 * G, rn, nmask, N, NG, BITS, GS, TWO_LEVEL,
                                        SUB, G)
        if GDC:
            gdc_wait()  # the activations (and everything the kernels before write) complete from here
            if TRIGGER:
                gdc_launch_dependents()
        a0, a1, a2, a3 = _tile_add(a0, a1, a2, a3, words, hiw, gw, sw, s0 * G, xq_ptr, xd_ptr, xs_ptr, m0, M,
                                   NG, stride_qm, stride_dm, stride_sm, BITS, GS, ZERO, TWO_LEVEL, HAS_O,
                                   SIGNED, SUB, BM, BN, G)
    if RSCALE:  # loads issued before the loop: their latency hides behind it
        c0, c1, c2, c3 = _row_factors(rs_ptr, m0, M, NRS, RS_K, RS_EPS, BM, NRSP)
    for t in tl.range(FIRST, STEPS, num_stages=STAGES):
        g0 = (s0 + t) * G
        words, hiw, gw, sw = _tile_load(q_ptr, gw_ptr, sw_ptr, g0, rn, nmask, N, NG, BITS, GS, TWO_LEVEL, SUB, G)
        a0, a1, a2, a3 = _tile_add(a0, a1, a2, a3, words, hiw, gw, sw, g0, xq_ptr, xd_ptr, xs_ptr, m0, M, NG,
                                   stride_qm, stride_dm, stride_sm, BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED,
                                   SUB, BM, BN, G)
    if RSCALE:
        a0 *= c0
        a1 *= c1
        a2 *= c2
        a3 *= c3
    if NORM_OUT:
        _finish_norm(a0, a1, a2, a3, p_ptr, c_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S, pm, pn, pk, NB,
                     nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr, BM, BN, SPLIT, SB)
    else:
        _finish_at(a0, a1, a2, a3, p_ptr, c_ptr, b_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S, pm, pn, pk, NB,
                   HAS_BIAS, BM, BN, SPLIT, SB)
    if ACT:
        _act_pair(y_ptr, aq_ptr, ad_ptr, as_ptr, pc_ptr, M, m0, stride_ym, NFF, S, pm, pn, NB, ACT == 2, BM, BN)


@triton.jit
def _act_pair(y_ptr, aq_ptr, ad_ptr, as_ptr, pc_ptr, M, m0, stride_ym, NFF, S, pm, pn, NB, GELU: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr):
    """y = [g | u], NFF columns each: the program of (batch block, column pair) that is the last
    of the 2·S programs of gate block j and up block j (BN columns each) to get here, after both
    blocks' y are written, quantizes act(g) · u of their columns into ``aq/ad/as`` as
    ``triton_q8.act_quantize_x`` does (the same values read, the same arithmetic: the same bits).
    The pair's count is reset by that program, as the K slices' counts are."""
    tl.debug_barrier()  # this program's stores of y (if it wrote) before its count is published
    half = NB // 2
    pair = pn % half
    cnt = pc_ptr + pm * half + pair
    done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if done == 2 * S - 1:
        c = pair * BN + tl.arange(0, BN)
        for r in tl.static_range(BM):
            m = m0 + r
            live = m < M
            row = y_ptr + m * stride_ym
            g = tl.load(row + c, mask=live, other=0.0, cache_modifier=".cg").to(tl.float32)
            u = tl.load(row + NFF + c, mask=live, other=0.0, cache_modifier=".cg").to(tl.float32)
            h = _act_mul(g, u, y_ptr, GELU)
            _store_quant(h, aq_ptr, ad_ptr, as_ptr, m, NFF, pair * (BN // 32), BN // 32, live)
        tl.atomic_xchg(cnt, 0)


# One body, two entry points (the interpreter takes loop bounds only as compile-time constants)
@triton.jit
def _tile_kernel(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, NG,
                 stride_qm, stride_dm, stride_sm, stride_ym, steps, S, aq_ptr, ad_ptr, as_ptr, pc_ptr, NFF,
                 rs_ptr, NRS, RS_K, RS_EPS, nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr,
                 BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                 HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr,
                 STAGES: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr,
                 TRIGGER: tl.constexpr, ACT: tl.constexpr, RSCALE: tl.constexpr, NRSP: tl.constexpr,
                 NORM_OUT: tl.constexpr):
    _tile_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, NG,
               stride_qm, stride_dm, stride_sm, stride_ym, steps, S, aq_ptr, ad_ptr, as_ptr, pc_ptr, NFF,
               rs_ptr, NRS, RS_K, RS_EPS, nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr,
               tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1),
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, G, SPLIT, STAGES, SB,
               PRE, GDC, TRIGGER, ACT, RSCALE, NRSP, NORM_OUT)


@triton.jit
def _tile_kernel_const(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, NG,
                       stride_qm, stride_dm, stride_sm, stride_ym, steps: tl.constexpr, S: tl.constexpr,
                       aq_ptr, ad_ptr, as_ptr, pc_ptr, NFF,
                       rs_ptr, NRS, RS_K, RS_EPS, nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr,
                       BITS: tl.constexpr, GS: tl.constexpr, ZERO: tl.constexpr, TWO_LEVEL: tl.constexpr,
                       HAS_O: tl.constexpr, SIGNED: tl.constexpr, SUB: tl.constexpr, HAS_BIAS: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr,
                       STAGES: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr,
                       TRIGGER: tl.constexpr, ACT: tl.constexpr, RSCALE: tl.constexpr, NRSP: tl.constexpr,
                       NORM_OUT: tl.constexpr):
    _tile_body(xq_ptr, xd_ptr, xs_ptr, q_ptr, gw_ptr, sw_ptr, b_ptr, y_ptr, p_ptr, c_ptr, M, N, NG,
               stride_qm, stride_dm, stride_sm, stride_ym, steps, S, aq_ptr, ad_ptr, as_ptr, pc_ptr, NFF,
               rs_ptr, NRS, RS_K, RS_EPS, nr_ptr, nw_ptr, nq_ptr, nd_ptr, ns_ptr, nss_ptr,
               tl.program_id(0), tl.program_id(1), tl.program_id(2), tl.num_programs(1),
               BITS, GS, ZERO, TWO_LEVEL, HAS_O, SIGNED, SUB, HAS_BIAS, BM, BN, G, SPLIT, STAGES, SB,
               PRE, GDC, TRIGGER, ACT, RSCALE, NRSP, NORM_OUT)


# The sweep of ``bench/quant_cuda.py --sweep`` at batch 1 on an H200 over the Llama-3-8B Q4_K_M
# tensors (4.6-572 MiB, 4- and 8-bit codes): one warp of 128 columns a program, 32 code words a
# column a loop step (8 groups of Q4_K, half a super-block of Q6_K), K split to about 8
# programs a multiprocessor, within 1.5 % of each tensor's best everywhere. By weight bytes, the
# first entry whose bound exceeds the tensor's (None: any size). For 2 or more batch rows.
CONFIGS: list[tuple[int | None, TileConfig]] = [(None, TileConfig(128, 1, 8, 32))]
# One batch row, by code bits: narrower programs with deeper tiles (the warp's lanes across
# groups as well as columns: fewer K slices to sum, as many bytes in flight a thread), the best
# of ``bench/quant_cuda.py --sweep --tile-configs ...`` on an H200 for the 8B shape's tensors
# (µs, the 2+-row table's configuration → this one): V (Q6_K, 4.6 MiB) 4.56 → 3.72, O (Q4_K,
# 10.2) 5.79 → 5.66, Q+K (12.8) 6.59 → 5.96, down (Q6_K, 63.9) 19.29 → 18.75, gate/up (71.8)
# 22.19 → 21.53 (sizes with the scale words of that run; the output projection, 219-572 MiB, as
# before). Other code widths, and tensors past the last bound: ``CONFIGS``.
ONE_ROW: dict[int, list[tuple[int, TileConfig]]] = {
    8: [(100 << 20, TileConfig(32, 1, 8, 128))],
    4: [(16 << 20, TileConfig(64, 2, 8, 128)), (100 << 20, TileConfig(32, 1, 8, 64))],
}


def _tuning() -> dict[int, TileConfig]:
    """``KVSERVE_GEMV_TILE_TUNING``: a JSON file {weight bytes: [bn, warps, programs, words,
    stages]}, as ``bench/quant_cuda.py --sweep --best FILE`` writes it for this kernel."""
    path = os.environ.get("KVSERVE_GEMV_TILE_TUNING")
    if not path:
        return {}
    with open(path) as f:
        return {int(k): TileConfig(*v) for k, v in json.load(f).items()}


TUNING = _tuning()


def default_config(p: Packed, m: int) -> TileConfig:
    cfg = TUNING.get(p.nbytes)
    if cfg is not None:
        return cfg
    if m == 1:
        for below, c in ONE_ROW.get(p.bits, ()):
            if p.nbytes < below:
                return c
    return next(c for below, c in CONFIGS if below is None or p.nbytes < below)


def groups_of(p: Packed, cfg: TileConfig, m: int) -> int:
    """Groups a loop step: ``cfg.words`` code words a column at one batch row, fewer with more
    rows (each row's dot products are a tile of int32 too), at least one group."""
    wpg = triton.next_power_of_2(p.gs * p.bits // 32)  # 6-bit planes: 3 words, counted as 4
    assert cfg.words & (cfg.words - 1) == 0, "words a step: a power of 2"
    bm = min(4, triton.next_power_of_2(m))
    return max(1, cfg.words // wpg // bm)


ACTS = {"silu": 1, "gelu_tanh": 2}


def fuses_act(p: Packed, m: int, n_ff: int, cfg: TileConfig | None = None) -> bool:
    """Whether ``gemv(..., act_out=(…, n_ff, act))`` can quantize act(g) · u of its output [g | u]
    (n_ff columns each) itself: gate block j and up block j are two programs' columns."""
    cfg = cfg or default_config(p, m)
    return p.n == 2 * n_ff and cfg.bn % 32 == 0 and n_ff % cfg.bn == 0


def gemv(xq: QuantX, p: Packed, out: torch.Tensor, bias: torch.Tensor | None = None,
         cfg: TileConfig | None = None, pdl_level: int | None = None,
         act_out: tuple[QuantX, int, str] | None = None, rscale: tuple[Prenormed, float] | None = None,
         norm_out: tuple[torch.Tensor, torch.Tensor, Prenormed] | None = None) -> torch.Tensor:
    """out [M, n] (a view with unit column stride) = the GEMV of ``xq`` (``quantize_x``) by Wᵀ, + bias.

    ``pdl_level`` (default ``KVSERVE_QUANT_GEMV_PDL``, see ``pdl``): from 1 each K slice loads its first
    tile before it reads the activations, and where PDL is supported the launch is a programmatic
    dependent one that loads it before waiting for the kernel before; 2 also lets the kernel
    after launch early. Where PDL is not supported (the interpreter) the first tile is still
    loaded first: the same arithmetic in the same order.

    ``act_out`` = (``sink``, n_ff, act) with ``fuses_act``: out = [g | u] and the kernel also fills
    ``sink`` (``QuantX`` buffers [M, n_ff]) with ``triton_q8.act_quantize_x(out, n_ff, act)``, the
    same bits, in the programs that finish each column pair (``_act_pair``): no launch of its own.

    ``rscale`` = (``pre``, eps): ``xq`` is ``pre.xq`` (a producer's codes of s · w) and the sums are
    scaled by each row's rsqrt(mean(s²) + eps) from ``pre.ss`` (``triton_q8_norm``). ``norm_out`` =
    (r, w, ``pre``) (no bias; ``pre`` from ``triton_q8_norm.empty_prenormed`` with ``norm_blocks``
    blocks; ``out`` is ``pre.s``): out = s = y + r, and ``pre`` is filled for the GEMV after
    ``rms_norm(s) · w``."""
    L = launch_of(xq, p, out, bias, cfg)
    m = xq.q.shape[0]
    if act_out is not None:
        sink, n_ff, act = act_out
        assert fuses_act(p, m, n_ff, L.cfg) and sink.q.shape == (m, n_ff // 4) and sink.q.is_contiguous()
        aq, ad, asum = sink.q.view(torch.int8), sink.d, sink.s
        pair_cnt = _counters(p, max(2, L.grid[0]) * (L.grid[1] // 2), "act")
        act_args = (aq, ad, asum, pair_cnt, n_ff)
        act_kind = ACTS[act]
    else:
        act_args, act_kind = (out, out, out, L.tensors[-1], 0), 0  # not read
    rs = rscale_args(*rscale, p.k) if rscale is not None else rscale_args(None, 0.0, p.k)
    if norm_out is not None:
        r, w, sink = norm_out
        assert bias is None and L.cfg.bn % 32 == 0 and out.data_ptr() == sink.s.data_ptr()
        assert r.shape == out.shape and r.is_contiguous() and out.is_contiguous() and w.numel() == p.n
        assert sink.ss.shape == (m, L.grid[1]) and sink.xq.q.shape == (m, p.n // 4)
        norm_args = (r, w, sink.xq.q.view(torch.int8), sink.xq.d, sink.xq.s, sink.ss)
    else:
        norm_args = (out,) * 6  # not read
    kernel = _tile_kernel_const if _INTERPRET else _tile_kernel
    pre = (pdl.LEVEL if pdl_level is None else pdl_level) > 0
    lv = pdl.level(out.device, pdl_level)
    extra = {"launch_pdl": True} if lv else {}
    kernel[L.grid](xq.q, xq.d, xq.s, *L.tensors, m, p.n, L.ng, xq.q.stride(0), xq.d.stride(0), xq.s.stride(0),
                   out.stride(0), L.steps, L.splits, *act_args, rs.pop("rs_ptr", out), *rs.pop("scalars"),
                   *norm_args, **L.consts, PRE=pre, GDC=lv > 0, TRIGGER=lv > 1, ACT=act_kind,
                   NORM_OUT=norm_out is not None, num_warps=L.cfg.warps, **rs, **extra)
    return out


def norm_blocks(p: Packed, m: int, cfg: TileConfig | None = None) -> int:
    """Column blocks of ``gemv`` over ``p`` at ``m`` rows: the partial sums a ``norm_out`` writes a row."""
    return triton.cdiv(p.n, (cfg or default_config(p, m)).bn)


class Launch(NamedTuple):
    """What a launch of the tiled GEMV over one weight tensor takes (``launch_of``)."""

    cfg: TileConfig
    grid: tuple[int, int, int]  # (batch blocks, column blocks, K slices)
    ng: int  # groups along K
    steps: int  # tiles a K slice
    splits: int
    tensors: tuple  # q, gw, sw, bias, out, partials, counters: the kernel's pointer arguments in order
    consts: dict  # the layout's and the tiling's compile-time constants (``_tile_body``'s)


def launch_of(xq: QuantX, p: Packed, out: torch.Tensor, bias: torch.Tensor | None = None,
              cfg: TileConfig | None = None) -> Launch:
    """The grid, the K split, the buffers and the constants of ``gemv(xq, p, out, bias, cfg)``."""
    m = xq.q.shape[0]
    assert xq.q.shape[1] * 4 == p.k and out.shape == (m, p.n) and out.stride(1) == 1
    cfg = cfg or default_config(p, m)
    g = groups_of(p, cfg, m)
    ng = p.k // p.gs
    tiles = triton.cdiv(ng, g)
    blocks = triton.cdiv(p.n, cfg.bn)
    want = max(1, min(tiles, (cfg.programs * _sms(out.device)) // blocks))
    steps = triton.cdiv(tiles, want)
    splits = triton.cdiv(tiles, steps)
    bm = min(4, triton.next_power_of_2(m))
    grid = (triton.cdiv(m, bm), blocks, splits)  # batch blocks first: they share weights in L2
    sw = p.sw if p.sw is not None else p.gw
    bias_t = bias if bias is not None else out
    if splits > 1:
        part = torch.empty((splits, m, p.n), dtype=torch.float32, device=out.device)
        # counters for up to 8 batch rows at once: a module's GEMVs at every decode batch size
        # (each captured in its own graph) share one counter tensor, never reallocated
        cnt = _counters(p, max(2, grid[0]) * grid[1])
    else:
        part, cnt = out, p.gw  # not read
    # SB: the last slice sums 16 slices' partials a round (one compilation for any split)
    consts = dict(**_meta(p), HAS_BIAS=bias is not None, BM=bm, BN=cfg.bn, G=g, SPLIT=splits > 1,
                  STAGES=cfg.stages, SB=16)
    return Launch(cfg, grid, ng, steps, splits, (p.q, p.gw, sw, bias_t, out, part, cnt), consts)
