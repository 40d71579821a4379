"""What a request asks to constrain its output with (pure data, no library objects).

A ``GrammarSpec`` is built by the HTTP layer (or the chat/tool-call layer) and compiled once per
request by :class:`kvserve.grammar.compiler.GrammarCompiler`.

``kind``:
  ``"gbnf"``         llama.cpp GBNF (``grammar`` field, ``--grammar``/``--grammar-file``); a text
                     starting with ``%llguidance`` is taken as llguidance Lark, as llama.cpp
                     routes such grammars to llguidance;
  ``"json_schema"``  a JSON schema as JSON text (``json_schema``, ``response_format``, ``-j``);
  ``"lark"``         llguidance Lark text.

Lazy grammars (llama.cpp's ``grammar_lazy`` + ``grammar_triggers``): with ``lazy=True`` the
output is free until a trigger fires; from then on it is constrained, and the grammar has
already been fed the text from the trigger on:

  ``Trigger("word", "<tool_call>")``         the word appears anywhere in the output; the grammar
                                             sees the output from the word's first character;
  ``Trigger("pattern", r"...")``             a regex (Python ``re``) found in the output; the
                                             grammar sees the output from the first non-empty
                                             capture group (or the match) on;
  ``Trigger("pattern_full", r"...")``        the regex must match the whole output so far;
  ``Trigger("token", "<tool_call>", 151657)`` that token is sampled; the grammar sees the
                                             token's text (its piece, special tokens included).

A non-lazy spec ignores its triggers. ``lazy=True`` with no triggers is refused, as llama.cpp
refuses it ("no triggers set for lazy grammar!").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["GrammarSpec", "Trigger", "TriggerKind", "GrammarKind"]

TriggerKind = Literal["word", "pattern", "pattern_full", "token"]
GrammarKind = Literal["gbnf", "json_schema", "lark"]


@dataclass(frozen=True)
class Trigger:
    kind: TriggerKind
    value: str
    token: int | None = None  # the token id for kind "token"


@dataclass(frozen=True)
class GrammarSpec:
    kind: GrammarKind
    text: str
    lazy: bool = False
    triggers: tuple[Trigger, ...] = ()

    def describe(self) -> str:
        """The grammar as ``generation_settings.grammar`` shows it (llama.cpp prints the GBNF)."""
        return self.text
