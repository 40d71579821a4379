"""The scheduler: turns queued requests into plans and plan results into tokens and events.

One engine step is ``plan = schedule()`` → ``out = runner.run(plan)`` → ``commit(plan, out)``.
``schedule`` admits waiting requests to slots, looks up the prefix cache, and builds the batch:
every generating sequence's next token first, then prompt chunks in arrival order until the
batch holds ``n_batch`` tokens (so a long prompt delays running streams by at most one chunk).
``commit`` advances counters, publishes computed pages, samples, applies stop rules and emits.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ..cache.page_pool import OutOfPages
from .output import TextOutput, token_prob
from ..plan import Plan, RunOutput, SeqChunk
from .request import CacheIdentity, Emit, ErrorEvent, FinalEvent, GenerationRequest, ProgressEvent, TokenEvent
from .sequence import Sequence, SeqState
from .slots import Slot, choose_slot, lcp_len
from .snapshot import IDLE, NextToken
from .stats import EngineStats, timings

log = logging.getLogger("kvserve.engine")


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


def exceed_context(n_prompt: int, n_ctx: int) -> tuple[int, str, str, dict[str, Any]]:
    msg = (
        f"request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it"
    )
    return 400, msg, "exceed_context_size_error", {"n_prompt_tokens": n_prompt, "n_ctx": n_ctx}


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, cache: Any, tokenizer: Any, sampling: Any) -> None:
        """``cache``: KVCacheManager; ``sampling``: object with ``make(params, history)`` →
        per-sequence sampler and ``sample(logits [B, V], samplers)`` → results."""
        self.cfg = cfg
        self.cache = cache
        self.tok = tokenizer
        self.sampling = sampling
        self.slots = [Slot(i, cfg.n_ctx_slot) for i in range(cfg.n_slots)]
        self.waiting: deque[tuple[GenerationRequest, Emit]] = deque()
        self.running: dict[int, Sequence] = {}  # arrival order (dicts keep insertion order)
        self.cancelled: set[int] = set()
        self.stats = EngineStats()
        self.eog = frozenset(tokenizer.eog_ids)

    # -- intake ----------------------------------------------------------------------------
    def add(self, req: GenerationRequest, emit: Emit) -> None:
        n = len(req.prompt_tokens)
        bad = next((t for t in req.prompt_tokens if not 0 <= t < self.tok.n_vocab), None)
        if bad is not None:
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
        self._apply_cancellations()
        self._admit()
        for seq in list(self.running.values()):
            if seq.state is SeqState.WAIT_SHARED:
                self._try_begin(seq)
        chunks: list[SeqChunk] = []
        moves: list[Any] = []
        decoding = [s for s in self.running.values() if s.state is SeqState.DECODE]
        for seq in decoding:
            if seq.n_computed + 1 >= self.cfg.n_ctx_slot:
                try:
                    self._context_shift(seq)
                except OutOfPages:
                    self._fail(seq, 500, "Context size has been exceeded.", "server_error")
                    continue
            try:
                table = self.cache.reserve(seq.id, seq.n_computed + 1)
            except OutOfPages:
                self._fail(seq, 500, "Context size has been exceeded.", "server_error")
                continue
            chunks.append(SeqChunk(seq.id, (seq.tokens[seq.n_computed],), seq.n_computed, tuple(table), "last"))
        budget = self.cfg.n_batch - len(chunks)
        if self.cfg.cont_batching or not chunks:
            for seq in list(self.running.values()):
                if budget <= 0:
                    break
                if seq.state is not SeqState.PREFILL:
                    continue
                n = min(budget, seq.n_prompt_total - seq.n_computed)
                try:
                    table = self.cache.reserve(seq.id, seq.n_computed + n)
                except OutOfPages:
                    if not chunks and len(self.running) == 1:
                        self._fail(seq, 500, "Context size has been exceeded.", "server_error")
                    continue
                done = seq.n_computed + n == seq.n_prompt_total
                toks = tuple(seq.tokens[seq.n_computed : seq.n_computed + n])
                chunks.append(SeqChunk(seq.id, toks, seq.n_computed, tuple(table), "last" if done else "none"))
                if not seq.t_prompt_start:
                    seq.t_prompt_start = time.perf_counter()
                budget -= n
        for seq in self.running.values():
            if seq.pending_moves:
                moves.extend(seq.pending_moves)
                seq.pending_moves = ()
        if not chunks and not moves:
            return None
        return Plan(tuple(chunks), tuple(moves))

    def _apply_cancellations(self) -> None:
        if not self.cancelled:
            return
        ids = self.cancelled
        self.cancelled = set()
        self.waiting = deque((r, e) for r, e in self.waiting if r.id not in ids)
        for rid in ids:
            seq = self.running.get(rid)
            if seq is not None:
                seq.cancelled = True
                self.stats.requests_cancelled += 1
                self._release(seq)

    def _admit(self) -> None:
        kept: deque[tuple[GenerationRequest, Emit]] = deque()
        blocked = False
        while self.waiting:
            req, emit = self.waiting.popleft()
            if blocked:
                kept.append((req, emit))
                continue
            slot = choose_slot(self.slots, req.prompt_tokens, req.params.id_slot, self.cfg.slot_prompt_similarity)
            if slot is None or slot.busy:
                kept.append((req, emit))
                # A request pinned to a busy slot waits without blocking the others; a free
                # request that finds no slot keeps its place and everyone behind it waits.
                blocked = req.params.id_slot == -1
                continue
            self._launch(req, emit, slot)
        self.waiting = kept

    def _launch(self, req: GenerationRequest, emit: Emit, slot: Slot) -> None:
        params = req.params
        ns = self.namespace(req.identity, slot.id)
        sampler = self.sampling.make(params.sampling, list(req.prompt_tokens), params.grammar,
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
            state=SeqState.WAIT_SHARED,
        )
        slot.seq_id = req.id
        slot.id_task = req.id
        slot.sampling = params.sampling
        self.running[req.id] = seq
        self._try_begin(seq)

    def identity_key(self, identity: CacheIdentity) -> tuple[Any, ...]:
        """The cache identity: this engine's model key plus the request's tenant/adapters/media."""
        return (self.cfg.model_key,) + tuple(identity.key()[1:])

    def namespace(self, identity: CacheIdentity, slot_id: int) -> tuple[Any, ...]:
        """Where a request's KV is looked up and donated: its identity, and its slot too when
        KV is not shared across slots (--no-cache-idle-slots)."""
        ns = self.identity_key(identity)
        return ns if self.cfg.share_across_slots else ns + (("slot", slot_id),)

    def _try_begin(self, seq: Sequence) -> None:
        """Look up the cache; first wait while an earlier running request is computing a
        prefix this one shares (so a burst on a new document computes it once)."""
        ps = self.cfg.page_size
        if seq.use_cache and self.cache.enabled:
            have = self.cache.lookup_len(seq.namespace, seq.tokens)
            for other in self.running.values():
                if other is seq or other.state is not SeqState.PREFILL or other.namespace != seq.namespace:
                    continue
                if not other.use_cache:
                    continue
                shared = lcp_len(other.tokens[: other.n_prompt], seq.tokens)
                if shared - have >= ps and other.n_computed < (shared // ps) * ps:
                    return  # stay WAIT_SHARED; re-checked every step
        try:
            adm = self.cache.begin(seq.id, seq.namespace, seq.tokens, seq.use_cache, seq.req.params.n_cache_reuse)
        except OutOfPages:
            return
        seq.n_cached = seq.n_computed = adm.n_cached
        seq.pending_moves = adm.moves
        seq.state = SeqState.PREFILL
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
            seq.emit(ProgressEvent(seq.id, seq.req.index, seq.n_prompt, seq.n_cached, seq.n_computed, ms))

    def _context_shift(self, seq: Sequence) -> None:
        n_ctx = self.cfg.n_ctx_slot
        p = seq.req.params
        n_keep = seq.n_prompt if p.n_keep < 0 else p.n_keep
        if self.tok.add_bos:
            n_keep += 1
        n_keep = max(0, min(n_keep, n_ctx - 4))
        n_left = seq.n_computed - n_keep
        n_discard = p.n_discard if p.n_discard > 0 else n_left // 2
        n_discard = max(0, min(n_discard, n_left - 1))
        if n_discard <= 0:
            return
        moves = self.cache.shift(seq.id, n_keep, n_discard, seq.n_computed)
        del seq.tokens[n_keep : n_keep + n_discard]
        seq.n_computed -= n_discard
        seq.pending_moves = tuple(seq.pending_moves) + tuple(moves)
        seq.truncated = True
        log.info("task %d: context shift, n_keep = %d, n_discard = %d", seq.id, n_keep, n_discard)

    # -- commit ----------------------------------------------------------------------------
    def commit(self, plan: Plan, out: RunOutput) -> None:
        now = time.perf_counter()
        to_sample: list[tuple[Sequence, torch.Tensor]] = []
        n_decode = 0
        for chunk in plan.chunks:
            seq = self.running.get(chunk.seq_id)
            if seq is None or seq.cancelled:
                continue
            n = len(chunk.tokens)
            seq.n_computed += n
            if seq.state is SeqState.PREFILL:
                seq.n_evaluated_prompt += n
                self._progress(seq, now)
                if seq.n_computed >= seq.n_prompt_total:
                    seq.t_prompt_end = now
                    to_sample.append((seq, out.logits[seq.id][-1]))
            else:
                n_decode += 1
                to_sample.append((seq, out.logits[seq.id][-1]))
            if seq.use_cache:
                self.cache.publish(seq.id, seq.tokens, seq.n_computed)
            self.stats.n_tokens_max = max(self.stats.n_tokens_max, seq.n_computed)
        self.stats.n_decode_total += 1
        self.stats.busy_slots_sum += sum(1 for s in self.slots if s.busy)
        if to_sample:
            results = self.sampling.sample(torch.stack([r for _, r in to_sample]), [s.sampler for s, _ in to_sample])
            for (seq, _), res in zip(to_sample, results):
                self._on_token(seq, res, now)

    def _on_token(self, seq: Sequence, res: Any, now: float) -> None:
        if getattr(res, "grammar_stop", False):
            self._grammar_stop(seq)
            return
        tok = int(res.token)
        first = seq.state is SeqState.PREFILL
        seq.state = SeqState.DECODE
        seq.tokens.append(tok)
        seq.generated.append(tok)
        seq.n_decoded += 1
        seq.t_last_token = now
        p = seq.req.params
        is_eog = tok in self.eog
        text, hit = seq.streamer.push_token(tok, is_eog)
        probs = []
        if p.n_probs > 0:
            probs = [token_prob(self.tok, tok, res, p.post_sampling_probs)]
            seq.probs.extend(probs)
        n_predict = p.n_predict if p.n_predict != -1 else self.cfg.n_predict
        if is_eog:
            seq.stop_type = "eos"
        elif hit is not None and hit.kind == "word":
            seq.stop_type, seq.stopping_word = "word", hit.word
        elif hit is not None:  # n_indent: llama-server reports it as a limit
            seq.stop_type = "limit"
        elif n_predict >= 0 and seq.n_decoded >= max(1, n_predict):
            seq.stop_type = "limit"
        elif not self.cfg.context_shift and len(seq.tokens) >= self.cfg.n_ctx_slot:
            seq.stop_type, seq.truncated = "limit", True
        elif (
            p.t_max_predict_ms > 0
            and "\n" in text
            and (now - seq.t_prompt_end) * 1000.0 > p.t_max_predict_ms
        ):
            seq.stop_type = "limit"
        done = seq.stop_type != "none"
        if done:
            text += seq.streamer.flush(hit is not None)
        seq.content.append(text)
        if p.stream and (text or probs or (first and p.return_progress)):
            tim = None
            if p.timings_per_token:
                tim = timings(seq.n_prompt, seq.n_cached, seq.n_decoded, seq.prompt_ms(), seq.predicted_ms())
            seq.emit(TokenEvent(seq.id, seq.req.index, text, [tok], seq.n_decoded, seq.n_prompt, probs, tim))
        slot = self.slots[seq.slot_id]
        slot.next_token = NextToken(
            has_next_token=not done,
            has_new_line="\n" in "".join(seq.content),
            n_remain=(n_predict - seq.n_decoded) if n_predict >= 0 else -1,
            n_decoded=seq.n_decoded,
        )
        if done:
            self._finish(seq)

    def _grammar_stop(self, seq: Sequence) -> None:
        """The request's grammar allows no further token (it cannot be satisfied, or it is
        complete and end-of-generation is banned): end with stop type "grammar", no new token."""
        seq.state = SeqState.DECODE
        seq.stop_type = "grammar"
        text = seq.streamer.flush(False)
        seq.content.append(text)
        if seq.req.params.stream and text:
            seq.emit(TokenEvent(seq.id, seq.req.index, text, [], seq.n_decoded, seq.n_prompt, []))
        p = seq.req.params
        n_predict = p.n_predict if p.n_predict != -1 else self.cfg.n_predict
        self.slots[seq.slot_id].next_token = NextToken(
            has_next_token=False, has_new_line="\n" in "".join(seq.content),
            n_remain=(n_predict - seq.n_decoded) if n_predict >= 0 else -1, n_decoded=seq.n_decoded,
        )
        self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        st = self.stats
        st.prompt_tokens_total += seq.n_evaluated_prompt
        st.prompt_tokens_cached_total += seq.n_cached
        st.prompt_seconds_total += seq.prompt_ms() / 1000.0
        st.tokens_predicted_total += seq.n_decoded
        st.tokens_predicted_seconds_total += seq.predicted_ms() / 1000.0
        st.bucket_prompt_tokens += seq.n_evaluated_prompt
        st.bucket_prompt_s += seq.prompt_ms() / 1000.0
        st.bucket_predicted_tokens += max(0, seq.n_decoded - 1)
        st.bucket_predicted_s += seq.predicted_ms() / 1000.0
        st.requests_finished += 1
        ev = FinalEvent(
            request_id=seq.id,
            index=seq.req.index,
            content="".join(seq.content),
            tokens=list(seq.generated),
            id_slot=seq.slot_id,
            stop_type=seq.stop_type,
            stopping_word=seq.stopping_word,
            truncated=seq.truncated,
            n_prompt=seq.n_prompt,
            n_cached=seq.n_cached,
            n_decoded=seq.n_decoded,
            tokens_cached=seq.n_computed,
            prompt_ms=seq.prompt_ms(),
            predicted_ms=seq.predicted_ms(),
            probs=self._final_probs(seq),
            has_new_line="\n" in "".join(seq.content),
        )
        log.info(
            "task %d: done, slot %d, prompt %d, cached %d, evaluated %d, generated %d, stop %s%s",
            seq.id, seq.slot_id, seq.n_prompt, seq.n_cached, seq.n_evaluated_prompt, seq.n_decoded,
            seq.stop_type, ", truncated" if seq.truncated else "",
        )
        self._release(seq)
        seq.emit(ev)

    def _final_probs(self, seq: Sequence) -> list[Any]:
        """llama-server drops the probabilities of a stop word's tokens from the final list
        (as many entries as the stop word has tokens)."""
        probs = list(seq.probs)
        if seq.stop_type == "word" and probs:
            n = len(self.tok.encode(seq.stopping_word, add_special=False, parse_special=False))
            probs = probs[: max(0, len(probs) - n)]
        return probs

    def _fail(self, seq: Sequence, code: int, message: str, typ: str) -> None:
        log.warning("task %d: %s", seq.id, message)
        seq.cancelled = True
        self._release(seq, donate=False)
        seq.emit(ErrorEvent(seq.id, seq.req.index, code, message, typ))

    def fail_all(self, ids: list[int], message: str) -> None:
        for rid in ids:
            seq = self.running.get(rid)
            if seq is not None:
                self._fail(seq, 500, message, "server_error")

    def _release(self, seq: Sequence, donate: bool = True) -> None:
        seq.state = SeqState.DONE
        self.running.pop(seq.id, None)
        if seq.id in self.cache.seqs:
            self.cache.finish(seq.id, seq.tokens, seq.n_computed, donate=donate and seq.use_cache)
        slot = self.slots[seq.slot_id]
        slot.seq_id = None
        slot.prompt_tokens = list(seq.tokens[: seq.n_computed])
        slot.n_prompt_processed = seq.n_evaluated_prompt
        slot.t_last_used = time.perf_counter()
        slot.next_token = IDLE
