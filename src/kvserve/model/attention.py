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
    """Single-token queries. When their page tables start with the same pages (a shared
    prompt prefix), keys [0, n_shared) are read once for all of them ("cascade"):

        positions  [0, n_shared)        shared_rows: one copy, attended by every query
                   [n_shared, L_b)      kv_rows / key_pos: per sequence, padded
    """

    batch_idx: torch.Tensor  # int64 [B]: rows of the batch that are single-token chunks
    kv_rows: torch.Tensor  # int64 [B, Lmax]: flat KV rows of positions n_shared..L_b-1 (padded)
    key_pos: torch.Tensor  # int64 [B, Lmax]: position of each key, -1 for padding
    q_pos: torch.Tensor  # int64 [B]
    shared_rows: torch.Tensor | None = None  # int64 [n_shared]
    whole: bool = False  # the batch's rows are exactly these queries, in order (a decode-only step)
    lengths: tuple[int, ...] = ()  # keys of each query (own part, after the shared prefix)
    _masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.flat_rows = self.kv_rows.reshape(-1)

    def sdpa_mask(self, window: int) -> torch.Tensor | None:
        """``own_mask``, or None where it hides nothing (no padding, every key in the window)."""
        if len(set(self.lengths)) == 1 and (window <= 0 or self.lengths[0] <= window):
            return None
        return self.own_mask(window)

    def own_mask(self, window: int) -> torch.Tensor:
        """[B, 1, 1, Lmax] bool: own key visible to the query (causal, in window)."""
        m = self._masks.get(window)
        if m is None:
            m = (self.key_pos >= 0) & (self.key_pos <= self.q_pos[:, None])
            if window > 0:
                m &= (self.q_pos[:, None] - self.key_pos) < window
            m = m[:, None, None, :]
            self._masks[window] = m
        return m

    def shared_bias(self, window: int) -> torch.Tensor | None:
        """[B, n_shared] additive mask of the shared keys (only a window can hide them)."""
        assert self.shared_rows is not None
        if window <= 0:
            return None
        key = -1 - window
        m = self._masks.get(key)
        if m is None:
            kpos = torch.arange(self.shared_rows.shape[0], device=self.q_pos.device)
            visible = (self.q_pos[:, None] - kpos[None, :]) < window
            m = torch.zeros(visible.shape, dtype=torch.float32, device=visible.device)
            m.masked_fill_(~visible, float("-inf"))
            self._masks[key] = m
        return m


@dataclass
class AttnMeta:
    positions: torch.Tensor  # int64 [T]
    write_rows: torch.Tensor  # int64 [T]: KV row each token's K/V is written to
    page_size: int
    prefill: list[PrefillSeq] = field(default_factory=list)
    decode: list[DecodeGroup] = field(default_factory=list)


_HAS_GQA = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")  # torch >= 2.5


def _up(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered K or V in the attention's dtype, converted while contiguous (a strided conversion
    is slower); float16 → float64 through float32, both exact and together ~2× faster than
    torch's direct conversion."""
    if x.dtype == dtype:
        return x
    if dtype == torch.float64 and x.dtype != torch.float32:
        x = x.float()
    return x.to(dtype)


def _rows(page_table: torch.Tensor, pos: torch.Tensor, page_size: int) -> torch.Tensor:
    return page_table[pos // page_size] * page_size + pos % page_size


def _gqa_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """q [n, H, D], k/v [L, Hkv, D], mask [n, L] → [n, H, D] without repeating K/V per group."""
    n, h, d = q.shape
    hkv = k.shape[1]
    if _HAS_GQA:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1), _up(k, q.dtype).transpose(0, 1), _up(v, q.dtype).transpose(0, 1),
            attn_mask=mask.unsqueeze(0), scale=scale, enable_gqa=h != hkv,
        )
        return o.transpose(0, 1)
    g = h // hkv
    qh = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * n, d)
    kh = k.permute(1, 0, 2)
    vh = v.permute(1, 0, 2)
    m = mask.unsqueeze(0).expand(g, n, mask.shape[-1]).reshape(1, g * n, mask.shape[-1])
    o = F.scaled_dot_product_attention(qh, _up(kh, q.dtype), _up(vh, q.dtype), attn_mask=m, scale=scale)
    return o.view(hkv, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)


