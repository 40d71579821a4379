"""Affine groups → 4-bit planes in the layout of torch's CPU int4 weight-only matmul.

``torch.ops.aten._weight_int4pack_mm_for_cpu(x_bf16, packed, 32, scale_zero)`` computes
``x @ W.T`` with ``W[n, k] = (c[n, k] - 8) * s[g, n] + z[g, n]`` for 4-bit codes ``c`` and one
bf16 scale ``s`` and offset ``z`` per group ``g`` of 32 columns. A format with more than four
bits per code is split into two planes, ``c = 16·h + l``, whose rows are stacked and whose
outputs are summed:

    bits  plane   codes      s      z                   Σ planes = code·scale + offset
    4     0       c          S      O + 8S
    5     hi      h + 8      16S    0                   16S·h
          lo      l          S      O + 8S              + S·l + O
    8     hi      h          16S    0                   16S·(h − 8)
          lo      l          S      O + 136S            + S·l + O + 128S

The codes are exact; ``s`` and ``z`` are rounded once to bf16 (relative error ≤ 2⁻⁹, the
precision of a bf16 weight), which is the one approximation of this path.

Packed layout (torch ≥ 2.6, checked by tests): rows padded to a multiple of 64; bytes
``[R/2H, K, H]`` where byte ``[b, k, j]`` holds row ``2Hb + j`` in its low nibble and row
``2Hb + H + j`` in its high nibble. ``H`` (``HALF``) is the one torch's kernel was built for on
this CPU: 32 with AVX-512, 16 with AVX2 (read from torch's own packer once, ``_half``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

import numpy as np
import torch

from .groups import GROUP, Groups

ROW_BLOCK = 64
PACK_ROWS = 64 * ROW_BLOCK


def _half() -> int | None:
    """The rows a packed byte's nibbles are apart in torch's layout on this CPU (None: another
    layout than the two known, and then this path is not used)."""
    codes = (np.arange(ROW_BLOCK)[:, None] * 7 + np.arange(GROUP)[None, :]).astype(np.uint8) % 16
    try:
        got = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes).to(torch.int32), 1)
    except (RuntimeError, AttributeError):
        return None
    for h in (32, 16):
        v = codes.reshape(-1, 2, h, GROUP)
        if np.array_equal((v[:, 0] | (v[:, 1] << 4)).transpose(0, 2, 1).reshape(got.shape), got.numpy()):
            return h
    return None


HALF = _half()


def supported() -> bool:
    """Whether torch's CPU int4 kernel has a layout this module writes."""
    return HALF is not None


class Plane(NamedTuple):
    codes: np.ndarray  # uint8 [N, K] in [0, 16)
    s: np.ndarray  # float64 [N, K // 32]: exact (a float32 times a power of two)
    z: np.ndarray  # float64 [N, K // 32]: exact sums of two float32 values


class GroupSource(Protocol):
    """Groups of a tensor by ranges of rows (``Groups`` itself, or decoded on demand)."""

    @property
    def n_rows(self) -> int: ...

    @property
    def bits(self) -> int: ...

    def rows(self, i: int, j: int) -> Groups: ...


def n_planes(bits: int) -> int:
    return 1 if bits == 4 else 2


def plane_rows(src: GroupSource, plane: int, chunk: int = 1024) -> Iterable[Plane]:
    """Plane ``plane`` (0 = first of ``planes``) of ``src``, a range of rows at a time."""
    for i in range(0, src.n_rows, chunk):
        yield planes(src.rows(i, min(i + chunk, src.n_rows)))[plane]


def planes(g: Groups) -> list[Plane]:
    """The planes of one grouped tensor (high plane first); their sum is exact in float64."""
    c, S, O = g.codes, g.scale.astype(np.float64), g.offset.astype(np.float64)
    if g.bits == 4:
        return [Plane(c, S, O + 8 * S)]
    low = Plane(c & 0x0F, S, O + (136 if g.bits == 8 else 8) * S)
    hi_codes = c >> 4 if g.bits == 8 else (c >> 4) + 8
    return [Plane(hi_codes.astype(np.uint8), 16 * S, np.zeros_like(S)), low]


