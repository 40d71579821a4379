"""Triton kernels of the CUDA attention backend, and their launchers.

Paged layout (``kv_store``): one layer's cache is [rows, Hkv, D]; the key of position p of a
sequence lives in row ``table[seq_row, p // PS] * PS + p % PS`` of the int32 page table.

- ``rope_write``: RoPE on q and k (adjacent-pair "norm" or half-split "neox", the first RD
  dims), k and v written to their cache rows: one program per token and KV head (its query
  heads with it), so that a decode step's few tokens still spread over several multiprocessors.
- ``decode_attention``: one query per sequence, split-K over the sequence (flash-decoding):
  program (b, kv head, split) handles the G = H / Hkv query heads of one KV head (GQA packing,
  K/V read once per group) over an equal share of the visible keys, keeping log-sum-exp
  partials; a second kernel merges the splits. The split length follows each sequence's length
  on the device, so the grid depends only on the batch (CUDA-graph friendly).
- ``decode_fused``: the same for a step of decoding sequences only, in one launch: each split
  program has its first block of cached keys in flight before it reads q (as a programmatic
  dependent launch, before the Q/K/V projection ends), rotates its q and the new key in
  registers, the one whose split holds the new position writes k/v to the cache last, and the
  last split of each (sequence, KV head) to finish (an atomic count) merges the splits in split
  order.
- ``cascade`` (``decode_attention`` with a ``CascadeGroups``): decoding sequences whose page
  tables start with the same pages read that shared prefix once per group: program (group,
  query block, kv head, split) attends every query head of every member (rows = member x G) to
  the prefix with one tensor-core dot per key block, writing log-sum-exp partials beside the
  split kernel's (which then reads only each sequence's own keys after the prefix); the merge
  kernel combines both. All per-group inputs live on the device.
- ``extend_attention``: a chunk of q_len queries at positions [kv_len - q_len, kv_len) over its
  cached prefix and itself (causal offset kv_len - q_len), with sliding windows.

Softmax runs in base 2 (scores scaled by log2(e)); accumulation in float32.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

LOG2E = 1.4426950408889634


@triton.jit
def _rope_write_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
    pos_ptr, tok_row_ptr, table_ptr, table_stride,
    stride_q, stride_k, stride_v,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, RD: tl.constexpr, NEOX: tl.constexpr,
    PS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """Program (t, j): the G = H / HKV query heads j·G … of token t and its KV head j."""
    t = tl.program_id(0)
    hk = tl.program_id(1)
    G: tl.constexpr = H // HKV
    pos = tl.load(pos_ptr + t)
    row = tl.load(tok_row_ptr + t)
    page = tl.load(table_ptr + row.to(tl.int64) * table_stride + pos // PS)
    slot = page.to(tl.int64) * PS + pos % PS
    d = tl.arange(0, BLOCK_D)
    RD2: tl.constexpr = RD // 2
    if NEOX:
        i = d % RD2
        partner = tl.where(d < RD2, d + RD2, d - RD2)
        sign = tl.where(d < RD2, -1.0, 1.0)
    else:
        i = d // 2
        partner = d ^ 1
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    rot = d < RD
    i = tl.where(rot, i, 0)
    partner = tl.where(rot, partner, d)
    sign = tl.where(rot, sign, 0.0)
    c1 = tl.load(cos_ptr + pos.to(tl.int64) * RD2 + i, mask=rot, other=1.0)
    s1 = tl.load(sin_ptr + pos.to(tl.int64) * RD2 + i, mask=rot, other=0.0)
    c = c1[None, :]
    s = s1[None, :]
    g = tl.arange(0, BLOCK_H)[:, None]
    h = hk * G + g
    dd = d[None, :]
    pp = partner[None, :]
    sg = sign[None, :]
    # q: rotated into q_out (same [T, H, D] layout, contiguous)
    mq = (g < G) & (dd < D)
    qa = q_ptr + t.to(tl.int64) * stride_q + h * D
    x = tl.load(qa + dd, mask=mq, other=0.0).to(tl.float32)
    xp = tl.load(qa + pp, mask=mq, other=0.0).to(tl.float32)
    y = x * c + sg * xp * s
    tl.store(q_out_ptr + t.to(tl.int64) * (H * D) + h * D + dd, y.to(q_out_ptr.dtype.element_ty), mask=mq)
    # k: rotated, rounded to the activations' dtype, then stored in the cache's
    dk = d < D
    ka = k_ptr + t.to(tl.int64) * stride_k + hk * D
    x = tl.load(ka + d, mask=dk, other=0.0).to(tl.float32)
    xp = tl.load(ka + partner, mask=dk, other=0.0).to(tl.float32)
    y = (x * c1 + sign * xp * s1).to(k_ptr.dtype.element_ty)
    dst = slot * (HKV * D) + hk * D + d
    tl.store(k_cache_ptr + dst, y.to(k_cache_ptr.dtype.element_ty), mask=dk)
    vv = tl.load(v_ptr + t.to(tl.int64) * stride_v + hk * D + d, mask=dk, other=0.0)
    tl.store(v_cache_ptr + dst, vv.to(v_cache_ptr.dtype.element_ty), mask=dk)


def _token_stride(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] with unit dim stride and head stride D (a view of a projection's output)."""
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    return x


def rope_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, tok_rows: torch.Tensor,
    table: torch.Tensor, page_size: int, rope_dim: int, neox: bool,
) -> torch.Tensor:
    """Returns rotated q [T, H, D]; writes rotated k and v into the caches."""
    q, k, v = _token_stride(q), _token_stride(k), _token_stride(v)
    t, h, d = q.shape
    hkv = k.shape[1]
    q_out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    if t == 0:
        return q_out
    _rope_write_kernel[(t, hkv)](
        q, k, v, q_out, k_cache, v_cache, cos, sin, positions, tok_rows, table, table.stride(0),
        q.stride(0), k.stride(0), v.stride(0),
        H=h, HKV=hkv, D=d, RD=rope_dim, NEOX=neox, PS=page_size,
        BLOCK_H=triton.next_power_of_2(h // hkv), BLOCK_D=triton.next_power_of_2(d),
        num_warps=1 if (h // hkv) * d <= 512 else 2,
    )
    return q_out


@triton.jit
def _kv_block(table_ptr, row, table_stride, tok, valid, hk, d, PS: tl.constexpr, HKV: tl.constexpr,
              D: tl.constexpr):
    """Offsets of the cache rows holding positions ``tok`` of page-table row ``row`` (KV head
    ``hk``, dims ``d``) and their load mask: where every kernel reads a block of keys/values."""
    page = tl.load(table_ptr + row * table_stride + tok // PS, mask=valid, other=0)
    slot = page.to(tl.int64) * PS + tok % PS
    return slot[:, None] * (HKV * D) + hk * D + d[None, :], valid[:, None] & (d[None, :] < D)


@triton.jit
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
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    hq = hk * G + g
    base = (b.to(tl.int64) * H + hq) * split_stride + sp
    tl.store(mid_o_ptr + base[:, None] * D + d[None, :], out, mask=mq)
    tl.store(mid_lse_ptr + base, lse, mask=g < G)


@triton.jit
def _shared_prefix_kernel(
    q_ptr, q_rows_ptr, k_cache_ptr, v_cache_ptr, table_ptr, table_stride, seq_rows_ptr, seq_lens_ptr,
    grp_members_ptr, grp_n_ptr, grp_shared_ptr, grp_minlen_ptr, members_stride, n_mblocks,
    mid_o_ptr, mid_lse_ptr, qk_scale, window, split_stride, own_splits, shared_splits,
    H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    gi = pid // n_mblocks
    mb = pid % n_mblocks
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    n_mem = tl.load(grp_n_ptr + gi)
    shared = tl.load(grp_shared_ptr + gi)
    # keys below (shortest member's length - window) are outside every member's window
    lo = tl.minimum(tl.maximum(tl.load(grp_minlen_ptr + gi) - window, 0), shared)
    per = tl.cdiv(tl.cdiv(shared - lo, shared_splits), BLOCK_N) * BLOCK_N
    s0 = lo + sp * per
    s1 = tl.minimum(shared, s0 + per)
    s1 = tl.where(mb * BLOCK_M < n_mem * G, s1, s0)  # no rows in this block: no keys either
    r = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    mem = r // G
    j = r % G
    rvalid = mem < n_mem
    bidx = tl.load(grp_members_ptr + gi * members_stride + mem, mask=rvalid, other=0)
    qrow = tl.load(q_rows_ptr + bidx, mask=rvalid, other=0).to(tl.int64)
    qpos = tl.load(seq_lens_ptr + bidx, mask=rvalid, other=1) - 1
    prow = tl.load(seq_rows_ptr + tl.load(grp_members_ptr + gi * members_stride)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    mq = rvalid[:, None] & (d[None, :] < D)
    q = tl.load(q_ptr + qrow[:, None] * (H * D) + (hk * G + j)[:, None] * D + d[None, :], mask=mq, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_off = tl.arange(0, BLOCK_N)
    for start in range(s0, s1, BLOCK_N):
        tok = start + n_off
        valid = tok < s1
        kv_off, mkv = _kv_block(table_ptr, prow, table_stride, tok, valid, hk, d, PS, HKV, D)
        k = tl.load(k_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        vis = valid[None, :] & ((qpos[:, None] - tok[None, :]) < window)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    base = (bidx.to(tl.int64) * H + hk * G + j) * split_stride + own_splits + sp
    tl.store(mid_o_ptr + base[:, None] * D + d[None, :], out, mask=mq)
    tl.store(mid_lse_ptr + base, lse, mask=rvalid)


@triton.jit
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


@triton.jit
def _rope_pairs(d, RD: tl.constexpr, NEOX: tl.constexpr):
    """Per dim: its cos/sin index, its rotation partner and the partner's sign (identity past RD)."""
    RD2: tl.constexpr = RD // 2
    if NEOX:
        i = d % RD2
        partner = tl.where(d < RD2, d + RD2, d - RD2)
        sign = tl.where(d < RD2, -1.0, 1.0)
    else:
        i = d // 2
        partner = d ^ 1
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    rot = d < RD
    return tl.where(rot, i, 0), tl.where(rot, partner, d), tl.where(rot, sign, 0.0), rot


@triton.jit
def _decode_fused_kernel(
    q_ptr, k_ptr, v_ptr, stride_q, stride_k, stride_v, cos_ptr, sin_ptr,
    q_rows_ptr, k_cache_ptr, v_cache_ptr, table_ptr, table_stride, seq_rows_ptr, seq_lens_ptr,
    mid_o_ptr, mid_lse_ptr, count_ptr, out_ptr, qk_scale, window, num_splits, split_stride,
    H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    RD: tl.constexpr, NEOX: tl.constexpr, ROPE: tl.constexpr, BLOCK_G: tl.constexpr, GP: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Decode step of one layer in one launch. Program (b, kv head, split):

    1. loads its first block of cached keys/values (all but the new position) - with PDL while
       the kernel before (the Q/K/V projection) still runs: nothing read before ``gdc_wait``
       is written by it;
    2. with ROPE, RoPE of its G query heads and of the new key in registers (rounded as
       ``rope_write`` rounds them); the new position's key/value come from registers (without
       ROPE, q is rotated and the cache written already);
    3. the split's log-sum-exp partials, as ``_decode_split_kernel``, each block's successor
       loaded before the block is used; the program whose split holds the new position
       writes its k/v to the cache last (no program of this launch reads that row);
    4. the last split of (b, kv head) to finish (an atomic count, reset after) merges all
       splits in split order, as ``_decode_merge_kernel`` does."""
    b = tl.program_id(0)
    hk = tl.program_id(1)
    sp = tl.program_id(2)
    length = tl.load(seq_lens_ptr + b)
    row = tl.load(seq_rows_ptr + b).to(tl.int64)
    t = tl.load(q_rows_ptr + b).to(tl.int64)  # the token's row in q/k/v and out
    pos = length - 1
    lo = tl.maximum(length - window, 0)
    per = tl.cdiv(tl.cdiv(length - lo, num_splits), BLOCK_N) * BLOCK_N
    s0 = lo + sp * per
    s1 = tl.minimum(length, s0 + per)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    dk = d < D
    n_off = tl.arange(0, BLOCK_N)
    # 1. the first block: in flight before q exists
    tok = s0 + n_off
    old = tok < s1
    if ROPE:  # the new key is not in the cache yet: it comes from registers
        old = old & (tok != pos)
    kv_off, mkv = _kv_block(table_ptr, row, table_stride, tok, old, hk, d, PS, HKV, D)
    k_blk = tl.load(k_cache_ptr + kv_off, mask=mkv, other=0.0)
    v_blk = tl.load(v_cache_ptr + kv_off, mask=mkv, other=0.0)
    if PDL:
        gdc_wait()  # the projections' outputs are complete and visible from here
    # 2. q (and the new k/v)
    mq = (g[:, None] < G) & (d[None, :] < D)
    qa = q_ptr + t * stride_q + (hk * G + g[:, None]) * D
    if ROPE:
        RD2: tl.constexpr = RD // 2
        ci, partner, sign, rot = _rope_pairs(d, RD, NEOX)
        c1 = tl.load(cos_ptr + pos.to(tl.int64) * RD2 + ci, mask=rot, other=1.0)
        s1n = tl.load(sin_ptr + pos.to(tl.int64) * RD2 + ci, mask=rot, other=0.0)
        x = tl.load(qa + d[None, :], mask=mq, other=0.0).to(tl.float32)
        xp = tl.load(qa + partner[None, :], mask=mq, other=0.0).to(tl.float32)
        q = (x * c1[None, :] + sign[None, :] * xp * s1n[None, :]).to(q_ptr.dtype.element_ty)
        ka = k_ptr + t * stride_k + hk * D
        x = tl.load(ka + d, mask=dk, other=0.0).to(tl.float32)
        xp = tl.load(ka + partner, mask=dk, other=0.0).to(tl.float32)
        k_new = (x * c1 + sign * xp * s1n).to(k_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
        v_new = tl.load(v_ptr + t * stride_v + hk * D + d, mask=dk, other=0.0)
        v_new = v_new.to(v_cache_ptr.dtype.element_ty)
        k_new_q = k_new.to(q.dtype)
        v_new_q = v_new.to(q.dtype)
    else:
        q = tl.load(qa + d[None, :], mask=mq, other=0.0)
    # 3. the split's partials
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for start in range(s0, s1, BLOCK_N):
        tok = start + n_off
        valid = tok < s1
        # the next block's loads go out before this block is used
        ntok = tok + BLOCK_N
        nold = ntok < s1
        if ROPE:
            nold = nold & (ntok != pos)
        n_kv_off, n_mkv = _kv_block(table_ptr, row, table_stride, ntok, nold, hk, d, PS, HKV, D)
        k_nxt = tl.load(k_cache_ptr + n_kv_off, mask=n_mkv, other=0.0)
        v_nxt = tl.load(v_cache_ptr + n_kv_off, mask=n_mkv, other=0.0)
        k = k_blk.to(q.dtype)
        v = v_blk.to(q.dtype)
        if ROPE:
            new = (tok == pos)[:, None]
            k = tl.where(new, k_new_q[None, :], k)
            v = tl.where(new, v_new_q[None, :], v)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
        k_blk = k_nxt
        v_blk = v_nxt
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    hq = hk * G + g
    base = (b.to(tl.int64) * H + hq) * split_stride
    tl.store(mid_o_ptr + (base + sp)[:, None] * D + d[None, :], out, mask=mq)
    tl.store(mid_lse_ptr + base + sp, lse, mask=g < G)
    if ROPE:
        if (pos >= s0) & (pos < s1):
            page = tl.load(table_ptr + row * table_stride + pos // PS)
            dst = (page.to(tl.int64) * PS + pos % PS) * (HKV * D) + hk * D + d
            tl.store(k_cache_ptr + dst, k_new, mask=dk)
            tl.store(v_cache_ptr + dst, v_new, mask=dk)
    # 4. the merge, by the last split to finish
    tl.debug_barrier()  # every thread's partials are stored before the count is published
    cnt = count_ptr + b * HKV + hk
    done = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if done == num_splits - 1:
        # every query head's splits in one round trip: [GP heads, BLOCK_S splits, BLOCK_D]
        gm = tl.arange(0, GP)
        j = tl.arange(0, BLOCK_S)
        hb = (b.to(tl.int64) * H + hk * G + gm) * split_stride  # [GP]
        ml = (gm[:, None] < G) & (j[None, :] < num_splits)
        lj = tl.load(mid_lse_ptr + hb[:, None] + j[None, :], mask=ml, other=float("-inf"),
                     cache_modifier=".cg")
        mo = ml[:, :, None] & (d[None, None, :] < D)
        oj = tl.load(mid_o_ptr + (hb[:, None, None] + j[None, :, None]) * D + d[None, None, :], mask=mo,
                     other=0.0, cache_modifier=".cg")
        mx = tl.max(lj, 1)
        w = tl.where(lj == float("-inf"), 0.0, tl.exp2(lj - mx[:, None]))
        res = tl.sum(oj * w[:, :, None], 1) / tl.sum(w, 1)[:, None]
        ho = (hk * G + gm)[:, None] * D + d[None, :]
        tl.store(out_ptr + t * (H * D) + ho, res.to(out_ptr.dtype.element_ty),
                 mask=(gm[:, None] < G) & (d[None, :] < D))
        tl.atomic_xchg(cnt, 0)


@functools.cache
def _sm90_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled CUDA kernels (not the interpreter) on sm90+."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device())


def decode_fused(
    q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, out: torch.Tensor, q_rows: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
    table: torch.Tensor, seq_rows: torch.Tensor, seq_lens: torch.Tensor, ws: DecodeWorkspace, page_size: int,
    scale: float, window: int, rope_dim: int = 0, neox: bool = False, block_n: int | None = None,
    num_warps: int | None = None, pdl: bool = False,
) -> None:
    """``rope_write`` then ``decode_attention`` for a step of decoding sequences only (token
    ``q_rows[b]`` at position ``seq_lens[b] - 1``), in one launch: q, k, v are the projections'
    unrotated outputs [T, heads, D]; out[q_rows[b]] gets the attention. With k None, q is
    rotated and the cache written already (split attention and merge only). ``ws`` needs
    ``count``.

    ``pdl`` (with RoPE only; ``pdl_supported``): launched as a programmatic dependent launch, the
    kernel starts while the kernel before it finishes and reads its first cached keys before
    waiting for it. The kernel before must then not write this layer's cache, the page table or
    ``seq_lens`` / ``seq_rows`` / ``q_rows`` (in a model step it is the Q/K/V projection)."""
    b = seq_lens.shape[0]
    if b == 0:
        return
    rope = k is not None
    q = _token_stride(q)
    if rope:
        assert v is not None and cos is not None and sin is not None
        k, v = _token_stride(k), _token_stride(v)
    else:
        k = v = q
        cos = sin = seq_lens
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    if block_n is None:
        block_n = 128 if d <= 64 and b * hkv >= 128 else 64
    block_d = triton.next_power_of_2(d)
    if num_warps is None:  # a block and its successor in registers: 4 warps up to 8K elements a block
        num_warps = 4 if block_n * block_d <= 8192 else 8
    g = h // hkv
    assert ws.count is not None and ws.count.shape[1] == hkv
    pdl = pdl and rope and pdl_supported(q.device)
    extra = {"launch_pdl": True} if pdl else {}
    _decode_fused_kernel[(b, hkv, ws.num_splits)](
        q, k, v, q.stride(0), k.stride(0), v.stride(0), cos, sin,
        q_rows, k_cache, v_cache, table, table.stride(0), seq_rows, seq_lens,
        ws.mid_o, ws.mid_lse, ws.count, out, scale * LOG2E, _window(window), ws.num_splits,
        ws.mid_lse.shape[2],
        H=h, HKV=hkv, G=g, D=d, PS=page_size, RD=max(rope_dim, 2), NEOX=neox, ROPE=rope,
        BLOCK_G=max(16, triton.next_power_of_2(g)), GP=triton.next_power_of_2(g),
        BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_S=triton.next_power_of_2(ws.num_splits),
        PREC=_precision(q), PDL=pdl, num_warps=num_warps, num_stages=1, **extra,
    )


def _precision(q: torch.Tensor) -> str:
    """float32 models get full-precision dots (Triton's default for float32 is tf32)."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


def _window(window: int) -> int:
    """0 (no window) becomes a window no sequence reaches, so kernels have one code path."""
    return window if window > 0 else 1 << 30


class DecodeWorkspace:
    """Split partials for up to ``max_b`` sequences: [max_b, H, num_splits + shared_splits, D]
    and lse (the last ``shared_splits`` slots hold the cascade kernel's shared-prefix partials)."""

    def __init__(self, max_b: int, n_head: int, head_dim: int, num_splits: int, device: torch.device,
                 shared_splits: int = 0, n_head_kv: int = 0) -> None:
        self.num_splits = num_splits
        self.shared_splits = shared_splits
        n = num_splits + shared_splits
        self.mid_o = torch.empty((max_b, n_head, n, head_dim), dtype=torch.float32, device=device)
        self.mid_lse = torch.empty((max_b, n_head, n), dtype=torch.float32, device=device)
        # with n_head_kv: splits finished per (sequence, kv head) for ``decode_fused`` (each launch
        # leaves it at zero again)
        self.count = (torch.zeros((max_b, n_head_kv), dtype=torch.int32, device=device)
                      if n_head_kv else None)


class CascadeGroups:
    """Decoding sequences sharing a prefix, as device tensors (int32), indices into the decode
    batch: ``members`` [n_groups, max_members] (padded), ``n`` members, ``shared`` prefix
    tokens and ``minlen`` (shortest member length) per group, and ``starts`` [B]: the first key
    each sequence reads itself (its group's prefix length, 0 outside any group).
    ``max_rows`` = the most members of a group times G bounds the query blocks."""

    def __init__(self, members: torch.Tensor, n: torch.Tensor, shared: torch.Tensor, minlen: torch.Tensor,
                 starts: torch.Tensor, max_members: int) -> None:
        self.members, self.n, self.shared, self.minlen, self.starts = members, n, shared, minlen, starts
        self.max_members = max_members


def cascade_lists(groups: list[tuple[list[int], int]], lengths: list[int]) -> tuple[list[list[int]], int]:
    """The int lists of a ``CascadeGroups`` for ``attention.cascade_groups``' result over a decode
    batch with these key counts: ([members (flat, padded to max_members) , n, shared, minlen,
    starts], max_members)."""
    width = max(len(m) for m, _ in groups)
    members: list[int] = []
    starts = [0] * len(lengths)
    for m, shared in groups:
        members += m + [m[0]] * (width - len(m))
        for i in m:
            starts[i] = shared
    return ([members, [len(m) for m, _ in groups], [sh for _, sh in groups],
             [min(lengths[i] for i in m) for m, _ in groups], starts], width)


def cascade_groups_tensor(groups: list[tuple[list[int], int]], lengths: list[int], device: torch.device
                          ) -> CascadeGroups:
    lists, width = cascade_lists(groups, lengths)
    t = [torch.tensor(x, dtype=torch.int32, device=device) for x in lists]
    return CascadeGroups(t[0].view(len(groups), width), t[1], t[2], t[3], t[4], width)


def shared_prefix_attention(
    q: torch.Tensor, q_rows: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
    seq_rows: torch.Tensor, seq_lens: torch.Tensor, cascade: CascadeGroups, ws: DecodeWorkspace, page_size: int,
    scale: float, window: int, block_n: int | None = None, num_warps: int | None = None,
) -> None:
    """The cascade's shared-prefix partials into ``ws``' last ``shared_splits`` slots (the part
    of ``decode_attention`` with ``cascade`` that reads each group's prefix once)."""
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    g = h // hkv
    block_d = triton.next_power_of_2(d)
    rows = cascade.max_members * g
    block_m = 64 if rows > 32 else (32 if rows > 16 else 16)
    n_mb = triton.cdiv(rows, block_m)
    n_groups = cascade.n.shape[0]
    _shared_prefix_kernel[(n_groups * n_mb, hkv, ws.shared_splits)](
        q, q_rows, k_cache, v_cache, table, table.stride(0), seq_rows, seq_lens,
        cascade.members, cascade.n, cascade.shared, cascade.minlen, cascade.members.stride(0), n_mb,
        ws.mid_o, ws.mid_lse, scale * LOG2E, _window(window), ws.mid_lse.shape[2], ws.num_splits, ws.shared_splits,
        H=h, HKV=hkv, G=g, D=d, PS=page_size, BLOCK_M=block_m,
        BLOCK_N=block_n or (64 if block_d <= 128 else 32), BLOCK_D=block_d, PREC=_precision(q),
        num_warps=num_warps or (8 if block_d >= 256 else 4), num_stages=2,
    )


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


@triton.jit
def _extend_kernel(
    q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, table_ptr, table_stride,
    seq_rows_ptr, q_start_ptr, q_len_ptr, kv_len_ptr, qk_scale, window,
    H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PREC: tl.constexpr,
):
    s_idx = tl.program_id(0)
    mb = tl.program_id(1)
    h = tl.program_id(2)
    hk = h // G
    row = tl.load(seq_rows_ptr + s_idx).to(tl.int64)
    q_start = tl.load(q_start_ptr + s_idx)
    q_len = tl.load(q_len_ptr + s_idx)
    kv_len = tl.load(kv_len_ptr + s_idx)
    pos0 = kv_len - q_len  # causal offset: query m is at position pos0 + m
    m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    mvalid = m < q_len
    qpos = pos0 + m
    d = tl.arange(0, BLOCK_D)
    mq = mvalid[:, None] & (d[None, :] < D)
    qoff = (q_start + m).to(tl.int64)[:, None] * (H * D) + h * D + d[None, :]
    q = tl.load(q_ptr + qoff, mask=mq, other=0.0)
    hi = tl.minimum(kv_len, pos0 + (mb + 1) * BLOCK_M)
    lo = tl.maximum(pos0 + mb * BLOCK_M - window + 1, 0)
    hi = tl.where(mb * BLOCK_M < q_len, hi, lo)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_off = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        tok = start + n_off
        valid = tok < hi
        kv_off, mkv = _kv_block(table_ptr, row, table_stride, tok, valid, hk, d, PS, HKV, D)
        k = tl.load(k_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        vis = valid[None, :] & (tok[None, :] <= qpos[:, None])
        vis = vis & ((qpos[:, None] - tok[None, :]) < window)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + kv_off, mask=mkv, other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + qoff, out.to(out_ptr.dtype.element_ty), mask=mq)


def extend_attention(
    q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
    seq_rows: torch.Tensor, q_start: torch.Tensor, q_len: torch.Tensor, kv_len: torch.Tensor, max_q_len: int,
    page_size: int, scale: float, window: int,
) -> None:
    """For each chunk s: out[q_start_s + m] = attention of query m (position kv_len_s - q_len_s + m)
    over keys [0, its position] (within the window) of sequence s."""
    n = seq_rows.shape[0]
    if n == 0:
        return
    _, h, d = q.shape
    hkv = k_cache.shape[1]
    block_m = 64 if max_q_len > 32 else 16
    block_d = triton.next_power_of_2(d)
    block_n = 64 if block_d <= 128 else 32
    _extend_kernel[(n, triton.cdiv(max_q_len, block_m), h)](
        q, out, k_cache, v_cache, table, table.stride(0), seq_rows, q_start, q_len, kv_len,
        scale * LOG2E, _window(window),
        H=h, HKV=hkv, G=h // hkv, D=d, PS=page_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        PREC=_precision(q), num_warps=8 if block_d >= 256 else 4, num_stages=2,
    )
