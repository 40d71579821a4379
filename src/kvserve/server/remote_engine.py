"""``EngineAPI`` for an engine in a process of its own (``engine/host`` is the other side).

The HTTP process keeps everything that turns bodies into requests and events into responses —
parsing, validation, tokenization, chat templates, grammar compilation, SSE — and the engine
process runs admission and steps. Each process has its own interpreter, so a burst of long
bodies being parsed and tokenized no longer waits with the engine thread for one interpreter
(and the engine's steps no longer delay the parsing).

The tokenizer, the chat template and the grammar compiler are built here from the model file's
header, as the engine process builds its own from the same header. Requests cross the pipe
pickled (a compiled grammar as its spec, compiled again on the other side from the engine's
cache); events come back in batches and are handed to each request's ``emit`` on the reading
thread, as the engine thread handed them before. Published state (slots, metrics, health, cache
and memory info) is asked for when read.

If the engine process exits, so does this one, with its exit status (a model that cannot load
ends the server as before).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import threading
import time
from typing import Any, Callable

from kvserve.engine.errors import EngineError
from kvserve.engine.host import CALLS
from kvserve.engine.request import Emit, ErrorEvent, FinalEvent, GenerationRequest
from kvserve.model import heap

log = logging.getLogger("kvserve")

# How long a call waits for the engine process: reads of published state are answered by its
# reading thread at once; slot actions, embeddings and ranking wait for the engine thread
# (``Engine.call``: 30 s), whose own timeout then comes back first
READ_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 60.0


class RemoteError(RuntimeError):
    """An engine-process call failed with an exception that is not an ``EngineError``."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


def reraise(err: tuple[str, Any]) -> None:
    """Raise what ``engine.host.error_reply`` made of an engine-process exception: the same
    status and message from ``server.errors.from_exception`` as the exception itself."""
    kind, data = err
    if kind == "engine":
        message, code, typ, extra = data
        raise EngineError(message, code, typ, extra)
    if kind == "value":
        raise ValueError(data)
    message, code = data
    raise RemoteError(message, code)


