"""GGUF blocks → the layout of the CUDA GEMV kernels (``triton_gemv``), in torch on any device.

Every format below is, per group of ``gs`` consecutive weights of a row, unsigned codes ``u`` of
``bits`` bits with a fixed zero point, one scale and (for some) one offset:

    w = (u − zero) · scale + offset

    format  bits gs  zero  scale                 offset                  file bits/weight → here
    Q4_0    4    32  8     d                     —                       4.5  → 4.5
    Q4_1    4    32  0     d                     m                       5.0  → 5.0
    Q4_K    4    32  0     D·sc   (sc: u8)       Dm·mn  (mn: u8)          4.5  → 4.625
    Q5_0    8    32  16    d                     —                       5.5  → 8.5
    Q5_1    8    32  0     d                     m                       6.0  → 9.0
    Q5_K    8    32  0     D·sc                  Dm·mn                   5.5  → 8.625
    Q6_K    8    16  32    D·sc   (sc: i8)       —                       6.56 → 8.56
    Q8_0    8    32  128   d                     —                       8.5  → 8.5

d, m: f16 per group; D, Dm (= −dmin): f16 per 256 weights (``two_level``). The scales are kept
as the file stores them (f16 and 6-/8-bit integers), so ``reference`` — computed in float32 in
the order gguf computes — reproduces gguf's own dequantizer bit for bit: nothing is rounded.

Codes: int32 words [N, K·bits/32]. A group is ``wpg = gs·bits/32`` consecutive words; slot i
(bits·i … bits·i+bits−1) of word w of group g holds column g·gs + i·wpg + w, so that one slot of
a group's words meets ``wpg`` consecutive activations (one vector load).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from gguf import GGMLQuantizationType as Q

# format → (bits, group size, zero point, block bytes, block weights)
FORMATS: dict[Q, tuple[int, int, int, int, int]] = {
    Q.Q4_0: (4, 32, 8, 18, 32),
    Q.Q4_1: (4, 32, 0, 20, 32),
    Q.Q4_K: (4, 32, 0, 144, 256),
    Q.Q5_0: (8, 32, 16, 22, 32),
    Q.Q5_1: (8, 32, 0, 24, 32),
    Q.Q5_K: (8, 32, 0, 176, 256),
    Q.Q6_K: (8, 16, 32, 210, 256),
    Q.Q8_0: (8, 32, 128, 34, 32),
}
SUPER = 256  # weights per K-quant super-block (D, Dm)


class Packed(NamedTuple):
    """One weight matrix [n, k] in the kernels' layout (all tensors on one device)."""

    q: torch.Tensor  # int32 [n, k·bits/32]
    s: torch.Tensor  # f16 [n, k/gs] (d), or u8/i8 [n, k/gs] (sc) when two_level
    o: torch.Tensor | None  # like s: f16 m, or u8 mn; None: no offset
    d: torch.Tensor | None  # f16 [n, k/256]: D (two_level only)
    dm: torch.Tensor | None  # f16 [n, k/256]: Dm = −dmin (two_level with offset)
    bits: int
    gs: int
    zero: int

    @property
    def n(self) -> int:
        return int(self.q.shape[0])

    @property
    def k(self) -> int:
        return int(self.q.shape[1]) * 32 // self.bits

    @property
    def two_level(self) -> bool:
        return self.d is not None

    @property
    def layout(self) -> tuple[int, int, int, bool, bool, torch.dtype]:
        """What one kernel compilation serves: tensors of equal layouts can be concatenated."""
        return (self.bits, self.gs, self.zero, self.two_level, self.o is not None, self.s.dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.q, self.s, self.o, self.d, self.dm) if t is not None)

    def to(self, device: torch.device) -> Packed:
        return Packed(*(t.to(device) if isinstance(t, torch.Tensor) else t for t in self))


def supported(qtype: Q, k: int) -> bool:
    return qtype in FORMATS and k % FORMATS[qtype][4] == 0


def cat(parts: list[Packed]) -> Packed:
    """Row-wise concatenation of packs of one layout."""
    assert len({p.layout for p in parts}) == 1
    if len(parts) == 1:
        return parts[0]
    fields = [None if parts[0][i] is None else torch.cat([p[i] for p in parts]) for i in range(5)]
    return Packed(*fields, parts[0].bits, parts[0].gs, parts[0].zero)  # type: ignore[arg-type]


