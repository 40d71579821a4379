"""Two tiled int8 GEMVs over one input in one launch (Triton, CUDA): a module whose members have two
layouts (a Q4_K_M file's Q4_K Q/K beside its Q6_K V) as one kernel.

Each GEMV keeps its own tiling, K split, partials and counters (``triton_q8_tile.launch_of``);
the launch's grid is (batch blocks, the first GEMV's column blocks × K slices + the second's),
and a program runs ``triton_q8_tile._tile_body`` of the GEMV its place falls in, at the place it
has there. The same programs as two launches, doing the same arithmetic: the same bits. What
the one launch saves is the second kernel and the fork and join of the two streams they
otherwise run on (``cuda_linear``), and it is one programmatic dependent launch (``pdl``) whose
every program loads its first weights while the kernel before still runs, and which lets the
kernel after start early, where the second stream's kernel waited for the whole kernel before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import pdl
from .cuda_pack import Packed
from .triton_gemv import _INTERPRET
from .triton_q8 import QuantX
from .triton_q8_norm import Prenormed, rscale_args
from .triton_q8_tile import _tile_body, launch_of


@triton.jit
def _pair_body(xq_ptr, xd_ptr, xs_ptr, M, stride_qm, stride_dm, stride_sm, stride_ym, rs_ptr, NRS, RS_K, RS_EPS,
               qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, N_a, NG_a, steps_a, S_a, NB_a,
               qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, N_b, NG_b, steps_b, S_b, NB_b,
               BITS_a: tl.constexpr, GS_a: tl.constexpr, ZERO_a: tl.constexpr, TWO_LEVEL_a: tl.constexpr,
               HAS_O_a: tl.constexpr, SIGNED_a: tl.constexpr, SUB_a: tl.constexpr, HAS_BIAS_a: tl.constexpr,
               BN_a: tl.constexpr, G_a: tl.constexpr, SPLIT_a: tl.constexpr, STAGES_a: tl.constexpr,
               BITS_b: tl.constexpr, GS_b: tl.constexpr, ZERO_b: tl.constexpr, TWO_LEVEL_b: tl.constexpr,
               HAS_O_b: tl.constexpr, SIGNED_b: tl.constexpr, SUB_b: tl.constexpr, HAS_BIAS_b: tl.constexpr,
               BN_b: tl.constexpr, G_b: tl.constexpr, SPLIT_b: tl.constexpr, STAGES_b: tl.constexpr,
               BM: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr, TRIGGER: tl.constexpr,
               RSCALE: tl.constexpr, NRSP: tl.constexpr):
    pm = tl.program_id(0)
    i = tl.program_id(1)
    first = NB_a * S_a
    if i < first:
        _tile_body(xq_ptr, xd_ptr, xs_ptr, qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, M, N_a, NG_a,
                   stride_qm, stride_dm, stride_sm, stride_ym, steps_a, S_a, ya_ptr, ya_ptr, ya_ptr, ca_ptr, 0,
                   rs_ptr, NRS, RS_K, RS_EPS, ya_ptr, ya_ptr, ya_ptr, ya_ptr, ya_ptr, ya_ptr,
                   pm, i % NB_a, i // NB_a, NB_a, BITS_a, GS_a, ZERO_a, TWO_LEVEL_a, HAS_O_a,
                   SIGNED_a, SUB_a, HAS_BIAS_a, BM, BN_a, G_a, SPLIT_a, STAGES_a, SB, PRE, GDC, TRIGGER, 0, RSCALE, NRSP, 0)
    else:
        j = i - first
        _tile_body(xq_ptr, xd_ptr, xs_ptr, qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, M, N_b, NG_b,
                   stride_qm, stride_dm, stride_sm, stride_ym, steps_b, S_b, yb_ptr, yb_ptr, yb_ptr, cb_ptr, 0,
                   rs_ptr, NRS, RS_K, RS_EPS, yb_ptr, yb_ptr, yb_ptr, yb_ptr, yb_ptr, yb_ptr,
                   pm, j % NB_b, j // NB_b, NB_b, BITS_b, GS_b, ZERO_b, TWO_LEVEL_b, HAS_O_b,
                   SIGNED_b, SUB_b, HAS_BIAS_b, BM, BN_b, G_b, SPLIT_b, STAGES_b, SB, PRE, GDC, TRIGGER, 0, RSCALE, NRSP, 0)


# One body, two entry points (the interpreter takes loop bounds only as compile-time constants)
@triton.jit
def _pair_kernel(xq_ptr, xd_ptr, xs_ptr, M, stride_qm, stride_dm, stride_sm, stride_ym, rs_ptr, NRS, RS_K, RS_EPS,
                 qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, N_a, NG_a, steps_a, S_a, NB_a,
                 qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, N_b, NG_b, steps_b, S_b, NB_b,
                 BITS_a: tl.constexpr, GS_a: tl.constexpr, ZERO_a: tl.constexpr, TWO_LEVEL_a: tl.constexpr,
                 HAS_O_a: tl.constexpr, SIGNED_a: tl.constexpr, SUB_a: tl.constexpr, HAS_BIAS_a: tl.constexpr,
                 BN_a: tl.constexpr, G_a: tl.constexpr, SPLIT_a: tl.constexpr, STAGES_a: tl.constexpr,
                 BITS_b: tl.constexpr, GS_b: tl.constexpr, ZERO_b: tl.constexpr, TWO_LEVEL_b: tl.constexpr,
                 HAS_O_b: tl.constexpr, SIGNED_b: tl.constexpr, SUB_b: tl.constexpr, HAS_BIAS_b: tl.constexpr,
                 BN_b: tl.constexpr, G_b: tl.constexpr, SPLIT_b: tl.constexpr, STAGES_b: tl.constexpr,
                 BM: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr, TRIGGER: tl.constexpr,
                 RSCALE: tl.constexpr, NRSP: tl.constexpr):
    _pair_body(xq_ptr, xd_ptr, xs_ptr, M, stride_qm, stride_dm, stride_sm, stride_ym, rs_ptr, NRS, RS_K, RS_EPS,
               qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, N_a, NG_a, steps_a, S_a, NB_a,
               qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, N_b, NG_b, steps_b, S_b, NB_b,
               BITS_a, GS_a, ZERO_a, TWO_LEVEL_a, HAS_O_a, SIGNED_a, SUB_a, HAS_BIAS_a, BN_a, G_a, SPLIT_a,
               STAGES_a, BITS_b, GS_b, ZERO_b, TWO_LEVEL_b, HAS_O_b, SIGNED_b, SUB_b, HAS_BIAS_b, BN_b, G_b,
               SPLIT_b, STAGES_b, BM, SB, PRE, GDC, TRIGGER, RSCALE, NRSP)


@triton.jit
def _pair_kernel_const(xq_ptr, xd_ptr, xs_ptr, M, stride_qm, stride_dm, stride_sm, stride_ym, rs_ptr, NRS, RS_K, RS_EPS,
                       qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, N_a, NG_a, steps_a: tl.constexpr,
                       S_a: tl.constexpr, NB_a,
                       qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, N_b, NG_b, steps_b: tl.constexpr,
                       S_b: tl.constexpr, NB_b,
                       BITS_a: tl.constexpr, GS_a: tl.constexpr, ZERO_a: tl.constexpr, TWO_LEVEL_a: tl.constexpr,
                       HAS_O_a: tl.constexpr, SIGNED_a: tl.constexpr, SUB_a: tl.constexpr,
                       HAS_BIAS_a: tl.constexpr, BN_a: tl.constexpr, G_a: tl.constexpr, SPLIT_a: tl.constexpr,
                       STAGES_a: tl.constexpr,
                       BITS_b: tl.constexpr, GS_b: tl.constexpr, ZERO_b: tl.constexpr, TWO_LEVEL_b: tl.constexpr,
                       HAS_O_b: tl.constexpr, SIGNED_b: tl.constexpr, SUB_b: tl.constexpr,
                       HAS_BIAS_b: tl.constexpr, BN_b: tl.constexpr, G_b: tl.constexpr, SPLIT_b: tl.constexpr,
                       STAGES_b: tl.constexpr,
                       BM: tl.constexpr, SB: tl.constexpr, PRE: tl.constexpr, GDC: tl.constexpr,
                       TRIGGER: tl.constexpr, RSCALE: tl.constexpr, NRSP: tl.constexpr):
    _pair_body(xq_ptr, xd_ptr, xs_ptr, M, stride_qm, stride_dm, stride_sm, stride_ym, rs_ptr, NRS, RS_K, RS_EPS,
               qa_ptr, gwa_ptr, swa_ptr, ba_ptr, ya_ptr, pa_ptr, ca_ptr, N_a, NG_a, steps_a, S_a, NB_a,
               qb_ptr, gwb_ptr, swb_ptr, bb_ptr, yb_ptr, pb_ptr, cb_ptr, N_b, NG_b, steps_b, S_b, NB_b,
               BITS_a, GS_a, ZERO_a, TWO_LEVEL_a, HAS_O_a, SIGNED_a, SUB_a, HAS_BIAS_a, BN_a, G_a, SPLIT_a,
               STAGES_a, BITS_b, GS_b, ZERO_b, TWO_LEVEL_b, HAS_O_b, SIGNED_b, SUB_b, HAS_BIAS_b, BN_b, G_b,
               SPLIT_b, STAGES_b, BM, SB, PRE, GDC, TRIGGER, RSCALE, NRSP)


_PER_GEMV = ("BITS", "GS", "ZERO", "TWO_LEVEL", "HAS_O", "SIGNED", "SUB", "HAS_BIAS", "BN", "G", "SPLIT", "STAGES")


def gemv_pair(xq: QuantX, a: tuple[Packed, torch.Tensor, torch.Tensor | None],
              b: tuple[Packed, torch.Tensor, torch.Tensor | None], pdl_level: int | None = None,
              rscale: tuple[Prenormed, float] | None = None) -> None:
    """``triton_q8_tile.gemv(xq, *a)`` and ``triton_q8_tile.gemv(xq, *b)`` — (weights, out [M, n] with unit
    column stride, bias) each, at their default configurations — in one launch, at the larger of
    the two configurations' warps. ``pdl_level`` and ``rscale`` as ``triton_q8_tile.gemv``'s."""
    m = xq.q.shape[0]
    la, lb = launch_of(xq, *a), launch_of(xq, *b)
    assert la.grid[0] == lb.grid[0] and la.consts["BM"] == lb.consts["BM"] and la.consts["SB"] == lb.consts["SB"]
    consts = {f"{k}_a": la.consts[k] for k in _PER_GEMV} | {f"{k}_b": lb.consts[k] for k in _PER_GEMV}
    grid = (la.grid[0], la.grid[1] * la.grid[2] + lb.grid[1] * lb.grid[2])
    kernel = _pair_kernel_const if _INTERPRET else _pair_kernel
    pre = (pdl.LEVEL if pdl_level is None else pdl_level) > 0
    lv = pdl.level(xq.q.device, pdl_level)
    extra = {"launch_pdl": True} if lv else {}
    out = a[1]
    assert b[1].stride(0) == out.stride(0)
    rs = rscale_args(*rscale, a[0].k) if rscale is not None else rscale_args(None, 0.0, a[0].k)
    kernel[grid](xq.q, xq.d, xq.s, m, xq.q.stride(0), xq.d.stride(0), xq.s.stride(0), out.stride(0),
                 rs.pop("rs_ptr", out), *rs.pop("scalars"),
                 *la.tensors, a[0].n, la.ng, la.steps, la.splits, la.grid[1],
                 *lb.tensors, b[0].n, lb.ng, lb.steps, lb.splits, lb.grid[1],
                 **consts, BM=la.consts["BM"], SB=la.consts["SB"], PRE=pre, GDC=lv > 0, TRIGGER=lv > 1,
                 num_warps=max(la.cfg.warps, lb.cfg.warps), **rs, **extra)
