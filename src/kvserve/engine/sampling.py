"""Glue between the scheduler and the sampler: per-sequence samplers with the model's vocab,
EOG set and DRY sequence breakers, and one batched sampling call per step."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch

from ..plan import RunOutput
from . import sampler_fast
from .dry import build_dry_breakers
from .records import maker
from .sampler import SampleResult, sample_batch
from .sampler_state import SequenceSampler
from .sampling_params import SamplingParams

_result = maker(SampleResult)  # every field, in order (records.py)


class Sampling:
    def __init__(self, tokenizer: Any, n_vocab: int, device: torch.device, n_ctx_train: int = 0) -> None:
        self.tok = tokenizer
        self.n_vocab = n_vocab
        self.n_ctx_train = n_ctx_train
        self._pieces: list[bytes] | None = None
        self._breakers: dict[tuple[str, ...], Any] = {}  # one vocabulary scan per breaker list

    def _token_bytes(self) -> list[bytes]:
        if self._pieces is None:
            self._pieces = [self.tok.token_bytes(i, special=False) for i in range(self.tok.n_vocab)]
        return self._pieces

    def make(self, params: SamplingParams | None, history: list[int], grammar: Any = None,
             budget: Any = None) -> SequenceSampler:
        """``grammar``: the request's ``kvserve.grammar.CompiledGrammar`` (or None); each
        sequence gets its own state of it. ``budget``: the request's ``ReasoningBudget`` (or None)."""
        params = params or SamplingParams()
        breakers = None
        if params.dry_multiplier > 0:
            key = tuple(params.dry_sequence_breakers)
            if key not in self._breakers:
                self._breakers[key] = build_dry_breakers(
                    key, self._token_bytes(), lambda s: self.tok.encode(s, add_special=False, parse_special=False)
                )
            breakers = self._breakers[key]
        sampler = SequenceSampler(
            params, self.n_vocab, self.tok.eog_ids, history, dry_breakers=breakers, n_ctx_train=self.n_ctx_train,
            grammar=grammar.new_state() if grammar is not None else None,
        )
        sampler.budget = budget.new_state() if budget is not None else None
        return sampler

    def sample(self, logits: torch.Tensor, samplers: list[SequenceSampler]) -> list[SampleResult]:
        return self._accept(sample_batch(logits, samplers), samplers)

    def sample_async(self, logits: torch.Tensor, samplers: list[SequenceSampler],
                     ready: Callable[[], None] | None = None) -> SampleJob:
        """``sample`` in two halves: calling the returned job gives the results. On the fast path
        the work is queued on the logits' device now (``job.tokens``: the sampled ids there) and
        the job waits for its one copy back, so the caller can do host work in between;
        otherwise everything happens in the job. ``ready``: waits until the logits exist (the
        runner's ``RunOutput.ready``)."""
        v = samplers[0].vocab_size if samplers else 0
        if sampler_fast.applies(samplers) and logits.dim() == 2 and logits.shape[0] == len(samplers) \
                and logits.shape[1] >= v and all(s.vocab_size == v for s in samplers):
            raw = logits if logits.shape[1] == v and logits.dtype == torch.float32 else logits[:, :v].float()
            dev_tokens = sampler_fast.launch(raw, samplers)
            pending = sampler_fast.Pending(dev_tokens)

            def fast() -> list[SampleResult]:
                if ready is not None:
                    ready()
                mk = _result  # SampleResult(t, 0.0)
                return self._accept([mk(t, 0.0, [], False, False) for t in pending.tokens()], samplers)

            return SampleJob(fast, dev_tokens)

        def chain() -> list[SampleResult]:
            if ready is not None:
                ready()
            return self.sample(logits, samplers)

        return SampleJob(chain, None)

    def _accept(self, results: list[SampleResult], samplers: list[SequenceSampler]) -> list[SampleResult]:
        for i, (s, r) in enumerate(zip(samplers, results)):
            budget = s.budget
            if budget is None:
                if not r.grammar_stop:
                    s.accept(r.token)
                continue
            forced = budget.forced_token()
            if forced is not None:  # the reasoning budget is spent: its end is written instead
                r = results[i] = replace(r, token=forced, grammar_stop=False)
            if not r.grammar_stop:
                s.accept(r.token)
                budget.accept(r.token)
        return results


class SampleJob:
    """Sampling of one step under way: ``job()`` gives the results (waiting for them).
    ``tokens``: the sampled ids as a device tensor [rows] (int64) before they reach the host,
    where the fast path made them (None on the full chain). The results may still differ from
    them where the host replaces a token (a row with a reasoning budget)."""

    __slots__ = ("_fn", "tokens")

    def __init__(self, fn: Callable[[], list[SampleResult]], tokens: torch.Tensor | None) -> None:
        self._fn = fn
        self.tokens = tokens

    def __call__(self) -> list[SampleResult]:
        return self._fn()


def logit_rows(out: RunOutput, seq_ids: list[int]) -> torch.Tensor:
    """[len(seq_ids), V]: the last logits row of each sequence, taken from the step's batch
    tensor when the runner gave one (no per-row slicing and stacking), else stacked."""
    b, where = out.batch, out.batch_rows
    if isinstance(b, torch.Tensor) and where is not None and all(s in where for s in seq_ids):
        idx = [where[s] for s in seq_ids]
        if idx == list(range(b.shape[0])):
            return b
        return b[sampler_fast.to_device(idx, torch.int64, b.device)]
    return torch.stack([out.logits[s][-1] for s in seq_ids])  # type: ignore[index]
