"""The one object that crosses from the scheduler to the runner, and what comes back.

Shared types below ``engine``, ``cache`` and ``model``: all three import them from here, and
this module imports none of them.

Positions are contiguous per sequence: the token at position ``p`` lives in page
``page_table[p // page_size]`` at row ``p % page_size``. A cache hit, a copy-on-write and a
KV shift all reduce to this layout before the forward pass, so the runner never knows which
tokens came from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Literal

LogitsWanted = Literal["none", "last", "all"]


@dataclass(frozen=True)
class KVMove:
    """Copy ``n_tokens`` KV rows (all layers) from (src_page, src_row) to (dst_page, dst_row).

    ``delta`` is the position difference dst - src; keys are re-rotated by it (``rope_shift``).
    ``delta == 0`` is a plain copy (copy-on-write of a shared, partially matching page).
    Rows may span page boundaries: row indices run past ``page_size`` into the next page of
    the *same page list* given by ``src_pages`` / ``dst_pages``.
    """

    src_pages: tuple[int, ...]
    src_start: int
    dst_pages: tuple[int, ...]
    dst_start: int
    n_tokens: int
    delta: int = 0


@dataclass(frozen=True)
class TierCopy:
    """Copy one KV page (every layer, every row) between the device pool and the host tier:
    device page ``page`` to host slot ``slot`` when ``to_host`` (an eviction that keeps the
    page's KV), else host slot ``slot`` to device page ``page`` (a prefix hit on a page that
    was moved out). Copies run in list order, before the plan's moves and forward."""

    to_host: bool
    page: int
    slot: int


@dataclass(frozen=True)
class SeqChunk:
    """Tokens of one sequence to run at positions [start_pos, start_pos + len(tokens)).

    Everything before ``start_pos`` is already in the pages of ``page_table`` (cached or
    computed earlier). ``page_table`` covers at least ``start_pos + len(tokens)`` positions.
    """

    seq_id: int
    tokens: tuple[int, ...]
    start_pos: int
    page_table: tuple[int, ...]
    logits: LogitsWanted = "last"


FED = -1  # the token of a fed chunk (``Plan.feed``): a placeholder, never a vocabulary id


@dataclass(frozen=True)
class Plan:
    """``feed`` (empty, or one entry per chunk): ``feed[i] >= 0`` means chunk i is one token,
    the one sampled in row ``feed[i]`` of the previous step, still on the device; the caller
    hands those sampled tokens to ``run`` (``prev_tokens``) and the chunk's token is ``FED``.
    ``-1``: the chunk's tokens are given. This lets the next decode step be planned and
    launched before the previous step's tokens have reached the host (overlap)."""

    chunks: tuple[SeqChunk, ...]
    moves: tuple[KVMove, ...] = ()
    copies: tuple[TierCopy, ...] = ()  # host-tier copies; they run first
    feed: tuple[int, ...] = ()


class BatchRows(Mapping[int, object]):
    """``logits`` of a step whose rows are one tensor: ``batch[rows[seq_id]]`` as a [1, vocab]
    view, made when it is read (the sampler reads the batch itself; a decode step of 64
    sequences made 64 views it never used)."""

    __slots__ = ("_batch", "_rows")

    def __init__(self, batch: Any, rows: dict[int, int]) -> None:
        self._batch = batch
        self._rows = rows

    def __getitem__(self, seq_id: int) -> object:
        i = self._rows[seq_id]
        return self._batch[i : i + 1]

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._rows

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


@dataclass
class RunOutput:
    """``logits[seq_id]``: float32 tensor [n, vocab] (n = 1 for "last", len(tokens) for "all")."""

    logits: Mapping[int, object]
    forward_s: float = 0.0
    # The same "last" rows as one float32 tensor [n, vocab] (row batch_rows[seq_id]), when the
    # runner has them in one piece: the sampler takes them without slicing and stacking.
    batch: object | None = None
    batch_rows: dict[int, int] | None = None
    # Waits until the step's results exist (a runner whose step outlives ``run`` without CUDA's
    # own stream ordering; None: they exist once ``run`` has returned, or the device orders it).
    ready: Callable[[], None] | None = None
