"""CPU attention over the paged KV pool in one native call per layer (``attn_cpu.c``).

llama.cpp's CPU flash-attention arithmetic (its path for decode and short prompts): per query row
and head, the query rounded to the cache's type, each visible key's score and an online softmax
with V accumulated in the cache's type, keys walked in position order. A row's output depends on
its own query and keys only, so every batch shape (prefill chunk, cached prefix, decode batch of
any width), chunking and thread count gives the same bits.

``NativeKeys`` describes where a step's sequences are (built once per step); ``attend`` runs one
layer. The extension ``_attn`` is built at install time (``setup.py``); without it, or with
``KVSERVE_NATIVE=0``, the torch backend computes attention with SDPA (``attention.py``), the
readable reference. ``KVSERVE_ATTN_ISA`` (``scalar``, ``avx512``, ``avx512fp16``) caps the instruction set, as ``isa=``
does per call; every level computes the same bits.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

try:
    from . import _attn  # type: ignore[attr-defined]
except ImportError:  # not built: torch SDPA runs instead
    _attn = None

KV_DTYPES = (torch.float16, torch.float32)


def available() -> bool:
    env = os.environ
    return _attn is not None and env.get("KVSERVE_NATIVE", "1") != "0" and env.get("KVSERVE_NATIVE_ATTN", "1") != "0"


def supports(kv_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether the CPU backend runs the kernel: built, on, a float16/float32 cache, and a CPU with
    AVX-512 (elsewhere only the scalar functions run, slower than torch's SDPA)."""
    return available() and device.type == "cpu" and kv_dtype in KV_DTYPES and int(_attn.best_isa()) >= 1  # type: ignore[union-attr]


ISAS = {"scalar": 0, "avx512": 1, "avx512fp16": 2}  # capped by the CPU in the call
_ISA = ISAS.get(os.environ.get("KVSERVE_ATTN_ISA", ""), 2)


class NativeKeys:
    """The sequences of one step, in batch order: each as (first position, rows, page table)."""

    def __init__(self, seqs: Sequence[tuple[int, int, Sequence[int]]], page_size: int) -> None:
        info: list[int] = []
        tables: list[int] = []
        q = 0
        for start, n, table in seqs:
            n_pages = -(-(start + n) // page_size)
            info += (q, n, start, len(tables))
            tables += table[:n_pages]
            q += n
        self.n_seq = len(seqs)
        self.rows = q
        self.page_size = page_size
        self.info = torch.tensor(info, dtype=torch.int64)
        self.tables = torch.tensor(tables or [0], dtype=torch.int64)
        self._ptrs = (self.info.data_ptr(), self.n_seq, self.tables.data_ptr(), page_size)


def attend(
    q: torch.Tensor, kv: torch.Tensor, keys: NativeKeys, window: int, scale: float, out: torch.Tensor | None = None,
    softcap: float = 0.0, threads: int | None = None, isa: int | None = None,
) -> torch.Tensor:
    """q [T, H, D] (computed in float32; any row stride), ``kv`` a layer's K and V side by side
    [2, rows, Hkv, D] (float16 or float32, this step's rows written). Returns float32 [T, H, D]
    (into ``out`` if given)."""
    t, h, d = q.shape
    qs = q.stride()
    if q.dtype != torch.float32 or qs[2] != 1 or qs[1] != d:
        q = q.float().contiguous()
        qs = q.stride()
    _, _, hkv, dk = kv.shape
    ks = kv.stride()
    dt = kv.dtype
    if t != keys.rows or dk != d or ks[2] != d or ks[3] != 1 or dt not in KV_DTYPES:
        raise ValueError("attn_native.attend: q, kv and keys do not match")
    if out is None:
        out = torch.empty((t, h, d), dtype=torch.float32)
    os_ = out.stride()
    if out.dtype != torch.float32 or out.shape != q.shape or os_[2] != 1 or os_[1] != d:
        raise ValueError("attn_native.attend: bad out")
    f16 = dt == torch.float16
    k = kv.data_ptr()
    _attn.attend(  # type: ignore[union-attr]
        q.data_ptr(), qs[0], h, hkv, d, k, k + ks[0] * (2 if f16 else 4), ks[1], f16, *keys._ptrs,  # V: one K on
        window, out.data_ptr(), os_[0], scale, softcap,
        torch.get_num_threads() if threads is None else threads, _ISA if isa is None else isa,
    )
    return out
