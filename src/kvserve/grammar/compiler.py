"""Compile a ``GrammarSpec`` against a model's vocabulary, once per request, under a time limit.

``GrammarCompiler`` is built once per model (it holds the llguidance tokenizer). ``compile``
turns a spec into a ``CompiledGrammar`` or raises ``GrammarError`` whose message is what the
client gets in its 400. Compiled grammars are kept in a small LRU keyed by the spec, so a grammar
sent again costs one matcher copy. ``CompiledGrammar.new_state()`` gives each generated sequence
its own matcher (:class:`kvserve.grammar.state.GrammarState`).

Limits: llguidance's own fuel limits bound the work of building the lexer and each mask; on top
of them compilation runs on a worker thread (llguidance releases the GIL) and a compilation
that takes longer than ``timeout_s`` is abandoned with a ``GrammarError``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
from collections import OrderedDict
from typing import Any

import llguidance

from .gbnf import GrammarSyntaxError, gbnf_to_lark
from .json_schema import schema_to_grammar
from .spec import GrammarSpec
from .state import GrammarState
from .vocab import build_ll_tokenizer

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 10.0
_LIMITS = dict(initial_lexer_fuel=2_000_000, step_lexer_fuel=400_000, max_grammar_size=500_000,
               verbose_errors=False)


class GrammarError(ValueError):
    """A grammar or schema that cannot be used; ``str()`` is the client-facing message."""


class CompiledGrammar:
    """A compiled spec: a template matcher that every sequence copies."""

    def __init__(self, spec: GrammarSpec, matcher: llguidance.LLMatcher, compiler: GrammarCompiler) -> None:
        self.spec = spec
        self._template = matcher
        self._compiler = compiler

    def __reduce__(self) -> tuple[Any, tuple[GrammarSpec]]:
        """Pickled as its spec: another process compiles it again with its own compiler
        (``set_process_compiler``), as the engine process does for the HTTP process's requests."""
        return (_compiled_here, (self.spec,))

    def new_state(self) -> GrammarState:
        c = self._compiler
        return GrammarState(self._template.deep_copy(), self.spec, c.text_to_tokens, c.token_text, c.eog_ids)


# The compiler (a factory of it) that unpickled grammars are compiled with in this process
_process_compiler: Any = None


def set_process_compiler(factory: Any) -> None:
    """``factory()`` gives this process's ``GrammarCompiler`` (built on the first grammar)."""
    global _process_compiler
    _process_compiler = factory


def _compiled_here(spec: GrammarSpec) -> CompiledGrammar:
    if _process_compiler is None:
        raise GrammarError("no grammar compiler in this process")
    return _process_compiler().compile(spec)


class GrammarCompiler:
    """Per-model grammar compilation. ``tokenizer``: kvserve's Tokenizer; ``n_vocab``: width of
    the model's logits (the mask covers that many ids)."""

    def __init__(self, tokenizer: Any, n_vocab: int | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 cache_size: int = 32) -> None:
        self.tok = tokenizer
        self.n_vocab = int(n_vocab if n_vocab is not None else tokenizer.n_vocab)
        self.ll_tok = build_ll_tokenizer(tokenizer, self.n_vocab)
        self.eog_ids = frozenset(int(t) for t in self.ll_tok.eos_tokens)
        self.timeout_s = timeout_s
        self._pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="grammar")
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    # -- helpers the states use ------------------------------------------------------------------
    def text_to_tokens(self, text: bytes) -> list[int]:
        return list(self.ll_tok.tokenize_bytes(text))

    def token_text(self, token: int) -> bytes:
        if 0 <= token < self.tok.n_vocab:
            return bytes(self.tok.token_bytes(token, special=True))
        return b""

    def resolve_token(self, text: str) -> list[int]:
        """``<text>`` token terminals: llama.cpp tokenizes with special tokens parsed."""
        return list(self.tok.encode(text, add_special=False, parse_special=True))

    # -- compilation -----------------------------------------------------------------------------
    def to_ll_grammar(self, spec: GrammarSpec) -> str:
        """The llguidance grammar text for ``spec`` (raises GrammarError)."""
        if spec.lazy and not spec.triggers:
            raise GrammarError("Error: no triggers set for lazy grammar!")
        for t in spec.triggers:
            if t.kind in ("pattern", "pattern_full"):
                try:
                    re.compile(t.value)
                except re.error as e:
                    raise GrammarError(f"invalid grammar trigger pattern {t.value!r}: {e}") from e
            elif t.kind == "token" and (t.token is None or not 0 <= t.token < self.n_vocab):
                raise GrammarError(f"invalid grammar trigger token {t.token!r}")
        if spec.kind == "json_schema":
            try:
                return schema_to_grammar(json.loads(spec.text))
            except (ValueError, TypeError) as e:
                raise GrammarError(f'"json_schema": {e}') from e
        if spec.kind == "lark" or spec.text.lstrip().startswith("%llguidance"):
            lark = spec.text
        else:
            try:
                lark = gbnf_to_lark(spec.text, self.resolve_token)
            except GrammarSyntaxError as e:
                raise GrammarError(f"Failed to initialize samplers: failed to parse grammar: {e}") from e
        try:
            return llguidance.LLMatcher.grammar_from_lark(lark)
        except ValueError as e:
            raise GrammarError(f"Failed to initialize samplers: failed to parse grammar: {e}") from e

    def _build(self, spec: GrammarSpec) -> CompiledGrammar:
        grammar = self.to_ll_grammar(spec)
        m = llguidance.LLMatcher(self.ll_tok, grammar, log_level=0,
                                 limits=llguidance.LLParserLimits(**_LIMITS))  # type: ignore[arg-type]
        if m.is_error():
            err = m.get_error()
            if spec.kind == "json_schema":
                raise GrammarError(f'"json_schema": {err}')
            raise GrammarError(f"Failed to initialize samplers: failed to parse grammar: {err}")
        return CompiledGrammar(spec, m, self)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """Compile (or fetch from the LRU) ``spec``; blocks up to ``timeout_s``."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        fut = self._pool.submit(self._build, spec)
        try:
            compiled = fut.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            fut.cancel()
            what = '"json_schema": ' if spec.kind == "json_schema" else "failed to parse grammar: "
            raise GrammarError(f"{what}compilation took longer than {self.timeout_s:g} s") from None
        with self._lock:
            self._cache[spec] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled
