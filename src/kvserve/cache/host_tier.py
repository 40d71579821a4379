"""Slots of the host tier: where the device pool's evicted prefix pages keep their KV.

With a host tier, evicting a retained page from the device pool copies it to a host slot
instead of dropping it; its index node stays findable, now resident on the host. A later
prefix hit on it loads it back into a fresh device page before the sequence's first forward.
This class only hands out slot ids within the byte budget (``capacity`` slots, None =
unbounded); which node sits where and the LRU order of host pages live in ``PrefixIndex``,
and the copies themselves are ``plan.TierCopy`` records the runner executes in order.
"""

from __future__ import annotations

import heapq


class HostTier:
    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError("host tier capacity must be >= 0 (or None: unbounded)")
        self.capacity = capacity
        self._free: list[int] = []  # freed slots, a min-heap: the lowest is reused first
        self._next = 0  # slots [_next, capacity) were never handed out
        self.n_used = 0

    @property
    def n_slots_touched(self) -> int:
        """Slots ever handed out: the host memory the runner has allocated for them."""
        return self._next

    def alloc(self) -> int | None:
        """A free slot, or None when the budget is used up."""
        if self._free:  # lowest first: the slots of one eviction burst tend to be consecutive
            slot = heapq.heappop(self._free)
        elif self.capacity is None or self._next < self.capacity:
            slot = self._next
            self._next += 1
        else:
            return None
        self.n_used += 1
        return slot

    def free(self, slot: int) -> None:
        if not 0 <= slot < self._next:
            raise ValueError(f"host slot {slot} was never handed out")
        heapq.heappush(self._free, slot)
        self.n_used -= 1

    def free_slots(self) -> list[int]:
        return list(self._free)
