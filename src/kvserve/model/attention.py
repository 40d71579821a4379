"""Attention over the paged KV pool.

``AttnMeta`` is built once per forward pass from the plan; ``paged_attention`` is the single
backend entry point (torch SDPA here; a CUDA kernel can replace it with the same signature).

Batch layout: the T tokens of a forward pass are the concatenation of the sequences' chunks.
Chunks with more than one token ("prefill") are attended one by one; single-token chunks
("decode") are gathered into one padded batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    q_start: int  # first row of this chunk in the batch
    q_len: int
    pos_start: int  # position of the chunk's first token
    page_table: torch.Tensor  # int64 [n_pages] (on device)


@dataclass
class DecodeGroup:
    batch_idx: torch.Tensor  # int64 [B]: rows of the batch that are single-token chunks
    kv_rows: torch.Tensor  # int64 [B, Lmax]: flat KV rows of positions 0..L_b-1 (padded)
    key_pos: torch.Tensor  # int64 [B, Lmax]: position of each key, -1 for padding
    q_pos: torch.Tensor  # int64 [B]


@dataclass
class AttnMeta:
    positions: torch.Tensor  # int64 [T]
    write_rows: torch.Tensor  # int64 [T]: KV row each token's K/V is written to
    page_size: int
    prefill: list[PrefillSeq] = field(default_factory=list)
    decode: DecodeGroup | None = None
    _mask_cache: dict[int, torch.Tensor] = field(default_factory=dict)

    def decode_mask(self, window: int) -> torch.Tensor:
        """[B, 1, 1, Lmax] bool: key visible to the decode query (causal, in window)."""
        m = self._mask_cache.get(window)
        if m is None:
            assert self.decode is not None
            d = self.decode
            m = (d.key_pos >= 0) & (d.key_pos <= d.q_pos[:, None])
            if window > 0:
                m &= (d.q_pos[:, None] - d.key_pos) < window
            m = m[:, None, None, :]
            self._mask_cache[window] = m
        return m


_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def _rows(page_table: torch.Tensor, pos: torch.Tensor, page_size: int) -> torch.Tensor:
    return page_table[pos // page_size] * page_size + pos % page_size


def _gqa_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """q [n, H, D], k/v [L, Hkv, D], mask [n, L] → [n, H, D] without repeating K/V per group."""
    n, h, d = q.shape
    hkv = k.shape[1]
    if _HAS_GQA:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype),
            attn_mask=mask.unsqueeze(0), scale=scale, enable_gqa=h != hkv,
        )
        return o.transpose(0, 1)
    g = h // hkv
    qh = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
    kh = k.permute(1, 0, 2)
    vh = v.permute(1, 0, 2)
    m = mask.unsqueeze(0).expand(g, n, mask.shape[-1]).reshape(1, g * n, mask.shape[-1])
    o = F.scaled_dot_product_attention(qh, kh.to(q.dtype), vh.to(q.dtype), attn_mask=m, scale=scale)
    return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A chunk that starts at position 0 with no window: plain causal attention, which lets
    SDPA use its fused (flash) kernel instead of a materialized mask."""
    h, hkv = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype)
    if h != hkv and not _HAS_GQA:
        kh = kh.repeat_interleave(h // hkv, dim=0)
        vh = vh.repeat_interleave(h // hkv, dim=0)
    kw = {"enable_gqa": True} if h != hkv and _HAS_GQA else {}
    o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, **kw)
    return o.transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttnMeta,
    window: int,
    scale: float,
) -> torch.Tensor:
    """q [T, H, D]; k_cache/v_cache [rows, Hkv, D] of one layer (this pass's K/V already written).

    Query at position p sees keys at positions j with j <= p and, when window > 0, p - j < window.
    """
    out = torch.empty_like(q)
    ps = meta.page_size
    for s in meta.prefill:
        last = s.pos_start + s.q_len  # keys [lo, last)
        if s.pos_start == 0 and (window == 0 or s.q_len <= window):
            rows = _rows(s.page_table, torch.arange(0, last, device=q.device), ps)
            out[s.q_start : s.q_start + s.q_len] = _causal_sdpa(
                q[s.q_start : s.q_start + s.q_len], k_cache.index_select(0, rows), v_cache.index_select(0, rows), scale
            )
            continue
        lo = max(0, s.pos_start - window + 1) if window > 0 else 0
        kpos = torch.arange(lo, last, device=q.device)
        rows = _rows(s.page_table, kpos, ps)
        qpos = torch.arange(s.pos_start, last, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]
        if window > 0:
            mask &= (qpos[:, None] - kpos[None, :]) < window
        qs = q[s.q_start : s.q_start + s.q_len]
        out[s.q_start : s.q_start + s.q_len] = _gqa_sdpa(
            qs, k_cache.index_select(0, rows), v_cache.index_select(0, rows), mask, scale
        )
    d = meta.decode
    if d is not None:
        b, lmax = d.kv_rows.shape
        _, h, hd = q.shape
        hkv = k_cache.shape[1]
        g = h // hkv
        flat = d.kv_rows.reshape(-1)
        k = k_cache.index_select(0, flat).view(b, lmax, hkv, hd).permute(0, 2, 1, 3)
        v = v_cache.index_select(0, flat).view(b, lmax, hkv, hd).permute(0, 2, 1, 3)
        qd = q.index_select(0, d.batch_idx).view(b, hkv, g, hd)
        o = F.scaled_dot_product_attention(
            qd, k.to(q.dtype), v.to(q.dtype), attn_mask=meta.decode_mask(window), scale=scale
        )
        out.index_copy_(0, d.batch_idx, o.reshape(b, h, hd))
    return out


def build_meta(
    chunks: list[tuple[int, int, list[int]]], page_size: int, device: torch.device
) -> AttnMeta:
    """chunks: (start_pos, n_tokens, page_table) in batch order."""
    positions: list[torch.Tensor] = []
    writes: list[torch.Tensor] = []
    prefill: list[PrefillSeq] = []
    dec_idx: list[int] = []
    dec_tables: list[tuple[list[int], int]] = []
    q = 0
    for start, n, table in chunks:
        pt = torch.as_tensor(table, dtype=torch.int64)
        pos = torch.arange(start, start + n, dtype=torch.int64)
        positions.append(pos)
        writes.append(_rows(pt, pos, page_size))
        if n == 1:
            dec_idx.append(q)
            dec_tables.append((table, start + 1))
        else:
            prefill.append(PrefillSeq(q, n, start, pt.to(device)))
        q += n
    decode = None
    if dec_idx:
        lmax = max(length for _, length in dec_tables)
        kv_rows = torch.zeros((len(dec_idx), lmax), dtype=torch.int64)
        key_pos = torch.full((len(dec_idx), lmax), -1, dtype=torch.int64)
        qpos = torch.empty(len(dec_idx), dtype=torch.int64)
        for i, (table, length) in enumerate(dec_tables):
            pos = torch.arange(length, dtype=torch.int64)
            kv_rows[i, :length] = _rows(torch.as_tensor(table, dtype=torch.int64), pos, page_size)
            key_pos[i, :length] = pos
            qpos[i] = length - 1
        decode = DecodeGroup(
            torch.as_tensor(dec_idx, dtype=torch.int64, device=device),
            kv_rows.to(device),
            key_pos.to(device),
            qpos.to(device),
        )
    return AttnMeta(
        positions=torch.cat(positions).to(device),
        write_rows=torch.cat(writes).to(device),
        page_size=page_size,
        prefill=prefill,
        decode=decode,
    )
