"""GGUF blocks → the layout of the CUDA GEMV kernels (``triton_gemv``), in torch on any device.

Every format below is, per group of ``gs`` consecutive weights of a row, unsigned codes ``u`` of
``bits`` bits with a fixed zero point, one scale and (for some) one offset:

    w = (u − zero) · scale + offset

    format  bits gs  zero  scale                 offset                  bits/weight: file → here
    Q4_0    4    32  8     d                     —                       4.5  → 5.0
    Q4_1    4    32  0     d                     m                       5.0  → 5.0
    Q4_K    4    32  0     D·sc   (sc: u6)       Dm·mn  (mn: u6)          4.5  → 4.625
    Q5_0    8    32  16    d                     —                       5.5  → 9.0
    Q5_1    8    32  0     d                     m                       6.0  → 9.0
    Q5_K    8    32  0     D·sc                  Dm·mn                   5.5  → 8.625
    Q6_K    8    16  32    D·sc   (sc: i8)       —                       6.56 → 8.625
    Q8_0    8    32  128   d                     —                       8.5  → 9.0

d, m: f16 per group; D, Dm (= −dmin): f16 per 256 weights (``two_level``). The scales are kept
as the file stores them (f16 and small integers), so ``reference`` — computed in float32 in the
order gguf computes — reproduces gguf's own dequantizer bit for bit: nothing is rounded.

Layout, K-major so that a GEMV program reads every tensor as rows of consecutive output columns
(16-byte loads, one register layout for all of them):

    q   int32 [k·bits/32, n]   word row g·wpg + w (wpg = gs·bits/32) of group g holds the codes
                               of the 32/bits consecutive columns from g·gs + w·32/bits, so that
                               its bytes pair with 4 consecutive int8 activations: 8-bit codes
                               in byte order; 4-bit codes low nibbles first (slot i, bits 4·i …,
                               holds column 8·w + 4·(i mod 2) + i div 2 of the group)
    gw  int32 [k/gs/sub, n]    one-level formats (sub = 1): low 16 bits d, high 16 bits m (f16
                               bits); two-level ones: ``sub`` consecutive groups an entry, 32/sub
                               bits each from the low bits up (group j at bit 32j/sub): Q4_K and
                               Q5_K (sub = 2) sc in the low 8 bits of a group's 16, mn in the high
                               8; Q6_K (sub = 4) its i8 sc
    sw  int32 [k/256, n]       two_level only: low 16 bits D, high 16 bits Dm (f16 bits)

Q6_K in planes (``pack(..., q6_planes=True)``, ``bits`` 6, 6.625 bits a weight instead of 8.625;
only ``triton_q8_tile`` and the dequantize kernel read it): per group of 16 three words, the
low 4 bits of the codes in the 4-bit layout (words 0 and 1) and their high 2 bits in word 2,
byte b bits 2j … 2j+1 holding column 4j + b, so that ``(word >> 2j) & 0x03030303`` pairs with
the 4 activations of x-word j; u = low + 16 · high.
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
SUB = {Q.Q4_K: 2, Q.Q5_K: 2, Q.Q6_K: 4}  # groups a gw entry (two-level formats; else 1)


class Packed(NamedTuple):
    """One weight matrix [n, k] in the kernels' layout (all tensors on one device)."""

    q: torch.Tensor  # int32 [k·bits/32, n]
    gw: torch.Tensor  # int32 [k/gs/sub, n]
    sw: torch.Tensor | None  # int32 [k/256, n] (two_level)
    bits: int
    gs: int
    zero: int
    has_o: bool  # an offset field (high half of gw)
    signed: bool  # integer sub-scales are i8 (Q6_K), else u8
    sub: int  # groups per gw entry: 4 for Q6_K, 2 for Q4_K and Q5_K, else 1 (``SUB``)

    @property
    def n(self) -> int:
        return int(self.q.shape[1])

    @property
    def k(self) -> int:
        return int(self.q.shape[0]) * 32 // self.bits

    @property
    def two_level(self) -> bool:
        return self.sw is not None

    @property
    def layout(self) -> tuple:
        """What one kernel compilation serves: tensors of equal layouts can be concatenated."""
        return (self.bits, self.gs, self.zero, self.two_level, self.has_o, self.signed, self.sub)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.q, self.gw, self.sw) if t is not None)

    def to(self, device: torch.device) -> Packed:
        return self._replace(q=self.q.to(device), gw=self.gw.to(device),
                             sw=None if self.sw is None else self.sw.to(device))


