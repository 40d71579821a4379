"""JSON schemas give llama.cpp's output shapes: property order, additionalProperties default,
whitespace, string formats; bad schemas and runaway compilations are refused."""

from __future__ import annotations

import json

import pytest

from kvserve.grammar import GrammarCompiler, GrammarError, GrammarSpec
from kvserve.grammar.json_schema import llama_shaped
from kvserve.model.tokenizer import Tokenizer


def accepts(compiler: GrammarCompiler, schema: object, text: str) -> bool:
    st = compiler.compile(GrammarSpec("json_schema", json.dumps(schema))).new_state()
    for t in compiler.text_to_tokens(text.encode()):
        if not st.allows(t):
            return False
        st.accept(t)
    return st.accepting


PERSON = {"type": "object", "properties": {"nick": {"type": "string"}, "name": {"type": "string"},
                                           "age": {"type": "integer"}}, "required": ["name", "age"]}


def test_required_properties_first_then_optional_in_schema_order(compiler) -> None:
    assert accepts(compiler, PERSON, '{"name": "A", "age": 3}')
    assert accepts(compiler, PERSON, '{"name": "A", "age": 3, "nick": "a"}')
    assert not accepts(compiler, PERSON, '{"nick": "a", "name": "A", "age": 3}')
    assert not accepts(compiler, PERSON, '{"age": 3, "name": "A"}')
    assert not accepts(compiler, PERSON, '{"name": "A"}')
    assert list(llama_shaped(PERSON)["properties"]) == ["name", "age", "nick"]


def test_additional_properties(compiler) -> None:
    assert not accepts(compiler, PERSON, '{"name": "A", "age": 3, "x": 1}')  # llama.cpp default: none
    open_ = dict(PERSON, additionalProperties=True)
    assert accepts(compiler, open_, '{"name": "A", "age": 3, "x": [1, {"y": null}]}')
    typed = dict(PERSON, additionalProperties={"type": "integer"})
    assert accepts(compiler, typed, '{"name": "A", "age": 3, "x": 1}')
    assert not accepts(compiler, typed, '{"name": "A", "age": 3, "x": "s"}')
    assert accepts(compiler, {"type": "object"}, '{"any": {"thing": [true]}}')  # no properties: any object
    assert accepts(compiler, {}, '{"a": 1}') and not accepts(compiler, {}, "[1]")  # {} means any object


def test_whitespace_follows_llama_space_rule(compiler) -> None:
    s = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert accepts(compiler, s, '{"a":1}')
    assert accepts(compiler, s, '{ "a": 1 }')
    assert accepts(compiler, s, '{\n  "a": 1\n}')
    assert accepts(compiler, s, '{\n\n\t\t"a": 1}')
    assert not accepts(compiler, s, '{   "a": 1}')  # one space at most
    assert not accepts(compiler, s, '{\n\n\n"a": 1}')  # two newlines at most
    assert not accepts(compiler, s, "{\n" + " " * 21 + '"a": 1}')  # 20 indent characters at most


def test_string_formats_as_llama_cpp(compiler) -> None:
    assert accepts(compiler, {"type": "string", "format": "date"}, '"2024-02-29"')
    assert not accepts(compiler, {"type": "string", "format": "date"}, '"yesterday"')
    assert accepts(compiler, {"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"')
    assert accepts(compiler, {"type": "string", "format": "date-time"}, '"2024-02-29T12:30:00Z"')
    assert accepts(compiler, {"type": "string", "format": "time"}, '"12:30:00Z"')
    # formats llama.cpp does not know are plain strings there
    assert accepts(compiler, {"type": "string", "format": "email"}, '"not an email"')


def test_other_keywords(compiler) -> None:
    assert accepts(compiler, {"enum": ["red", 1, None]}, "null")
    assert not accepts(compiler, {"enum": ["red", 1, None]}, '"blue"')
    assert accepts(compiler, {"const": {"k": [1]}}, '{"k": [1]}')
    arr = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}
    assert accepts(compiler, arr, "[1, 2]") and not accepts(compiler, arr, "[]") and not accepts(compiler, arr, "[1,2,3]")
    s = {"type": "string", "minLength": 2, "maxLength": 3}
    assert accepts(compiler, s, '"ab"') and not accepts(compiler, s, '"a"') and not accepts(compiler, s, '"abcd"')
    assert accepts(compiler, {"type": "string", "pattern": "^[a-z]+$"}, '"abc"')
    assert not accepts(compiler, {"type": "string", "pattern": "^[a-z]+$"}, '"ab1"')
    assert accepts(compiler, {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "true")
    ref = {"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}
    assert accepts(compiler, ref, "[1, 2]") and not accepts(compiler, ref, '["x"]')
    assert accepts(compiler, {"type": "integer", "minimum": 1, "maximum": 5}, "5")
    assert not accepts(compiler, {"type": "integer", "minimum": 1, "maximum": 5}, "6")
    assert accepts(compiler, {"type": "object", "title": "t", "description": "unknown keywords are ignored",
                              "x-extension": 1}, "{}")


@pytest.mark.parametrize("schema", [{"type": "nope"}, {"type": "string", "pattern": "(("},
                                    {"$ref": "#/$defs/missing"}])
def test_bad_schema_is_an_error(compiler, schema) -> None:
    with pytest.raises(GrammarError, match='^"json_schema": '):
        compiler.compile(GrammarSpec("json_schema", json.dumps(schema)))


def test_runaway_compilation_is_stopped(smollm_meta) -> None:
    slow = GrammarCompiler(Tokenizer.from_metadata(smollm_meta), timeout_s=1e-4)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^(a|b{i}){{1,64}}c{{2,40}}$"}
                                               for i in range(300)}, "required": [f"p{i}" for i in range(300)]}
    with pytest.raises(GrammarError, match="compilation took longer than"):
        slow.compile(GrammarSpec("json_schema", json.dumps(schema)))
