"""An engine served over a pipe: the engine process's side of ``server/remote_engine``.

The HTTP side (parsing, validation, tokenization, SSE) runs in the process that listens; the
engine runs here, in a process of its own, so that the two never wait for one interpreter.
Messages are pickled tuples on a ``multiprocessing`` connection, each direction written by one
thread at a time:

- in (the HTTP process → here): ``("submit", GenerationRequest)``, ``("cancel", id)``,
  ``("call", call_id, name, args)``;
- out: ``("ready", info)`` once, ``("events", [event, ...])`` (every event emitted since the
  previous message, in order: one write per batch, not one per token), ``("reply", call_id, ok,
  value)``.

Reads of published state (snapshots, health, cache and memory info) are answered at once by the
reading thread; calls that may block (slot actions, embeddings, ranking) run in a thread of
their own, as the HTTP side ran them in a worker thread before.
"""

from __future__ import annotations

import logging
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any

from .errors import EngineError
from .request import ErrorEvent, FinalEvent

log = logging.getLogger("kvserve")

# what the HTTP side may read or call, and whether it may block (run in a thread of its own)
CALLS = {
    "health": False, "slots_snapshot": False, "metrics_snapshot": False, "cache_info": False,
    "memory_info": False, "slot_action": True, "embed": True, "rank": True,
}


def static_info(engine: Any) -> dict[str, Any]:
    """What the HTTP side reads of the engine that does not change while it serves."""
    return {
        "n_slots": engine.n_slots,
        "n_ctx_slot": engine.n_ctx_slot,
        "n_vocab": engine.sampling.n_vocab,
        "rerank_template": engine.rerank_template,
        "model_info": engine.model_info(),
    }


def error_reply(e: BaseException) -> tuple[str, Any]:
    """An exception as plain data, with what the HTTP side maps to a status
    (``server.errors.from_exception``): an ``EngineError``'s code, type and extra fields, a
    ``ValueError`` (a 400), any other exception's int ``code`` and its message."""
    if isinstance(e, EngineError):
        return ("engine", (e.message, e.code, e.type, e.extra))
    if isinstance(e, ValueError):
        return ("value", str(e))
    code = getattr(e, "code", None)
    return ("other", (str(e) or type(e).__name__, code if isinstance(code, int) else None))


class EngineHost:
    """Serves ``engine`` (started) over ``conn`` until the other side closes it."""

    def __init__(self, engine: Any, conn: Connection) -> None:
        self.engine = engine
        self.conn = conn
        self._out: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._send_lock = threading.Lock()
        self._sender = threading.Thread(target=self._send_events, name="kvserve-events", daemon=True)
        self._running: set[int] = set()  # requests submitted here without their terminal event yet

    def emit(self, ev: Any) -> None:
        """Every request's emit (engine thread): queued for the sender thread."""
        if isinstance(ev, (FinalEvent, ErrorEvent)):
            self._running.discard(ev.request_id)
        self._out.put(ev)

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self.conn.send(msg)

    def _send_events(self) -> None:
        get, get_nowait = self._out.get, self._out.get_nowait
        while True:
            batch = [get()]
            while True:
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            if batch[-1] is None:  # closing
                if len(batch) > 1:
                    self._send(("events", batch[:-1]))
                return
            try:
                self._send(("events", batch))
            except (OSError, EOFError, BrokenPipeError):
                return

    def serve(self) -> None:
        """Announce readiness, then answer messages until the connection closes."""
        self._sender.start()
        self._send(("ready", static_info(self.engine)))
        engine = self.engine
        try:
            while True:
                try:
                    msg = self.conn.recv()
                except (EOFError, OSError):
                    return
                kind = msg[0]
                if kind == "submit":
                    self._running.add(msg[1].id)
                    engine.submit(msg[1], self.emit)
                elif kind == "cancel":
                    engine.cancel(msg[1])
                elif kind == "call":
                    _, call_id, name, args = msg
                    if CALLS.get(name):
                        threading.Thread(target=self._call, args=(call_id, name, args), daemon=True,
                                         name=f"kvserve-{name}").start()
                    else:
                        self._call(call_id, name, args)
                else:
                    log.warning("engine process: unknown message %r", kind)
        finally:
            # the other side is gone (an HTTP process of several ended): nobody reads its
            # requests' events any more
            for rid in list(self._running):
                engine.cancel(rid)
            self._out.put(None)

    def _call(self, call_id: int, name: str, args: tuple) -> None:
        try:
            if name not in CALLS:
                raise AttributeError(name)
            value = getattr(self.engine, name)(*args)
            reply = ("reply", call_id, True, value)
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            reply = ("reply", call_id, False, error_reply(e))
        try:
            self._send(reply)
        except (OSError, EOFError, BrokenPipeError):
            pass