def _f16(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes → [...] f16."""
    return b.contiguous().view(torch.float16)[..., 0]


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[..., 16] bytes → [..., 32]: low nibbles are weights 0..15, high nibbles 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """[..., 4] bytes (a little-endian uint32) → [..., 32] bits: bit j for weight j."""
    j = torch.arange(32, device=qh.device)
    return (qh[..., j // 8] >> (j % 8).to(torch.uint8)) & 1


def _k_scales(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte K-quant scale field [..., 12] → 8 six-bit scales, 8 six-bit mins (ggml order)."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _decode(b: torch.Tensor, qtype: Q) -> tuple[torch.Tensor, ...]:
    """Blocks [n, blocks, bytes] → (u [n, blocks, weights] u8, s, o, d, dm) per block."""
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        d = _f16(b[..., 0:2])
        m = _f16(b[..., 2:4]) if qtype in (Q.Q4_1, Q.Q5_1) else None
        if qtype == Q.Q4_0:
            u = _nibbles(b[..., 2:18])
        elif qtype == Q.Q4_1:
            u = _nibbles(b[..., 4:20])
        elif qtype == Q.Q5_0:
            u = _nibbles(b[..., 6:22]) | (_bits32(b[..., 2:6]) << 4)
        elif qtype == Q.Q5_1:
            u = _nibbles(b[..., 8:24]) | (_bits32(b[..., 4:8]) << 4)
        else:
            u = b[..., 2:34] ^ 0x80  # int8 q → q + 128
        return u, d[..., None], None if m is None else m[..., None], None, None
    if qtype == Q.Q6_K:
        nb = b.shape[:-1]
        ql = b[..., 0:128].reshape(*nb, 2, 1, 64) >> torch.tensor([0, 4], dtype=torch.uint8, device=b.device).view(2, 1)
        ql = (ql & 0x0F).reshape(*nb, 256)
        qh = b[..., 128:192].reshape(*nb, 2, 1, 32) >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8,
                                                                      device=b.device).view(4, 1)
        qh = (qh & 0x03).reshape(*nb, 256)
        sc = b[..., 192:208].contiguous().view(torch.int8)
        return ql | (qh << 4), sc, None, _f16(b[..., 208:210])[..., None], None
    # Q4_K, Q5_K: f16 D, f16 dmin, 12 bytes of scales/mins, (Q5_K: 32 bytes of high bits), codes
    dd, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    sc, mn = _k_scales(b[..., 4:16])
    sh = torch.tensor([0, 4], dtype=torch.uint8, device=b.device).view(2, 1)
    nb = b.shape[:-1]
    if qtype == Q.Q4_K:
        u = ((b[..., 16:144].reshape(*nb, 4, 1, 32) >> sh) & 0x0F).reshape(*nb, 256)
    else:
        low = ((b[..., 48:176].reshape(*nb, 4, 1, 32) >> sh) & 0x0F).reshape(*nb, 8, 32)
        hb = torch.arange(8, dtype=torch.uint8, device=b.device).view(8, 1)
        high = (b[..., 16:48].reshape(*nb, 1, 32) >> hb) & 1
        u = (low | (high << 4)).reshape(*nb, 256)
    return u, sc, mn, dd[..., None], -dmin[..., None]


def _words(u: torch.Tensor, bits: int, gs: int) -> torch.Tensor:
    """u8 codes [n, k] → int32 words [n, k·bits/32] in the slot order of the module docstring."""
    n, k = u.shape
    cpw, wpg = 32 // bits, gs * bits // 32
    v = u.view(n, k // gs, cpw, wpg).to(torch.int64)
    shifts = (torch.arange(cpw, device=u.device, dtype=torch.int64) * bits).view(1, 1, cpw, 1)
    w = (v << shifts).sum(dim=2)  # < 2**32
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).reshape(n, k * bits // 32)


ROW_CHUNK = 2048  # rows decoded at a time: temporaries stay bounded for any tensor


def pack(raw: torch.Tensor, qtype: Q, k: int) -> Packed:
    """Raw GGUF bytes of one tensor, u8 [n, bytes per row] (on any device) → ``Packed`` there."""
    bits, gs, zero, bb, bw = FORMATS[qtype]
    n = raw.shape[0]
    chunks = []
    for i in range(0, n, ROW_CHUNK):
        b = raw[i : i + ROW_CHUNK].reshape(-1, k // bw, bb)
        u, s, o, d, dm = _decode(b, qtype)
        r = b.shape[0]
        o = None if o is None else o.reshape(r, -1).contiguous()
        chunks.append(Packed(_words(u.reshape(r, k), bits, gs), s.reshape(r, -1).contiguous(), o,
                             None if d is None else d.reshape(r, -1).contiguous(),
                             None if dm is None else dm.reshape(r, -1).contiguous(), bits, gs, zero))
    return cat(chunks)


def codes(p: Packed) -> torch.Tensor:
    """u8 codes [n, k] in column order (the inverse of the word layout)."""
    cpw, wpg = 32 // p.bits, p.gs * p.bits // 32
    w = p.q.view(p.n, p.k // p.gs, 1, wpg).to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(cpw, device=p.q.device, dtype=torch.int64) * p.bits).view(1, 1, cpw, 1)
    return ((w >> shifts) & ((1 << p.bits) - 1)).to(torch.uint8).reshape(p.n, p.k)


def scales(p: Packed) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 scale and offset per group [n, k/gs], computed as gguf computes them."""
    if not p.two_level:
        return p.s.float(), None if p.o is None else p.o.float()
    r = SUPER // p.gs
    scale = p.d.float().repeat_interleave(r, dim=1) * p.s.float()  # type: ignore[union-attr]
    off = None if p.o is None else p.dm.float().repeat_interleave(r, dim=1) * p.o.float()  # type: ignore[union-attr]
    return scale, off


def reference(p: Packed) -> torch.Tensor:
    """float32 [n, k]: the weights the kernels apply (== gguf's dequantizer, bit for bit)."""
    c = (codes(p).to(torch.int32) - p.zero).float().view(p.n, -1, p.gs)
    scale, off = scales(p)
    w = c * scale[..., None]
    if off is not None:
        w = w + off[..., None]
    return w.view(p.n, p.k)


def dequantize(raw: torch.Tensor, qtype: Q, k: int, dtype: torch.dtype) -> torch.Tensor:
    """gguf's dequantization of raw bytes u8 [n, bytes per row], computed where ``raw`` lies
    (a GPU does it in milliseconds), rounded once to ``dtype``."""
    out = torch.empty((raw.shape[0], k), dtype=dtype, device=raw.device)
    for i in range(0, raw.shape[0], ROW_CHUNK):
        out[i : i + ROW_CHUNK] = reference(pack(raw[i : i + ROW_CHUNK], qtype, k))
    return out
