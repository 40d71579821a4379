"""``tool_choice: required`` / a named function: the forced-call grammar, compiled against a real
vocabulary and sampled from random logits, always yields a call that every family's parser
reads, naming an allowed tool, with arguments that satisfy the tool's schema."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from kvserve.engine.sampler import SequenceSampler, sample_batch
from kvserve.engine.sampling_params import SamplingParams
from kvserve.server.chat_parsing import ChatSyntax, parse_final
from kvserve.server.chat_parsing.generic import GenericFormat
from kvserve.server.chat_parsing.hermes import HermesFormat
from kvserve.server.chat_parsing.llama3 import Llama3Format
from kvserve.server.chat_parsing.mistral import MistralFormat
from kvserve.server.chat_tools import ToolRequest
from kvserve.server.tool_grammar import tool_call_grammar

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string", "maxLength": 16},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["location", "days"]}}}
PY = {"type": "function", "function": {"name": "python", "parameters": {
    "type": "object", "properties": {"code": {"type": "string", "maxLength": 24}}, "required": ["code"]}}}
NAMES = frozenset({"get_weather", "python"})


def _generate(compiler, tok, spec, seed: int, steps: int = 400) -> str:
    s = SequenceSampler(SamplingParams(temperature=0.0), compiler.n_vocab, tok.eog_ids,
                        grammar=compiler.compile(spec).new_state())
    out: list[int] = []
    for step in range(steps):
        logits = torch.randn(1, compiler.n_vocab, generator=torch.Generator().manual_seed(seed * 1000 + step)) * 4
        r = sample_batch(logits, [s])[0]
        if r.grammar_stop or r.token in tok.eog_ids:
            break
        out.append(r.token)
        s.accept(r.token)
    else:
        pytest.fail("the grammar never ended the call")
    return tok.decode(out)


@pytest.mark.parametrize("fmt", [HermesFormat(NAMES), Llama3Format(NAMES), MistralFormat(NAMES),
                                 GenericFormat(NAMES)], ids=lambda f: f.name)
@pytest.mark.parametrize("seed", [1])
def test_required_call_is_always_valid(compiler, tok, fmt, seed: int) -> None:
    spec = tool_call_grammar(ToolRequest([WEATHER, PY], "required", "", False, fmt))
    assert spec is not None
    text = _generate(compiler, tok, spec, seed)
    msg = parse_final(ChatSyntax(tools=fmt), text)
    assert len(msg.tool_calls) == 1, text
    tc = msg.tool_calls[0]
    tool = {"get_weather": WEATHER, "python": PY}[tc.name]
    jsonschema.validate(json.loads(tc.arguments), tool["function"]["parameters"])


def test_named_choice_forces_that_function(compiler, tok) -> None:
    fmt = HermesFormat(frozenset({"python"}))
    spec = tool_call_grammar(ToolRequest([WEATHER, PY], "function", "python", False, fmt))
    for seed in (3, 4):
        msg = parse_final(ChatSyntax(tools=fmt), _generate(compiler, tok, spec, seed))
        assert [t.name for t in msg.tool_calls] == ["python"]


def test_auto_and_none_are_not_constrained() -> None:
    fmt = HermesFormat(NAMES)
    assert tool_call_grammar(ToolRequest([WEATHER], "auto", "", False, fmt)) is None
    assert tool_call_grammar(ToolRequest([WEATHER], "none", "", False, None)) is None


def test_thinking_opened_by_the_prompt_stays_free_until_its_end_tag(compiler, tok) -> None:
    from kvserve.server.chat_parsing.reasoning import ThinkTags

    fmt = HermesFormat(NAMES)
    spec = tool_call_grammar(ToolRequest([WEATHER], "required", "", False, fmt), think_end="</think>")
    assert spec is not None and spec.lazy
    state = compiler.compile(spec).new_state()
    assert not state.constrained
    for t in tok.encode("I should look it up.</think>\n", add_special=False, parse_special=False):
        state.accept(t)
    assert state.constrained
    call = tok.encode('{"name": "get_weather", "arguments": {"location": "Rome", "days": 2}}', False, False)
    for t in call:
        assert state.allows(t)
        state.accept(t)
    assert state.accepting
    out = "I should look it up.</think>\n" + tok.decode(call)
    msg = parse_final(ChatSyntax(tools=fmt, think=ThinkTags(), opened=True), out)
    assert msg.reasoning_content == "I should look it up." and msg.tool_calls[0].name == "get_weather"
