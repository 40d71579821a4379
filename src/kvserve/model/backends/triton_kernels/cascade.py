"""``cascade`` (``decode_attention`` with a ``CascadeGroups``): decoding sequences whose page
tables start with the same pages read that shared prefix once per group: program (group, query
block, kv head, split) attends every query head of every member (rows = member x G) to the
prefix with one tensor-core dot per key block, writing log-sum-exp partials beside the split
kernel's (which then reads only each sequence's own keys after the prefix); the merge kernel
combines both. All per-group inputs live on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (LOG2E, STEP_SCALARS, DecodeWorkspace, _attend_masked_block, _kv_block, _precision,
                     _split_partials, _window)


@triton.jit(do_not_specialize=STEP_SCALARS["shared_prefix"])
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
        vis = valid[None, :] & ((qpos[:, None] - tok[None, :]) < window)
        m_i, l_i, acc = _attend_masked_block(q, k, vis, v_cache_ptr + kv_off, mkv, m_i, l_i, acc, qk_scale,
                                             PREC)
    out, lse = _split_partials(acc, m_i, l_i)
    base = (bidx.to(tl.int64) * H + hk * G + j) * split_stride + own_splits + sp
    tl.store(mid_o_ptr + base[:, None] * D + d[None, :], out, mask=mq)
    tl.store(mid_lse_ptr + base, lse, mask=rvalid)


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
