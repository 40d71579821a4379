"""OpenAI chat bodies -> a rendered prompt + completion fields (``oaicompat_chat_params_parse``).

Order of checks follows llama-server: stop, json_schema/grammar, response_format, messages
(required, an array, content rules), chat_template_kwargs (``enable_thinking`` must be a
boolean), assistant prefill (a trailing assistant message is continued), logprobs. Every
other body key is copied through so llama.cpp sampling extensions work on this endpoint too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kvserve.model.chat_messages import MessageFormatError, prefill_text, request_messages
from kvserve.server.chat_parsing import ChatSyntax
from kvserve.server.chat_parsing.reasoning import REASONING_FORMATS, detect_think_tags
from kvserve.server.chat_tools import (
    ToolRequest,
    build_syntax,
    generation_prompt,
    polyfill_messages,
    read_tool_request,
    supports_thinking,
    template_source,
)
from kvserve.grammar.spec import GrammarSpec
from kvserve.server.engine_api import ChatTemplateLike
from kvserve.server.errors import ApiError, invalid, server_error, unsupported_field
from kvserve.server.settings import ServerSettings
from kvserve.server.grammar_fields import response_format_schema
from kvserve.server.tool_grammar import tool_call_grammar
from kvserve.server.unsupported import check_chat

def _validate_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """llama-server's checks on ``messages`` (``model.chat_messages``, the one place they live)."""
    try:
        return request_messages(body)
    except MessageFormatError as e:
        if e.unsupported is not None:
            raise unsupported_field(e.unsupported, str(e)) from None
        raise invalid(str(e)) from None


def _template_kwargs(body: dict[str, Any], s: ServerSettings, tmpl: ChatTemplateLike) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for k, v in s.chat_template_kwargs.items():
        if isinstance(v, str):  # the CLI stores each value as its JSON dump
            try:
                v = json.loads(v)
            except ValueError:
                pass
        kwargs[k] = v
    req_kwargs = body.get("chat_template_kwargs")
    if isinstance(req_kwargs, dict):
        kwargs.update(req_kwargs)
    if isinstance(kwargs.get("enable_thinking"), str):
        raise invalid('invalid type for "enable_thinking" (expected boolean, got string)')
    if not isinstance(kwargs.get("enable_thinking"), bool):
        # llama-server always passes it: off with --reasoning off or a template without thinking
        kwargs["enable_thinking"] = s.reasoning != "off" and supports_thinking(tmpl)
    effort = body.get("reasoning_effort", kwargs.get("reasoning_effort"))
    if effort == "none":
        kwargs["enable_thinking"] = False
        kwargs.pop("reasoning_effort", None)
    elif isinstance(effort, str):
        kwargs["reasoning_effort"] = effort
    return kwargs


@dataclass
class RenderedChat:
    prompt: str
    generation_prompt: str  # what the generation prompt (and a prefilled reply) added
    syntax: ChatSyntax  # how the output is parsed
    tool_grammar: GrammarSpec | None = None  # tool_choice required / named: the forced call


def render_chat(body: dict[str, Any], tmpl: ChatTemplateLike | None, s: ServerSettings) -> str:
    """The chat prompt for ``body`` (used by chat completions, /apply-template, input_tokens)."""
    return render_chat_full(body, tmpl, s).prompt


def _render(tmpl: ChatTemplateLike, messages: list[dict[str, Any]], add_generation_prompt: bool,
            tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]) -> str:
    try:
        return tmpl.render(messages, add_generation_prompt=add_generation_prompt, tools=tools or None, **kwargs)
    except ValueError as e:  # malformed messages, or the template refusing them: the client's mistake
        raise invalid(str(e))
    except ApiError:
        raise
    except Exception as e:  # noqa: BLE001 - jinja runtime errors: the template, not the request, failed
        raise server_error(f"chat template error: {e}")


def _reasoning_format(body: dict[str, Any], s: ServerSettings) -> str:
    v = body.get("reasoning_format")
    return v if isinstance(v, str) and v in REASONING_FORMATS else s.reasoning_format


