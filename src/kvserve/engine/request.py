"""What the HTTP side hands to the engine thread and what comes back (no tensors here).

The server builds a ``GenerationRequest`` (tokens already tokenized, parameters already
validated and defaulted), calls ``Engine.submit(request, emit)`` and receives events through
``emit`` — called on the engine thread, so the server must hop back to its event loop
(``loop.call_soon_threadsafe``). Exactly one terminal event (``FinalEvent`` or
``ErrorEvent``) is emitted per request.
"""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Union


@dataclass(frozen=True)
class CacheIdentity:
    """Pages are shared only between requests whose identity is equal.

    ``model``: model file digest + KV dtype + rope/context settings (set by the engine).
    ``tenant``: the API key a request authenticated with ("" when no keys are configured).
    ``lora``: the active adapter set as a sorted tuple of (id, scale).
    ``media``: digest of media inputs ("" when none).
    """

    tenant: str = ""
    lora: tuple[tuple[int, float], ...] = ()
    media: str = ""
    model: str = ""

    def key(self) -> Hashable:
        return (self.model, self.tenant, self.lora, self.media)


@dataclass
class RequestParams:
    """Per-request generation parameters (llama-server names; defaults resolved by the server)."""

    n_predict: int = -1
    n_keep: int = 0
    n_discard: int = 0
    n_indent: int = 0
    t_max_predict_ms: int = -1
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    cache_prompt: bool = True
    n_cache_reuse: int = 0
    id_slot: int = -1
    n_probs: int = 0
    post_sampling_probs: bool = False
    return_tokens: bool = False
    timings_per_token: bool = False
    return_progress: bool = False
    # The sampler's parameters (kvserve.engine.sampler.SamplingParams); typed loosely so this
    # module stays import-light.
    sampling: Any = None
    # The request's compiled grammar (kvserve.grammar.CompiledGrammar) or None; each sequence
    # gets its own state of it. It never reaches the cache: cached KV does not depend on it.
    grammar: Any = None
    # kvserve.engine.reasoning_budget.ReasoningBudget or None: the thinking block's token budget
    reasoning_budget: Any = None


@dataclass
class GenerationRequest:
    id: int
    prompt_tokens: list[int]
    params: RequestParams
    identity: CacheIdentity = field(default_factory=CacheIdentity)
    index: int = 0  # position in a multi-prompt / n_cmpl response
    # time.perf_counter() when the server began handling the HTTP request (0: not from one)
    # and when the request entered the engine's queue (set by Engine.submit): the first
    # stages of its time to first token (EngineStats.first_token)
    t_received: float = 0.0
    t_submitted: float = 0.0
    # token_bytes(prompt_tokens), set at intake (Scheduler.add) unless the submitter made it
    # (the HTTP side does, in its worker thread): slot choice and the prefix cache compare
    # prompts as bytes
    prompt_key: bytes | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (to an engine process) with the prompt as its bytes alone when it has them:
        its ids are already there, and a list of thousands of ints was most of the pickling."""
        state = dict(self.__dict__)
        if self.prompt_key is not None:
            state["prompt_tokens"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if state["prompt_tokens"] is None:
            state["prompt_tokens"] = array.array("i", state["prompt_key"]).tolist()
        self.__dict__.update(state)


@dataclass
class TokenProb:
    id: int
    token: str
    bytes: list[int]
    logprob: float  # or prob when post_sampling_probs
    top: list["TokenProb"] = field(default_factory=list)


@dataclass
class TokenEvent:
    """Newly released text (held back while it may start a stop string or is partial UTF-8)."""

    request_id: int
    index: int
    text: str
    tokens: list[int]
    n_decoded: int
    n_prompt: int
    probs: list[TokenProb] = field(default_factory=list)
    timings: dict[str, Any] | None = None
    n_cached: int = 0  # prompt tokens whose KV came from the cache


@dataclass
class ProgressEvent:
    request_id: int
    index: int
    total: int
    cache: int
    processed: int
    time_ms: float
    timings: dict[str, Any] | None = None  # with timings_per_token: prompt_n/prompt_ms so far


@dataclass
class FinalEvent:
    request_id: int
    index: int
    content: str  # full generated text (stop string removed)
    tokens: list[int]
    id_slot: int
    stop_type: str  # "eos" | "word" | "limit" | "grammar" (the grammar allows no more tokens) | "none"
    stopping_word: str
    truncated: bool
    n_prompt: int  # tokens_evaluated
    n_cached: int  # timings.cache_n
    n_decoded: int  # tokens_predicted
    tokens_cached: int  # slot prompt length at the end
    prompt_ms: float
    predicted_ms: float
    probs: list[TokenProb] = field(default_factory=list)
    has_new_line: bool = False


@dataclass
class ErrorEvent:
    request_id: int
    index: int
    code: int
    message: str
    type: str  # llama-server error type string
    extra: dict[str, Any] = field(default_factory=dict)


EngineEvent = Union[TokenEvent, ProgressEvent, FinalEvent, ErrorEvent]
Emit = Callable[[EngineEvent], None]
