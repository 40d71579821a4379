"""GGUF block formats → exact affine groups of 32: ``w = code * scale + offset``.

Every format listed in ``GROUPED`` stores, per group of 32 consecutive weights of a row, a
scale and an offset (possibly derived from a super-block scale and 6-bit sub-scales) and
unsigned integer codes. ``to_groups`` returns those codes and the float32 scale/offset such
that ``code * scale + offset`` reproduces gguf's own float32 dequantizer bit for bit:

    format  codes       scale        offset          (d, m, dmin: f16 → f32; sc, mn: 6-bit)
    Q4_0    q   ∈[0,16)  d            -8·d
    Q4_1    q   ∈[0,16)  d            m
    Q5_0    q   ∈[0,32)  d            -16·d
    Q5_1    q   ∈[0,32)  d            m
    Q8_0    q+128∈[0,256) d           -128·d
    Q4_K    q   ∈[0,16)  d·sc[j]      -(dmin·mn[j])   j = sub-block (32 weights) of 256
    Q5_K    q   ∈[0,32)  d·sc[j]      -(dmin·mn[j])

Exactness: d·sc and dmin·mn are computed in float32 as gguf does; ``code·scale`` is exact in
float32 (at most 11+6+8 significant bits), so the one rounding left is the final addition,
which gguf performs on the same operands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as Q

GROUP = 32
# format → (bytes per block, weights per block, bits per code)
GROUPED: dict[Q, tuple[int, int, int]] = {
    Q.Q4_0: (18, 32, 4),
    Q.Q4_1: (20, 32, 4),
    Q.Q5_0: (22, 32, 5),
    Q.Q5_1: (24, 32, 5),
    Q.Q8_0: (34, 32, 8),
    Q.Q4_K: (144, 256, 4),
    Q.Q5_K: (176, 256, 5),
}


class Groups(NamedTuple):
    codes: np.ndarray  # uint8 [N, K]
    scale: np.ndarray  # float32 [N, K // 32]
    offset: np.ndarray  # float32 [N, K // 32]
    bits: int  # 4, 5 or 8: codes lie in [0, 2**bits)

    @property
    def n_rows(self) -> int:
        return int(self.codes.shape[0])

    def rows(self, i: int, j: int) -> Groups:
        return Groups(self.codes[i:j], self.scale[i:j], self.offset[i:j], self.bits)

    def dequantize(self) -> np.ndarray:
        n, k = self.codes.shape
        c = self.codes.reshape(n, k // GROUP, GROUP).astype(np.float32)
        return (c * self.scale[..., None] + self.offset[..., None]).reshape(n, k)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)[:, 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[n, 16] bytes → [n, 32]: low nibbles are weights 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """[n, 4] bytes (a little-endian uint32) → [n, 32] bits, bit j for weight j."""
    bits = np.ascontiguousarray(qh).view("<u4")
    return ((bits >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12-byte K-quant scale field → 8 six-bit scales and 8 six-bit mins (ggml order)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=1)
    return sc, mn


def _k_blocks(b: np.ndarray, qtype: Q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b[:, 4:16])
    scale = d[:, None] * sc.astype(np.float32)  # [n, 8]
    offset = -(dmin[:, None] * mn.astype(np.float32))
    if qtype == Q.Q4_K:
        qs = b[:, 16:144].reshape(-1, 4, 1, 32)  # 4 chunks of 64 weights: low nibbles, then high
        codes = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(-1, 256)
    else:
        qh = b[:, 16:48].reshape(-1, 1, 32)
        qs = b[:, 48:176].reshape(-1, 4, 1, 32)
        low = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F).reshape(-1, 8, 32)
        high = ((qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1).reshape(-1, 8, 32)
        codes = (low | (high << 4)).reshape(-1, 256)
    return codes, scale, offset


ROW_CHUNK = 1024  # rows decoded at a time: temporaries stay a few MiB for any tensor


class GGUFGroups(NamedTuple):
    """A GGUF tensor in a grouped format, decoded on demand a range of rows at a time."""

    raw: np.ndarray  # uint8 [N, bytes per row]
    qtype: Q
    n_rows: int
    k: int
    # called once rows [i, j) are decoded: the loader drops those rows' file pages, so that a
    # large tensor never has all of its file bytes resident beside its repacked copy
    release: Callable[[int, int], None] | None = None

    @classmethod
    def of(cls, raw: np.ndarray, qtype: Q, shape: tuple[int, int],
           release: Callable[[int, int], None] | None = None) -> GGUFGroups:
        return cls(np.ascontiguousarray(raw).view(np.uint8).reshape(shape[0], -1), qtype, shape[0], shape[1],
                   release)

    @property
    def bits(self) -> int:
        return GROUPED[self.qtype][2]

    def rows(self, i: int, j: int) -> Groups:
        out = Groups(*_decode(self.raw[i:j], self.qtype, self.k), self.bits)
        if self.release is not None:
            self.release(i, j)
        return out


def to_groups(raw: np.ndarray, qtype: Q, shape: tuple[int, int]) -> Groups:
    """Codes, scales and offsets of a GGUF tensor of ``shape`` = (rows, cols) in a grouped format."""
    n, k = shape
    rows = np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)
    out = Groups(np.empty((n, k), np.uint8), np.empty((n, k // GROUP), np.float32),
                 np.empty((n, k // GROUP), np.float32), GROUPED[qtype][2])
    for i in range(0, n, ROW_CHUNK):
        c, s, o = _decode(rows[i : i + ROW_CHUNK], qtype, k)
        out.codes[i : i + ROW_CHUNK], out.scale[i : i + ROW_CHUNK], out.offset[i : i + ROW_CHUNK] = c, s, o
    return out


def _decode(raw: np.ndarray, qtype: Q, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    block_bytes, block_w, bits = GROUPED[qtype]
    n = raw.shape[0]
    b = raw.reshape(-1, block_bytes)
    if qtype in (Q.Q4_K, Q.Q5_K):
        codes, scale, offset = _k_blocks(b, qtype)
    else:
        d = _f16(b[:, 0:2])
        if qtype == Q.Q4_0:
            codes, offset = _nibbles(b[:, 2:18]), -8.0 * d
        elif qtype == Q.Q4_1:
            codes, offset = _nibbles(b[:, 4:20]), _f16(b[:, 2:4])
        elif qtype == Q.Q5_0:
            codes, offset = _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4), -16.0 * d
        elif qtype == Q.Q5_1:
            codes, offset = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4), _f16(b[:, 2:4])
        else:  # Q8_0
            codes, offset = (b[:, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8), -128.0 * d
        scale = d
    g = k // GROUP
    scale = np.asarray(scale, np.float32).reshape(n, g)
    return codes.reshape(n, k), scale, np.asarray(offset, np.float32).reshape(n, g)
