"""A compiled grammar crosses a process boundary as its spec and is compiled again there
(the engine process's requests, ``KVSERVE_ENGINE_PROCESS``)."""

from __future__ import annotations

import pickle

import pytest

from kvserve.grammar import compiler as C
from kvserve.grammar.spec import GrammarSpec


def test_a_pickled_grammar_is_compiled_by_the_process_compiler(compiler: C.GrammarCompiler) -> None:
    spec = GrammarSpec("gbnf", 'root ::= "yes" | "no"')
    g = compiler.compile(spec)
    data = pickle.dumps(g)
    assert len(data) < 400  # the spec, not the matcher
    old = C._process_compiler
    try:
        C.set_process_compiler(None)
        with pytest.raises(C.GrammarError):
            pickle.loads(data)
        asked: list[int] = []
        C.set_process_compiler(lambda: asked.append(1) or compiler)
        back = pickle.loads(data)
        assert asked == [1] and back.spec == spec and back is compiler.compile(spec)
        state = back.new_state()
        yes = compiler.tok.encode("yes", add_special=False, parse_special=False)
        maybe = compiler.tok.encode("maybe", add_special=False, parse_special=False)
        assert state.allows(yes[0]) and not state.allows(maybe[0])
    finally:
        C.set_process_compiler(old)
