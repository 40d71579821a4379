"""Grammar state of one generated sequence: a matcher, advanced with each accepted token.

The state lives with the request (the sampler of its sequence), never with the KV cache: the
cache holds tokens and their KV only, so a cached prefix is shared the same with or without a
grammar.

Contract for the sampler:

- ``constrained``: whether the grammar restricts the next token (a lazy grammar does not until
  a trigger fires);
- ``allows(token)``: whether ``token`` may come next (always True when not constrained);
- masks for many states at once: :func:`kvserve.grammar.mask.fill_bitmask`;
- ``accept(token)``: after the token is committed; drives lazy triggers;
- ``failed``: the grammar can no longer be satisfied (the matcher is in its error state); the
  sequence must stop (stop type "grammar").
"""

from __future__ import annotations

import re
from typing import Callable

import llguidance

from .spec import GrammarSpec

__all__ = ["GrammarState"]


class GrammarState:
    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        spec: GrammarSpec,
        text_to_tokens: Callable[[bytes], list[int]],
        token_text: Callable[[int], bytes],
        eog_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.matcher = matcher
        self.spec = spec
        self._to_tokens = text_to_tokens
        self._token_text = token_text
        self.eog_ids = eog_ids
        self.awaiting_trigger = spec.lazy
        self._buffer = b""  # output so far while awaiting a trigger (token pieces, special included)
        self._trigger_tokens = {t.token for t in spec.triggers if t.kind == "token"}
        self._patterns: list[tuple[str, re.Pattern[str]]] = []
        for t in spec.triggers:
            if t.kind == "word":
                self._patterns.append(("search", re.compile(re.escape(t.value))))
            elif t.kind == "pattern":
                self._patterns.append(("search", re.compile(t.value)))
            elif t.kind == "pattern_full":
                self._patterns.append(("full", re.compile(t.value)))

    @property
    def constrained(self) -> bool:
        return not self.awaiting_trigger

    @property
    def failed(self) -> bool:
        return self.constrained and self.matcher.is_error()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar (end of generation allowed)."""
        return self.awaiting_trigger or self.matcher.is_accepting()

    def allows(self, token: int) -> bool:
        if self.awaiting_trigger:
            return True
        if self.matcher.is_error():
            return False
        if int(token) in self.eog_ids:
            return bool(self.matcher.is_accepting())
        return self.matcher.validate_tokens([int(token)]) == 1

    def accept(self, token: int) -> None:
        token = int(token)
        if self.awaiting_trigger:
            self._await(token)
            return
        if self.matcher.is_error() or self.matcher.is_stopped() or token in self.eog_ids:
            return
        self.matcher.consume_token(token)

    # -- lazy grammars ---------------------------------------------------------------------------
    def _await(self, token: int) -> None:
        piece = self._token_text(token)
        if token in self._trigger_tokens:
            self._activate(piece)
            return
        self._buffer += piece
        text = self._buffer.decode("utf-8", errors="surrogateescape")
        for how, rx in self._patterns:
            m = rx.fullmatch(text) if how == "full" else rx.search(text)
            if m is None:
                continue
            start = next((m.start(i) for i in range(1, (rx.groups or 0) + 1) if m.group(i)), m.start())
            self._activate(text[start:].encode("utf-8", errors="surrogateescape"))
            return

    def _activate(self, text: bytes) -> None:
        self.awaiting_trigger = False
        self._buffer = b""
        if text:
            self.matcher.consume_tokens(self._to_tokens(text))
