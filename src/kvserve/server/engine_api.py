"""What the HTTP layer needs from the engine: the seam between ``server/`` and ``engine/``.

The server never touches tensors. It tokenizes, validates, builds ``GenerationRequest``s and
hands them to ``EngineAPI.submit``; events come back through ``emit`` on the engine thread.

Threading contract:
- ``submit``, ``cancel`` and ``new_request_id`` are thread-safe and never block for long.
- ``health``, ``slots_snapshot``, ``metrics_snapshot`` and ``cache_info`` may be called from
  the event loop; they read the latest published snapshot and never wait for a step.
- ``slot_action``, ``embed`` and ``rank`` may block (they run in a worker thread on the server side).
- Exactly one terminal event (``FinalEvent`` or ``ErrorEvent``) per submitted request, also
  after ``cancel`` (an ``ErrorEvent`` or a ``FinalEvent`` with what was generated; the server
  ignores events of requests it has cancelled). The engine reports context overflow,
  invalid tokens and sampler failures as ``ErrorEvent``s with llama-server's code/type.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvserve.engine.request import Emit, GenerationRequest
from kvserve.engine.snapshot import SlotView


class TokenizerLike(Protocol):
    """The slice of ``kvserve.model.tokenizer.Tokenizer`` the server uses."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def bos_id(self) -> int | None: ...
    @property
    def eos_id(self) -> int | None: ...
    @property
    def eog_ids(self) -> Sequence[int]: ...
    @property
    def add_bos(self) -> bool: ...
    @property
    def bos_token(self) -> str: ...
    @property
    def eos_token(self) -> str: ...

    def encode(self, text: str, add_special: bool = ..., parse_special: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int], special: bool = ...) -> str: ...
    def token_bytes(self, id: int) -> bytes: ...


class ChatTemplateLike(Protocol):
    """``kvserve.model.chat_template.ChatTemplate``: raises ValueError on bad messages."""

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str: ...


class EngineAPI(Protocol):
    @property
    def tokenizer(self) -> TokenizerLike: ...
    @property
    def chat_template(self) -> ChatTemplateLike | None: ...
    @property
    def n_ctx_slot(self) -> int: ...
    @property
    def rerank_template(self) -> str | None:
        """The model's rerank prompt (``{query}``/``{document}`` placeholders), None without one."""
        ...
    @property
    def n_slots(self) -> int: ...
    @property
    def ready(self) -> bool: ...
    @property
    def grammar_compiler(self) -> Any:
        """``kvserve.grammar.GrammarCompiler`` for this model; ``compile(spec)`` is thread-safe
        and may block (the server calls it from a worker thread)."""
        ...

    def model_info(self) -> dict[str, Any]:
        """vocab_type, n_vocab, n_ctx_train, n_embd, n_params, size, ftype (str), path."""
        ...

    def new_request_id(self) -> int: ...

    def submit(self, req: GenerationRequest, emit: Emit) -> None: ...

    def cancel(self, request_id: int) -> None: ...

    def health(self) -> str | None:
        """None while requests are served; else the reason they are not (``/health`` 503)."""
        ...

    def slots_snapshot(self) -> tuple[SlotView, ...]:
        """One plain view per slot; the server renders llama-server's ``GET /slots`` form."""
        ...

    def metrics_snapshot(self) -> dict[str, float]:
        """llama-server metric names without the ``llamacpp:`` prefix (see metrics.py),
        ``t_start`` (process start, for the ``Process-Start-Time-Unix`` header) and kvserve
        cache counters as ``kvserve:<name>`` or ``kvserve:<name>{label="value"}``."""
        ...

    def slot_action(self, id_slot: int, action: str, filename: str, tenant: str = "") -> dict[str, Any]:
        """``save`` / ``restore`` / ``erase`` (filename "" for erase); the response body.
        ``id_slot`` is the raw request id (wrap it modulo n_slots); ``filename`` is validated
        (a bare name); ``tenant`` is the caller's API key. Raises ``kvserve.engine.errors.EngineError``."""
        ...

    def embed(self, token_lists: list[list[int]], pooling: str) -> list[list[list[float]]]:
        """Per input: one vector (pooled) or one per token (pooling "none"). Un-normalized."""
        ...

    def rank(self, token_lists: list[list[int]]) -> list[float]:
        """Per input (a query/document prompt): its relevance score (rank pooling)."""
        ...
