"""The scheduler: turns queued requests into plans and plan results into tokens and events.

One engine step is ``plan = schedule()`` → ``out = runner.run(plan)`` → ``commit(plan, out)``.
``schedule`` admits waiting requests to slots, looks up the prefix cache, and builds the batch:
every generating sequence's next token first, then prompt chunks in arrival order until the
batch holds ``n_batch`` tokens (so a long prompt delays running streams by at most one chunk).
``commit`` advances counters, publishes computed pages, samples, applies stop rules and emits
(``commit.py``: the scheduler's base class).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from ..cache.page_pool import OutOfPages
from .commit import Commit, Launched
from .context_shift import context_shift
from .errors import exceed_context
from .outcome import cancelled_event, final_event
from .output import TextOutput
from ..plan import Plan, SeqChunk
from .request import CacheIdentity, Emit, ErrorEvent, GenerationRequest, ProgressEvent
from .sequence import Sequence, SeqState
from .slot_choice import SlotChooser
from .slots import Slot, key_in_range, lcp_len, prompt_key
from .snapshot import IDLE
from .stats import EngineStats, timings

__all__ = ["Launched", "Scheduler", "SchedulerConfig"]

log = logging.getLogger("kvserve.engine")
T = TypeVar("T")


@dataclass(frozen=True)
class SchedulerConfig:
    n_slots: int
    n_ctx_slot: int
    n_batch: int = 2048
    cont_batching: bool = True
    context_shift: bool = False
    slot_prompt_similarity: float = 0.1
    n_predict: int = -1  # server default (-n)
    page_size: int = 16
    special: bool = False  # render special tokens in output text (-sp)
    model_key: str = ""  # model part of the cache identity
    share_across_slots: bool = True  # --cache-idle-slots; False keeps each slot's KV to itself


class Scheduler(Commit):
    def __init__(self, cfg: SchedulerConfig, cache: Any, tokenizer: Any, sampling: Any) -> None:
        """``cache``: KVCacheManager; ``sampling``: object with ``make(params, history)`` →
        per-sequence sampler and ``sample(logits [B, V], samplers)`` → results."""
        self.cfg = cfg
        self.cache = cache
        self.tok = tokenizer
        self.sampling = sampling
        self.slots = [Slot(i, cfg.n_ctx_slot) for i in range(cfg.n_slots)]
        self.chooser = SlotChooser()  # choose_slot's rule over a sorted index of the slots' tokens
        self.waiting: deque[tuple[GenerationRequest, Emit]] = deque()
        self.running: dict[int, Sequence] = {}  # arrival order (dicts keep insertion order)
        self.cancelled: set[int] = set()
        self.stats = EngineStats()
        self.eog = frozenset(tokenizer.eog_ids)
        self.n_changes = 0  # launches, releases and preemptions so far (what slot views show)
        self._sharers: list[Sequence] | None = None  # while admitting: see schedule()

    # -- intake ----------------------------------------------------------------------------
    def add(self, req: GenerationRequest, emit: Emit) -> None:
        n = len(req.prompt_tokens)
        key = req.prompt_key
        if key is not None and len(key) == 4 * n:  # made with the request (the HTTP side's intake)
            valid = key_in_range(key, self.tok.n_vocab)
        else:
            valid, req.prompt_key = prompt_key(req.prompt_tokens, self.tok.n_vocab)
        if not valid:
            emit(ErrorEvent(req.id, req.index, 400, "Prompt contains invalid tokens", "invalid_request_error"))
            return
        if n >= self.cfg.n_ctx_slot:
            code, msg, typ, extra = exceed_context(n, self.cfg.n_ctx_slot)
            emit(ErrorEvent(req.id, req.index, code, msg, typ, extra))
            return
        if req.params.id_slot < -1:
            emit(ErrorEvent(req.id, req.index, 400, f"Invalid id_slot: {req.params.id_slot}", "invalid_request_error"))
            return
        self.waiting.append((req, emit))

    def cancel(self, req_id: int) -> None:
        self.cancelled.add(req_id)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.cancelled)

    @property
    def n_deferred(self) -> int:
        return len(self.waiting)

    # -- schedule --------------------------------------------------------------------------
    def schedule(self) -> Plan | None:
        """The batch: decode tokens (oldest first), then admission, then prompt chunks.

        KV pages: a decoding sequence that cannot get its next page takes one from the
        youngest sequence holding pages (preemption: that one's KV is donated or freed and
        recomputed later); then a sequence is admitted with pages for everything it must
        compute before its next sample (``n_target``), or waits. The oldest sequence is
        never preempted while a younger one holds pages, so it always progresses: no
        livelock.

        An exception while handling one sequence fails that sequence (500) and scheduling
        goes on with the others.
        """
        self._apply_cancellations()
        chunks: list[SeqChunk] = []
        in_plan: set[int] = set()
        for seq in [s for s in self.running.values() if s.state is SeqState.DECODE]:
            if seq.state is not SeqState.DECODE:  # preempted by an older one just now
                continue
            table = self._guarded(seq, self._decode_pages, seq, in_plan)
            if table is not None:
                chunks.append(SeqChunk(seq.id, (seq.tokens[seq.n_computed],), seq.n_computed, table, "last"))
                in_plan.add(seq.id)
        # Admission takes what the decoding sequences left: older waiting ones first.
        self._pages_short = False
        ps = self.cfg.page_size  # the sequences still computing a prefix others may wait for
        self._sharers = [s for s in self.running.values() if s.state is SeqState.PREFILL
                         and s.use_cache and s.n_computed < s.n_prompt // ps * ps]
        try:
            for seq in list(self.running.values()):
                if seq.state in (SeqState.WAIT_SHARED, SeqState.PREEMPTED):
                    self._guarded(seq, self._try_begin)
            self._admit()
        finally:
            self._sharers = None
        budget = self.cfg.n_batch - len(chunks)
        if self.cfg.cont_batching or not chunks:
            for seq in list(self.running.values()):
                if budget <= 0:
                    break
                if seq.state is not SeqState.PREFILL:
                    continue
                n = min(budget, seq.n_target - seq.n_computed)
                table = self._guarded(seq, self._reserve, seq, seq.n_computed + n, in_plan)
                if table is None:
                    continue
                done = seq.n_computed + n == seq.n_target
                toks = tuple(seq.tokens[seq.n_computed : seq.n_computed + n])
                chunks.append(SeqChunk(seq.id, toks, seq.n_computed, table, "last" if done else "none"))
                in_plan.add(seq.id)
                if not seq.t_prompt_start:
                    seq.t_prompt_start = time.perf_counter()
                budget -= n
        # A sequence's moves travel with its own next forward (the cache's contract), so a
        # failed forward never loses the moves of a sequence it did not run.
        moves: list[Any] = []
        for c in chunks:
            seq = self.running[c.seq_id]  # a sequence with a chunk is neither failed nor preempted
            moves.extend(seq.pending_moves)
            seq.pending_moves = ()
        if not chunks:
            return None
        return Plan(tuple(chunks), tuple(moves), self.cache.take_copies())

    def _guarded(self, seq: Sequence, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)`` for ``seq`` (``fn(seq)`` without args); an exception fails ``seq``
        with llama-server's ``got exception`` 500 and returns None."""
        try:
            return fn(*args) if args else fn(seq)
        except Exception as e:  # noqa: BLE001 - one request's failure, not the server's
            self.crash([seq], e)
            return None

    def crash(self, seqs: Iterable[Sequence], e: BaseException) -> None:
        """Fail ``seqs`` after an unexpected exception while handling them."""
        seqs = [s for s in seqs if s.state is not SeqState.DONE]
        log.error("tasks %s: %s: %s", [s.id for s in seqs], type(e).__name__, e, exc_info=e)
        for seq in seqs:
            self._fail(seq, 500, f"got exception: {e}", "server_error")

    def _decode_pages(self, seq: Sequence, in_plan: set[int]) -> tuple[int, ...] | None:
        """Pages for ``seq``'s next token (context shift first when the slot is full)."""
        if seq.n_computed + 1 >= self.cfg.n_ctx_slot:
            if not self._with_room(seq, in_plan, lambda: context_shift(seq, self.cfg, self.cache, self.tok.add_bos)):
                return None
        return self._reserve(seq, seq.n_computed + 1, in_plan)

    def _reserve(self, seq: Sequence, n: int, in_plan: set[int]) -> tuple[int, ...] | None:
        table: list[tuple[int, ...]] = []
        ok = self._with_room(seq, in_plan, lambda: table.append(tuple(self.cache.reserve(seq.id, n))))
        return table[0] if ok else None

    def _with_room(self, seq: Sequence, in_plan: set[int], fn: Callable[[], Any]) -> bool:
        """Run ``fn`` (which may raise ``OutOfPages``), preempting younger sequences that
        hold pages until it succeeds. With none left, ``seq`` itself is preempted when an
        older sequence holds pages (it resumes when they are done), else it fails with
        llama-server's error. Returns whether ``fn`` ran."""
        while True:
            try:
                fn()
                return True
            except OutOfPages:
                victim = self._youngest_holder(after=seq, exclude=in_plan)
                if victim is not None:
                    self._preempt(victim)
                    continue
                if self._youngest_holder(exclude={seq.id}) is not None:
                    self._preempt(seq)
                else:
                    self._fail(seq, 500, "Context size has been exceeded.", "server_error")
                return False

    def _youngest_holder(self, after: Sequence | None = None, exclude: set[int] = set()) -> Sequence | None:
        """The youngest running sequence holding KV pages (younger than ``after``)."""
        for s in reversed(self.running.values()):
            if after is not None and s is after:
                return None
            if s.id not in exclude and s.state in (SeqState.PREFILL, SeqState.DECODE):
                return s
        return None

    def _preempt(self, seq: Sequence) -> None:
        """Give back ``seq``'s pages (its computed KV donated to the cache when it may be
        shared, so the recompute is mostly a cache hit); it keeps its slot and output."""
        log.info("task %d: preempted, KV pages exhausted (%d tokens to recompute)", seq.id, len(seq.tokens))
        self.cache.finish(seq.id, seq.tokens, seq.n_computed, donate=seq.use_cache)
        seq.state = SeqState.PREEMPTED
        seq.pending_moves = ()
        seq.n_computed = 0
        seq.n_preempted += 1
        self.stats.preemptions += 1
        self.n_changes += 1

    def _apply_cancellations(self) -> None:
        if not self.cancelled:
            return
        ids = self.cancelled
        self.cancelled = set()
        kept: deque[tuple[GenerationRequest, Emit]] = deque()
        for req, emit in self.waiting:
            if req.id not in ids:
                kept.append((req, emit))
                continue
            self.stats.requests_cancelled += 1
            emit(cancelled_event(req))
        self.waiting = kept
        for rid in ids:
            seq = self.running.get(rid)
            if seq is not None:
                seq.cancelled = True
                self.stats.requests_cancelled += 1
                self._release(seq)
                seq.emit(final_event(seq, self.tok))

    def _admit(self) -> None:
        kept: deque[tuple[GenerationRequest, Emit]] = deque()
        blocked = False
        if self.waiting:  # and again only after a release: a launch changes no slot's tokens
            self.chooser.sync(self.slots)
        while self.waiting:
            req, emit = self.waiting.popleft()
            if blocked:
                kept.append((req, emit))
                continue
            slot = self.chooser.choose(self.slots, req.prompt_tokens, req.params.id_slot,
                                       self.cfg.slot_prompt_similarity, req.prompt_key, sync=False)
            if slot is None or slot.busy:
                kept.append((req, emit))
                # A request pinned to a busy slot waits without blocking the others; a free
                # request that finds no slot keeps its place and everyone behind it waits.
                blocked = req.params.id_slot == -1
                continue
            n = self.n_changes
            self._launch(req, emit, slot)
            if self.n_changes != n + 1:
                self.chooser.sync(self.slots)
        self.waiting = kept

    def _launch(self, req: GenerationRequest, emit: Emit, slot: Slot) -> None:
        self.n_changes += 1
        params = req.params
        ns = self.namespace(req.identity, slot.id)
        sampler = self.sampling.make(params.sampling, req.prompt_tokens, params.grammar,
                                     params.reasoning_budget)
        seq = Sequence(
            req=req,
            emit=emit,
            slot_id=slot.id,
            namespace=ns,
            sampler=sampler,
            streamer=TextOutput(self.tok, params.stop, self.cfg.special, params.n_indent),
            tokens=list(req.prompt_tokens),
            n_prompt=len(req.prompt_tokens),
            n_target=len(req.prompt_tokens),
            state=SeqState.WAIT_SHARED,
        )
        slot.seq_id = req.id
        slot.id_task = req.id
        slot.sampling = params.sampling
        self.running[req.id] = seq
        self._guarded(seq, self._try_begin)

    def identity_key(self, identity: CacheIdentity) -> tuple[Any, ...]:
        """The cache identity: this engine's model key plus the request's tenant/adapters/media."""
        return (self.cfg.model_key,) + tuple(identity.key()[1:])

    def namespace(self, identity: CacheIdentity, slot_id: int) -> tuple[Any, ...]:
        """Where a request's KV is looked up and donated: its identity, and its slot too when
        KV is not shared across slots (--no-cache-idle-slots)."""
        ns = self.identity_key(identity)
        return ns if self.cfg.share_across_slots else ns + (("slot", slot_id),)

    def _try_begin(self, seq: Sequence) -> None:
        """Look up the cache and take the pages ``seq`` needs up to ``n_target``, or leave it
        waiting (WAIT_SHARED / PREEMPTED). First wait while an earlier running request is
        computing a prefix this one shares (so a burst on a new document computes it once);
        once one sequence waits for pages, later ones wait behind it (first come, first
        served)."""
        if self._pages_short:
            return
        ps = self.cfg.page_size
        key = seq.req.prompt_key if seq.state is SeqState.WAIT_SHARED else None  # the prompt's bytes
        key = key if key is not None and len(key) == 4 * len(seq.tokens) else None  # (a faster lookup)
        if seq.use_cache and self.cache.enabled and seq.state is SeqState.WAIT_SHARED:
            have = -1  # what the cache holds of seq's tokens: looked up when first needed
            for other in self.running.values() if self._sharers is None else self._sharers:
                if other is seq or other.state is not SeqState.PREFILL or other.namespace != seq.namespace:
                    continue
                most = min(other.n_prompt, len(seq.tokens))  # the prefix they can share at most
                if not other.use_cache or other.n_computed >= (most // ps) * ps:
                    continue  # nothing to wait for, whatever they share
                if have < 0:
                    have = self.cache.lookup_len(seq.namespace, seq.tokens, key)
                if most - have < ps:
                    continue
                # sharing a page beyond what the cache holds needs the page after it equal: one
                # short comparison rules most pairs out (a burst of n requests makes n² pairs)
                if other.tokens[have : have + ps] != seq.tokens[have : have + ps]:
                    continue
                shared = min(lcp_len(other.tokens, seq.tokens), other.n_prompt)
                if shared - have >= ps and other.n_computed < (shared // ps) * ps:
                    return  # stay WAIT_SHARED; re-checked every step
        resumed = seq.state is SeqState.PREEMPTED
        seq.n_target = len(seq.tokens)
        try:
            adm = self.cache.begin(
                seq.id, seq.namespace, seq.tokens, seq.use_cache, seq.req.params.n_cache_reuse, seq.n_target,
                key,
            )
        except OutOfPages:
            if self._youngest_holder(exclude={seq.id}) is None:
                # Nothing holds pages that could come back: it can never fit.
                self._fail(seq, 500, "Context size has been exceeded.", "server_error")
            else:
                self._pages_short = True
            return
        seq.n_computed = adm.n_cached
        seq.pending_moves = adm.moves
        seq.state = SeqState.PREFILL
        if self._sharers is not None and seq.use_cache and seq.n_computed < seq.n_prompt // ps * ps:
            self._sharers.append(seq)
        if resumed:
            log.info("task %d: resumed, %d tokens, cached %d", seq.id, seq.n_target, adm.n_cached)
            return
        seq.n_cached = adm.n_cached
        slot = self.slots[seq.slot_id]
        slot.n_prompt_cache = adm.n_cached
        self._progress(seq, time.perf_counter())  # the 0% event
        log.info(
            "task %d: slot %d, prompt %d tokens, cached %d (prefix %d, shift %d), lookup stopped at %d: %s",
            seq.id, seq.slot_id, seq.n_prompt, adm.n_cached, adm.n_reused_prefix, adm.n_reused_shift,
            adm.n_hit, adm.stop_reason,
        )

    def _progress(self, seq: Sequence, now: float) -> None:
        """Prompt-progress event of a streaming request that asked for them (return_progress)."""
        p = seq.req.params
        if p.stream and p.return_progress:
            ms = (now - seq.t_prompt_start) * 1000.0 if seq.t_prompt_start else 0.0
            tim = timings(seq.n_computed, seq.n_cached, 0, ms, 0.0) if p.timings_per_token else None
            seq.emit(ProgressEvent(seq.id, seq.req.index, seq.n_prompt, seq.n_cached, seq.n_computed, ms, tim))

    def _fail(self, seq: Sequence, code: int, message: str, typ: str) -> None:
        """End ``seq`` with an error event (emitted even when releasing its pages raises)."""
        log.warning("task %d: %s", seq.id, message)
        seq.cancelled = True
        try:
            self._release(seq, donate=False)
        finally:
            seq.emit(ErrorEvent(seq.id, seq.req.index, code, message, typ))

    def fail_plan(self, plan: Plan, message: str) -> None:
        """A failed forward: fail the sequences it ran (their moves were in it; no other
        sequence's moves were)."""
        for c in plan.chunks:
            seq = self.running.get(c.seq_id)
            if seq is not None:
                self._fail(seq, 500, message, "server_error")

    def fail_everything(self, message: str, code: int = 500, typ: str = "server_error") -> None:
        """Fail every running and waiting request (the engine cannot go on)."""
        waiting, self.waiting = self.waiting, deque()
        for req, emit in waiting:
            try:
                emit(ErrorEvent(req.id, req.index, code, message, typ))
            except Exception:  # noqa: BLE001 - the others still get theirs
                log.exception("task %d: emit failed", req.id)
        for seq in list(self.running.values()):
            try:
                self._fail(seq, code, message, typ)
            except Exception:  # noqa: BLE001 - the event went out; the pages are moot now
                log.exception("task %d: release failed", seq.id)

    def _release(self, seq: Sequence, donate: bool = True) -> None:
        """Take ``seq`` off its slot and give its pages back (donating its KV if allowed)."""
        self.n_changes += 1
        seq.state = SeqState.DONE
        self.running.pop(seq.id, None)
        slot = self.slots[seq.slot_id]
        slot.seq_id = None
        slot.prompt_tokens = list(seq.tokens[: seq.n_computed])
        slot.n_prompt_processed = seq.n_evaluated_prompt
        slot.t_last_used = time.perf_counter()
        slot.next_token = IDLE
        if seq.id in self.cache.seqs:
            self.cache.finish(seq.id, seq.tokens, seq.n_computed, donate=donate and seq.use_cache)
