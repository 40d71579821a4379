"""Schema fuzz: hypothesis-generated JSON schemas, outputs drawn by the batched sampler from random
logits (an adversarial "model"), every finished output validated with ``jsonschema`` and checked
for llama.cpp's property order."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.engine.sampler import SequenceSampler, sample_batch
from kvserve.engine.sampling_params import SamplingParams
from kvserve.grammar import GrammarCompiler, GrammarSpec
from kvserve.model.tokenizer import Tokenizer

NAMES = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)

scalars = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, w: {"type": "integer", "minimum": lo, "maximum": lo + w},
              st.integers(-50, 50), st.integers(0, 200)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.just({"type": "string", "format": "date"}),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.one_of(st.integers(-3, 3), NAMES, st.none()),
                                                min_size=1, max_size=4, unique=True)),
    st.builds(lambda v: {"const": v}, st.one_of(st.integers(-9, 9), NAMES, st.booleans())),
)


def _obj(props: dict[str, Any], req: list[bool]) -> dict[str, Any]:
    names = list(props)
    return {"type": "object", "properties": props,
            "required": [n for n, r in zip(names, req) if r]}


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda it, n: {"type": "array", "items": it, "maxItems": n}, children, st.integers(0, 3)),
        st.dictionaries(NAMES, children, min_size=1, max_size=4).flatmap(
            lambda p: st.builds(_obj, st.just(p), st.lists(st.booleans(), min_size=len(p), max_size=len(p)))),
        st.builds(lambda a, b: {"anyOf": [a, b]}, children, children),
    )


schemas = st.recursive(scalars, _extend, max_leaves=8).map(
    lambda s: s if s.get("type") == "object" else {"type": "object", "properties": {"v": s}, "required": ["v"]})


@pytest.fixture(scope="module")
def setup(smollm_meta):
    tok = Tokenizer.from_metadata(smollm_meta)
    return tok, GrammarCompiler(tok)


def _order_ok(schema: Any, value: Any) -> bool:
    """Keys appear required first, then optional, each group in schema order (llama.cpp)."""
    if isinstance(schema, dict) and "anyOf" in schema:
        return any(_order_ok(s, value) for s in schema["anyOf"])
    if isinstance(schema, dict) and schema.get("type") == "object" and isinstance(value, dict):
        props, req = schema["properties"], schema["required"]
        order = [k for k in props if k in req] + [k for k in props if k not in req]
        keys = list(value)
        if keys != [k for k in order if k in value]:
            return False
        return all(_order_ok(props[k], v) for k, v in value.items())
    if isinstance(schema, dict) and schema.get("type") == "array" and isinstance(value, list):
        return all(_order_ok(schema["items"], v) for v in value)
    return True


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(schema=schemas, seed=st.integers(0, 2**31 - 1))
def test_fuzzed_schemas_give_valid_json(setup, schema: dict[str, Any], seed: int) -> None:
    tok, compiler = setup
    grammar = compiler.compile(GrammarSpec("json_schema", json.dumps(schema)))
    samplers = [SequenceSampler(SamplingParams(seed=seed + i), compiler.n_vocab,
                                tok.eog_ids, grammar=grammar.new_state()) for i in range(2)]
    eog = sorted(tok.eog_ids)
    gen = torch.Generator().manual_seed(seed)
    outs: list[list[int]] = [[] for _ in samplers]
    live = list(range(len(samplers)))
    for _ in range(400):
        if not live:
            break
        logits = torch.randn(len(live), compiler.n_vocab, generator=gen) * 4.0
        logits[:, eog] += 12.0  # end as soon as the grammar allows it
        for i, r in zip(list(live), sample_batch(logits, [samplers[i] for i in live])):
            assert not r.grammar_stop, schema
            samplers[i].accept(r.token)
            if r.token in tok.eog_ids:
                live.remove(i)
            else:
                outs[i].append(r.token)
    assert not live, f"no end within 400 tokens for {schema}"
    for ids in outs:
        text = tok.decode(ids)
        value = json.loads(text)
        jsonschema.validate(value, schema)
        assert _order_ok(schema, value), (schema, text)