def supported(qtype: Q, k: int) -> bool:
    return qtype in FORMATS and k % FORMATS[qtype][4] == 0


def cat(parts: list[Packed]) -> Packed:
    """Concatenation of packs of one layout along the output dimension."""
    assert len({p.layout for p in parts}) == 1
    if len(parts) == 1:
        return parts[0]
    sw = None if parts[0].sw is None else torch.cat([p.sw for p in parts], dim=1)  # type: ignore[misc]
    return parts[0]._replace(q=torch.cat([p.q for p in parts], dim=1), gw=torch.cat([p.gw for p in parts], dim=1),
                             sw=sw)


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


def slot_positions(bits: int, gs: int) -> torch.Tensor:
    """[wpg, 32/bits]: the position in its group of the code in slot i of word w."""
    cpw, wpg = 32 // bits, gs * bits // 32
    w = torch.arange(wpg).view(wpg, 1)
    i = torch.arange(cpw).view(1, cpw)
    if bits == 4:
        return w * 8 + (i % 2) * 4 + i // 2
    return w * 4 + i


def _words(u: torch.Tensor, bits: int, gs: int) -> torch.Tensor:
    """u8 codes [n, k] → int32 words [k·bits/32, n] in the slot order of the module docstring."""
    n, k = u.shape
    cpw = 32 // bits
    pos = slot_positions(bits, gs).to(u.device)
    v = u.view(n, k // gs, gs)[:, :, pos].to(torch.int64)  # [n, groups, wpg, cpw]
    shifts = (torch.arange(cpw, device=u.device, dtype=torch.int64) * bits).view(1, 1, 1, cpw)
    w = (v << shifts).sum(dim=3).reshape(n, k * bits // 32)  # < 2**32
    return _i32(w).t().contiguous()


def _i32(w: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) → the int32 of the same bits."""
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def _bits16(t: torch.Tensor | None) -> torch.Tensor:
    """A 16-bit field as int64 in [0, 2**16): f16 bits, or a u8/i8 integer (i8 sign-extended)."""
    if t is None:
        return torch.zeros((), dtype=torch.int64)
    if t.dtype == torch.float16:
        t = t.view(torch.int16)
    return t.to(torch.int64) & 0xFFFF


def _halves(lo: torch.Tensor | None, hi: torch.Tensor | None) -> torch.Tensor:
    return _i32(_bits16(lo) | (_bits16(hi) << 16)).t().contiguous()


def _entries(s: torch.Tensor, o: torch.Tensor | None, sub: int) -> torch.Tensor:
    """Integer sub-scales s (and offsets o) [n, groups] → int32 entry words [groups/sub, n]: group
    j of an entry in bits 32j/sub … (with o: s in the low half of them, o in the high half)."""
    fb = 32 // sub
    v = s.to(torch.int64) & ((1 << fb) - 1) if o is None else \
        (s.to(torch.int64) & ((1 << fb // 2) - 1)) | ((o.to(torch.int64) & ((1 << fb // 2) - 1)) << (fb // 2))
    n, g = v.shape
    shifts = (torch.arange(sub, device=v.device, dtype=torch.int64) * fb).view(1, 1, sub)
    return _i32((v.view(n, g // sub, sub) << shifts).sum(dim=2)).t().contiguous()


def _sub_fields(gw: torch.Tensor, sub: int, signed: bool, has_o: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The inverse of ``_entries``: gw [E, n] → float32 sub-scales and offsets [n, E·sub]."""
    fb = 32 // sub
    w = gw.t().to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(sub, device=gw.device, dtype=torch.int64) * fb).view(1, 1, sub)
    v = (w[:, :, None] >> shifts).reshape(w.shape[0], -1)
    if has_o:
        hb = fb // 2
        return (v & ((1 << hb) - 1)).float(), ((v >> hb) & ((1 << hb) - 1)).float()
    v = v & ((1 << fb) - 1)
    if signed:
        v = torch.where(v >= 1 << (fb - 1), v - (1 << fb), v)
    return v.float(), None


ROW_CHUNK = 2048  # rows decoded at a time: temporaries stay bounded for any tensor


def _words6(u: torch.Tensor) -> torch.Tensor:
    """6-bit codes [n, k] (groups of 16) → int32 words [3k/16, n] in the planes of the docstring."""
    n, k = u.shape
    v = u.view(n, k // 16, 16).to(torch.int64)
    lo = _words((v & 15).reshape(n, k).to(torch.uint8), 4, 16).t().reshape(n, k // 16, 2)
    c = torch.arange(16, device=u.device, dtype=torch.int64)
    hi = ((v >> 4) << (8 * (c % 4) + 2 * (c // 4))).sum(dim=2, keepdim=True)  # < 2**32
    w = torch.cat([lo.to(torch.int64) & 0xFFFFFFFF, hi], dim=2).reshape(n, k * 3 // 16)
    return _i32(w).t().contiguous()


def _codes6(p: Packed) -> torch.Tensor:
    """``codes`` of the 6-bit planes."""
    w = (p.q.t().reshape(p.n, p.k // 16, 3).to(torch.int64) & 0xFFFFFFFF)
    lo_words = w[:, :, :2].reshape(p.n, -1)
    lo = codes(p._replace(q=_i32(lo_words).t().contiguous(), bits=4)).view(p.n, p.k // 16, 16).to(torch.int64)
    c = torch.arange(16, device=p.q.device, dtype=torch.int64)
    hi = (w[:, :, 2:3] >> (8 * (c % 4) + 2 * (c // 4))) & 3
    return (lo | (hi << 4)).reshape(p.n, p.k).to(torch.uint8)


def pack(raw: torch.Tensor, qtype: Q, k: int, q6_planes: bool = False) -> Packed:
    """Raw GGUF bytes of one tensor, u8 [n, bytes per row] (on any device) → ``Packed`` there
    (``q6_planes``: Q6_K as 6-bit codes in two planes)."""
    bits, gs, zero, bb, bw = FORMATS[qtype]
    planes = q6_planes and qtype == Q.Q6_K
    sub = SUB.get(qtype, 1)
    n = raw.shape[0]
    chunks = []
    for i in range(0, n, ROW_CHUNK):
        b = raw[i : i + ROW_CHUNK].reshape(-1, k // bw, bb)
        u, s, o, d, dm = _decode(b, qtype)
        r = b.shape[0]
        s = s.reshape(r, -1)
        o = None if o is None else o.reshape(r, -1)
        gw = _entries(s, o, sub) if d is not None else _halves(s, o)
        sw = None if d is None else _halves(d.reshape(r, -1), None if dm is None else dm.reshape(r, -1))
        q = _words6(u.reshape(r, k)) if planes else _words(u.reshape(r, k), bits, gs)
        chunks.append(Packed(q, gw, sw, 6 if planes else bits, gs, zero, o is not None, s.dtype == torch.int8,
                             sub))
    return cat(chunks)


def codes(p: Packed) -> torch.Tensor:
    """u8 codes [n, k] in column order (the inverse of the word layout)."""
    if p.bits == 6:
        return _codes6(p)
    cpw, wpg = 32 // p.bits, p.gs * p.bits // 32
    w = p.q.t().reshape(p.n, p.k // p.gs, wpg, 1).to(torch.int64) & 0xFFFFFFFF
    shifts = (torch.arange(cpw, device=p.q.device, dtype=torch.int64) * p.bits).view(1, 1, 1, cpw)
    slots = ((w >> shifts) & ((1 << p.bits) - 1)).to(torch.uint8)  # [n, groups, wpg, cpw]
    out = torch.empty((p.n, p.k // p.gs, p.gs), dtype=torch.uint8, device=p.q.device)
    out[:, :, slot_positions(p.bits, p.gs).to(p.q.device)] = slots
    return out.reshape(p.n, p.k)


def _field(v: torch.Tensor, high: bool, kind: str) -> torch.Tensor:
    """float32 of a 16-bit half of int32 ``v``: ``kind`` f16, u (unsigned) or i (signed)."""
    h = ((v.to(torch.int64) >> (16 if high else 0)) & 0xFFFF)
    if kind == "f16":
        return _i32(h).to(torch.int16).view(torch.float16).float()
    if kind == "i":
        h = torch.where(h >= 2**15, h - 2**16, h)
    return h.float()


def scales(p: Packed) -> tuple[torch.Tensor, torch.Tensor | None]:
    """float32 scale and offset per group [n, k/gs], computed as gguf computes them."""
    gw = p.gw.t()
    if not p.two_level:
        return _field(gw, False, "f16"), _field(gw, True, "f16") if p.has_o else None
    sc, mn = _sub_fields(p.gw, p.sub, p.signed, p.has_o)
    sw = p.sw.t()  # type: ignore[union-attr]
    r = SUPER // p.gs
    scale = _field(sw, False, "f16").repeat_interleave(r, dim=1) * sc
    off = None
    if p.has_o:
        off = _field(sw, True, "f16").repeat_interleave(r, dim=1) * mn
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
