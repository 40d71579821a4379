"""Engine events cross to the event loop through one mailbox per loop: in order, all of them,
with fewer loop wake-ups than events when they come in bursts."""

from __future__ import annotations

import asyncio
import threading

from kvserve.engine.request import TokenEvent
from kvserve.server.dispatch import Mailbox


def test_events_arrive_in_order_with_coalesced_wakeups() -> None:
    async def main() -> tuple[list[list[int]], int]:
        loop = asyncio.get_running_loop()
        box = Mailbox.of(loop)
        assert Mailbox.of(loop) is box
        queues: list[asyncio.Queue] = [asyncio.Queue(), asyncio.Queue()]
        wakeups = 0
        orig = loop.call_soon_threadsafe

        def counting(cb, *args):
            nonlocal wakeups
            wakeups += 1
            return orig(cb, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]

        def engine() -> None:
            for step in range(50):
                for q in range(2):
                    box.post(queues[q], TokenEvent(q, 0, "", [step], step, 0))

        t = threading.Thread(target=engine)
        t.start()
        got: list[list[int]] = [[], []]
        for q in range(2):
            for _ in range(50):
                ev = await asyncio.wait_for(queues[q].get(), 10)
                got[q].append(ev.tokens[0])
        t.join()
        return got, wakeups

    got, wakeups = asyncio.run(main())
    assert got == [list(range(50)), list(range(50))]
    assert 1 <= wakeups < 100
