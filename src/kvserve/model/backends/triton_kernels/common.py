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
# Integer arguments that change from step to step (split counts, strides of per-step buffers, block
# counts) or layer to layer (a sliding window), per kernel of the eager steps: Triton does not
# specialize them, so a kernel compiles once per choice of its constexprs (which the backend's
# ``warm_eager`` runs at start-up) rather than once more per value class (1, a multiple of 16,
# other) a request meets. The one-launch decode kernel keeps its specializations (the batch-1
# graphs run it; eager, only without graphs, where ``warm_eager`` meets each class).
STEP_SCALARS = {
    "decode_split": ("window", "num_splits", "split_stride"),
    "decode_merge": ("split_stride", "num_splits", "own_splits"),
    "shared_prefix": ("members_stride", "n_mblocks", "window", "split_stride", "own_splits", "shared_splits"),
    "extend": ("window",),
}


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


@triton.jit
def _attend_block(q, k, v, valid, m_i, l_i, acc, qk_scale, PREC: tl.constexpr):
    """One block of keys of an online softmax (base 2) whose first key every row sees (a decode
    split's blocks): the running max, sum and float32 accumulator after it."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _attend_masked_block(q, k, vis, v_ptrs, mkv, m_i, l_i, acc, qk_scale, PREC: tl.constexpr):
    """``_attend_block`` for blocks where a row may see no key (causal and window masks ``vis``):
    such rows keep max -inf and add nothing. The values are loaded after the scores."""
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
    s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptrs, mask=mkv, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return m_new, l_i, acc


@triton.jit
def _split_partials(acc, m_i, l_i):
    """A split's normalized output and log-sum-exp (base 2; -inf where it saw no key)."""
    has = l_i > 0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    return out, lse


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
