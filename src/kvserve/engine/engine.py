"""The engine thread and the facade the HTTP side talks to.

HTTP handlers call ``submit`` / ``cancel`` / snapshot methods from any thread; requests cross
into the engine thread through a queue and come back as events through the request's
``emit`` callback. The thread sleeps on the queue when there is nothing to do.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..cache.manager import KVCacheManager
from ..model.chat_template import ChatTemplate
from ..model.loader import LoadedModel
from ..model.runner import ModelRunner
from ..model.tokenizer import Tokenizer
from .request import Emit, GenerationRequest
from .sampling import Sampling
from .scheduler import Scheduler, SchedulerConfig

log = logging.getLogger("kvserve.engine")


@dataclass(frozen=True)
class EngineOptions:
    n_slots: int = 4
    n_ctx: int = 0  # total KV positions in the pool (0 = model's n_ctx_train)
    n_ctx_slot: int = 0  # per-slot limit (0 = n_ctx)
    n_batch: int = 2048
    n_ubatch: int = 512
    cont_batching: bool = True
    context_shift: bool = False
    slot_prompt_similarity: float = 0.1
    n_predict: int = -1
    page_size: int = 16
    cache_ram_mib: int = 8192  # -1 unlimited, 0 none
    kv_dtype: torch.dtype | None = None
    special: bool = False
    check_integrity: bool = False  # run the cache invariants after every step (tests)


class Engine:
    def __init__(self, loaded: LoadedModel, tokenizer: Tokenizer, template: ChatTemplate, opts: EngineOptions) -> None:
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.chat_template = template
        self.opts = opts
        cfg = loaded.cfg
        n_ctx = opts.n_ctx or cfg.n_ctx_train
        self.n_ctx = n_ctx
        self.n_ctx_slot = opts.n_ctx_slot or n_ctx
        self.n_slots = opts.n_slots
        ps = opts.page_size
        # Every slot can hold a partial page and a copy-on-write page beyond its share.
        n_pages = -(-n_ctx // ps) + 2 * opts.n_slots + 2
        self.runner = ModelRunner(loaded, n_pages, ps, opts.kv_dtype, opts.n_ubatch)
        page_bytes = self.runner.kv.bytes_per_page
        if opts.cache_ram_mib < 0:
            retain: int | None = None
        else:
            retain = min(n_pages, (opts.cache_ram_mib << 20) // page_bytes)
        self.cache = KVCacheManager(n_pages, ps, retain)
        self.page_bytes = page_bytes
        kv_dtype = str(self.runner.kv.dtype).replace("torch.", "")
        model_key = f"{loaded.digest}:{kv_dtype}:{cfg.rope_base}:{cfg.rope_scale}:{n_ctx}"
        self.sampling = Sampling(tokenizer, cfg.n_vocab, loaded.device)
        self.scheduler = Scheduler(
            SchedulerConfig(
                n_slots=opts.n_slots,
                n_ctx_slot=self.n_ctx_slot,
                n_batch=opts.n_batch,
                cont_batching=opts.cont_batching,
                context_shift=opts.context_shift,
                slot_prompt_similarity=opts.slot_prompt_similarity,
                n_predict=opts.n_predict,
                page_size=ps,
                special=opts.special,
                model_key=model_key,
            ),
            self.cache,
            tokenizer,
            self.sampling,
        )
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # guards snapshots against the engine thread's step
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ready = False
        self.step_hook: Callable[[Engine], None] | None = None
        self.last_error: BaseException | None = None

    # -- facade (any thread) ---------------------------------------------------------------
    def new_request_id(self) -> int:
        return next(self._ids)

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        self._inbox.put(("submit", (req, emit)))

    def cancel(self, request_id: int) -> None:
        self._inbox.put(("cancel", request_id))

    def call(self, fn: Callable[[], Any], timeout: float = 30.0) -> Any:
        """Run ``fn`` on the engine thread between steps and return its result."""
        box: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def run() -> None:
            try:
                box.put((True, fn()))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                box.put((False, e))

        self._inbox.put(("call", run))
        ok, val = box.get(timeout=timeout)
        if not ok:
            raise val
        return val

    # -- thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kvserve-engine", daemon=True)
        self._thread.start()
        self.ready = True

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=1.0) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = item
            if kind == "submit":
                self.scheduler.add(*arg)
            elif kind == "cancel":
                self.scheduler.cancel(arg)
            elif kind == "call":
                arg()
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            self._drain(block=not self.scheduler.has_work())
            self.step()

    def step(self) -> bool:
        """One schedule → run → commit. Returns whether a plan ran."""
        with self._lock:
            plan = self.scheduler.schedule()
            if plan is None:
                return False
            try:
                out = self.runner.run(plan)
            except Exception as e:  # a failed forward fails its requests, not the server
                log.exception("forward pass failed")
                self.last_error = e
                self.scheduler.fail_all([c.seq_id for c in plan.chunks], f"forward pass failed: {e}")
                return True
            self.scheduler.commit(plan, out)
            if self.opts.check_integrity:
                self.cache.check_integrity()
        if self.step_hook is not None:
            self.step_hook(self)
        return True
