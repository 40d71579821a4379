"""``decode_fused``: ``rope_write`` and ``decode_attention`` for a step of decoding sequences
only, in one launch: each split program has its first block of cached keys in flight before it
reads q (as a programmatic dependent launch, before the Q/K/V projection ends), rotates its q
and the new key in registers, the one whose split holds the new position writes k/v to the
cache last, and the last split of each (sequence, KV head) to finish (an atomic count) merges
the splits in split order. With ``quant_out`` that program also writes the merged output as
the int8 codes, scales and sums the output projection's quantized GEMV reads (``triton_q8``'s
``quantize_x`` of it), so that no quantizing kernel runs between the attention and the GEMV.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import (LOG2E, DecodeWorkspace, _attend_block, _kv_block, _precision, _split_partials,
                     _token_stride, _window)
from ...pdl_support import pdl_supported
from ...quant.triton_q8 import QuantX, _store_quant
from .rope import _rope_pairs


@triton.jit
def _decode_fused_kernel(
    q_ptr, k_ptr, v_ptr, stride_q, stride_k, stride_v, cos_ptr, sin_ptr,
    q_rows_ptr, k_cache_ptr, v_cache_ptr, table_ptr, table_stride, seq_rows_ptr, seq_lens_ptr,
    mid_o_ptr, mid_lse_ptr, count_ptr, out_ptr, xq_ptr, xd_ptr, xs_ptr, qk_scale, window, num_splits,
    split_stride, H: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PS: tl.constexpr,
    RD: tl.constexpr, NEOX: tl.constexpr, ROPE: tl.constexpr, BLOCK_G: tl.constexpr, GP: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr,
    PDL: tl.constexpr, TRIGGER: tl.constexpr, QUANT: tl.constexpr,
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
       splits in split order, as ``_decode_merge_kernel`` does; with QUANT it also quantizes its
       G·D output columns (rounded to out's dtype first) as ``quantize_x`` does, into xq/xd/xs.

    With TRIGGER (sm90+) the kernel after it may start at once (a programmatic dependent launch:
    the output projection's GEMV, which reads only its weights before it waits for this one)."""
    if TRIGGER:
        gdc_launch_dependents()
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
        m_i, l_i, acc = _attend_block(q, k, v, valid, m_i, l_i, acc, qk_scale, PREC)
        k_blk = k_nxt
        v_blk = v_nxt
    out, lse = _split_partials(acc, m_i, l_i)
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
        res = res.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + t * (H * D) + ho, res, mask=(gm[:, None] < G) & (d[None, :] < D))
        if QUANT:  # GP == G and BLOCK_D == D (checked by the launcher): the columns are contiguous
            _store_quant(tl.reshape(res.to(tl.float32), (GP * BLOCK_D,)), xq_ptr, xd_ptr, xs_ptr, t, H * D,
                         hk * ((G * D) // 32), (G * D) // 32)
        tl.atomic_xchg(cnt, 0)


# KVSERVE_DECODE_TRIGGER=0: the kernel after this one (the output projection) starts only when
# this one ends, as before (it matters only where that GEMV is a programmatic dependent launch,
# ``KVSERVE_GEMV_PDL``)
TRIGGER = os.environ.get("KVSERVE_DECODE_TRIGGER", "1").strip() != "0"


def decode_fused(
    q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None, out: torch.Tensor, q_rows: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None,
    table: torch.Tensor, seq_rows: torch.Tensor, seq_lens: torch.Tensor, ws: DecodeWorkspace, page_size: int,
    scale: float, window: int, rope_dim: int = 0, neox: bool = False, block_n: int | None = None,
    num_warps: int | None = None, pdl: bool = False, trigger: bool | None = None,
    quant_out: QuantX | None = None,
) -> None:
    """``rope_write`` then ``decode_attention`` for a step of decoding sequences only (token
    ``q_rows[b]`` at position ``seq_lens[b] - 1``), in one launch: q, k, v are the projections'
    unrotated outputs [T, heads, D]; out[q_rows[b]] gets the attention. With k None, q is
    rotated and the cache written already (split attention and merge only). ``ws`` needs
    ``count``.

    ``pdl`` (with RoPE only; ``pdl_supported``): launched as a programmatic dependent launch, the
    kernel starts while the kernel before it finishes and reads its first cached keys before
    waiting for it. The kernel before must then not write this layer's cache, the page table or
    ``seq_lens`` / ``seq_rows`` / ``q_rows`` (in a model step it is the Q/K/V projection).

    ``trigger`` (default ``TRIGGER``; ``pdl_supported`` only): the kernel after it, if launched
    as a programmatic dependent launch, may start as soon as every program of this one has
    started; it must then read nothing this kernel writes before its own wait (the dense GEMV
    of ``model/dense_gemv`` reads only its weights).

    ``quant_out`` (``quant_fits``): also ``quantize_x(out.view(T, H·D))`` into its buffers."""
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
    trigger = (TRIGGER if trigger is None else trigger) and pdl_supported(q.device)
    extra = {"launch_pdl": True} if pdl else {}
    if quant_out is not None:
        assert quant_fits(h, hkv, d) and quant_out.q.shape[1] * 4 == h * d and out.is_contiguous()
        xq, xd, xs = quant_out.q.view(torch.int8), quant_out.d, quant_out.s
    else:
        xq = xd = xs = ws.mid_lse  # not read
    _decode_fused_kernel[(b, hkv, ws.num_splits)](
        q, k, v, q.stride(0), k.stride(0), v.stride(0), cos, sin,
        q_rows, k_cache, v_cache, table, table.stride(0), seq_rows, seq_lens,
        ws.mid_o, ws.mid_lse, ws.count, out, xq, xd, xs, scale * LOG2E, _window(window), ws.num_splits,
        ws.mid_lse.shape[2],
        H=h, HKV=hkv, G=g, D=d, PS=page_size, RD=max(rope_dim, 2), NEOX=neox, ROPE=rope,
        BLOCK_G=max(16, triton.next_power_of_2(g)), GP=triton.next_power_of_2(g),
        BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_S=triton.next_power_of_2(ws.num_splits),
        PREC=_precision(q), PDL=pdl, TRIGGER=trigger, QUANT=quant_out is not None, num_warps=num_warps,
        num_stages=1, **extra,
    )


def quant_fits(n_head: int, n_head_kv: int, head_dim: int) -> bool:
    """Whether ``decode_fused`` can write its output quantized: a KV head's query heads a power of
    2 and head_dim a power of 2 of at least 32 (the merge's tile is then exactly its columns, whole
    blocks of 32)."""
    g = n_head // n_head_kv
    return g & (g - 1) == 0 and head_dim >= 32 and head_dim & (head_dim - 1) == 0
