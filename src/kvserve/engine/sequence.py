"""State of one request while the engine runs it. Counters have one meaning each:

    tokens        prompt + generated tokens (context shift compacts both)
    n_prompt      prompt length as received (tokens_evaluated)
    n_cached      prompt tokens whose KV came from the cache at admission (timings.cache_n)
    n_computed    tokens whose KV is in the sequence's pages: positions [0, n_computed)
    n_decoded     generated tokens (tokens_predicted)
    n_target      tokens whose KV must exist before the next sample: the prompt, or after a
                  preemption every token (the last sampled one included)

A cache hit only means ``n_computed`` starts above 0; nothing else special-cases it. A
preempted sequence holds no KV pages and keeps everything else (its slot, sampler, detokenizer,
output so far); it is admitted again like a new prompt of ``tokens`` and continues.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from .request import Emit, GenerationRequest, TokenProb


class SeqState(enum.Enum):
    WAIT_SHARED = "wait_shared"  # waits for a shared prefix to be published, or for KV pages
    PREEMPTED = "preempted"  # its KV pages were taken back; waits to recompute them
    PREFILL = "prefill"  # computing positions [n_computed, n_target)
    DECODE = "decode"
    DONE = "done"


@dataclass
class Sequence:
    req: GenerationRequest
    emit: Emit
    slot_id: int
    namespace: Any
    sampler: Any  # SequenceSampler
    streamer: Any  # text output: detokenizer + stop strings
    tokens: list[int]
    n_prompt: int
    state: SeqState = SeqState.PREFILL
    n_cached: int = 0
    n_computed: int = 0
    n_decoded: int = 0
    n_target: int = 0
    n_preempted: int = 0  # times its KV was taken back
    pending_moves: tuple = ()
    content: list[str] = field(default_factory=list)
    has_new_line: bool = False  # some released text holds a new line (kept as text is added)
    generated: list[int] = field(default_factory=list)
    probs: list[TokenProb] = field(default_factory=list)
    stop_type: str = "none"
    stopping_word: str = ""
    truncated: bool = False
    cancelled: bool = False
    t_arrival: float = field(default_factory=time.perf_counter)
    t_prompt_start: float = 0.0
    t_prompt_end: float = 0.0
    t_last_token: float = 0.0
    n_evaluated_prompt: int = 0  # prompt tokens actually run through the model
    # the request's id (read several times per token: an attribute, not a property)
    id: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.id = self.req.id

    @property
    def use_cache(self) -> bool:
        return self.req.params.cache_prompt

    def prompt_ms(self) -> float:
        return max(0.0, (self.t_prompt_end - self.t_prompt_start) * 1000.0) if self.t_prompt_start else 0.0

    def predicted_ms(self) -> float:
        return max(0.0, (self.t_last_token - self.t_prompt_end) * 1000.0) if self.t_prompt_end else 0.0
