"""Grammars end to end on SmolLM2: valid constrained output, the prompt cache unchanged by
grammars, and a clear stop when the grammar allows nothing more."""

from __future__ import annotations

import json

import jsonschema
import pytest

from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar import GrammarSpec

from .engine_harness import GREEDY, assert_idle, make_engine, run, submit

SCHEMA = {"type": "object", "properties": {"color": {"type": "string", "maxLength": 12},
                                           "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                                           "pet": {"type": "boolean"}},
          "required": ["legs", "color"]}


@pytest.fixture(scope="module")
def eng(smollm):
    return make_engine(smollm, n_slots=2)


def chat(tok, text: str) -> list[int]:
    return tok.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special=True,
                      parse_special=True)


def test_json_schema_output_validates_in_llama_order(eng) -> None:
    g = eng.grammar_compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    prompt = chat(eng.tokenizer, "Describe a cat as JSON.")
    cols = [submit(eng, prompt, n_predict=40, sampling=sp, grammar=g)[1]
            for sp in (GREEDY, SamplingParams(seed=8, temperature=1.5))]
    run(eng, cols)
    for c in cols:
        assert c.final.stop_type == "eos", c.final.content
        doc = json.loads(c.final.content)
        jsonschema.validate(doc, SCHEMA)
        assert list(doc)[:2] == ["color", "legs"]  # required first, in schema order
    assert_idle(eng)


def test_gbnf_output_and_unconstrained_neighbour(eng) -> None:
    g = eng.grammar_compiler.compile(GrammarSpec("gbnf", 'root ::= ("yes" | "no") "." [ ]? [A-Z] [a-z ]{0,20} "."'))
    prompt = chat(eng.tokenizer, "Is water wet? Answer yes or no, then explain.")
    _, plain = submit(eng, prompt, n_predict=12)
    run(eng, [plain])
    _, a = submit(eng, prompt, n_predict=40, grammar=g)
    _, b = submit(eng, prompt, n_predict=12)
    run(eng, [a, b])
    assert a.final.content.split(".")[0] in ("yes", "no")
    assert b.final.content == plain.final.content  # batched with a grammar row, unchanged
    assert_idle(eng)


def test_prompt_cache_counts_are_the_same_with_and_without_grammar(smollm) -> None:
    counts = []
    for use_grammar in (False, True):
        e = make_engine(smollm, n_slots=1, n_ctx=1024)
        g = e.grammar_compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA))) if use_grammar else None
        prompt = chat(e.tokenizer, "Describe a dog as JSON.")
        seen = []
        for grammar in (g, None, g):
            _, c = submit(e, prompt, n_predict=4, grammar=grammar)
            run(e, [c])
            seen.append((c.final.n_cached, c.final.n_prompt))
        # a follow-up turn reuses prompt + generated tokens whatever constrained them
        _, c = submit(e, prompt + c.final.tokens, n_predict=2)
        run(e, [c])
        seen.append((c.final.n_cached, c.final.n_prompt))
        counts.append(seen)
        assert_idle(e)
    assert counts[0][:3] == counts[1][:3]
    assert counts[0][0][0] == 0 and counts[0][1][0] == counts[0][1][1] - 1  # llama.cpp's n - 1 rule
    assert counts[1][3][0] == counts[1][3][1] - 1


def test_grammar_that_allows_nothing_more_ends_the_request(eng) -> None:
    g = eng.grammar_compiler.compile(GrammarSpec("gbnf", 'root ::= "ok"'))
    prompt = chat(eng.tokenizer, "Say ok.")
    _, a = submit(eng, prompt, n_predict=30, grammar=g, sampling=SamplingParams(temperature=0.0, ignore_eos=True))
    _, b = submit(eng, prompt, n_predict=30, grammar=g)
    run(eng, [a, b], max_steps=50)
    assert a.final.stop_type == "grammar" and a.final.content == "ok"  # complete; the end is banned
    assert b.final.stop_type == "eos" and b.final.content == "ok"
    assert_idle(eng)
