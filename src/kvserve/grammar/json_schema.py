"""JSON schema → llguidance grammar, shaped like llama.cpp's json-schema-to-grammar output.

llguidance compiles JSON schemas itself; this module first rewrites a schema so that the output
it allows has llama.cpp's shapes (common/json-schema.cpp + json-schema-to-grammar.cpp):

- properties appear required ones first, each group in schema order (llama.cpp's object rule);
- an object schema with ``properties`` and no ``additionalProperties`` allows no other keys
  (llama.cpp's default); ``{"type": "object"}`` alone is any object;
- whitespace follows llama.cpp's ``space`` rule: nothing, one space, or one or two newlines then
  up to 20 spaces/tabs, wherever the JSON grammar allows whitespace;
- string ``format`` is enforced only for llama.cpp's formats (date, time, date-time, uuid); any
  other format is a plain string, as there;
- unknown keywords are ignored (``lenient``), as llama.cpp ignores them.

The remaining differences are listed in docs/compat.md ("JSON schema").
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

__all__ = ["LLAMA_FORMATS", "SPACE_PATTERN", "llama_shaped", "schema_to_grammar"]

LLAMA_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
# llama.cpp: space ::= | " " | "\n"{1,2} [ \t]{0,20}
SPACE_PATTERN = r"(?: |\n{1,2}[ \t]{0,20})?"

_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "contains", "additionalItems")


def llama_shaped(schema: Any) -> Any:
    """A copy of ``schema`` rewritten to llama.cpp's defaults (see the module doc)."""
    if isinstance(schema, list):
        return [llama_shaped(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [llama_shaped(v) for v in value]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {k: llama_shaped(v) for k, v in value.items()}
        elif key in _SCHEMA_ONE and isinstance(value, (dict, list)):
            out[key] = llama_shaped(value)
        else:
            out[key] = value
    props = out.get("properties")
    if isinstance(props, dict):
        required = out.get("required")
        req = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        out["properties"] = {k: v for k, v in props.items() if k in req} | {
            k: v for k, v in props.items() if k not in req
        }
        out.setdefault("additionalProperties", False)
    fmt = out.get("format")
    if isinstance(fmt, str) and fmt not in LLAMA_FORMATS:
        del out["format"]
    return out


def schema_to_grammar(schema: Any) -> str:
    """The llguidance grammar (a JSON string) for ``schema`` with llama.cpp's shapes; raises
    ``ValueError`` with llguidance's message when the schema is not one it can compile."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if isinstance(schema, dict) and not schema:
        schema = {"type": "object"}
    return llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(llama_shaped(schema)),
        overrides={"whitespace_pattern": SPACE_PATTERN, "lenient": True},
    )
