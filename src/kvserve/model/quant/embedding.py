"""Token embeddings: only the gathered rows are dequantized, exactly as the file's dequantizer.

``QuantEmbedding`` keeps the GGUF bytes. ``PlaneEmbedding`` serves a tied model (the output
head multiplies by the embedding matrix): the head's int4 planes already hold every code
exactly, so only the file's float32 group scales (and offsets) are kept beside them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

from . import int4
from .dequant import dequantize
from .groups import GGUFGroups
from .linear import QuantLinear

_COPY_ROWS = 4096


class QuantEmbedding(nn.Module):
    """``forward(ids)`` = the float32 rows ``ids`` of the GGUF tensor, dequantized exactly as
    the full-tensor dequantizer would (each row is whole blocks: GGUF blocks never span rows)."""

    path = "rows"

    def __init__(self, raw: np.ndarray | torch.Tensor, qtype: Q, n_vocab: int, n_embd: int,
                 release: Callable[[int, int], None] | None = None) -> None:
        """``release(i, j)``: called once rows [i, j) of ``raw`` are copied (see ``GGUFGroups``).
        A uint8 tensor ``raw`` [n_vocab, bytes per row] is used as it is, not copied (a native
        output head's bytes: ``shared``)."""
        super().__init__()
        self.shared = isinstance(raw, torch.Tensor)
        if isinstance(raw, torch.Tensor):
            rows_t = raw
        else:  # own copy (the file is unmapped after load), taken a block of rows at a time
            src = np.ascontiguousarray(raw).view(np.uint8).reshape(n_vocab, -1)
            rows = np.empty(src.shape, np.uint8)
            for i in range(0, n_vocab, _COPY_ROWS):
                j = min(i + _COPY_ROWS, n_vocab)
                rows[i:j] = src[i:j]
                if release is not None:
                    release(i, j)
            rows_t = torch.from_numpy(rows)
        self.register_buffer("raw", rows_t, persistent=False)
        self.qtype = qtype
        self.n_embd = n_embd

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.raw.index_select(0, ids.reshape(-1).cpu()).numpy()
        out = dequantize(rows, self.qtype, (rows.shape[0], self.n_embd))
        return out.reshape(*ids.shape, self.n_embd).to(ids.device)

    def weight_bytes(self) -> int:
        """Bytes this module adds (none when the bytes are the output head's)."""
        return 0 if self.shared else self.raw.nbytes


# formats whose offset is ``-zero·scale``: ``(code - zero)·scale`` is the weight, bit for bit
_SYMMETRIC = {Q.Q4_0: 8, Q.Q5_0: 16, Q.Q8_0: 128}


class PlaneEmbedding(nn.Module):
    """``forward(ids)`` = the float32 rows ``ids`` of a grouped GGUF tensor, read from the int4
    planes of ``head`` (a one-part ``QuantLinear`` of the same tensor: rows [0, N) its low or
    only plane, [N, 2N) its high plane) with the file's float32 group scales and offsets, as
    ``Groups.dequantize`` computes them: equal to ``QuantEmbedding``'s rows.

    For the symmetric formats (Q4_0, Q5_0, Q8_0) only the scale is kept; ``(c − zero)·scale``
    is exact in float32 and equals ``c·scale + offset``."""

    path = "rows"

    def __init__(self, head: QuantLinear, src: GGUFGroups) -> None:
        super().__init__()
        if head.n_rows != src.n_rows * int4.n_planes(src.bits) or head.out_features != src.n_rows:
            raise ValueError("PlaneEmbedding: the head is not a one-part QuantLinear of this tensor")
        self.n_vocab, self.n_embd, self.bits = src.n_rows, src.k, src.bits
        self.zero = _SYMMETRIC.get(src.qtype)
        g = src.k // int4.GROUP
        scale = np.empty((src.n_rows, g), np.float32)
        offset = None if self.zero is not None else np.empty((src.n_rows, g), np.float32)
        for i in range(0, src.n_rows, _COPY_ROWS):
            j = min(i + _COPY_ROWS, src.n_rows)
            got = src.rows(i, j)
            scale[i:j] = got.scale
            if offset is not None:
                offset[i:j] = got.offset
        self.register_buffer("packed", head.packed, persistent=False)  # shared with the head
        self.register_buffer("scale", torch.from_numpy(scale), persistent=False)
        self.register_buffer("offset", None if offset is None else torch.from_numpy(offset), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).cpu()
        n = flat.shape[0]
        rows = flat if self.bits == 4 else torch.cat([flat, flat + self.n_vocab])  # low, high plane
        c = int4.gather_codes(self.packed, self.n_embd, rows).float()  # integers: exact in float32
        if self.bits != 4:  # the format's code: 16·high + low (the 5-bit high plane holds high + 8)
            c = (c[n:].sub_(8) if self.bits == 5 else c[n:]).mul_(16).add_(c[:n])
        c = c.view(n, -1, int4.GROUP)
        s = self.scale.index_select(0, flat).unsqueeze(-1)
        if self.offset is None:
            out = c.sub_(self.zero).mul_(s)
        else:  # two float32 roundings, as numpy's c * scale + offset (no fused multiply-add)
            out = c.mul_(s).add_(self.offset.index_select(0, flat).unsqueeze(-1))
        return out.view(*ids.shape, self.n_embd).to(ids.device)

    def weight_bytes(self) -> int:
        """Bytes this module adds (the codes are the head's)."""
        return self.scale.nbytes + (0 if self.offset is None else self.offset.nbytes)
