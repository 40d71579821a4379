"""The second half of the scheduler: plan results into tokens and events (``Scheduler``'s
commit, kept here as its base class: it runs for every token of every stream, the rest of the
scheduler for admissions and prompt chunks).

``launch`` queues the sampling of a step's due rows (on the device, on the fast path);
``complete`` advances counters, publishes computed pages, waits for the tokens and applies them:
text, stop rules, events, the slot's ``next_token``, the end of a finished request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..plan import Plan, RunOutput, SeqChunk
from .outcome import final_event, grammar_stop, push_token, record_finish
from .records import maker
from .sampling import logit_rows
from .sequence import Sequence, SeqState
from .snapshot import NextToken

log = logging.getLogger("kvserve.engine")
_next_token = maker(NextToken)  # every field, in order (records.py)


@dataclass(frozen=True)
class Launched:
    """A step between the halves of its commit: its plan, the sequences sampled (row order)
    and the sampling under way (None: nothing sampled)."""

    plan: Plan
    due: list[Sequence]
    job: Any



class Commit:
    """``Scheduler``'s commit (see the module docstring); the state is the scheduler's."""

    # the scheduler's, set in its __init__ (the methods below use these)
    running: dict[int, Sequence]
    slots: list[Any]
    stats: Any
    cfg: Any
    cache: Any
    tok: Any
    eog: frozenset[int]
    sampling: Any
    crash: Callable[..., None]
    _progress: Callable[[Sequence, float], None]
    _release: Callable[..., None]

    def commit(self, plan: Plan, out: RunOutput) -> None:
        """Advance counters, publish computed pages, sample, apply stop rules and emit:
        ``complete(launch(plan, out))``."""
        self.complete(self.launch(plan, out))

    def launch(self, plan: Plan, out: RunOutput) -> Launched:
        """The first half of the commit: queue the sampling of the plan's due rows (on the
        device, on the fast path). An exception there fails the sequences being sampled."""
        due = []
        get, done, prefill = self.running.get, SeqState.DONE, SeqState.PREFILL
        for c in plan.chunks:
            seq = get(c.seq_id)
            if seq is None or seq.cancelled or seq.state is done:
                continue
            if seq.state is not prefill or seq.n_computed + len(c.tokens) >= seq.n_target:
                due.append(seq)
        job = None
        if due:
            try:
                rows = logit_rows(out, [s.id for s in due])
                job = self.sampling.sample_async(rows, [s.sampler for s in due], out.ready)
            except Exception as e:  # noqa: BLE001 - fails the sampled requests, not the server
                self.crash(due, e)
                due = []
        return Launched(plan, due, job)

    def complete(self, launched: Launched) -> None:
        """The second half: advance counters and publish pages, wait for the sampled tokens,
        then apply them (stop rules, events). Sequences that ended since the launch (a stop in
        the step before, a cancellation) are skipped. An exception while handling one sequence
        fails that sequence (``_guarded``'s rule, written out in the loops: they run for every
        token); one while waiting for the tokens fails the sampled ones."""
        now = time.perf_counter()
        get, done, advance = self.running.get, SeqState.DONE, self._advance
        for c in launched.plan.chunks:
            seq = get(c.seq_id)
            if seq is not None and not seq.cancelled and seq.state is not done:
                try:
                    advance(seq, c, now)
                except Exception as e:  # noqa: BLE001 - one request's failure, not the server's
                    self.crash([seq], e)
        st = self.stats
        st.n_decode_total += 1
        slots = self.slots
        st.busy_slots_sum += len(slots) - [s.seq_id for s in slots].count(None)  # Slot.busy
        if launched.job is None:
            return
        t0 = time.perf_counter()
        try:
            results = launched.job()
        except Exception as e:  # noqa: BLE001
            self.crash([s for s in launched.due if not s.cancelled], e)
            return
        now = time.perf_counter()
        if getattr(launched.job, "tokens", None) is not None:  # the fast path: all of it was waiting
            st.device_wait_s += now - t0
        on_token = self._on_token
        for seq, res in zip(launched.due, results):
            if not seq.cancelled and seq.state is not done:
                try:
                    on_token(seq, res, now)
                except Exception as e:  # noqa: BLE001 - one request's failure, not the server's
                    self.crash([seq], e)

    def _advance(self, seq: Sequence, chunk: SeqChunk, now: float) -> None:
        """Account for ``chunk``'s tokens (the sampling of a due row is the caller's)."""
        n = seq.n_computed = seq.n_computed + len(chunk.tokens)
        if seq.state is SeqState.PREFILL:
            if seq.n_preempted == 0:
                seq.n_evaluated_prompt += len(chunk.tokens)
                self._progress(seq, now)
            if n >= seq.n_target and seq.n_decoded == 0:
                seq.t_prompt_end = now
        if seq.req.params.cache_prompt:  # Sequence.use_cache
            self.cache.publish(seq.id, seq.tokens, n)
        st = self.stats
        if n > st.n_tokens_max:
            st.n_tokens_max = n

    def _on_token(self, seq: Sequence, res: Any, now: float) -> None:
        p = seq.req.params
        n_predict = p.n_predict if p.n_predict != -1 else self.cfg.n_predict
        if getattr(res, "grammar_stop", False):
            done = grammar_stop(seq)
        else:
            seq.state = SeqState.DECODE
            done = push_token(seq, res, now, n_predict, self.tok, self.eog, self.cfg)
            if seq.n_decoded == 1:
                self.stats.first_token(seq.req.t_received, seq.req.t_submitted, seq.t_arrival, now)
        n = seq.n_decoded
        # NextToken(has_next_token, has_new_line, n_remain, n_decoded)
        self.slots[seq.slot_id].next_token = _next_token(not done, seq.has_new_line,
                                                         (n_predict - n) if n_predict >= 0 else -1, n)
        if done:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        record_finish(self.stats, seq)
        ev = final_event(seq, self.tok)
        log.info(
            "task %d: done, slot %d, prompt %d, cached %d, evaluated %d, generated %d, stop %s%s",
            seq.id, seq.slot_id, seq.n_prompt, seq.n_cached, seq.n_evaluated_prompt, seq.n_decoded,
            seq.stop_type, ", truncated" if seq.truncated else "",
        )
        self._release(seq)
        seq.emit(ev)
