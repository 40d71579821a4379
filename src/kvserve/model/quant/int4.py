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
``[R/64, K, 32]`` where byte ``[b, k, j]`` holds row ``64b + j`` in its low nibble and row
``64b + 32 + j`` in its high nibble.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple, Protocol

import numpy as np
import torch

from .groups import GROUP, Groups

ROW_BLOCK = 64
PACK_ROWS = 64 * ROW_BLOCK


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


def pack(rows: Iterable[Plane]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stack planes row-wise → (packed uint8, scale_zero bf16 [K/32, R_pad, 2], R).

    Streams: rows are gathered into blocks of ``PACK_ROWS`` (a multiple of 64: packed row
    blocks are independent), each packed and its scales rounded on its own, so the temporaries
    (the packer takes int32 codes) stay small for any tensor."""
    packed: list[torch.Tensor] = []
    sz: list[torch.Tensor] = []
    buf: list[Plane] = []
    n_buf = n_total = 0

    def flush(final: bool) -> None:
        nonlocal buf, n_buf
        codes = np.concatenate([p.codes for p in buf])
        s = np.concatenate([p.s for p in buf])
        z = np.concatenate([p.z for p in buf])
        take = codes.shape[0] if final else PACK_ROWS
        rest = [Plane(codes[take:], s[take:], z[take:])] if take < codes.shape[0] else []
        codes, s, z = codes[:take], s[:take], z[:take]
        pad = (-take) % ROW_BLOCK
        if pad:
            codes = np.concatenate([codes, np.full((pad, codes.shape[1]), 8, np.uint8)])
            s = np.concatenate([s, np.zeros((pad, s.shape[1]))])
            z = np.concatenate([z, np.zeros((pad, z.shape[1]))])
        c32 = torch.from_numpy(codes).to(torch.int32)
        packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(c32, 1))
        sz.append(torch.from_numpy(np.stack([s.T, z.T], axis=-1)).to(torch.bfloat16))  # one rounding
        buf, n_buf = rest, sum(p.codes.shape[0] for p in rest)

    for p in rows:
        buf.append(p)
        n_buf += p.codes.shape[0]
        n_total += p.codes.shape[0]
        while n_buf >= PACK_ROWS:
            flush(False)
    if n_buf:
        flush(True)
    return torch.cat(packed), torch.cat(sz, dim=1).contiguous(), n_total


def matmul(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """bf16 [M, K] @ planes.T → bf16 [M, R_pad] with the int4 kernel (best for few rows)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, scale_zero)


def unpack_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    """packed → uint8 codes [R_pad, K] (the inverse of the layout described above)."""
    v = packed.view(-1, k, GROUP)
    both = torch.stack([v & 0x0F, v >> 4], dim=2)  # [R/64, K, 2, 32]
    return both.view(-1, k, ROW_BLOCK).transpose(1, 2).reshape(-1, k)


def dequantize(packed: torch.Tensor, scale_zero: torch.Tensor, k: int) -> torch.Tensor:
    """The planes as a bf16 matrix [R_pad, K], computed as the kernel defines them."""
    c = unpack_codes(packed, k).view(-1, k // GROUP, GROUP).to(torch.bfloat16).sub_(8)
    s = scale_zero[..., 0].t().unsqueeze(-1)
    z = scale_zero[..., 1].t().unsqueeze(-1)
    return c.mul_(s).add_(z).view(-1, k)

