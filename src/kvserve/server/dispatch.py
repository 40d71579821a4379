"""From one HTTP request to N engine requests and back.

``Dispatch`` owns the engine requests of one HTTP request (several prompts and/or n_cmpl > 1
fan out, each with its ``index``). Events arrive on the engine thread and hop to the event
loop through its ``Mailbox``: one ``call_soon_threadsafe`` (one wake-up of the loop) carries
every event posted until the loop runs it, so a decode step of 64 streams wakes the loop once,
not 64 times, and the events of one request keep their order. Whatever way the HTTP side ends (done, error, client gone,
task cancelled), ``cancel()`` tells the engine to drop the requests that are still running.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import deque
from typing import Any, Callable, Protocol

from kvserve.engine.request import (
    EngineEvent,
    ErrorEvent,
    FinalEvent,
    GenerationRequest,
)
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import ApiError, from_event

log = logging.getLogger("kvserve.server")

POLL_S = 1.0  # how often a waiting handler checks for a client disconnect (HTTP_POLLING_SECONDS)


class Mailbox:
    """Events from the engine thread to queues of one event loop, delivered in posting order."""

    _of: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = weakref.WeakKeyDictionary()
    _of_lock = threading.Lock()

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Any, EngineEvent]] = []  # (queue with put_nowait, event)

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> Mailbox:
        with cls._of_lock:
            box = cls._of.get(loop)
            if box is None:
                box = cls._of[loop] = cls(loop)
            return box

    def post(self, queue: Any, ev: EngineEvent) -> None:
        """Any thread. Raises RuntimeError when the loop is closed."""
        with self._lock:
            self._items.append((queue, ev))
            if len(self._items) > 1:  # a delivery is already scheduled and has not run yet
                return
        try:
            self.loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:
            with self._lock:
                self._items.clear()
            raise

    def _deliver(self) -> None:  # on the loop
        with self._lock:
            items, self._items = self._items, []
        for queue, ev in items:
            queue.put_nowait(ev)


class EventQueue:
    """The events of one HTTP request on its event loop: what ``Mailbox`` delivers to
    (``put_nowait``), taken with ``get_nowait``; ``wait`` sleeps until one is there. One future
    per wait, where ``asyncio.wait_for(queue.get(), t)`` costs a getter future, a timeout context
    and its rescheduling for every token of a stream. The timer is kept across waits: a wait
    whose deadline is not before the armed one's reuses it, so a stream that gets a token every
    few milliseconds arms about one timer per timeout, not one per token; such a wait may then
    end before its own timeout (False, nothing there), which every caller treats as a wake-up
    to look around (pings, timeouts, disconnects) and wait again.

    ``sink``: while the consumer waits with nothing queued, an event is first offered to it; an
    event it takes (True) is handled there and then, in the delivery, and neither queued nor
    waking the consumer. A stream writes its plain token chunks this way: one wake-up of the
    loop per engine step for all its streams, and none of each stream's task per token. Events
    it declines, and every event while others are queued or the consumer is busy, keep their
    order through the queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[EngineEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.sink: Callable[[EngineEvent], bool] | None = None

    def put_nowait(self, ev: EngineEvent) -> None:  # on the loop
        if self.sink is not None and self._waiter is not None and not self._items and self.sink(ev):
            return
        self._items.append(ev)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def empty(self) -> bool:
        return not self._items

    def get_nowait(self) -> EngineEvent:
        if not self._items:
            raise asyncio.QueueEmpty
        return self._items.popleft()

    async def wait(self, timeout: float | None) -> bool:
        """Until an event is here (True) or ``timeout`` seconds passed (False)."""
        if self._items:
            return True
        loop = self._loop
        fut = loop.create_future()
        self._waiter = fut
        if timeout is not None:
            deadline = loop.time() + timeout
            t = self._timer
            if t is None or t.when() > deadline:
                if t is not None:
                    t.cancel()
                self._timer = loop.call_at(deadline, self._expire)
        try:
            await fut
        finally:
            self._waiter = None
        return bool(self._items)

    def _expire(self) -> None:
        self._timer = None
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def close(self) -> None:
        """Disarm the timer and wake a waiter (the request is over: it looks and sees that)."""
        self.sink = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)


class Disconnectable(Protocol):
    async def is_disconnected(self) -> bool: ...


class ClientGone(Exception):
    """The client disconnected while we waited; the engine requests were cancelled."""