def _causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A chunk that starts at position 0 with no window: plain causal attention, which lets
    SDPA use its fused (flash) kernel instead of a materialized mask."""
    h, hkv = q.shape[1], k.shape[1]
    qh, kh, vh = q.transpose(0, 1), _up(k, q.dtype).transpose(0, 1), _up(v, q.dtype).transpose(0, 1)
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
    kv_cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, H, D]; k_cache/v_cache [rows, Hkv, D] of one layer (this pass's K/V already written);
    ``kv_cache``: both side by side, [2, rows, Hkv, D], where the pool holds them so.

    Query at position p sees keys at positions j with j <= p and, when window > 0, p - j < window.
    """
    only = meta.decode[0] if not meta.prefill and len(meta.decode) == 1 else None
    if only is not None and only.whole and only.shared_rows is None:  # a decode-only step
        return _padded_decode(q, k_cache, v_cache, only, window, scale, kv_cache)
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
    for d in meta.decode:
        if d.shared_rows is not None:
            o = _cascade_decode(q, k_cache, v_cache, d, window, scale)
        else:
            o = _padded_decode(q, k_cache, v_cache, d, window, scale, kv_cache)
        out.index_copy_(0, d.batch_idx, o)
    return out


class Scratch:
    """Buffers of one step, reused by every layer (a step's layers have the same shapes): copies
    into them are one aten call each where ``.to()`` allocates and takes four."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        key = (name, shape, dtype)
        b = self._bufs.get(key)
        if b is None:
            b = self._bufs[key] = torch.empty(shape, dtype=dtype, device=device)
        return b

    def up(self, name: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """x converted to dtype in a buffer (``_up``'s conversion: float16 → float64 via float32)."""
        if x.dtype == dtype:
            return x
        if dtype == torch.float64 and x.dtype != torch.float32:
            x = self.get(name + "32", tuple(x.shape), torch.float32, x.device).copy_(x)
        return self.get(name, tuple(x.shape), dtype, x.device).copy_(x)


@dataclass
class SeqKeys:
    """Where the first ``n`` keys of one sequence lie in a layer's cache rows: one run of rows
    from ``start`` when its pages are consecutive (read as a view, no gather), else its first
    pages ``pages`` (int64, on the device), gathered whole and cut to ``n`` rows."""

    n: int
    page_size: int
    start: int = -1
    pages: torch.Tensor | None = None

    def read(self, cache: torch.Tensor) -> torch.Tensor:
        """[..., n, Hkv, D] of ``cache`` [..., rows, Hkv, D] (K, V, or both side by side)."""
        if self.pages is None:
            return cache.narrow(-3, self.start, self.n)
        *lead, rows, h, d = cache.shape
        x = cache.view(*lead, rows // self.page_size, self.page_size, h, d)
        return x.index_select(len(lead), self.pages).view(*lead, -1, h, d).narrow(-3, 0, self.n)

    @staticmethod
    def of(page_table: tuple[int, ...], n: int, page_size: int, device: torch.device) -> SeqKeys:
        n_pages = -(-n // page_size)
        first = page_table[0]
        if page_table[n_pages - 1] == first + n_pages - 1 and tuple(page_table[:n_pages]) == tuple(
            range(first, first + n_pages)
        ):
            return SeqKeys(n, page_size, start=first * page_size)
        pages = torch.tensor(page_table[:n_pages], dtype=torch.int64, device=device)
        return SeqKeys(n, page_size, pages=pages)


def one_query_attention(
    q: torch.Tensor, kv_cache: torch.Tensor, keys: SeqKeys, scale: float, dtype: torch.dtype,
    scratch: Scratch,
) -> torch.Tensor:
    """One query token q [1, H, D] over one sequence's keys (all visible: a decode step of one
    sequence whose keys are all in the layer's window) in a layer's K and V side by side
    (``kv_cache`` [2, rows, Hkv, D]), computed in ``dtype``: the same softmax attention as SDPA
    in three operations (scaled scores in one GEMM, softmax, the weighted sum), with K and V read
    and converted together in this step's buffers. Returns [1, H, D] in ``dtype``."""
    _, h, d = q.shape
    hkv = kv_cache.shape[2]
    k, v = scratch.up("kv", keys.read(kv_cache), dtype).unbind(0)  # [L, Hkv, D] each
    qd = scratch.up("q", q, dtype).view(hkv, h // hkv, d)
    s = scratch.get("s", (hkv, h // hkv, keys.n), dtype, q.device)
    s = torch.baddbmm(s, qd, k.permute(1, 2, 0), beta=0.0, alpha=scale)  # [Hkv, G, L]
    return torch.bmm(torch.softmax(s, -1), v.transpose(0, 1)).view(1, h, d)


def _partial_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unnormalized softmax attention: (sum_j e^(s_j - m) v_j, m, sum_j e^(s_j - m)) with
    s = q k^T * scale + bias; m is 0 where every key is masked (so the sums are 0)."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    if bias is not None:
        s = s + bias
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    return torch.matmul(p, v), m, p.sum(-1, keepdim=True)


def _gather(cache: torch.Tensor, d: DecodeGroup, dtype: torch.dtype) -> torch.Tensor:
    """Own keys or values of a decode group: [B, Hkv, Lmax, D]."""
    b, lmax = d.kv_rows.shape
    x = _up(cache.index_select(0, d.flat_rows), dtype)
    return x.view(b, lmax, cache.shape[1], cache.shape[2]).transpose(1, 2)


def _padded_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, d: DecodeGroup, window: int, scale: float,
    kv_cache: torch.Tensor | None = None,
) -> torch.Tensor:
    b, lmax = d.kv_rows.shape
    _, h, hd = q.shape
    hkv = k_cache.shape[1]
    qd = (q if d.whole else q.index_select(0, d.batch_idx)).view(b, hkv, h // hkv, hd)
    if kv_cache is not None:  # K and V side by side: gathered and converted together
        x = _up(kv_cache.index_select(1, d.flat_rows), q.dtype)
        k, v = x.view(2, b, lmax, hkv, hd).transpose(2, 3).unbind(0)
    else:
        k, v = _gather(k_cache, d, q.dtype), _gather(v_cache, d, q.dtype)
    o = F.scaled_dot_product_attention(qd, k, v, attn_mask=d.sdpa_mask(window), scale=scale)
    return o.reshape(b, h, hd)


def _cascade_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, d: DecodeGroup, window: int, scale: float
) -> torch.Tensor:
    """Decode attention with a shared prefix read once: softmax over the shared keys and over
    each sequence's own keys separately, merged exactly with their log-sum-exp weights."""
    assert d.shared_rows is not None
    b = d.kv_rows.shape[0]
    _, h, hd = q.shape
    hkv = k_cache.shape[1]
    g = h // hkv
    qd = q.index_select(0, d.batch_idx).view(b, hkv, g, hd)
    # Shared part: every query of every sequence against one copy of the prefix.
    ks = _up(k_cache.index_select(0, d.shared_rows), q.dtype).transpose(0, 1)  # [Hkv, Ls, D]
    vs = _up(v_cache.index_select(0, d.shared_rows), q.dtype).transpose(0, 1)
    qs = qd.permute(1, 0, 2, 3).reshape(hkv, b * g, hd)
    bias = d.shared_bias(window)
    if bias is not None:  # in q's dtype: a float32 bias would promote the scores past v's dtype
        bias = bias.to(q.dtype).repeat_interleave(g, dim=0)  # [B*G, Ls], row = b * g + j
    o1, m1, l1 = _partial_attention(qs, ks, vs, bias, scale)
    o1, m1, l1 = (t.view(hkv, b, g, -1).permute(1, 0, 2, 3) for t in (o1, m1, l1))
    # Own part: each sequence's keys after the shared prefix (its own token at least).
    k, v = _gather(k_cache, d, q.dtype), _gather(v_cache, d, q.dtype)
    mask = d.own_mask(window)
    own = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
    o2, m2, l2 = _partial_attention(qd, k, v, own, scale)
    m = torch.maximum(m1, m2)
    w1, w2 = torch.exp(m1 - m), torch.exp(m2 - m)
    o = (o1 * w1 + o2 * w2) / (l1 * w1 + l2 * w2)
    return o.reshape(b, h, hd)


CASCADE_MIN_SHARED = 64  # shared positions below which one padded batch is cheaper


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
    decode: list[DecodeGroup] = []
    grouped: set[int] = set()
    for members, shared in cascade_groups(dec_tables, page_size):
        tables = [dec_tables[i] for i in members]
        decode.append(_decode_group([dec_idx[i] for i in members], tables, shared, page_size, device))
        grouped.update(members)
    plain = [i for i in range(len(dec_tables)) if i not in grouped]
    if plain:
        plain.sort()
        tables = [dec_tables[i] for i in plain]
        decode.append(_decode_group([dec_idx[i] for i in plain], tables, 0, page_size, device))
        decode[-1].whole = not prefill and len(plain) == q
    return AttnMeta(
        positions=torch.cat(positions).to(device),
        write_rows=torch.cat(writes).to(device),
        page_size=page_size,
        prefill=prefill,
        decode=decode,
    )


def cascade_groups(tables: list[tuple[list[int], int]], page_size: int) -> list[tuple[list[int], int]]:
    """Decoding sequences (page table, length) that share a prefix worth reading once: groups of
    at least two with the same first page, as (member indices in order, shared tokens), the
    shared part whole pages common to every member's table, at least ``CASCADE_MIN_SHARED``
    tokens and short of each member's own last key. Every backend groups the same way."""
    by_first: dict[int, list[int]] = {}
    for i, (table, _) in enumerate(tables):
        by_first.setdefault(table[0] if table else -1, []).append(i)
    out = []
    for members in by_first.values():
        if len(members) < 2:
            continue
        shared = _shared_pages([tables[i] for i in members], page_size) * page_size
        if shared >= CASCADE_MIN_SHARED:
            out.append((members, shared))
    return out


def _decode_group(
    batch_idx: list[int], tables: list[tuple[list[int], int]], shared: int, page_size: int, device: torch.device
) -> DecodeGroup:
    lmax = max(length for _, length in tables) - shared
    kv_rows = torch.zeros((len(tables), lmax), dtype=torch.int64)
    key_pos = torch.full((len(tables), lmax), -1, dtype=torch.int64)
    qpos = torch.empty(len(tables), dtype=torch.int64)
    for i, (table, length) in enumerate(tables):
        pos = torch.arange(shared, length, dtype=torch.int64)
        kv_rows[i, : length - shared] = _rows(torch.as_tensor(table, dtype=torch.int64), pos, page_size)
        key_pos[i, : length - shared] = pos
        qpos[i] = length - 1
    shared_rows = None
    if shared:
        table0 = torch.as_tensor(tables[0][0], dtype=torch.int64)
        shared_rows = _rows(table0, torch.arange(shared, dtype=torch.int64), page_size).to(device)
    return DecodeGroup(
        torch.as_tensor(batch_idx, dtype=torch.int64, device=device),
        kv_rows.to(device),
        key_pos.to(device),
        qpos.to(device),
        shared_rows,
        lengths=tuple(length - shared for _, length in tables),
    )


def _shared_pages(tables: list[tuple[list[int], int]], page_size: int) -> int:
    """Leading pages common to every table, leaving each sequence at least its own last key."""
    n = min((length - 1) // page_size for _, length in tables)
    first = tables[0][0]
    head = list(first[:n])
    for t, _ in tables[1:]:  # the shortest common prefix with the first table (slices compare in C)
        if n and list(t[:n]) != head[:n]:
            k = 0
            while t[k] == first[k]:
                k += 1
            n = k
    return n