def pack(rows: Iterable[Plane], n_rows: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stack ``n_rows`` rows of planes row-wise → (packed uint8 [R_pad, K/2], scale_zero bf16
    [K/32, R_pad, 2], R).

    Writes the layout above with numpy, straight into the output (the packer torch offers
    takes int32 codes: four times the bytes, several times the time; tests check that both
    give the same bytes); scales and offsets are rounded to bf16 by ``bf16_bits``. Rows are
    taken in blocks of at most ``PACK_ROWS`` (a multiple of 64: packed row blocks are
    independent), so temporaries stay small for any tensor."""
    r_pad = -(-n_rows // ROW_BLOCK) * ROW_BLOCK
    packed: np.ndarray | None = None
    sz: np.ndarray | None = None  # bf16 bit patterns
    carry: list[Plane] = []  # fewer than ROW_BLOCK rows left over from the previous plane
    at = 0

    def write(codes: np.ndarray, s: np.ndarray, z: np.ndarray) -> None:
        nonlocal packed, sz, at
        n, k = codes.shape
        if packed is None:
            packed = np.empty((r_pad, k // 2), np.uint8)
            sz = np.empty((k // GROUP, r_pad, 2), np.uint16)
        assert sz is not None and at + n <= r_pad, "more rows than n_rows"
        h = HALF or 32
        v = codes.reshape(-1, 2, h, k)  # [blocks, low/high nibble rows, H, K]
        packed.reshape(-1, k, h)[at // (2 * h) : (at + n) // (2 * h)] = (v[:, 0] | (v[:, 1] << 4)).transpose(0, 2, 1)
        sz[:, at : at + n, 0], sz[:, at : at + n, 1] = bf16_bits(s.T), bf16_bits(z.T)
        at += n

    for p in rows:
        if carry:
            p = Plane(*(np.concatenate([c[i] for c in carry] + [p[i]]) for i in range(3)))
            carry = []
        for i in range(0, p.codes.shape[0], PACK_ROWS):
            j = min(i + PACK_ROWS, p.codes.shape[0])
            whole = i + (j - i) // ROW_BLOCK * ROW_BLOCK
            if whole > i:
                write(p.codes[i:whole], p.s[i:whole], p.z[i:whole])
            if whole < j:
                carry = [Plane(p.codes[whole:j], p.s[whole:j], p.z[whole:j])]
    n_total = at + sum(c.codes.shape[0] for c in carry)
    if n_total != n_rows:
        raise ValueError(f"planes have {n_total} rows, expected {n_rows}")
    if carry:  # the last rows: pad to a row block with code 8 and zero scale and offset
        c = carry[0]
        pad = r_pad - at - c.codes.shape[0]
        write(
            np.concatenate([c.codes, np.full((pad, c.codes.shape[1]), 8, np.uint8)]),
            np.concatenate([c.s, np.zeros((pad, c.s.shape[1]))]),
            np.concatenate([c.z, np.zeros((pad, c.z.shape[1]))]),
        )
    assert packed is not None and sz is not None
    return torch.from_numpy(packed), torch.from_numpy(sz).view(torch.bfloat16), n_rows


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bits of ``x`` (float64, finite) rounded to bf16 as torch's ``.to(torch.bfloat16)``
    rounds it: to float32, then to nearest-even bf16. Numpy, so that loading runs no torch op
    per block (each wakes torch's thread pool, which spins on a busy machine)."""
    bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def matmul(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """bf16 [M, K] @ planes.T → bf16 [M, R_pad] with the int4 kernel (best for few rows)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scale_zero)


def unpack_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    """packed → uint8 codes [R_pad, K] (the inverse of the layout described above)."""
    h = HALF or 32
    v = packed.view(-1, k, h)
    both = torch.stack([v & 0x0F, v >> 4], dim=2)  # [R/2H, K, 2, H]
    return both.view(-1, k, 2 * h).transpose(1, 2).reshape(-1, k)


def gather_codes(packed: torch.Tensor, k: int, rows: torch.Tensor) -> torch.Tensor:
    """uint8 codes [len(rows), K] of the packed rows ``rows`` (int64; the layout above)."""
    h = HALF or 32
    j = rows % (2 * h)
    b = packed.view(-1, k, h)[rows // (2 * h), :, j % h]  # [n, K]: row's low or high nibbles
    return (b >> (4 * (j // h)).to(torch.uint8).unsqueeze(1)) & 0x0F


def dequantize_t(
    packed: torch.Tensor, scale_zero: torch.Tensor, k: int, b0: int, b1: int, hi: int | None = None
) -> torch.Tensor:
    """W.T as bf16 [K, 64·(b1 − b0)] of row blocks [b0, b1): the right operand of a GEMM.

    Every weight is the kernel's float32 weight rounded to bf16 once (torch computes bf16
    elementwise ops in float32): ``(c − 8)·s + z`` with the plane's own bf16 ``s`` and ``z``.
    With ``hi`` (the first row block of a second plane whose rows line up with [b0, b1), whose
    scales are 16× the first plane's, and whose offsets ``Z = z_lo + z_hi − 8·s`` are bf16
    numbers: ``combined_offsets``; 0 for Q8_0, −16·s for Q5_0), both planes are one weight
    ``(16·(c_hi − 8) + c_lo)·s + Z`` with an int8 code, which equals ``Σ (c − 8)·s + z``.
    Nibbles are taken from the kernel's layout (see above) and written through a strided view:
    a few passes over the weights."""
    nb, g = b1 - b0, k // GROUP
    h = HALF or 32
    f = ROW_BLOCK // (2 * h)  # the layout's row blocks in one of 64 rows
    v = packed.view(-1, k, h)
    lo = v[f * b0 : f * b1]
    cols = slice(ROW_BLOCK * b0, ROW_BLOCK * b1)
    s = scale_zero[:, cols, 0].contiguous()  # unit stride: elementwise ops stay vectorized
    if hi is None:  # c − 8 as int8 (uint8 arithmetic wraps), exact in bf16
        c0 = (lo & 0x0F).sub_(8).view(torch.int8)
        c1 = (lo >> 4).sub_(8).view(torch.int8)
        z = scale_zero[:, cols, 1].contiguous()
    else:
        up = v[f * hi : f * (hi + nb)]
        c0 = (up << 4).bitwise_or_(lo & 0x0F).bitwise_xor_(0x80).view(torch.int8)  # −128 mod 256
        c1 = (up & 0xF0).bitwise_or_(lo >> 4).bitwise_xor_(0x80).view(torch.int8)
        z = combined_offsets(scale_zero, b0, b1, hi).to(torch.bfloat16)
    out = torch.empty(k, ROW_BLOCK * nb, dtype=torch.bfloat16)
    ov = out.view(g, GROUP, f * nb, 2, h).permute(2, 0, 1, 3, 4)  # [block, group, k in group, half, j]
    ov[..., 0, :].copy_(c0.view(f * nb, g, GROUP, h))
    ov[..., 1, :].copy_(c1.view(f * nb, g, GROUP, h))
    o3 = out.view(g, GROUP, ROW_BLOCK * nb)
    return torch.addcmul(z.unsqueeze(1), o3, s.unsqueeze(1), out=o3).view(k, -1)


def combined_offsets(scale_zero: torch.Tensor, b0: int, b1: int, hi: int) -> torch.Tensor:
    """float32 ``z_lo + z_hi − 8·s_lo`` of row blocks [b0, b1) and the second plane's blocks
    from ``hi``: the offset of the combined int8 code (exact: sums of a few bf16 numbers)."""
    cols = slice(ROW_BLOCK * b0, ROW_BLOCK * b1)
    hcols = slice(ROW_BLOCK * hi, ROW_BLOCK * (hi + b1 - b0))
    z_lo, z_hi, s = scale_zero[:, cols, 1].float(), scale_zero[:, hcols, 1].float(), scale_zero[:, cols, 0]
    return z_lo + z_hi - 8 * s.float()


def dequantize(
    packed: torch.Tensor, scale_zero: torch.Tensor, k: int, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """The planes as a matrix [R_pad, K]: ``(c − 8)·s + z`` computed in ``dtype`` (float32:
    the kernel's weights exactly; bf16: each step rounded, the reference for mixed planes)."""
    c = unpack_codes(packed, k).view(-1, k // GROUP, GROUP).to(dtype).sub_(8)
    s = scale_zero[..., 0].t().unsqueeze(-1).to(dtype)
    z = scale_zero[..., 1].t().unsqueeze(-1).to(dtype)
    return c.mul_(s).add_(z).view(-1, k)
