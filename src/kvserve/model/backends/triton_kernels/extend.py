"""``extend_attention``: a chunk of q_len queries at positions [kv_len - q_len, kv_len) over its
cached prefix and itself (causal offset kv_len - q_len), with sliding windows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import LOG2E, STEP_SCALARS, _attend_masked_block, _kv_block, _precision, _window


@triton.jit(do_not_specialize=STEP_SCALARS["extend"])
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
        vis = valid[None, :] & (tok[None, :] <= qpos[:, None])
        vis = vis & ((qpos[:, None] - tok[None, :]) < window)
        m_i, l_i, acc = _attend_masked_block(q, k, vis, v_cache_ptr + kv_off, mkv, m_i, l_i, acc, qk_scale,
                                             PREC)
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
