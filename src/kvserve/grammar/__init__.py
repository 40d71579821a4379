"""Constrained generation: GBNF grammars, JSON schemas and lazy (triggered) grammars.

Layering: used by the server (compile a request's spec; errors become 400s) and by the engine's
sampler (masks, per-sequence state). Depends on llguidance and torch only; the tokenizer is
passed in (kvserve.model.tokenizer.Tokenizer).
"""

from __future__ import annotations

from .compiler import CompiledGrammar, GrammarCompiler, GrammarError
from .mask import alloc_bitmask, apply_bitmask_, fill_bitmask
from .spec import GrammarSpec, Trigger
from .state import GrammarState

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarSpec", "GrammarState", "Trigger",
           "alloc_bitmask", "apply_bitmask_", "fill_bitmask"]