def render_chat_full(body: dict[str, Any], tmpl: ChatTemplateLike | None, s: ServerSettings) -> RenderedChat:
    check_chat(body)
    treq: ToolRequest = read_tool_request(body, tmpl, s.jinja)
    messages = _validate_messages(body)
    if tmpl is None:
        raise server_error("this model has no chat template")
    kwargs = _template_kwargs(body, s, tmpl)
    if treq.polyfill and treq.tools:
        messages = polyfill_messages(messages, treq)

    agp_given = body.get("add_generation_prompt") is not None
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        add_generation_prompt = True
    cont = body.get("continue_final_message")
    if cont is not None and not isinstance(cont, bool):
        raise invalid("'continue_final_message' must be a boolean")
    if cont is True and agp_given and add_generation_prompt is True:
        raise invalid("Cannot set both add_generation_prompt and continue_final_message")
    last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    if cont is True and not last_is_assistant:
        raise invalid("continue_final_message requires the last message to be from the assistant")

    prefill = last_is_assistant and (cont is True or (cont is None and s.prefill_assistant))
    last: dict[str, Any] | None = None
    if prefill and getattr(tmpl, "builtin", None) is not None:
        # llama.cpp's built-in formats cannot leave a turn open: the final assistant message is
        # rendered closed and no generation prompt follows, as llama-server does without --jinja.
        if len(messages) >= 2 and messages[-2].get("role") == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.")
        add_generation_prompt = False
    elif prefill:
        last = messages.pop()
        if messages and messages[-1].get("role") == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.")
        if kwargs.get("enable_thinking") is True and "enable_thinking" in _explicit_kwargs(body, s):
            raise invalid("Assistant response prefill is incompatible with enable_thinking.")
        add_generation_prompt = True
    prompt = _render(tmpl, messages, add_generation_prompt, treq.tools, kwargs)
    with_gp = prompt if add_generation_prompt else _try_render(tmpl, messages, True, treq.tools, kwargs)
    without_gp = _try_render(tmpl, messages, False, treq.tools, kwargs)
    gen = generation_prompt(with_gp, without_gp) if with_gp is not None and without_gp is not None else ""
    if last is not None:  # the raw message: its text parts are joined as llama.cpp continues them
        text = prefill_text(body["messages"][-1])
        prompt += text
        gen += text
    syntax = build_syntax(treq, tmpl, _reasoning_format(body, s), gen, s.skip_chat_parsing)
    think_end = syntax.think.end if syntax.think is not None and syntax.opened else None
    return RenderedChat(prompt, gen, syntax, tool_call_grammar(treq, think_end))


def _try_render(tmpl: ChatTemplateLike, messages: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]) -> str | None:
    try:
        return _render(tmpl, messages, add_generation_prompt, tools, kwargs)
    except ApiError:
        return None


def _explicit_kwargs(body: dict[str, Any], s: ServerSettings) -> set[str]:
    keys = set(s.chat_template_kwargs)
    req = body.get("chat_template_kwargs")
    if isinstance(req, dict):
        keys |= set(req)
    return keys


def chat_to_completion(body: dict[str, Any], tmpl: ChatTemplateLike | None, s: ServerSettings) -> dict[str, Any]:
    """The completion-field body equivalent to a chat body (``prompt`` = rendered chat)."""
    return prepare_chat(body, tmpl, s)[0]


def prepare_chat(body: dict[str, Any], tmpl: ChatTemplateLike | None, s: ServerSettings
                 ) -> tuple[dict[str, Any], RenderedChat]:
    """``chat_to_completion`` plus the rendered chat (how the output is parsed, the tool grammar)."""
    params: dict[str, Any] = {}
    stop = body.get("stop")
    params["stop"] = [stop] if isinstance(stop, str) else (stop if stop is not None else [])

    if body.get("json_schema") is not None and body.get("grammar"):
        raise invalid("Cannot use both json_schema and grammar")
    if "response_format" in body:
        schema = response_format_schema(body.get("response_format"), body.get("json_schema"))
        if schema is not None:
            params["json_schema"] = schema

    rendered = render_chat_full(body, tmpl, s)
    params["prompt"] = rendered.prompt
    params["generation_prompt"] = rendered.generation_prompt
    tags = detect_think_tags(template_source(tmpl))
    if tags is not None:  # what a reasoning budget counts between (the chat path sets them, as llama-server)
        params["reasoning_budget_start_tag"] = tags.start
        params["reasoning_budget_end_tags"] = [tags.end]
    if rendered.tool_grammar is not None and params.get("json_schema", body.get("json_schema")) is not None:
        raise invalid("A required tool call cannot be combined with response_format or json_schema")

    if body.get("logprobs") is True:
        if rendered.syntax.tools is not None and body.get("stream") is True:
            raise invalid("logprobs is not supported with tools + stream")
        top = body.get("top_logprobs")
        params["n_probs"] = 20 if top is None else top
    elif body.get("top_logprobs") is not None:
        raise invalid("top_logprobs requires logprobs to be set to true")

    for k, v in body.items():
        if k not in params or k == "n_predict":
            params[k] = v
    return params, rendered
