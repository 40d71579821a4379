"""Token embeddings kept in their GGUF encoding; only the gathered rows are dequantized."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

from .dequant import dequantize

_COPY_ROWS = 4096


class QuantEmbedding(nn.Module):
    """``forward(ids)`` = the float32 rows ``ids`` of the GGUF tensor, dequantized exactly as
    the full-tensor dequantizer would (each row is whole blocks: GGUF blocks never span rows)."""

    path = "rows"

    def __init__(self, raw: np.ndarray, qtype: Q, n_vocab: int, n_embd: int,
                 release: Callable[[int, int], None] | None = None) -> None:
        """``release(i, j)``: called once rows [i, j) of ``raw`` are copied (see ``GGUFGroups``)."""
        super().__init__()
        # own copy (the file is unmapped after load), taken a block of rows at a time
        src = np.ascontiguousarray(raw).view(np.uint8).reshape(n_vocab, -1)
        rows = np.empty(src.shape, np.uint8)
        for i in range(0, n_vocab, _COPY_ROWS):
            j = min(i + _COPY_ROWS, n_vocab)
            rows[i:j] = src[i:j]
            if release is not None:
                release(i, j)
        self.register_buffer("raw", torch.from_numpy(rows), persistent=False)
        self.qtype = qtype
        self.n_embd = n_embd

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.raw.index_select(0, ids.reshape(-1).cpu()).numpy()
        out = dequantize(rows, self.qtype, (rows.shape[0], self.n_embd))
        return out.reshape(*ids.shape, self.n_embd).to(ids.device)

    def weight_bytes(self) -> int:
        return self.raw.nbytes
