"""The Triton kernel behind ``dense_gemv``: y = x @ Wᵀ (+ bias) for a few rows x [M ≤ 4, K]
over a dense row-major weight W [N, K] (bf16 or f16, as ``nn.Linear`` stores it).

A program owns ``BN`` rows of W (output columns) and a slice of K, walked in chunks of ``BK``:
each thread loads 8 consecutive weights of a row (16 bytes), multiplies them by the matching
activations of every batch row (one read of a weight serves them all) and the chunk is reduced
along K into float32 sums per column. With several K slices the slices write float32 partials,
count themselves done on their column block's counter and the one completing the count sums
the partials in slice order and writes y (``triton_gemv``'s scheme: one launch, deterministic,
fixed shapes, CUDA-graph capturable).

Two prologues take the kernel that produced the input into the GEMV (one launch instead of two):

- ``PRO = 1`` (norm): the input is ``rms_norm(x + r) · w_norm``. Every program adds its slice of x and
  r (rounded to their dtype, as the residual stream is), multiplies by ``w_norm`` and sums the
  squares of the sum; the programs of column block 0 also write the sum (the residual stream's
  next value). The row's 1/rms is known only over the whole K, so it scales the output: with K
  slices each slice stores its sum of squares beside its partials and the last slice adds them.
- ``PRO = 2`` (act): the input is ``act(g) · u`` of the gate/up output [g | u] (rounded as the
  ``act_mul`` kernel rounds: act(g) to the dtype, then the product), computed per chunk.

Weights never depend on the kernel before; only the input does. With ``PRE`` = 1 or 2 a program
issues the loads of its first ``PRE`` weight tiles before it reads anything else, and with ``PDL``
(a programmatic dependent launch, sm90+; never under the interpreter) it waits for the kernel
before (``gdc_wait``) only after those loads, and lets the kernel after it start at once
(``gdc_launch_dependents``): a chain of such GEMVs streams each one's first weights while the one
before still runs. Nothing is written before the wait (the buffers of a CUDA graph's pool may be
the ones the kernel before reads). The sums are the same, in the same order, with or without.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .quant.triton_gemv import _store_rows, _sum_slices

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # as the kernels below were defined


@triton.jit
def _act(g, GELU: tl.constexpr):
    if GELU:  # tanh approximation; tanh(z) = 2 sigmoid(2z) - 1
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return 0.5 * g * (2.0 * tl.sigmoid(2.0 * z))
    return g * tl.sigmoid(g)


@triton.jit
def _xin(x_ptr, r_ptr, nw_ptr, s_ptr, m, k, kmask, M, stride_xm, stride_rm, stride_sm, n_ff, write_s,
         PRO: tl.constexpr, GELU: tl.constexpr):
    """(the GEMV's input at columns k of row m in float32, Σ of the squares of the residual sum
    over them (PRO 1; else 0))."""
    ok = kmask & (m < M)
    ty = x_ptr.dtype.element_ty
    if PRO == 1:
        xv = tl.load(x_ptr + m * stride_xm + k, mask=ok, other=0.0).to(tl.float32)
        rv = tl.load(r_ptr + m * stride_rm + k, mask=ok, other=0.0).to(tl.float32)
        s = (xv + rv).to(ty)
        if write_s:
            tl.store(s_ptr + m * stride_sm + k, s, mask=ok)
        sf = s.to(tl.float32)
        w = tl.load(nw_ptr + k, mask=kmask, other=0.0).to(tl.float32)
        return sf * w, tl.sum(sf * sf, axis=0)
    elif PRO == 2:
        g = tl.load(x_ptr + m * stride_xm + k, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + m * stride_xm + n_ff + k, mask=ok, other=0.0).to(tl.float32)
        a = _act(g, GELU).to(ty).to(tl.float32)
        return (a * u).to(ty).to(tl.float32), 0.0
    else:
        return tl.load(x_ptr + m * stride_xm + k, mask=ok, other=0.0).to(tl.float32), 0.0


@triton.jit
def _rstd(ss, K, eps):
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _wtile(w_ptr, rn, nmask, stride_wn, K, pid_s, STEPS, t, BK: tl.constexpr):
    """The weight tile of K chunk ``t`` of this program's slice, in W's dtype."""
    k = (pid_s * STEPS + t) * BK + tl.arange(0, BK)
    return tl.load(w_ptr + rn[:, None] * stride_wn + k[None, :], mask=nmask[:, None] & (k < K)[None, :],
                   other=0.0)


@triton.jit
def _chunk(w, t, a0, a1, a2, a3, q0, q1, q2, q3, x_ptr, r_ptr, nw_ptr, s_ptr, m0, M, K, pid_s, STEPS,
           stride_xm, stride_rm, stride_sm, n_ff, write_s, PRO: tl.constexpr, GELU: tl.constexpr,
           BM: tl.constexpr, BK: tl.constexpr):
    """The sums after K chunk ``t`` (weights ``w``) of every batch row."""
    k = (pid_s * STEPS + t) * BK + tl.arange(0, BK)
    kmask = k < K
    w = w.to(tl.float32)
    x, sq = _xin(x_ptr, r_ptr, nw_ptr, s_ptr, m0, k, kmask, M, stride_xm, stride_rm, stride_sm, n_ff,
                 write_s, PRO, GELU)
    a0 += tl.sum(w * x[None, :], axis=1)
    q0 += sq
    if BM > 1:
        x, sq = _xin(x_ptr, r_ptr, nw_ptr, s_ptr, m0 + 1, k, kmask, M, stride_xm, stride_rm, stride_sm, n_ff,
                     write_s, PRO, GELU)
        a1 += tl.sum(w * x[None, :], axis=1)
        q1 += sq
    if BM > 2:
        x, sq = _xin(x_ptr, r_ptr, nw_ptr, s_ptr, m0 + 2, k, kmask, M, stride_xm, stride_rm, stride_sm, n_ff,
                     write_s, PRO, GELU)
        a2 += tl.sum(w * x[None, :], axis=1)
        q2 += sq
        x, sq = _xin(x_ptr, r_ptr, nw_ptr, s_ptr, m0 + 3, k, kmask, M, stride_xm, stride_rm, stride_sm, n_ff,
                     write_s, PRO, GELU)
        a3 += tl.sum(w * x[None, :], axis=1)
        q3 += sq
    return a0, a1, a2, a3, q0, q1, q2, q3


@triton.jit
def _body(x_ptr, r_ptr, nw_ptr, s_ptr, w_ptr, b_ptr, y_ptr, p_ptr, q_ptr, c_ptr, M, N, K,
          stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, n_ff, eps, STEPS, S,
          PRO: tl.constexpr, GELU: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
          BK: tl.constexpr, SPLIT: tl.constexpr, SB: tl.constexpr, STAGES: tl.constexpr, PRE: tl.constexpr,
          PDL: tl.constexpr):
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    m0 = tl.program_id(0) * BM
    rn = pid_n * BN + tl.arange(0, BN)
    nmask = rn < N
    write_s = pid_n == 0
    if PDL:  # the next kernel may start now: it too reads only its weights before its wait
        gdc_launch_dependents()
    # the first PRE weight tiles (≤ STEPS) are loaded before anything the kernel before wrote is
    # read: under PDL they stream in while that kernel finishes
    if PRE > 0:
        w0 = _wtile(w_ptr, rn, nmask, stride_wn, K, pid_s, STEPS, 0, BK)
    if PRE > 1:
        w1 = _wtile(w_ptr, rn, nmask, stride_wn, K, pid_s, STEPS, 1, BK)
    if PDL:
        gdc_wait()  # the input (and every buffer this kernel writes) is free from here
    a0 = tl.zeros((BN,), dtype=tl.float32)
    a1 = tl.zeros((BN,), dtype=tl.float32)
    a2 = tl.zeros((BN,), dtype=tl.float32)
    a3 = tl.zeros((BN,), dtype=tl.float32)
    q0 = 0.0
    q1 = 0.0
    q2 = 0.0
    q3 = 0.0
    if PRE > 0:
        a0, a1, a2, a3, q0, q1, q2, q3 = _chunk(w0, 0, a0, a1, a2, a3, q0, q1, q2, q3, x_ptr, r_ptr,
                                                nw_ptr, s_ptr, m0, M, K, pid_s, STEPS, stride_xm, stride_rm,
                                                stride_sm, n_ff, write_s, PRO, GELU, BM, BK)
    if PRE > 1:
        a0, a1, a2, a3, q0, q1, q2, q3 = _chunk(w1, 1, a0, a1, a2, a3, q0, q1, q2, q3, x_ptr, r_ptr,
                                                nw_ptr, s_ptr, m0, M, K, pid_s, STEPS, stride_xm, stride_rm,
                                                stride_sm, n_ff, write_s, PRO, GELU, BM, BK)
    for t in tl.range(PRE, STEPS, num_stages=STAGES):
        w = _wtile(w_ptr, rn, nmask, stride_wn, K, pid_s, STEPS, t, BK)
        a0, a1, a2, a3, q0, q1, q2, q3 = _chunk(w, t, a0, a1, a2, a3, q0, q1, q2, q3, x_ptr, r_ptr,
                                                nw_ptr, s_ptr, m0, M, K, pid_s, STEPS, stride_xm, stride_rm,
                                                stride_sm, n_ff, write_s, PRO, GELU, BM, BK)
    if SPLIT:
        part = p_ptr + pid_s * M * N + rn
        tl.store(part + m0 * N, a0, mask=nmask & (m0 < M))
        if BM > 1:
            tl.store(part + (m0 + 1) * N, a1, mask=nmask & (m0 + 1 < M))
        if BM > 2:
            tl.store(part + (m0 + 2) * N, a2, mask=nmask & (m0 + 2 < M))
            tl.store(part + (m0 + 3) * N, a3, mask=nmask & (m0 + 3 < M))
        nb = tl.num_programs(1)
        if PRO == 1:  # this slice's Σ s² per row, for the last slice of this column block
            qs = q_ptr + (pid_s * M + m0) * nb + pid_n
            tl.store(qs, q0, mask=m0 < M)
            if BM > 1:
                tl.store(qs + nb, q1, mask=m0 + 1 < M)
            if BM > 2:
                tl.store(qs + 2 * nb, q2, mask=m0 + 2 < M)
                tl.store(qs + 3 * nb, q3, mask=m0 + 3 < M)
        tl.debug_barrier()  # every thread's partials are stored before the count is published
        cnt = c_ptr + tl.program_id(0) * nb + pid_n
        done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if done == S - 1:
            a0, a1, a2, a3 = _sum_slices(p_ptr, rn, nmask, M, N, m0, S, BM, BN, SB)
            if PRO == 1:
                q0 = 0.0
                q1 = 0.0
                q2 = 0.0
                q3 = 0.0
                for s in range(0, S):
                    qs = q_ptr + (s * M + m0) * nb + pid_n
                    q0 += tl.load(qs, mask=m0 < M, other=0.0, cache_modifier=".cg")
                    if BM > 1:
                        q1 += tl.load(qs + nb, mask=m0 + 1 < M, other=0.0, cache_modifier=".cg")
                    if BM > 2:
                        q2 += tl.load(qs + 2 * nb, mask=m0 + 2 < M, other=0.0, cache_modifier=".cg")
                        q3 += tl.load(qs + 3 * nb, mask=m0 + 3 < M, other=0.0, cache_modifier=".cg")
                a0 = a0 * _rstd(q0, K, eps)
                a1 = a1 * _rstd(q1, K, eps)
                a2 = a2 * _rstd(q2, K, eps)
                a3 = a3 * _rstd(q3, K, eps)
            _store_rows(y_ptr, b_ptr, rn, nmask, M, m0, stride_ym, a0, a1, a2, a3, HAS_BIAS, BM, BN)
            tl.atomic_xchg(cnt, 0)
    else:
        if PRO == 1:
            a0 = a0 * _rstd(q0, K, eps)
            a1 = a1 * _rstd(q1, K, eps)
            a2 = a2 * _rstd(q2, K, eps)
            a3 = a3 * _rstd(q3, K, eps)
        _store_rows(y_ptr, b_ptr, rn, nmask, M, m0, stride_ym, a0, a1, a2, a3, HAS_BIAS, BM, BN)


# Two entry points of one body, as in ``triton_gemv``: the interpreter takes loop bounds only as
# compile-time constants; on the GPU run-time bounds keep one compilation per configuration.
@triton.jit
def gemv_kernel(x_ptr, r_ptr, nw_ptr, s_ptr, w_ptr, b_ptr, y_ptr, p_ptr, q_ptr, c_ptr, M, N, K,
                stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, n_ff, eps, steps, S,
                PRO: tl.constexpr, GELU: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, SB: tl.constexpr, STAGES: tl.constexpr,
                PRE: tl.constexpr, PDL: tl.constexpr):
    _body(x_ptr, r_ptr, nw_ptr, s_ptr, w_ptr, b_ptr, y_ptr, p_ptr, q_ptr, c_ptr, M, N, K,
          stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, n_ff, eps, steps, S,
          PRO, GELU, HAS_BIAS, BM, BN, BK, SPLIT, SB, STAGES, PRE, PDL)


@triton.jit
def gemv_kernel_const(x_ptr, r_ptr, nw_ptr, s_ptr, w_ptr, b_ptr, y_ptr, p_ptr, q_ptr, c_ptr, M, N, K,
                      stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, n_ff, eps,
                      steps: tl.constexpr, S: tl.constexpr, PRO: tl.constexpr, GELU: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      SPLIT: tl.constexpr, SB: tl.constexpr, STAGES: tl.constexpr, PRE: tl.constexpr,
                      PDL: tl.constexpr):
    _body(x_ptr, r_ptr, nw_ptr, s_ptr, w_ptr, b_ptr, y_ptr, p_ptr, q_ptr, c_ptr, M, N, K,
          stride_xm, stride_rm, stride_sm, stride_wn, stride_ym, n_ff, eps, steps, S,
          PRO, GELU, HAS_BIAS, BM, BN, BK, SPLIT, SB, STAGES, PRE, PDL)
