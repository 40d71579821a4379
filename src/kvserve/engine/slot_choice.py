"""Slot choice without comparing a prompt with every idle slot's tokens.

``slots.choose_slot`` is the rule (llama-server's): the idle slot whose last token list shares
the longest common prefix with the new prompt, when that similarity is above the threshold,
else the least recently used idle slot. Done as written it compares every new prompt with
every idle slot's tokens: in a burst of 64 requests over one 2,000-token document, 64 × 64
comparisons of thousands of tokens on the engine thread.

``SlotChooser`` keeps the slots' token strings (``token_bytes``) sorted, with the common-prefix
length of each adjacent pair. In a sorted list the common prefix of a string ``q`` with entry
``j`` is the minimum of the adjacent lengths between ``j`` and ``q``'s insertion point, and
the one comparison with the entry beside that point (lcp(a, c) = min(lcp(a, b), lcp(b, c))
for a ≤ b ≤ c). A prompt then costs a binary search and two comparisons; every slot's common
prefix follows with integer minima, and the walk outward stops once the prefix can no longer
win. The answer is ``choose_slot``'s, to the slot (``tests/unit/test_slot_choice.py``).

Byte order is not token order (the strings are little-endian integers), but any total order
works: the property needs only the order the list is sorted by, and a common prefix of the
byte strings of whole tokens is a whole number of tokens plus less than one.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Sequence

from .slots import Slot, choose_slot, lcp_bytes, token_bytes


class SlotChooser:
    """``choose_slot`` over a sorted index of the slots' token lists (see the module docstring).

    The index follows the slots by identity: a slot whose ``prompt_tokens`` is another list or
    another length than when it was indexed is indexed again on the next ``choose``."""

    def __init__(self) -> None:
        self._keys: list[tuple[bytes, int]] = []  # (token bytes, slot id), sorted
        self._adj: list[int] = []  # _adj[i]: common prefix (tokens) of _keys[i] and _keys[i + 1]
        self._of: dict[int, tuple[list[int], int, bytes]] = {}  # slot id -> (list, length, bytes) indexed
        # slot id -> (prompt, its bytes) of the last request it was chosen for: the slot's next
        # token list (that prompt + what was generated) is indexed from these bytes
        self._hint: dict[int, tuple[Sequence[int], bytes]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def choose(self, slots: list[Slot], tokens: Sequence[int], id_slot: int, sps: float,
               key: bytes | None = None, sync: bool = True) -> Slot | None:
        """``key``: ``token_bytes(tokens)`` if the caller has it. ``sync=False``: no slot's
        token list has changed since the last ``choose`` (the index is not checked)."""
        if id_slot != -1 or sps == 0 or not tokens:
            return choose_slot(slots, tokens, id_slot, sps)
        if sync:
            self._sync(slots)
        q = key if key is not None else token_bytes(tokens)
        best = self._most_similar(slots, q, len(tokens), sps)
        if best is None:
            best = choose_slot(slots, tokens, -1, 0.0)  # the LRU rule alone
        if best is not None:
            self._hint[best.id] = (tokens, q)
        return best

    # -- the index -------------------------------------------------------------------------
    def sync(self, slots: list[Slot]) -> None:
        """Bring the index up to date with the slots' token lists (``choose`` does it first
        unless told the lists have not changed)."""
        self._sync(slots)

    def _sync(self, slots: list[Slot]) -> None:
        of = self._of
        for s in slots:
            src = s.prompt_tokens
            cur = of.get(s.id)
            if cur is not None and cur[0] is src and cur[1] == len(src):
                continue
            if cur is None and not src:
                continue
            if cur is not None:
                self._remove(cur[2], s.id)
                del of[s.id]
            if src:
                b = self._bytes_of(s.id, src)
                self._insert(b, s.id)
                of[s.id] = (src, len(src), b)

    def _bytes_of(self, sid: int, src: list[int]) -> bytes:
        """``token_bytes(src)``, from the bytes of the prompt the slot was last chosen for when
        ``src`` begins with that prompt or is a prefix of it (checked: a comparison of the same
        int objects, the slot's list is copied from the request's), else packed afresh.
        A request's prompt list is not changed after intake."""
        hint = self._hint.pop(sid, None)
        if hint is not None:
            toks, key = hint
            n = len(toks)
            if len(key) == 4 * n:
                if len(src) >= n and src[:n] == toks:
                    return key + token_bytes(src[n:])
                if len(src) < n and src == toks[: len(src)]:
                    return key[: 4 * len(src)]
        return token_bytes(src)

    def _insert(self, b: bytes, sid: int) -> None:
        keys, adj = self._keys, self._adj
        i = bisect_left(keys, (b, sid))
        left = lcp_bytes(keys[i - 1][0], b) if i > 0 else None
        right = lcp_bytes(b, keys[i][0]) if i < len(keys) else None
        keys.insert(i, (b, sid))
        # adj[i - 1] joined keys[i - 1] and the old keys[i]: now left | new | right
        if left is not None and right is not None:
            adj[i - 1] = left
            adj.insert(i, right)
        elif left is not None:
            adj.insert(i - 1, left)
        elif right is not None:
            adj.insert(i, right)

    def _remove(self, b: bytes, sid: int) -> None:
        keys, adj = self._keys, self._adj
        i = bisect_left(keys, (b, sid))
        assert keys[i] == (b, sid)
        del keys[i]
        if 0 < i <= len(adj) - 1:  # it had neighbours on both sides: they are adjacent now
            adj[i - 1] = min(adj[i - 1], adj[i])
            del adj[i]
        elif i == 0:
            if adj:
                del adj[0]
        else:  # it was the last entry
            del adj[i - 1]

    # -- the query -------------------------------------------------------------------------
    def _most_similar(self, slots: list[Slot], q: bytes, n: int, sps: float) -> Slot | None:
        """The first idle slot (in slot order) of the highest similarity above ``sps``."""
        keys, adj = self._keys, self._adj
        p = bisect_left(keys, (q, -1))
        best_l, best_id = -1, -1
        # right of the insertion point, then left: the common prefix only shrinks outward
        for step in (1, -1):
            j = p if step == 1 else p - 1
            if not 0 <= j < len(keys):
                continue
            lcp = lcp_bytes(q, keys[j][0])
            while True:
                if lcp / n <= sps or lcp < best_l:
                    break
                sid = keys[j][1]
                if not slots[sid].busy and (lcp > best_l or sid < best_id):
                    best_l, best_id = lcp, sid
                j += step
                if not 0 <= j < len(keys):
                    break
                lcp = min(lcp, adj[j - 1] if step == 1 else adj[j])
        return slots[best_id] if best_id >= 0 else None
