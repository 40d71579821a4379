"""The Jinja environment chat templates render in: HuggingFace's (sandboxed, ``trim_blocks`` and
``lstrip_blocks``, loop controls, ``{% generation %}``) with ``raise_exception``, ``strftime_now``
and a ``tojson`` that keeps non-ASCII text, as llama-server's template engine does."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment




class TemplateRaised(jinja2.exceptions.TemplateError):
    """The template called ``raise_exception``: it refuses the messages it was given."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def date_variables() -> dict[str, str]:
    """The variables llama.cpp adds to every render (``common_chat_extra_context``): today, local
    time, as ``date_string`` ("%d %b %Y", Llama 3.x templates) and ``datetime`` ("%b %d %Y")."""
    now = datetime.now()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (used by some HF templates): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


class _TemplateEnv(ImmutableSandboxedEnvironment):
    """``string + undefined`` and ``string + none`` (either order) give the string, as in
    llama.cpp's template engine (templates such as firefunction-v2's add variables that
    llama-server never sets); every other ``+`` is Jinja's."""

    intercepted_binops = frozenset(["+"])

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            left_null = left is None or isinstance(left, jinja2.Undefined)
            right_null = right is None or isinstance(right, jinja2.Undefined)
            if (left_null and isinstance(right, str)) or (right_null and isinstance(left, str)):
                return ("" if left_null else left) + ("" if right_null else right)
        return super().call_binop(context, operator, left, right)


def make_env() -> ImmutableSandboxedEnvironment:
    env = _TemplateEnv(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
