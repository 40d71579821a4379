"""The RMSNorm between two tiled GEMVs, split between them (Triton, CUDA): no kernel of its own.

A decode layer's output projection (and its down projection) is followed by ``rms_norm(y + r) ·
w`` and the next GEMV. llama.cpp runs a norm kernel there, and so does ``triton_q8.
norm_quantize_x``: one program a row, between the two GEMVs. Here the two GEMVs share it:

- the **producer** (``triton_q8_tile.gemv(..., norm_out=...)``): each program that finishes a
  block of columns of y writes s = y + r there (in the activations' dtype, as the norm kernel
  rounds it) instead of y, Σ s² over its columns into ``ss`` [M, column blocks], and the int8
  codes of s · w per block of 32 (``quantize_x``'s arithmetic on float32 s · w), their scales and
  sums: the quantized input of the next GEMV up to the row's factor 1 / rms(s), which no
  program of the producer knows;
- the **consumer** (``rscale=``): each program sums the row's partial Σ s² (in column order: the
  same value in every program), c = rsqrt(Σ s² / K + eps), and scales its sums of
  ``scale · d · Σ u·q + offset' · Σ x`` by c — d and Σ x scale by c, Σ u·q (the codes) does not:
  the codes of c · s · w are those of s · w.

What differs from the norm kernel: s · w · c is not rounded to the activations' dtype before it
is quantized (llama.cpp's CUDA norm neither: it writes float32), and Σ s² is summed in another
order. ``Prenormed`` (``model.prenormed``) is what passes from the one to the other.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_gemv import _publish_slice, _sum_slices
from ..prenormed import Prenormed
from .triton_q8 import QuantX, _store_quant

__all__ = ["Prenormed", "empty_prenormed", "reference", "rscale_args"]


@triton.jit
def _norm_row(a, m, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr, N,
              BN: tl.constexpr):
    """Batch row m of the producer's column block ``pn`` (a: its finished float32 sums): s = y + r
    rounded as the norm kernel rounds (y to the dtype, then the sum), stored in y's place; Σ s² of
    the block into ss[m, pn]; the codes of s · w quantized into the consumer's buffers."""
    live = m < M
    ok = nmask & live
    ty = y_ptr.dtype.element_ty
    r = tl.load(r_ptr + m * N + rn, mask=ok, other=0.0).to(tl.float32)
    s = (a.to(ty).to(tl.float32) + r).to(ty)
    tl.store(y_ptr + m * stride_ym + rn, s, mask=ok)
    sf = tl.where(ok, s.to(tl.float32), 0.0)
    tl.store(ss_ptr + m * NB + pn, tl.sum(sf * sf, 0), mask=live)
    w = tl.load(w_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    _store_quant(sf * w, q_ptr, d_ptr, s_ptr, m, N, pn * (BN // 32), BN // 32, live)


@triton.jit
def _norm_rows(a0, a1, a2, a3, m0, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr,
               ss_ptr, N, BM: tl.constexpr, BN: tl.constexpr):
    _norm_row(a0, m0, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr, N, BN)
    if BM > 1:
        _norm_row(a1, m0 + 1, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr,
                  N, BN)
    if BM > 2:
        _norm_row(a2, m0 + 2, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr,
                  N, BN)
        _norm_row(a3, m0 + 3, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr,
                  N, BN)


@triton.jit
def _finish_norm(a0, a1, a2, a3, p_ptr, c_ptr, y_ptr, rn, nmask, M, N, m0, stride_ym, S, pm, pn, pk, NB,
                 r_ptr, w_ptr, q_ptr, d_ptr, s_ptr, ss_ptr, BM: tl.constexpr, BN: tl.constexpr,
                 SPLIT: tl.constexpr, SB: tl.constexpr):
    """``triton_gemv._finish_at`` of a producer (no bias): the program that finishes a block of
    columns writes ``_norm_rows`` of it instead of y."""
    if SPLIT:
        done = _publish_slice(a0, a1, a2, a3, p_ptr, c_ptr, rn, nmask, M, N, m0, pm, pn, pk, NB, BM)
        if done == S - 1:
            a0, a1, a2, a3 = _sum_slices(p_ptr, rn, nmask, M, N, m0, S, BM, BN, SB)
            _norm_rows(a0, a1, a2, a3, m0, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr,
                       s_ptr, ss_ptr, N, BM, BN)
            tl.atomic_xchg(c_ptr + pm * NB + pn, 0)
    else:
        _norm_rows(a0, a1, a2, a3, m0, M, rn, nmask, pn, NB, y_ptr, stride_ym, r_ptr, w_ptr, q_ptr, d_ptr, s_ptr,
                   ss_ptr, N, BM, BN)


@triton.jit
def _row_factor(rs_ptr, m, M, NRS, K, eps, NRSP: tl.constexpr):
    """rsqrt(Σ s² / K + eps) of batch row m from its NRS partial sums (1 past the batch)."""
    i = tl.arange(0, NRSP)
    v = tl.load(rs_ptr + m * NRS + i, mask=(i < NRS) & (m < M), other=0.0)
    return tl.rsqrt(tl.sum(v, 0) / K + eps)


@triton.jit
def _row_factors(rs_ptr, m0, M, NRS, K, eps, BM: tl.constexpr, NRSP: tl.constexpr):
    """``_row_factor`` of the rows m0 … m0 + BM - 1 (1.0 for those past BM)."""
    c0 = _row_factor(rs_ptr, m0, M, NRS, K, eps, NRSP)
    c1 = c0
    c2 = c0
    c3 = c0
    if BM > 1:
        c1 = _row_factor(rs_ptr, m0 + 1, M, NRS, K, eps, NRSP)
    if BM > 2:
        c2 = _row_factor(rs_ptr, m0 + 2, M, NRS, K, eps, NRSP)
        c3 = _row_factor(rs_ptr, m0 + 3, M, NRS, K, eps, NRSP)
    return c0, c1, c2, c3


def rscale_args(pre: Prenormed | None, eps: float, k: int) -> dict:
    """A consumer kernel's arguments of ``rscale``: ``rs_ptr`` (absent where ``pre`` is None: not
    read), ``scalars`` (NRS, RS_K, RS_EPS in the kernels' order) and the constants."""
    if pre is None:
        return dict(scalars=(1, k, 0.0), RSCALE=False, NRSP=1)
    assert pre.ss.is_contiguous() and pre.ss.dtype == torch.float32 and pre.xq.q.shape[1] * 4 == k
    nrs = pre.ss.shape[1]
    return dict(rs_ptr=pre.ss, scalars=(nrs, k, float(eps)), RSCALE=True, NRSP=triton.next_power_of_2(nrs))


def empty_prenormed(m: int, k: int, blocks: int, dtype: torch.dtype, device: torch.device) -> Prenormed:
    """Buffers for a producer's ``norm_out`` of [m, k] in ``blocks`` column blocks."""
    q = torch.empty((m, k), dtype=torch.int8, device=device).view(torch.int32)
    xq = QuantX(q, torch.empty((m, k // 32), dtype=torch.float32, device=device),
                torch.empty((m, k // 16), dtype=torch.float32, device=device))
    return Prenormed(xq, torch.empty((m, blocks), dtype=torch.float32, device=device),
                     torch.empty((m, k), dtype=dtype, device=device))


def reference(pre: Prenormed, eps: float, w: torch.Tensor) -> torch.Tensor:
    """rms_norm(s) · w in float32 for ``pre`` (what its codes, scaled, stand for): the tests' yardstick."""
    s = pre.s.float()
    return s * torch.rsqrt((s * s).mean(dim=1, keepdim=True) + eps) * w.float()