class RemoteEngine:
    """Starts the engine process (``target(conn, *args)``, a spawned process) and stands for its
    engine. ``text_side()`` builds (tokenizer, chat template) here; ``ready`` once both are up."""

    def __init__(self, n_slots: int, target: Callable[..., None] | None, args: tuple,
                 text_side: Callable[[], tuple[Any, Any]], on_exit: Callable[[int], None] | None = None,
                 workers: int = 1, conn: Any = None, worker: int = 0) -> None:
        """``target``: the engine process's function, started here with a pipe's end and ``args``
        (and, for ``workers`` > 1, the engine's ends of the other HTTP processes' pipes, whose
        ends here are ``worker_conns``). ``conn`` instead of ``target``: the pipe of an HTTP
        process ``worker`` of ``workers`` (``server/http_workers``) to an engine process started by
        the first; request ids are then those ≡ ``worker`` (mod ``workers``), unique across them."""
        self.n_slots = n_slots
        self._info: dict[str, Any] | None = None
        self._text: tuple[Any, Any] | None = None
        self._text_side = text_side
        self._emits: dict[int, Emit] = {}
        self._calls: dict[int, list[Any]] = {}  # call id -> [event, reply]
        self._call_ids = itertools.count(1)
        self._ids = itertools.count(1 + worker, max(1, workers))
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._grammars: Any = None
        self._on_exit = on_exit or (lambda code: os._exit(code))
        self._closing = False
        self.worker_conns: list[Any] = []
        self.others_ready: Callable[[], bool] | None = None
        self.process: Any = None
        if conn is not None:
            self._conn = conn
        else:
            ctx = multiprocessing.get_context("spawn")
            self._conn, child = ctx.Pipe(duplex=True)
            engine_ends = []
            for _ in range(workers - 1):
                here, there = ctx.Pipe(duplex=True)
                self.worker_conns.append(here)
                engine_ends.append(there)
            self.process = ctx.Process(target=target, args=(child, *args, engine_ends), name="kvserve-engine",
                                       daemon=True)
            self.process.start()
            child.close()
            for end in engine_ends:
                end.close()
        threading.Thread(target=self._read, name="kvserve-engine-events", daemon=True).start()
        threading.Thread(target=self._build_text_side, name="kvserve-text-side", daemon=True).start()

    # -- start-up and the reading thread -------------------------------------------------------
    def _build_text_side(self) -> None:
        try:
            self._text = self._text_side()
        except BaseException:  # noqa: BLE001 - as a model that cannot load: the server ends
            log.exception("failed to build the tokenizer and chat template")
            self.close()
            self._on_exit(1)
            return
        while self._info is None and not self._closing:
            time.sleep(0.05)
        if not self._closing:
            # what start-up left here (torch's modules, the tokenizer, the app) out of every full
            # collection, as in the engine's process (model/heap.freeze): else one falls on a
            # burst's requests now and then
            heap.freeze()

    def _read(self) -> None:
        conn = self._conn
        try:
            while True:
                msg = conn.recv()
                kind = msg[0]
                if kind == "events":
                    self._deliver(msg[1])
                elif kind == "reply":
                    _, call_id, ok, value = msg
                    with self._lock:
                        box = self._calls.pop(call_id, None)
                    if box is not None:
                        box[1] = (ok, value)
                        box[0].set()
                elif kind == "ready":
                    self._info = msg[1]
        except (EOFError, OSError):
            pass
        if self._closing:
            return
        code = None
        if self.process is not None:
            self.process.join(timeout=10)
            code = self.process.exitcode
        log.error("the engine process exited (status %s)", code)
        self._on_exit(code if isinstance(code, int) and code > 0 else 1)

    def _deliver(self, events: list[Any]) -> None:
        emits = self._emits
        for ev in events:
            # exactly one terminal event per request: its emit is dropped with it
            emit = emits.pop(ev.request_id, None) if isinstance(ev, (FinalEvent, ErrorEvent)) \
                else emits.get(ev.request_id)
            if emit is None:
                continue
            try:
                emit(ev)
            except Exception:  # noqa: BLE001 - one request's failure is not the others'
                log.exception("emit failed")

    def _send(self, msg: Any) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def _call(self, name: str, *args: Any) -> Any:
        if self._info is None:
            raise AttributeError(name)
        call_id = next(self._call_ids)
        box: list[Any] = [threading.Event(), None]
        with self._lock:
            self._calls[call_id] = box
        self._send(("call", call_id, name, args))
        limit = CALL_TIMEOUT_S if CALLS[name] else READ_TIMEOUT_S  # blocking calls wait longer
        if not box[0].wait(limit):
            with self._lock:
                self._calls.pop(call_id, None)
            raise EngineError(f"the engine did not answer {name} in {limit:g} s", 503, "unavailable_error")
        ok, value = box[1]
        if not ok:
            reraise(value)
        return value

    def close(self) -> None:
        """Ends the engine process (the server is shutting down)."""
        self._closing = True
        try:
            self._conn.close()
        except OSError:
            pass
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()

    # -- EngineAPI ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        # (the first of several HTTP processes: ready once the others listen too, ``http_workers``)
        return self._info is not None and self._text is not None and (self.others_ready is None or self.others_ready())

    def _static(self, name: str) -> Any:
        info = self._info
        if info is None or self._text is None:
            raise AttributeError(name)
        return info[name]

    @property
    def tokenizer(self) -> Any:
        if self._text is None:
            raise AttributeError("tokenizer")
        return self._text[0]

    @property
    def chat_template(self) -> Any:
        if self._text is None:
            raise AttributeError("chat_template")
        return self._text[1]

    @property
    def n_ctx_slot(self) -> int:
        return self._static("n_ctx_slot")

    @property
    def rerank_template(self) -> str | None:
        return self._static("rerank_template")

    @property
    def grammar_compiler(self) -> Any:
        from kvserve.grammar.compiler import GrammarCompiler

        with self._lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self._static("n_vocab"))
            return self._grammars

    def model_info(self) -> dict[str, Any]:
        return dict(self._static("model_info"))

    def new_request_id(self) -> int:
        return next(self._ids)

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        self._emits[req.id] = emit
        req.t_submitted = time.perf_counter()
        self._send(("submit", req))

    def cancel(self, request_id: int) -> None:
        self._send(("cancel", request_id))

    def health(self) -> str | None:
        if self.process is not None and not self.process.is_alive():
            return "the engine process exited"
        return self._call("health")

    def slots_snapshot(self) -> tuple[Any, ...]:
        return self._call("slots_snapshot")

    def metrics_snapshot(self) -> dict[str, float]:
        return self._call("metrics_snapshot")

    def cache_info(self) -> dict[str, Any]:
        return self._call("cache_info")

    def memory_info(self) -> dict[str, Any]:
        return self._call("memory_info")

    def slot_action(self, id_slot: int, action: str, filename: str, tenant: str = "") -> dict[str, Any]:
        return self._call("slot_action", id_slot, action, filename, tenant)

    def embed(self, token_lists: list[list[int]], pooling: str) -> list[list[list[float]]]:
        return self._call("embed", token_lists, pooling)

    def rank(self, token_lists: list[list[int]]) -> list[float]:
        return self._call("rank", token_lists)
