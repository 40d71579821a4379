"""The grammar that makes ``tool_choice: "required"`` (or a named function) produce a valid call.

The output is constrained from its first token to one call written as bare JSON,
``{"name": "<tool>", "arguments": <object matching the tool's parameters schema>}`` (Llama 3.x
uses ``"parameters"``; the generic format wraps it as ``{"tool_call": …}``). Every family's
parser reads that shape, and it needs no special token (``<tool_call>``, ``[TOOL_CALLS]`` are
single tokens in their vocabularies, which a text grammar cannot ask for reliably).
The arguments are constrained by the tool's JSON schema with llama.cpp's schema shapes.
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.grammar.json_schema import SPACE_PATTERN, llama_shaped
from kvserve.grammar.spec import GrammarSpec, Trigger
from kvserve.server.chat_parsing.generic import GenericFormat
from kvserve.server.chat_parsing.llama3 import Llama3Format
from kvserve.server.chat_tools import ToolRequest


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal (JSON escapes)


def _schema(tool: dict[str, Any]) -> Any:
    params = tool["function"].get("parameters")
    schema = llama_shaped(params) if isinstance(params, dict) and params else {"type": "object"}
    # llama.cpp's whitespace rule and its leniency towards unknown keywords, as for json_schema
    return {**schema, "x-guidance": {"whitespace_pattern": SPACE_PATTERN, "lenient": True}}


def tool_call_grammar(treq: ToolRequest, think_end: str | None = None) -> GrammarSpec | None:
    """The forced-call grammar (llguidance Lark), or None when the choice does not force one.

    ``think_end``: the prompt opened a thinking block that ends with this tag; the reasoning is
    left free and the grammar starts at the tag (a lazy grammar triggered by it)."""
    if treq.format is None or treq.choice not in ("required", "function"):
        return None
    tools = [t for t in treq.tools if treq.choice != "function" or t["function"]["name"] == treq.function]
    args_key = "parameters" if isinstance(treq.format, Llama3Format) else "arguments"
    rules: list[str] = []
    alts: list[str] = []
    for i, tool in enumerate(tools):
        head = "{" + f'"name": {json.dumps(tool["function"]["name"], ensure_ascii=False)}, "{args_key}": '
        alts.append(f"{_lit(head)} args{i} {_lit('}')}")
        rules.append(f"args{i}: %json {json.dumps(_schema(tool))}")
    call = "call: " + " | ".join(alts)
    body = '"{\\"tool_call\\": " call "}"' if isinstance(treq.format, GenericFormat) else "call"
    if think_end:
        text = "\n".join([f"start: {_lit(think_end)} WS? {body}", "WS: /[ \\t\\r\\n]+/", call, *rules]) + "\n"
        return GrammarSpec("lark", text, lazy=True, triggers=(Trigger("word", think_end),))
    return GrammarSpec("lark", "\n".join([f"start: {body}", call, *rules]) + "\n")
