"""Grammar masks in the batched sampler: llama.cpp's rejection semantics, tokens outside the
grammar never drawn, other rows untouched, a clear stop when nothing is allowed, lazy triggers."""

from __future__ import annotations

import json

import pytest
import torch

from kvserve.engine.sampler import SequenceSampler, sample_batch
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar import GrammarSpec, Trigger

GREEDY = SamplingParams(temperature=0.0)
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
          "required": ["ok", "n"]}


def _sampler(compiler, tok, params, spec=None):
    g = compiler.compile(spec).new_state() if spec is not None else None
    return SequenceSampler(params, compiler.n_vocab, tok.eog_ids, grammar=g)


def _logits(seed: int, b: int, v: int) -> torch.Tensor:
    return torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * 3.0


def _run(samplers, steps: int, seed: int, device: str = "cpu") -> list[list[int]]:
    out: list[list[int]] = [[] for _ in samplers]
    live = list(range(len(samplers)))
    for step in range(steps):
        if not live:
            break
        logits = _logits(seed + step, len(samplers), samplers[0].vocab_size)[live].to(device)
        res = sample_batch(logits, [samplers[i] for i in live])
        for i, r in zip(list(live), res):
            assert not r.grammar_stop
            out[i].append(r.token)
            samplers[i].accept(r.token)
            if r.token in samplers[i].eog_ids:
                live.remove(i)
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_constrained_rows_stay_in_grammar_and_other_rows_are_untouched(compiler, tok, device) -> None:
    specs = [GrammarSpec("json_schema", json.dumps(SCHEMA)), None, GrammarSpec("gbnf", 'root ::= [a-z ]{1,40} "."'),
             None, GrammarSpec("json_schema", json.dumps(SCHEMA))]
    params = [SamplingParams(seed=1), SamplingParams(seed=2), GREEDY, SamplingParams(seed=4, top_k=0, min_p=0.0),
              SamplingParams(seed=5, mirostat=2)]
    mixed = [_sampler(compiler, tok, p, s) for p, s in zip(params, specs)]
    alone = [_sampler(compiler, tok, p) for p in params]
    got = _run(mixed, 40, seed=100, device=device)
    ref = _run(alone, 40, seed=100, device=device)
    for i, spec in enumerate(specs):
        if spec is None:
            assert got[i] == ref[i]  # a grammar in the batch changes nothing for the other rows
            continue
        check = compiler.compile(spec).new_state()  # an independent matcher replays the output
        for t in got[i]:
            assert check.allows(t)
            check.accept(t)
        text = tok.decode(got[i])
        if spec.kind == "json_schema" and got[i][-1] in tok.eog_ids:
            doc = json.loads(text)
            assert set(doc) == {"ok", "n"} and isinstance(doc["ok"], bool) and isinstance(doc["n"], int)


def test_allowed_first_draw_is_kept_else_best_allowed(compiler, tok) -> None:
    yes = tok.encode("yes", add_special=False, parse_special=False)[0]
    no = tok.encode("no", add_special=False, parse_special=False)[0]
    spec = GrammarSpec("gbnf", 'root ::= "yes" | "no"')
    logits = torch.zeros(1, compiler.n_vocab)
    logits[0, yes] = 5.0
    logits[0, no] = 4.0
    r = sample_batch(logits, [_sampler(compiler, tok, GREEDY, spec)])[0]
    assert r.token == yes
    logits[0, 7] = 9.0  # the unmasked argmax is outside the grammar: resampled under the mask
    s = _sampler(compiler, tok, SamplingParams(temperature=0.0, n_probs=2))
    s.grammar = compiler.compile(spec).new_state()
    r = sample_batch(logits, [s])[0]
    assert r.token == yes
    assert r.top[0][0] == 7  # raw logprobs are those of the unmasked logits, as llama-server reports


def test_no_allowed_token_ends_with_grammar_stop(compiler, tok) -> None:
    spec = GrammarSpec("gbnf", 'root ::= "a"')
    a = tok.encode("a", add_special=False, parse_special=False)[0]
    # complete grammar, end of generation banned (ignore_eos): nothing is left
    s = _sampler(compiler, tok, SamplingParams(temperature=0.0, ignore_eos=True), spec)
    s.accept(a)
    assert sample_batch(torch.zeros(1, compiler.n_vocab), [s])[0].grammar_stop
    # the only allowed token is banned by logit_bias
    s = _sampler(compiler, tok, SamplingParams(seed=3, logit_bias=((a, float("-inf")),)), spec)
    assert sample_batch(torch.zeros(1, compiler.n_vocab), [s])[0].grammar_stop
    # complete grammar, end of generation allowed: the end is drawn
    s = _sampler(compiler, tok, GREEDY, spec)
    s.accept(a)
    assert sample_batch(torch.randn(1, compiler.n_vocab), [s])[0].token in tok.eog_ids


def test_lazy_grammar_waits_for_its_trigger(compiler, tok) -> None:
    spec = GrammarSpec("gbnf", 'root ::= "<call>" [a-z]+ "</call>"', lazy=True,
                       triggers=(Trigger("word", "<call>"),))
    st = compiler.compile(spec).new_state()
    digit = tok.encode("7", add_special=False, parse_special=False)[0]
    for t in tok.encode("Sure, 1 2 3 <ca", add_special=False, parse_special=False):
        assert not st.constrained and st.allows(digit)
        st.accept(t)
    for t in tok.encode("ll>ab", add_special=False, parse_special=False):
        st.accept(t)
    assert st.constrained and not st.failed
    assert not st.allows(digit)  # the grammar was fed "<call>ab": digits are out
    for t in tok.encode("c</call>", add_special=False, parse_special=False):
        assert st.allows(t)
        st.accept(t)
    assert st.accepting


def test_lazy_triggers_pattern_and_token(compiler, tok) -> None:
    spec = GrammarSpec("gbnf", 'root ::= "[" [0-9]+ "]"', lazy=True, triggers=(Trigger("pattern", r"calc(\[)"),))
    st = compiler.compile(spec).new_state()
    for t in tok.encode("let me calc[4", add_special=False, parse_special=False):
        st.accept(t)
    assert st.constrained and not st.failed  # fed from the first capture group: "[4"
    full = GrammarSpec("gbnf", 'root ::= "x" [0-9]', lazy=True, triggers=(Trigger("pattern_full", r"\s*(x)"),))
    st = compiler.compile(full).new_state()
    for t in tok.encode("  x", add_special=False, parse_special=False):
        st.accept(t)
    assert st.constrained and not st.failed  # the whole output matched; fed from the group: "x"
    tid = tok.encode("<|im_start|>", add_special=False, parse_special=True)[0]
    tspec = GrammarSpec("gbnf", 'root ::= "<|im_start|>" "a"', lazy=True,
                        triggers=(Trigger("token", "<|im_start|>", tid),))
    st = compiler.compile(tspec).new_state()
    st.accept(tok.encode("hi", add_special=False, parse_special=False)[0])
    assert not st.constrained
    st.accept(tid)  # the trigger token's text is fed to the grammar
    assert st.constrained and not st.failed
    assert st.allows(tok.encode("a", add_special=False, parse_special=False)[0])
