"""``rope_write``: RoPE on q and k (adjacent-pair "norm" or half-split "neox", the first RD
dims), k and v written to their cache rows: one program per token and KV head (its query heads
with it), so that a decode step's few tokens still spread over several multiprocessors.
``_rope_pairs`` (each dim's cos/sin index, partner and sign) serves it and the fused decode kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import _token_stride


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
    i, partner, sign, rot = _rope_pairs(d, RD, NEOX)
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
