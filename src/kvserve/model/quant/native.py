"""Linear layers computed straight from GGUF block bytes by the native kernels (``qmm.c``).

``NativeLinear`` keeps each weight's file bytes (one copy; the file pages are released as the
rows are copied) and runs ``y = x @ W.T`` the way llama.cpp's CPU backend does: the activation
rows quantized per block (Q8_0, Q8_1 or Q8_K), exact int32 block dot products scaled by the blocks'
scales, summed over the blocks of a row in order in float32. A row's output depends on nothing
else in the call (batch width, tiling, thread count, instruction set), so cached and uncached
evaluations, batch widths and chunkings give the same bits.

The extension ``_qmm`` is built at install time (``setup.py``); without it the model falls back
to the int4 path (``available()`` is False and the load log says so). ``KVSERVE_QMM_ISA``
(``scalar``, ``avx2``, ``avx512``, ``amx``) caps the instruction set, as ``isa=`` does per call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

log = logging.getLogger(__name__)

try:
    from . import _qmm  # type: ignore[attr-defined]
except ImportError as e:  # not built: the int4 path runs instead
    _qmm = None
    _IMPORT_ERROR = str(e)
else:
    _IMPORT_ERROR = ""

# GGUF type → the kernel's format id (the order of ``enum`` in qmm.h)
FORMATS: dict[Q, int] = {
    Q.Q4_0: 0, Q.Q4_1: 1, Q.Q5_0: 2, Q.Q5_1: 3, Q.Q8_0: 4, Q.Q4_K: 5, Q.Q5_K: 6, Q.Q6_K: 7,
}
BLOCK_WEIGHTS = {q: (256 if q in (Q.Q4_K, Q.Q5_K, Q.Q6_K) else 32) for q in FORMATS}
# activation block bytes per weight block (the kernel's act32 / actK structs), for ``quantize``
ACT_BYTES = {q: (304 if BLOCK_WEIGHTS[q] == 256 else 48) for q in FORMATS}
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2, "amx": 3}
_COPY_ROWS = 4096


def available() -> bool:
    return _qmm is not None and os.environ.get("KVSERVE_NATIVE", "1") != "0"


def unavailable_reason() -> str:
    if _qmm is None:
        return f"native kernels not built ({_IMPORT_ERROR})"
    return "native kernels turned off (KVSERVE_NATIVE=0)"


def best_isa() -> int:
    """0 scalar, 1 AVX2, 2 AVX-512 VNNI, 3 AMX int8 (prefill tiles; AVX-512 VNNI otherwise): the best
    level this CPU runs (capped by KVSERVE_QMM_ISA)."""
    assert _qmm is not None
    best = int(_qmm.best_isa())
    cap = os.environ.get("KVSERVE_QMM_ISA")
    return min(best, ISAS[cap]) if cap in ISAS else best


def isa_name(level: int) -> str:
    return {v: k for k, v in ISAS.items()}[level]


def supported(qtype: Q, k: int) -> bool:
    return available() and qtype in FORMATS and k % BLOCK_WEIGHTS[qtype] == 0


def matmul(qtype: Q, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None = None,
           isa: int = -1, threads: int | None = None) -> torch.Tensor:
    """float32 [M, N] = x @ W.T, x float32 [M, K], w the GGUF bytes uint8 [N, bytes per row];
    ``out`` may be a column slice of a wider row-major float32 matrix (row stride ≥ N)."""
    assert _qmm is not None
    m, k = x.shape
    n = w.shape[0]
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    if out is None:
        out = torch.empty(m, n)
    assert out.dtype == torch.float32 and out.shape == (m, n) and out.stride(1) == 1
    _qmm.matmul(FORMATS[qtype], x.data_ptr(), m, k, w.data_ptr(), n, out.data_ptr(), out.stride(0),
                torch.get_num_threads() if threads is None else threads, _ISA if isa < 0 else isa)
    return out


def quantize(qtype: Q, x: torch.Tensor, isa: int = -1) -> np.ndarray:
    """The activation blocks the kernel computes for x (float32 [M, K]; tests): per row and block
    (d float32, s float32, Σq int32, pad, 32 int8 codes) or, for the K-quants, (d float32, 12
    bytes pad, 16 int16 sums of 16, 256 int8 codes)."""
    assert _qmm is not None
    x = x.float().contiguous()
    m, k = x.shape
    out = np.zeros(m * (k // BLOCK_WEIGHTS[qtype]) * ACT_BYTES[qtype], np.uint8)
    _qmm.quantize(FORMATS[qtype], x.data_ptr(), m, k, out.ctypes.data, _ISA if isa < 0 else isa)
    return out.reshape(m, k // BLOCK_WEIGHTS[qtype], ACT_BYTES[qtype])


def copy_rows(raw: np.ndarray, n_rows: int, release: Callable[[int, int], None] | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Own copy of a tensor's GGUF bytes as uint8 [N, bytes per row] (into ``out`` if given), a
    block of rows at a time, releasing each block's file pages once copied."""
    src = np.ascontiguousarray(raw).view(np.uint8).reshape(n_rows, -1)
    dst = torch.empty(src.shape, dtype=torch.uint8) if out is None else out
    d = dst.numpy()
    for i in range(0, n_rows, _COPY_ROWS):
        j = min(i + _COPY_ROWS, n_rows)
        d[i:j] = src[i:j]
        if release is not None:
            release(i, j)
    return dst


