"""llama-server's ``--cache-reuse`` greedy chunk matching (spec §3.4), on plain token lists.

After the common prefix ``n_past`` the cache cursor ``head_c`` and prompt cursor ``head_p``
both start at ``n_past``. Runs of at least ``n_min`` equal tokens are moved from cache
position ``head_c`` to prompt position ``head_p`` (delta = head_p - head_c <= 0); otherwise the
cache cursor skips one token. The prompt cursor only advances on a match, so the reused
chunks tile the prompt contiguously: ``[n_past, n_past + sum(n))`` is covered without gaps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class ReuseChunk(NamedTuple):
    src: int  # cache position of the chunk's first token
    dst: int  # prompt position it moves to (dst <= src)
    n: int

    @property
    def delta(self) -> int:
        return self.dst - self.src


def plan_chunk_reuse(
    cache: Sequence[int], prompt: Sequence[int], n_past: int, n_min: int
) -> list[ReuseChunk]:
    """Chunks to move, in increasing ``dst`` order (also increasing ``src``).

    Precondition: ``cache[:n_past] == prompt[:n_past]``. ``n_min <= 0`` disables reuse.
    """
    chunks: list[ReuseChunk] = []
    if n_min <= 0:
        return chunks
    head_c = head_p = n_past
    n_c, n_p = len(cache), len(prompt)
    while head_c < n_c and head_p < n_p:
        n = 0
        while head_c + n < n_c and head_p + n < n_p and cache[head_c + n] == prompt[head_p + n]:
            n += 1
        if n >= n_min:
            chunks.append(ReuseChunk(head_c, head_p, n))
            head_c += n
            head_p += n
        else:
            head_c += 1
    return chunks


def trim_to(chunks: list[ReuseChunk], n_past: int, limit: int) -> tuple[int, list[ReuseChunk]]:
    """Cap ``n_past + sum(chunk.n)`` at ``limit`` by shortening the tail (last chunks first,
    then the prefix). Returns the new prefix length and chunks; used for "evaluate at least
    one prompt token" (limit = len(prompt) - 1)."""
    out = list(chunks)
    total = n_past + sum(c.n for c in out)
    while total > limit and out:
        last = out.pop()
        cut = min(last.n, total - limit)
        total -= cut
        if last.n > cut:
            out.append(last._replace(n=last.n - cut))
    if total > limit:
        n_past = limit
    return n_past, out
