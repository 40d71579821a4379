"""GGUF tensor data → torch tensors. Fast paths for the common block types, gguf for the rest."""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as np_dequantize

_FAST = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1}


def _blocks(raw: np.ndarray, block_bytes: int) -> torch.Tensor:
    arr = np.ascontiguousarray(raw).view(np.uint8).reshape(-1, block_bytes)
    if not arr.flags.writeable:  # memory-mapped file: torch wants a writable buffer
        arr = arr.copy()
    return torch.from_numpy(arr)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] packed bytes → [n, 32] values: low nibbles first, then high nibbles (ggml order)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1).to(torch.float32)


def dequantize(raw: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """Dequantize to float32 with the numpy-order shape (rows = GGUF ne[1], cols = ne[0])."""
    if qtype == Q.F32:
        t = torch.from_numpy(np.ascontiguousarray(raw).view(np.float32).copy())
    elif qtype == Q.F16:
        t = torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).copy()).float()
    elif qtype == Q.BF16:
        t = torch.from_numpy(np.ascontiguousarray(raw).view(np.int16).copy()).view(torch.bfloat16).float()
    elif qtype == Q.Q8_0:  # 2-byte f16 scale + 32 int8
        b = _blocks(raw, 34)
        d = b[:, :2].contiguous().view(torch.float16).float()
        t = b[:, 2:].contiguous().view(torch.int8).float().mul_(d)
    elif qtype == Q.Q4_0:  # f16 scale + 16 bytes of nibbles, value = (q - 8) * d
        b = _blocks(raw, 18)
        d = b[:, :2].contiguous().view(torch.float16).float()
        t = (_nibbles(b[:, 2:]) - 8.0) * d
    elif qtype == Q.Q4_1:  # f16 scale, f16 min, 16 bytes of nibbles, value = q * d + m
        b = _blocks(raw, 20)
        d = b[:, :2].contiguous().view(torch.float16).float()
        m = b[:, 2:4].contiguous().view(torch.float16).float()
        t = _nibbles(b[:, 4:]) * d + m
    else:
        t = torch.from_numpy(np.asarray(np_dequantize(raw, qtype), dtype=np.float32))
    return t.reshape(shape)


def has_fast_path(qtype: Q) -> bool:
    return qtype in _FAST