class Segment:
    """Consecutive output columns [n0, n0 + n) computed from one format's bytes."""

    def __init__(self, qtype: Q, n0: int, raw: torch.Tensor) -> None:
        self.qtype, self.n0, self.raw = qtype, n0, raw
        self.n = raw.shape[0]


class NativeLinear(nn.Module):
    """y = x @ W.T + b, W = the row-wise concatenation of ``parts`` kept as their GGUF bytes.

    Parts of the same format are stored as one byte matrix and run by one kernel call; a fused
    module of mixed formats (Q/K/V with V in Q6_K, say) makes one call per run of a format,
    each writing its columns of the output."""

    path = "native"

    def __init__(self, parts: Sequence[tuple[np.ndarray, Q, tuple[int, int], Callable[[int, int], None] | None]],
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        k = parts[0][2][1]
        self.in_features = k
        self.segments: list[Segment] = []
        i, col = 0, 0
        while i < len(parts):
            j = i
            while j < len(parts) and parts[j][1] == parts[i][1]:
                j += 1
            n = sum(p[2][0] for p in parts[i:j])
            raw = torch.empty(n, parts[i][0].nbytes // parts[i][2][0], dtype=torch.uint8)
            r = 0
            for data, _, shape, release in parts[i:j]:
                copy_rows(data, shape[0], release, raw[r : r + shape[0]])
                r += shape[0]
            self.register_buffer(f"raw{len(self.segments)}", raw, persistent=False)  # counted by buffers()
            self.segments.append(Segment(parts[i][1], col, raw))
            col += n
            i = j
        self.out_features = col
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    @property
    def qtypes(self) -> list[Q]:
        return [s.qtype for s in self.segments]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a float32 row-major x (every CPU step's activations) is read in place: one torch call
        # (the output's allocation) per call, where a decode step's calls cost more than its bytes
        k, n = self.in_features, self.out_features
        x2 = x
        if x.dtype is not _F32 or not x.is_contiguous():
            x2 = x.float().contiguous()
        m = x2.numel() // k
        out = torch.empty((*x.shape[:-1], n))
        threads = torch.get_num_threads()
        for s in self.segments:
            _qmm.matmul(FORMATS[s.qtype], x2.data_ptr(), m, k, s.raw.data_ptr(), s.n, out.data_ptr() + 4 * s.n0,
                        n, threads, _ISA)
        if self.bias is not None:
            out += self.bias
        return out if x.dtype is _F32 else out.to(x.dtype)

    def weight_bytes(self) -> int:
        return sum(s.raw.nbytes for s in self.segments) + (0 if self.bias is None else self.bias.nbytes)

    def dequantized(self) -> torch.Tensor:
        """float32 [out, in]: the weights as the file's dequantizer gives them (for tests)."""
        from .dequant import dequantize

        return torch.cat([dequantize(s.raw.numpy(), s.qtype, (s.n, self.in_features)) for s in self.segments])


_ISA = best_isa() if _qmm is not None else 0
_F32 = torch.float32