class Dispatch:
    def __init__(
        self, engine: EngineAPI, loop: asyncio.AbstractEventLoop | None = None, timeout: float | None = None
    ):
        """``timeout`` (``--timeout``): seconds a request may go without producing any event
        before it is cancelled and answered with an error; None = no limit."""
        self.engine = engine
        self.timeout = timeout if timeout and timeout > 0 else None
        self.loop = loop or asyncio.get_running_loop()
        self.mailbox = Mailbox.of(self.loop)
        self.queue = EventQueue(self.loop)
        self.ids: list[int] = []
        self.pending: set[int] = set()
        self.cancelled = False
        self._last_check = self.loop.time()
        self._last_event = self.loop.time()

    # engine thread -------------------------------------------------------------------
    def emit(self, ev: EngineEvent) -> None:
        try:
            self.mailbox.post(self.queue, ev)
        except RuntimeError:  # event loop closed (shutdown): nobody is listening any more
            pass

    # event loop ----------------------------------------------------------------------
    def submit(self, reqs: list[GenerationRequest]) -> None:
        for r in reqs:
            self.ids.append(r.id)
            self.pending.add(r.id)
        for r in reqs:
            try:
                self.engine.submit(r, self.emit)
            except Exception:
                self.cancel()
                raise

    def cancel(self) -> None:
        """Cancel every request that has not finished (idempotent)."""
        if self.pending:
            log.info("cancel %d request(s): %s", len(self.pending), sorted(self.pending))
        for rid in sorted(self.pending):
            try:
                self.engine.cancel(rid)
            except Exception:  # pragma: no cover - engine bug; never mask the real exit path
                log.exception("cancel(%d) failed", rid)
        self.pending.clear()
        self.cancelled = True
        self.queue.close()

    def handle_on_delivery(self, handle: Callable[[EngineEvent], bool]) -> None:
        """While the consumer waits (``next``) with nothing queued, a token or progress event of
        a pending request is given to ``handle`` on delivery; one it takes (True) is done with
        (see ``EventQueue.sink``). ``handle`` must not raise for an event it could not take: an
        exception counts as declining it, and the event is queued as usual."""

        def sink(ev: EngineEvent) -> bool:
            if ev.request_id not in self.pending or isinstance(ev, (FinalEvent, ErrorEvent)):
                return False
            try:
                taken = handle(ev)
            except Exception:  # noqa: BLE001 - the consumer meets it again, in its own context
                return False
            if taken:
                self._last_event = self.loop.time()
            return taken

        self.queue.sink = sink

    @property
    def done(self) -> bool:
        return not self.pending

    def next_nowait(self) -> EngineEvent | None:
        """The next event of a still-pending request if one is already here, else None."""
        while not self.queue.empty():
            ev = self.queue.get_nowait()
            if ev.request_id not in self.pending:
                continue  # late event of a cancelled/finished request
            if isinstance(ev, (FinalEvent, ErrorEvent)):
                self.pending.discard(ev.request_id)
            self._last_event = self.loop.time()
            return ev
        return None

    async def next(self, timeout: float | None) -> EngineEvent | None:
        """The next event of a still-pending request (None after ``timeout`` seconds)."""
        while True:
            ev = self.next_nowait()
            if ev is not None:
                return ev
            if not await self.queue.wait(timeout):
                return None

    async def next_or_gone(self, client: Disconnectable, poll: float | None = None) -> EngineEvent:
        """The next event, checking every ``poll`` seconds whether the client is still there
        (also while events keep arriving: a non-stream request receives every token event)."""
        interval = poll if poll is not None else POLL_S
        while True:
            now = self.loop.time()
            if now - self._last_check >= interval:
                self._last_check = now
                if await client.is_disconnected():
                    self.cancel()
                    raise ClientGone()
            self.check_timeout()
            ev = await self.next(max(0.0, interval - (self.loop.time() - self._last_check)))
            if ev is not None:
                return ev

    def check_timeout(self) -> None:
        """Cancel and raise 503 when nothing arrived for ``timeout`` seconds."""
        if self.timeout is not None and self.pending and self.loop.time() - self._last_event > self.timeout:
            self.cancel()
            raise ApiError(
                f"no result within the server timeout ({self.timeout:g} s); the request was cancelled",
                "unavailable_error",
            )

    async def collect(self, client: Disconnectable, poll: float | None = None) -> list[FinalEvent]:
        """Wait for every result (sorted by index). The first error cancels the siblings and
        is raised as ``ApiError``; a client disconnect cancels everything (``ClientGone``)."""
        finals: list[FinalEvent] = []
        try:
            while self.pending:
                ev = await self.next_or_gone(client, poll)
                if isinstance(ev, ErrorEvent):
                    self.cancel()
                    raise error_of(ev)
                if isinstance(ev, FinalEvent):
                    finals.append(ev)
        finally:
            self.cancel()
        return sorted(finals, key=lambda e: e.index)


def error_of(ev: ErrorEvent) -> ApiError:
    return from_event(ev.code, ev.message, ev.type, ev.extra)


def error_event_body(ev: ErrorEvent) -> dict[str, Any]:
    return error_of(ev).body()
