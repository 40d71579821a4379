"""Start-up compiles of the Triton backend's eager step kernels (``TritonBackend.warm_eager``).

Decode steps replay CUDA graphs, whose capture compiled their kernels. Steps with a prompt chunk
(a prefill, a chunk over a cached prefix, decode rows beside one) and cascade steps with more
groups than a graph takes run eagerly, and which variant of a kernel they need depends on the
step: the extend kernel's query block (a chunk of up to 32 tokens or more), the split kernel's
key block (fewer or more than 128 (sequence, kv head) pairs), the merge kernel's split block (a
power of two up to a sequence's splits plus its shared prefix's), the shared-prefix kernel's row
block (members x query heads per kv head). A variant that a request meets first compiles on
that step's critical path (0.1-0.6 s each on an H200, logged by ``jit_watch``), and every
sequence of the step waits.

``warm`` runs one step of each such shape through the backend's own ``prepare`` and ``attend``,
so the choice of variant is the backend's and is not repeated here. The kernels' per-step
integers are not specialized (``triton_kernels.common.STEP_SCALARS``), so a shape per choice of
constexprs covers every step (the one-launch decode kernel's are: a shape per value class too).
Every page-table entry of the warm-up's sequences is the scratch page: their KV writes land
there, and nothing cached is read or changed.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from .base import StepSeq

if TYPE_CHECKING:
    from .triton_backend import TritonBackend

# Lengths (in units of the split kernel's 64 keys, or the one-launch kernel's 32) whose split
# counts fall in every power-of-two class up to the 32-split cap (1, 2, 3-4, 5-8, 9-16, 17-32),
# each also as a multiple of 16 where it has one (the one-launch kernel's specializations)
SPLIT_UNITS = (1, 2, 3, 5, 9, 16, 17, 32)
# Shared prefixes (in units of the shared-prefix kernel's 256 keys) whose shared splits, plus a
# sequence's one own split, fall in every power-of-two class up to 64
SHARED_UNITS = (1, 2, 3, 7, 15, 31, 32)
_ID = itertools.count()


def warm(be: TritonBackend, dtype: torch.dtype, decode_only: bool = False) -> int:
    """Run the eager step shapes above (``decode_only``: also decode-only steps, which the
    one-launch kernel takes when no graph replays them); returns the number of steps run."""
    cfg = be.cfg
    ps = be.kv.page_size
    scratch = be.kv.scratch_page
    max_tokens = be.pt.max_pages * ps
    max_seqs = be.pt.n_rows
    windows: dict[tuple, int] = {}
    for layer in range(cfg.n_layer):  # one layer per kind of attention (window, RoPE table)
        windows.setdefault((cfg.layer_window(layer), cfg.layer_rope(layer)), layer)
    layers = list(windows.values())
    used: list[int] = []
    steps = 0

    def seq(start: int, n: int) -> StepSeq:
        sid = -1000 - next(_ID)  # never a request's sequence
        used.append(sid)
        return StepSeq(sid, start, n, (scratch,) * -(-(start + n) // ps))

    def run(seqs: list[StepSeq]) -> None:
        nonlocal steps
        if any(len(s.page_table) > be.pt.max_pages for s in seqs):
            return  # a pool this small never has such a step
        steps += 1
        t = sum(s.n for s in seqs)
        _, step = be.prepare(seqs, [0] * t)
        q = torch.zeros((t, cfg.n_head, cfg.head_dim), dtype=dtype, device=be.device)
        kv = torch.zeros((t, cfg.n_head_kv, cfg.head_dim), dtype=dtype, device=be.device)
        for layer in layers:
            step.attend(layer, q, kv, kv)

    mode, n_cascade = be.cascade_mode, be.n_cascade_steps
    wide = -(-128 // cfg.n_head_kv)  # decode rows from which the split kernel takes 128-key blocks
    try:
        for n in (17, 40):  # the extend kernel's two query blocks
            run([seq(0, n)])
        be.cascade_mode = "0"
        for b in sorted({1, min(wide, max_seqs - 1)}):  # decode rows beside a chunk: split and merge
            for u in SPLIT_UNITS:
                length = max(1, min(64 * u, max_tokens - ps))
                run([seq(length - 1, 1) for _ in range(b)] + [seq(0, 17)])
        if be.cascade_graphs:  # one group of m members: the shared-prefix kernel and the cascade's merge
            be.cascade_mode = "1"
            g = cfg.n_head // cfg.n_head_kv
            for m in sorted({2, -(-17 // g), -(-33 // g), wide}):
                if not 2 <= m <= max_seqs:
                    continue
                for u in SHARED_UNITS:
                    shared = 256 * u
                    if shared + 1 > max_tokens:
                        break
                    run([seq(shared, 1) for _ in range(m)])
        if decode_only:
            be.cascade_mode = "0"
            for b in sorted({1, min(wide, max_seqs)}):
                for u in SPLIT_UNITS:
                    length = max(1, min(32 * u, max_tokens - ps))
                    run([seq(length - 1, 1) for _ in range(b)])
    finally:
        be.cascade_mode, be.n_cascade_steps = mode, n_cascade
        for sid in used:
            be.pt.forget(sid)
    return steps
