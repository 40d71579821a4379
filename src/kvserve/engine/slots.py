"""Slots: llama-server's unit of concurrency, and how a request picks one (spec §3.1).

With one shared prefix cache a slot holds no KV of its own; it keeps the token list of its
last request, which is what ``/slots`` shows and what LCP similarity compares against.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .sampling_params import SamplingParams
from .snapshot import IDLE, NextToken


@dataclass
class Slot:
    id: int
    n_ctx: int
    seq_id: int | None = None  # running request id, or None when idle
    id_task: int = -1
    prompt_tokens: list[int] = field(default_factory=list)  # last request's prompt + generated
    n_prompt_processed: int = 0
    n_prompt_cache: int = 0
    t_last_used: float = -1.0
    sampling: SamplingParams | None = None  # the running (or last) request's sampler parameters
    next_token: NextToken = IDLE

    @property
    def busy(self) -> bool:
        return self.seq_id is not None


_LCP_BLOCK = 128


def lcp_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix. Whole blocks are compared as slices (a C loop), then the
    first differing block element by element: choosing a slot compares every idle slot's
    tokens with every new prompt, thousands of tokens each."""
    if type(a) is not type(b):  # a list slice never equals a tuple slice
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    i = 0
    while i + _LCP_BLOCK <= n and a[i : i + _LCP_BLOCK] == b[i : i + _LCP_BLOCK]:
        i += _LCP_BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as 4-byte machine integers (``array("i", tokens).tobytes()``): common
    prefixes then compare with memcmp. ``struct.pack`` converts a few thousand ints about
    twice as fast as ``array``."""
    return struct.pack(f"{len(tokens)}i", *tokens)


def prompt_key(tokens: Sequence[int], n_vocab: int) -> tuple[bool, bytes | None]:
    """(whether every token is in ``[0, n_vocab)``, ``token_bytes(tokens)``): the range read
    from the bytes (numpy's min and max, not Python's over thousands of int objects). Tokens
    that are not 32-bit integers get no bytes and Python's test (the same answer, the same
    errors)."""
    try:
        key = token_bytes(tokens)
    except struct.error:
        return not tokens or (min(tokens) >= 0 and max(tokens) < n_vocab), None
    return key_in_range(key, n_vocab), key


def key_in_range(key: bytes, n_vocab: int) -> bool:
    """Whether every token of ``key`` (``token_bytes`` of a prompt) is in ``[0, n_vocab)``."""
    if not key:
        return True
    a = np.frombuffer(key, dtype=np.int32)
    return bool(a.min() >= 0 and a.max() < n_vocab)


def lcp_bytes(a: bytes, b: bytes) -> int:
    """``lcp_len`` of two ``token_bytes`` strings: numpy's elementwise comparison of the
    common length and the first difference (a few microseconds for thousands of tokens)."""
    n = min(len(a), len(b)) // 4
    if n == 0:
        return 0
    diff = np.frombuffer(a, np.int32, n) != np.frombuffer(b, np.int32, n)
    i = int(diff.argmax())
    return i if diff[i] else n


def _slot_bytes(s: Slot) -> bytes:
    """The slot's ``token_bytes``, kept until its token list is replaced or grows."""
    src = s.prompt_tokens
    cached = s.__dict__.get("_bytes")
    if cached is None or cached[0] is not src or cached[1] != len(src):
        cached = (src, len(src), token_bytes(src))
        s.__dict__["_bytes"] = cached
    return cached[2]


def choose_slot(slots: list[Slot], tokens: Sequence[int], id_slot: int, sps: float,
                key: bytes | None = None) -> Slot | None:
    """llama-server's order: explicit id (returned even when busy; the caller waits), then LCP
    similarity over idle slots with a prompt (strictly > sps, first best wins), then LRU over
    idle slots (ties to the highest id). ``key``: ``token_bytes(tokens)`` if the caller has it."""
    if id_slot != -1:
        return slots[id_slot % len(slots)] if id_slot >= 0 else None
    if sps != 0 and tokens:
        best, best_sim = None, -1.0
        mine = key if key is not None else token_bytes(tokens)
        for s in slots:
            if s.busy or not s.prompt_tokens:
                continue
            sim = lcp_bytes(_slot_bytes(s), mine) / len(tokens)
            if sim > best_sim and sim > sps:
                best, best_sim = s, sim
        if best is not None:
            return best
    lru = None
    for s in slots:
        if not s.busy and (lru is None or s.t_last_used <= lru.t_last_used):
            lru = s
    return lru
