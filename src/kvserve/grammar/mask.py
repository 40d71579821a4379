"""Token masks as bitmasks: computed for many sequences at once, applied on the logits' device.

A mask row is ``ceil(V / 32)`` int32 words; bit ``t % 32`` of word ``t // 32`` is 1 when token
``t`` is allowed (llguidance's layout). ``fill_bitmask`` computes the rows of several grammar
states in parallel (llguidance's executor, off the GIL) into one pinned CPU tensor;
``apply_bitmask_`` moves it to the logits' device in one copy and sets every disallowed logit to
-inf there, so CPU and CUDA logits take the same path.
"""

from __future__ import annotations

import os
from typing import Sequence

import llguidance
import torch
from torch import Tensor

from .state import GrammarState

__all__ = ["alloc_bitmask", "apply_bitmask_", "fill_bitmask", "mask_words"]

_EXECUTOR: llguidance.LLExecutor | None = None


def _executor() -> llguidance.LLExecutor:
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = llguidance.LLExecutor(num_threads=max(1, min(8, os.cpu_count() or 1)))
    return _EXECUTOR


def mask_words(n_vocab: int) -> int:
    return (int(n_vocab) + 31) // 32


def alloc_bitmask(n_rows: int, n_vocab: int, pin: bool = False) -> Tensor:
    return torch.zeros((n_rows, mask_words(n_vocab)), dtype=torch.int32, pin_memory=pin)


def fill_bitmask(states: Sequence[GrammarState], bitmask: Tensor) -> None:
    """Row i of ``bitmask`` (CPU int32, contiguous, [>= len(states), W]) = the mask of
    ``states[i]``. A failed matcher gives an all-zero row."""
    assert bitmask.dtype == torch.int32 and bitmask.device.type == "cpu" and bitmask.is_contiguous()
    if not states:
        return
    row_bytes = bitmask.shape[1] * 4
    _executor().unsafe_compute_mask_ptr(
        [(s.matcher, i) for i, s in enumerate(states)], bitmask.data_ptr(), row_bytes, bitmask.shape[0]
    )


_SHIFTS: dict[torch.device, Tensor] = {}


def apply_bitmask_(logits: Tensor, bitmask: Tensor) -> None:
    """``logits[b, V]`` (any device) gets -inf wherever ``bitmask[b, W]`` has a 0 bit; columns
    beyond 32 * W are disallowed."""
    b, v = logits.shape
    dev = logits.device
    shifts = _SHIFTS.get(dev)
    if shifts is None:
        shifts = _SHIFTS[dev] = torch.arange(32, dtype=torch.int32, device=dev)
    m = bitmask.to(dev, non_blocking=True)
    bits = ((m.unsqueeze(-1) >> shifts) & 1).reshape(b, -1)
    n = min(v, bits.shape[1])
    logits[:, :n].masked_fill_(bits[:, :n] == 0, float("-inf"))
    if n < v:
        logits[:, n:] = float("-inf")
