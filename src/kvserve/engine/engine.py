"""The engine thread and the facade the HTTP side talks to.

HTTP handlers call ``submit`` / ``cancel`` / snapshot methods from any thread; requests cross
into the engine thread through a queue and come back as events through the request's
``emit`` callback. The thread sleeps on the queue when there is nothing to do.

Snapshots: after every schedule, step and queue drain the thread publishes an immutable
``EngineSnapshot`` by replacing one reference; readers never wait for a step. A schedule that
made a decode-only step and launched, released or preempted nothing is not published on its
own (its snapshot would differ from the previous one only in page counters); the end of its
step is.

Failures: an exception while scheduling or committing one request fails that request (500,
``got exception: ...``); a failed forward fails the requests of that step ("Compute error.").
Anything else that escapes a step fails every request and is checked: if the cache's
invariants still hold the engine goes on, else it stops serving (``health()`` reports the
error, new requests fail at once) instead of hanging.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..cache.manager import KVCacheManager
from ..grammar import GrammarCompiler
from ..model import heap, jit_watch
from ..model.chat_template import ChatTemplate
from ..model.loader import LoadedModel
from ..model.runner import ModelRunner
from ..model.tokenizer import Tokenizer
from . import introspect, slot_store
from ..plan import Plan
from .errors import EngineError
from .pipeline import StepLoop, overlap_wanted
from .request import Emit, ErrorEvent, GenerationRequest
from .sampling import Sampling
from .scheduler import Scheduler, SchedulerConfig
from .snapshot import EngineSnapshot, SlotView, build_snapshot
from .stats import EngineStats, throughput

log = logging.getLogger("kvserve.engine")

# A prefill's temporaries stay resident in glibc's arenas after they are freed (40-130 MiB on
# the CPU after a 700-token prompt, depending on the heap's layout; docs/benchmarks.md §6). Once
# the engine has been idle this long after one, they go back to the OS (``heap.trim``). Not
# sooner: the next prefill faults those pages in again, 1-3% more CPU time for that prefill
# (SmolLM2, Qwen2.5-0.5B, 700 tokens, one thread), which requests in a burst or a conversation
# should not pay.
TRIM_IDLE_S = 5.0


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
    # Host tier: evicted KV pages kept in host memory within the --cache-ram budget, which then
    # bounds that memory instead of the device pool's retained pages. None: KVSERVE_HOST_TIER=1
    # turns it on with CUDA (off by default: on the H200 a 4k-token 1B prompt loaded back took
    # longer than recomputing it, bench/host_tier.py); never on the CPU (the pool is host memory).
    host_tier: bool | None = None
    cache_idle_slots: bool = True  # False: KV is reused only by the slot that computed it
    kv_dtype: torch.dtype | None = None
    special: bool = False
    check_integrity: bool = False  # run the cache invariants after every step (tests)
    slot_save_path: str | None = None
    warmup: bool = False
    overlap: bool | None = None  # commit step N while step N+1 runs (None: when the runner is asynchronous)


class Engine:
    def __init__(self, loaded: LoadedModel, tokenizer: Tokenizer, template: ChatTemplate, opts: EngineOptions) -> None:
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.chat_template = template
        self.rerank_template: str | None = loaded.metadata.get("tokenizer.chat_template.rerank") or None
        self.opts = opts
        cfg = loaded.cfg
        n_ctx = opts.n_ctx or cfg.n_ctx_train
        self.n_ctx = n_ctx
        self.n_ctx_slot = opts.n_ctx_slot or n_ctx
        self.n_slots = opts.n_slots
        ps = opts.page_size
        # Every slot can hold a partial page and a copy-on-write page beyond its share.
        n_pages = -(-n_ctx // ps) + 2 * opts.n_slots + 2
        if opts.context_shift:
            # A shift rewrites the kept tail into fresh pages while the old ones are still
            # shared with the prefix index: room for one more slot's worth of pages.
            n_pages += -(-self.n_ctx_slot // ps)
        self.runner = ModelRunner(loaded, n_pages, ps, opts.kv_dtype, opts.n_ubatch, max_batch=opts.n_slots,
                                  n_batch=opts.n_batch)
        page_bytes = self.runner.kv.bytes_per_page
        host_on = opts.host_tier
        if host_on is None:
            host_on = loaded.device.type == "cuda" and os.environ.get("KVSERVE_HOST_TIER", "0") == "1"
        budget_pages = None if opts.cache_ram_mib < 0 else (opts.cache_ram_mib << 20) // page_bytes
        host_on = host_on and opts.cache_ram_mib != 0
        if host_on:  # the pool keeps what it has room for; the budget bounds the host tier
            retain: int | None = None
        else:
            retain = None if budget_pages is None else min(n_pages, budget_pages)
        self.cache = KVCacheManager(n_pages, ps, retain, host_tier=host_on, host_limit_pages=budget_pages)
        if self.cache.host is not None:
            self.runner.attach_host_tier(budget_pages)
        self.page_bytes = page_bytes
        kv_dtype = str(self.runner.kv.dtype).replace("torch.", "")
        model_key = f"{loaded.digest}:{kv_dtype}:{cfg.rope_base}:{cfg.rope_scale}:{n_ctx}"
        self.sampling = Sampling(tokenizer, cfg.n_vocab, loaded.device)
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()
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
                share_across_slots=opts.cache_idle_slots,
            ),
            self.cache,
            tokenizer,
            self.sampling,
        )
        self.loop = StepLoop(self.scheduler, self.runner, overlap_wanted(self.runner, opts.overlap))
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ready = False
        self.step_hook: Callable[[Engine], None] | None = None
        self.slot_save_path = opts.slot_save_path
        self.fatal: str | None = None  # why the engine stopped serving (None: it serves)
        self._changes_published = -1
        self._snap: EngineSnapshot = build_snapshot(self.scheduler, self.cache, page_bytes)
        self._scrape_lock = threading.Lock()  # /metrics scrapers only; never the engine thread
        self._scraped_rates = self._snap.rates
        self._trim_due = False  # a prefill ran since freed memory last went back to the OS
        self._busy_at = 0.0  # when the engine last ran a step (time.monotonic)

    # -- facade (any thread) ---------------------------------------------------------------
    def new_request_id(self) -> int:
        return next(self._ids)

    def submit(self, req: GenerationRequest, emit: Emit) -> None:
        req.t_submitted = time.perf_counter()
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

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        """Compiles request grammars against this model's vocabulary (built on first use;
        thread-safe: the HTTP side compiles before submitting)."""
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, self.sampling.n_vocab)
            return self._grammars

    def model_info(self) -> dict[str, Any]:
        return introspect.model_info(self.loaded, self.tokenizer)

    def snapshot(self) -> EngineSnapshot:
        """The state published at the end of the latest step (never waits)."""
        return self._snap

    def slots_snapshot(self) -> tuple[SlotView, ...]:
        return tuple(self._snap.slots)

    def metrics_snapshot(self) -> dict[str, float]:
        """The latest counters; the throughput gauges cover the time since the previous call
        (llama-server resets them on each scrape)."""
        snap = self._snap
        with self._scrape_lock:
            prev, self._scraped_rates = self._scraped_rates, snap.rates
        m = dict(snap.metrics)
        m.update(throughput(snap.rates, prev))
        return m

    @property
    def scraped_rates(self) -> tuple[int, float, int, float]:
        """The throughput counters at the latest /metrics scrape (see ``metrics_snapshot``)."""
        with self._scrape_lock:
            return self._scraped_rates

    def adopt_counters(self, stats: EngineStats, scraped_rates: tuple[int, float, int, float]) -> None:
        """Continue another engine's cumulative counters (a reload after sleeping). Before ``start``."""
        assert self._thread is None
        self.scheduler.stats = stats
        with self._scrape_lock:
            self._scraped_rates = scraped_rates
        self._snap = build_snapshot(self.scheduler, self.cache, self.page_bytes)

    def cache_info(self) -> dict[str, Any]:
        """The shared prefix cache's budget and state, for /props."""
        return dict(self._snap.cache)

    def health(self) -> str | None:
        """None while the engine serves; else why it does not (``/health`` answers 503)."""
        if self.fatal is not None:
            return self.fatal
        t = self._thread
        if t is not None and not t.is_alive() and not self._stop.is_set():
            return "the engine thread exited"
        return None

    def memory_info(self) -> dict[str, Any]:
        """Resident bytes by owner, for the load log and /props."""
        summary = self.loaded.summary
        host = self.runner.host_kv
        return {
            "weights": self.loaded.weights,
            "weight_bytes": self.loaded.weight_bytes,
            "weight_paths": summary.as_dict() if summary is not None else {},
            "kv_pool_pages": self.cache.pool.n_pages,
            "kv_pool_bytes": self.cache.pool.n_pages * self.page_bytes,
            "cache_ram_budget_bytes": self._snap.cache["cache_ram_budget_bytes"],
            "host_tier": host is not None,
            "host_tier_allocated_bytes": 0 if host is None else host.allocated_bytes,
        }

    def slot_action(self, id_slot: int, action: str, filename: str, tenant: str = "") -> dict[str, Any]:
        slot_id = id_slot % self.n_slots
        if self._snap.slots[slot_id].is_processing:
            raise EngineError("slot is busy", 503, "unavailable_error")
        if action == "erase":
            return self.call(lambda: slot_store.erase(self, slot_id))
        if not self.slot_save_path:
            raise EngineError("This server does not support slots action. Start it with `--slot-save-path`", 501)
        path = os.path.join(self.slot_save_path, filename)
        if action == "save":
            return self.call(lambda: slot_store.save(self, slot_id, path, tenant))
        if action == "restore":
            return self.call(lambda: slot_store.restore(self, slot_id, path, tenant))
        raise EngineError("Invalid action", 400)

    def embed(self, token_lists: list[list[int]], pooling: str) -> list[list[list[float]]]:
        return self.call(lambda: [self._embed_one(t, pooling) for t in token_lists])

    def rank(self, token_lists: list[list[int]]) -> list[float]:
        """One relevance score per token list (rank pooling, see ``model/rank_head.py``)."""
        head = self.loaded.rank_head
        assert head is not None
        return self.call(lambda: [head.score(self._hidden(t, causal_limit=True)[-1]) for t in token_lists])

    def _hidden(self, tokens: list[int], causal_limit: bool = False) -> torch.Tensor:
        """Final-normed hidden states of ``tokens`` computed alone (no cache). A pooling that
        reads every token is limited to one physical batch, as in llama-server; one that reads
        the last token of this causal model (``causal_limit``) only to the slot's context."""
        if causal_limit and len(tokens) > self.n_ctx_slot:
            raise EngineError(
                f"request ({len(tokens)} tokens) exceeds the available context size ({self.n_ctx_slot} tokens), "
                "try increasing it", 400, "exceed_context_size_error",
                {"n_prompt_tokens": len(tokens), "n_ctx": self.n_ctx_slot})
        if not causal_limit and len(tokens) > self.opts.n_ubatch:
            raise EngineError(
                f"input ({len(tokens)} tokens) is too large to process. increase the physical batch size "
                f"(current batch size: {self.opts.n_ubatch})", 500, "server_error")
        seq_id = -2_000_000 - self.new_request_id()
        self._trim_due = True
        self._busy_at = time.monotonic()
        self.cache.begin(seq_id, ("embedding",), tokens, use_cache=False)
        try:
            table = tuple(self.cache.reserve(seq_id, len(tokens)))
            self.flush_copies()
            return self.runner.hidden_states(tokens, table)
        finally:
            self.cache.finish(seq_id, tokens, len(tokens), donate=False)

    def _embed_one(self, tokens: list[int], pooling: str) -> list[list[float]]:
        h = self._hidden(tokens, causal_limit=pooling in ("last", "rank"))
        if pooling == "none":
            return h.tolist()
        if pooling == "cls":
            return [h[0].tolist()]
        if pooling == "last":
            return [h[-1].tolist()]
        if pooling == "rank":
            assert self.loaded.rank_head is not None
            return [self.loaded.rank_head.pooled(h[-1]).tolist()]
        return [h.mean(0).tolist()]

    def flush_copies(self) -> None:
        """Run the host-tier copies the cache has issued; anything that touches KV pages outside
        a plan calls this first (plans carry their own)."""
        self.runner.apply_copies(self.cache.take_copies())

    # -- thread ----------------------------------------------------------------------------
    def warmup(self) -> None:
        """One tiny forward pass so the first request does not pay for lazy initialisation."""
        tok = self.tokenizer.bos_id if self.tokenizer.bos_id is not None else 0
        self._embed_one([tok], "last")

    def start(self) -> None:
        if self.opts.warmup:
            self.warmup()
        jit_watch.serving()  # a Triton compile from now on is logged: start-up missed that variant
        # KVSERVE_SWITCH_INTERVAL_MS: the interpreter's switch interval (how long the HTTP thread
        # may keep it while the engine thread waits for it; Python's default is 5 ms). Measured on
        # an H200, 64 streams: 0.25 ms gave 10,745 tok/s, the default 11,630 (docs/benchmarks.md).
        ms = os.environ.get("KVSERVE_SWITCH_INTERVAL_MS")
        if ms is not None:
            sys.setswitchinterval(float(ms) / 1000.0)
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
                if self.fatal is not None:
                    req, emit = arg
                    emit(ErrorEvent(req.id, req.index, 503, self.fatal, "unavailable_error"))
                else:
                    self._add(*arg)
            elif kind == "cancel":
                self.scheduler.cancel(arg)
            elif kind == "call":
                arg()
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
        self._publish()

    def _add(self, req: GenerationRequest, emit: Emit) -> None:
        try:
            self.scheduler.add(req, emit)
        except Exception as e:  # noqa: BLE001 - this request's failure, not the server's
            log.exception("task %d: intake failed", req.id)
            emit(ErrorEvent(req.id, req.index, 500, f"got exception: {e}", "server_error"))

    def _publish(self) -> None:
        self._changes_published = self.scheduler.n_changes
        self._snap = build_snapshot(self.scheduler, self.cache, self.page_bytes)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stop.is_set():
            try:
                idle = not self.scheduler.has_work() and self.loop.in_flight is None
                if idle and self._trim_due and time.monotonic() - self._busy_at >= TRIM_IDLE_S:
                    self._trim_due = False
                    heap.trim()
                self._drain(block=self.fatal is not None or idle)
                if self.fatal is None:
                    self.step()
            except Exception as e:  # noqa: BLE001 - reported through health(), never silent
                log.exception("engine loop failed")
                self._stop_serving(f"engine loop failed: {type(e).__name__}: {e}")

    def step(self) -> bool:
        """One step of the loop (schedule → run → commit; with overlap the commit of the step
        before), then publish a snapshot. Returns whether anything ran."""
        try:
            return self._step()
        except Exception as e:  # noqa: BLE001 - a bug outside any one request's handling
            log.exception("engine step failed")
            self._recover(e)
            return True
        finally:
            self._publish()

    def _step(self) -> bool:
        ran = self.loop.step(self._before_launch)
        if ran:
            self._busy_at = time.monotonic()
            if self.opts.check_integrity:
                self.cache.check_integrity()
            if self.step_hook is not None:
                self.step_hook(self)
        return ran

    def _before_launch(self, plan: Plan) -> None:
        prefill = any(len(c.tokens) != 1 for c in plan.chunks)
        self._trim_due = self._trim_due or prefill
        if self.scheduler.n_changes != self._changes_published or prefill:
            self._publish()  # what is running during the forward (admissions, slots)

    def _recover(self, e: BaseException) -> None:
        """Fail every request; go on only if the cache's invariants still hold."""
        msg = f"got exception: {e}"
        self.loop.drop()
        try:
            self.scheduler.fail_everything(msg)
            self.cache.check_integrity()
        except Exception as e2:  # noqa: BLE001
            log.exception("engine state is inconsistent")
            self._stop_serving(f"engine stopped after an internal error: {type(e2).__name__}: {e2}")

    def _stop_serving(self, reason: str) -> None:
        self.fatal = reason
        self.loop.drop()
        try:
            self.scheduler.fail_everything(reason, 503, "unavailable_error")
            self._publish()
        except Exception:  # noqa: BLE001 - health() reports the reason without them
            log.exception("failing the remaining requests failed")
