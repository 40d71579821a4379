"""``decode_attention``: one query per sequence, split-K over the sequence (flash-decoding):
program (b, kv head, split) handles the G = H / Hkv query heads of one KV head (GQA packing,
K/V read once per group) over an equal share of the visible keys, keeping log-sum-exp
partials; a second kernel merges the splits. The split length follows each sequence's length
on the device, so the grid depends only on the batch (CUDA-graph friendly). With a
``CascadeGroups`` the shared prefixes are read by ``cascade``'s kernel and merged with the rest.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .cascade import CascadeGroups, shared_prefix_attention
from .common import (LOG2E, STEP_SCALARS, DecodeWorkspace, _attend_block, _kv_block, _precision,
                     _split_partials, _window)


@triton.jit(do_not_specialize=STEP_SCALARS["decode_split"])
def _decode_split_kernel(
    q_ptr, q_rows_ptr, k_cache_ptr, v_cache_ptr, table_ptr, table_stride, seq_rows_ptr, seq_lens_ptr,
    seq_starts_ptr, mid_o_ptr, mid_lse_ptr, qk_scale, window, num_splits, split_stride,
    H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr,
    HAS_START: tl.constexpr,
):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    length = tl.load(seq_lens_ptr + b)
    row = tl.load(seq_rows_ptr + b).to(tl.int64)
    lo = tl.maximum(length - window, 0)
    if HAS_START:  # keys below the sequence's start are a shared prefix read by the cascade kernel
        lo = tl.maximum(lo, tl.load(seq_starts_ptr + b))
    per = tl.cdiv(tl.cdiv(length - lo, num_splits), BLOCK_N) * BLOCK_N
    s0 = lo + sp * per
    s1 = tl.minimum(length, s0 + per)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    qrow = tl.load(q_rows_ptr + b).to(tl.int64)
    mq = (g[:, None] < G) & (d[None, :] < D)
    q = tl.load(q_ptr + qrow * (H * D) + (hk * G + g[:, None]) * D + d[None, :], mask=mq, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    n_off = tl.arange(0, BLOCK_N)
    for start in range(s0, s1, BLOCK_N):
        tok = start + n_off
        valid = tok < s1
        kv_off, mkv = _kv_block(table_ptr, row, table_stride, tok, valid, hk, d, PS, HKV, D)
        k = tl.load(k_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)
        v = tl.load(v_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)  # in flight with k's
        m_i, l_i, acc = _attend_block(q, k, v, valid, m_i, l_i, acc, qk_scale, PREC)
    out, lse = _split_partials(acc, m_i, l_i)
    hq = hk * G + g
    base = (b.to(tl.int64) * H + hq) * split_stride + sp
    tl.store(mid_o_ptr + base[:, None] * D + d[None, :], out, mask=mq)
    tl.store(mid_lse_ptr + base, lse, mask=g < G)


@triton.jit(do_not_specialize=STEP_SCALARS["decode_merge"])
def _decode_merge_kernel(
    mid_o_ptr, mid_lse_ptr, out_ptr, q_rows_ptr, seq_starts_ptr, split_stride, num_splits, own_splits,
    H: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_START: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    base = (b.to(tl.int64) * H + h) * split_stride
    ms = sp < num_splits
    if HAS_START:  # the shared-prefix partials exist only for members of a group
        ms = ms & ((sp < own_splits) | (tl.load(seq_starts_ptr + b) > 0))
    lse = tl.load(mid_lse_ptr + base + sp, mask=ms, other=float("-inf"))
    m = tl.max(lse, 0)
    w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m))
    o = tl.load(mid_o_ptr + (base + sp[:, None]) * D + d[None, :], mask=ms[:, None] & (d[None, :] < D), other=0.0)
    out = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    qrow = tl.load(q_rows_ptr + b).to(tl.int64)
    tl.store(out_ptr + qrow * (H * D) + h * D + d, out.to(out_ptr.dtype.element_ty), mask=d < D)


def decode_attention(
    q: torch.Tensor, out: torch.Tensor, q_rows: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    table: torch.Tensor, seq_rows: torch.Tensor, seq_lens: torch.Tensor, ws: DecodeWorkspace,
    page_size: int, scale: float, window: int, block_n: int | None = None, num_warps: int = 4,
    num_stages: int = 2, cascade: CascadeGroups | None = None,
) -> None:
    """out[q_rows[b]] = attention of q[q_rows[b]] over keys [max(0, L_b - window), L_b) of sequence b.

    With ``cascade`` (and ``ws.shared_splits`` > 0), each group's shared prefix is read once for
    all its members and merged with their own keys by log-sum-exp: the same result.
    ``block_n`` (keys per inner step) defaults to 128 for head_dim <= 64 when the batch alone fills
    the GPU (measured faster on an H200 by bench/attn_kernels.py), else 64."""
    b = seq_lens.shape[0]
    if b == 0:
        return
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    if block_n is None:
        block_n = 128 if d <= 64 and b * hkv >= 128 else 64
    g = h // hkv
    ns = ws.num_splits
    cas = cascade is not None and ws.shared_splits > 0
    total = ns + (ws.shared_splits if cas else 0)
    starts = cascade.starts if cas else seq_lens  # (unused without HAS_START)
    _decode_split_kernel[(b, hkv, ns)](
        q, q_rows, k_cache, v_cache, table, table.stride(0), seq_rows, seq_lens, starts,
        ws.mid_o, ws.mid_lse, scale * LOG2E, _window(window), ns, ws.mid_lse.shape[2],
        H=h, HKV=hkv, G=g, D=d, PS=page_size,
        BLOCK_G=max(16, triton.next_power_of_2(g)), BLOCK_D=triton.next_power_of_2(d), BLOCK_N=block_n,
        PREC=_precision(q), HAS_START=cas, num_warps=num_warps, num_stages=num_stages,
    )
    if cas:
        assert cascade is not None
        shared_prefix_attention(q, q_rows, k_cache, v_cache, table, seq_rows, seq_lens, cascade, ws, page_size,
                                scale, window)
    _decode_merge_kernel[(b, h)](
        ws.mid_o, ws.mid_lse, out, q_rows, starts, ws.mid_lse.shape[2], total, ns,
        H=h, D=d, BLOCK_S=triton.next_power_of_2(total), BLOCK_D=triton.next_power_of_2(d), HAS_START=cas,
    )
