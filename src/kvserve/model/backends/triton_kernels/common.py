"""What the Triton attention kernels share: the paged cache's addressing, the split partials'
workspace and the launchers' small rules.

Paged layout (``kv_store``): one layer's cache is [rows, Hkv, D]; the key of position p of a
sequence lives in row ``table[seq_row, p // PS] * PS + p % PS`` of the int32 page table.
Softmax runs in base 2 (scores scaled by log2(e)); accumulation in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def _token_stride(x: torch.Tensor) -> torch.Tensor:
    """x [T, heads, D] with unit dim stride and head stride D (a view of a projection's output)."""
    if x.stride(2) != 1 or x.stride(1) != x.shape[2]:
        x = x.contiguous()
    return x


@triton.jit
def _kv_block(table_ptr, row, table_stride, tok, valid, hk, d, PS: tl.constexpr, HKV: tl.constexpr,
              D: tl.constexpr):
    """Offsets of the cache rows holding positions ``tok`` of page-table row ``row`` (KV head
    ``hk``, dims ``d``) and their load mask: where every kernel reads a block of keys/values."""
    page = tl.load(table_ptr + row * table_stride + tok // PS, mask=valid, other=0)
    slot = page.to(tl.int64) * PS + tok % PS
    return slot[:, None] * (HKV * D) + hk * D + d[None, :], valid[:, None] & (d[None, :] < D)


def _precision(q: torch.Tensor) -> str:
    """float32 models get full-precision dots (Triton's default for float32 is tf32)."""
    return "ieee" if q.dtype == torch.float32 else "tf32"


def _window(window: int) -> int:
    """0 (no window) becomes a window no sequence reaches, so kernels have one code path."""
    return window if window > 0 else 1 << 30


class DecodeWorkspace:
    """Split partials for up to ``max_b`` sequences: [max_b, H, num_splits + shared_splits, D]
    and lse (the last ``shared_splits`` slots hold the cascade kernel's shared-prefix partials)."""

    def __init__(self, max_b: int, n_head: int, head_dim: int, num_splits: int, device: torch.device,
                 shared_splits: int = 0, n_head_kv: int = 0) -> None:
        self.num_splits = num_splits
        self.shared_splits = shared_splits
        n = num_splits + shared_splits
        self.mid_o = torch.empty((max_b, n_head, n, head_dim), dtype=torch.float32, device=device)
        self.mid_lse = torch.empty((max_b, n_head, n), dtype=torch.float32, device=device)
        # with n_head_kv: splits finished per (sequence, kv head) for ``decode_fused`` (each launch
        # leaves it at zero again)
        self.count = (torch.zeros((max_b, n_head_kv), dtype=torch.int32, device=device)
                      if n_head_kv else None)
