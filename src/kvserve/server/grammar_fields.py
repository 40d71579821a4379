"""Grammar request fields → ``GrammarSpec`` (llama-server's ``json_schema``/``grammar`` handler,
``grammar_lazy``, ``grammar_triggers``), ``response_format`` → ``json_schema``, and compilation.

- ``json_schema`` (present, and no ``grammar`` key) wins over ``grammar``; ``{}`` means any
  object; the schema must be a JSON object or boolean.
- ``grammar``: a GBNF string; an empty string keeps the server default (``--grammar``,
  ``--grammar-file``, ``-j``, ``-jf``).
- ``grammar_lazy`` + ``grammar_triggers`` (``[{"type": 0-3, "value": str, "token": int}]``,
  types token/word/pattern/pattern_full): a lazy grammar with no triggers is a 400; a word
  trigger that is one token becomes a token trigger and must be listed in
  ``preserved_tokens`` (400 otherwise), as in llama-server.
- ``response_format`` (chat): ``json_object`` [+ ``schema``], ``json_schema`` with the OpenAI
  wrapper ``{"json_schema": {"schema": ...}}`` or the schema directly under ``schema``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kvserve.grammar.spec import GrammarSpec, Trigger
from kvserve.server.errors import invalid
from kvserve.server.fields import type_error

__all__ = ["compile_grammar", "grammar_spec", "response_format_schema", "trigger_json", "TRIGGER_TYPES"]

TRIGGER_TYPES = ("token", "word", "pattern", "pattern_full")  # llama.cpp's enum order


def response_format_schema(rf: Any, json_schema: Any) -> Any:
    """The ``json_schema`` a chat ``response_format`` asks for (``json_schema`` when it asks for
    none): llama-server's rules, plus the bare ``{"type": "json_schema", "schema": ...}``."""
    if not isinstance(rf, dict):
        return json_schema
    rtype = rf.get("type", "")
    if not isinstance(rtype, str):
        rtype = ""
    if rtype == "json_object":
        if "schema" in rf or not json_schema:
            schema = rf.get("schema")
            return schema if schema is not None else {}
        return json_schema
    if rtype == "json_schema":
        wrapper = rf.get("json_schema")
        if isinstance(wrapper, dict) and wrapper.get("schema") is not None:
            return wrapper["schema"]
        if rf.get("schema") is not None:
            return rf["schema"]
        return {}
    if rtype not in ("", "text"):
        raise invalid(f'response_format type must be one of "text" or "json_object", but got: {rtype}')
    return json_schema


def _triggers(data: dict[str, Any], tok: Any) -> tuple[Trigger, ...]:
    raw = data.get("grammar_triggers")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise type_error("grammar_triggers", "array", raw)
    preserved: set[int] = set()
    for p in data.get("preserved_tokens") or []:
        if isinstance(p, str):
            ids = tok.encode(p, add_special=False, parse_special=True)
            if len(ids) == 1:
                preserved.add(ids[0])
    out: list[Trigger] = []
    for t in raw:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str):
            raise invalid("grammar_triggers: each trigger needs an integer 'type' and a string 'value'")
        kind = t.get("type")
        if isinstance(kind, bool) or not isinstance(kind, int) or not 0 <= kind < len(TRIGGER_TYPES):
            raise invalid(f"grammar_triggers: unknown trigger type {kind!r}")
        name, value = TRIGGER_TYPES[kind], t["value"]
        if name == "token":
            token = t.get("token")
            if isinstance(token, bool) or not isinstance(token, int):
                raise invalid("grammar_triggers: a token trigger needs an integer 'token'")
            out.append(Trigger("token", value, token))
        elif name == "word":
            ids = tok.encode(value, add_special=False, parse_special=True)
            if len(ids) == 1:
                if ids[0] not in preserved:
                    raise invalid(f"Grammar trigger word should be marked as preserved token: {value}")
                out.append(Trigger("token", value, ids[0]))
            else:
                out.append(Trigger("word", value))
        else:
            out.append(Trigger(name, value))  # type: ignore[arg-type]
    return tuple(out)


def grammar_spec(data: dict[str, Any], default: GrammarSpec | None, tok: Any) -> GrammarSpec | None:
    """The request's grammar, or ``default`` (the server's) when it sets none."""
    spec = default
    if data.get("json_schema") is not None and "grammar" not in data:
        schema = data["json_schema"]
        if isinstance(schema, dict) and not schema:
            schema = {"type": "object"}
        if not isinstance(schema, (dict, bool)):
            raise invalid(f'"json_schema": the schema must be a JSON object or boolean, but is {type(schema).__name__}')
        spec = GrammarSpec("json_schema", json.dumps(schema))
    elif data.get("grammar") is not None:
        g = data["grammar"]
        if not isinstance(g, str):
            raise type_error("grammar", "string", g)
        if g:
            spec = GrammarSpec("gbnf", g)
    lazy = data.get("grammar_lazy")
    if lazy is not None and not isinstance(lazy, bool):
        raise type_error("grammar_lazy", "boolean", lazy)
    triggers = _triggers(data, tok)
    if lazy and not triggers:
        raise invalid("Error: no triggers set for lazy grammar!")
    if spec is not None and (lazy or triggers):
        spec = GrammarSpec(spec.kind, spec.text, bool(lazy), triggers)
    return spec


def trigger_json(t: Trigger) -> dict[str, Any]:
    """A trigger as ``generation_settings.grammar_triggers`` lists it."""
    out: dict[str, Any] = {"type": TRIGGER_TYPES.index(t.kind), "value": t.value}
    if t.kind == "token":
        out["token"] = t.token
    return out


async def compile_grammar(engine: Any, spec: GrammarSpec | None) -> Any:
    """The engine's compiled grammar for ``spec`` (None for None), off the event loop; a bad
    grammar or schema is a 400 carrying the parse error."""
    if spec is None:
        return None
    from kvserve.grammar import GrammarError

    compiler = engine.grammar_compiler
    try:
        return await asyncio.to_thread(compiler.compile, spec)
    except GrammarError as e:
        raise invalid(str(e)) from None
