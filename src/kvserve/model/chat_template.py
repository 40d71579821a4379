"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered with Jinja, llama-server style.

* The template comes from ``--chat-template`` (a built-in name or inline Jinja) or the model metadata;
  without one, llama-server's ChatML template is used (also when the model's template fails to render
  the startup example).
* Rendering follows HuggingFace's environment (sandboxed, ``trim_blocks``/``lstrip_blocks``,
  ``raise_exception``, ``strftime_now``, ``tojson``) with the variables llama-server passes
  (``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt``, ``tools`` and extra kwargs).
* Messages are validated with llama-server's error messages, and typed content
  (``[{"type": "text", "text": ...}]``) is joined into one string with newlines, as llama-server does
  for templates that take string content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvserve.model.chat_detect import detect_format
from kvserve.model.chat_formats import apply_format
from kvserve.model.tokenizer import Tokenizer, VocabInfo

# llama.cpp's CHATML_TEMPLATE_SRC (common/chat.cpp), byte for byte: /props reports it as chat_template.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\n' -}}\n"
    "{%- endif -%}"
)

# common_chat_format_example: what llama-server renders at startup to check the model's template
_EXAMPLE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "How are you?"},
]


class ChatTemplateError(RuntimeError):
    """Rendering failed (a template error or ``raise_exception``); llama-server answers 500."""


class MessageFormatError(ValueError):
    """A malformed ``messages``/``tools`` list. ``status`` is the HTTP status llama-server uses:
    400 for its request checks, 500 for errors raised while parsing the messages afterwards."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------------------------------
# Jinja environment
# --------------------------------------------------------------------------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}…{% endgeneration %}`` (used by some HF templates): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _make_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_env()

# --------------------------------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------------------------------


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """llama-server's checks on ``messages`` (``oaicompat_chat_params_parse`` then
    ``common_chat_msgs_parse_oaicompat``). Returns the messages as templates see them: ``content``
    always a string (text parts joined by newlines), tool calls normalized."""
    if messages is None:
        raise MessageFormatError("'messages' is required")
    if not isinstance(messages, list):
        raise MessageFormatError("Expected 'messages' to be an array")
    for msg in messages:
        is_obj = isinstance(msg, dict)
        role = msg.get("role") if is_obj else None
        role = role if isinstance(role, str) else ""
        has_content = is_obj and "content" in msg
        if role != "assistant" and not has_content:
            raise MessageFormatError("All non-assistant messages must contain 'content'")
        if role == "assistant":
            if not has_content and "tool_calls" not in msg:
                raise MessageFormatError("Assistant message must contain either 'content' or 'tool_calls'!")
            if not has_content:
                continue
        content = msg["content"]
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            raise MessageFormatError("Expected 'content' to be a string or an array")
        for part in content:
            ptype = part.get("type") if isinstance(part, dict) else None
            ptype = ptype if isinstance(ptype, str) else ""
            if ptype in ("image_url", "input_audio"):
                media = "image" if ptype == "image_url" else "audio"
                raise MessageFormatError(
                    f"{media} input is not supported - hint: if this is unexpected, "
                    "you may need to provide the mmproj",
                    status=500,
                )
            if ptype != "text":
                raise MessageFormatError("unsupported content[].type")
    try:
        return [_parse_message(m) for m in messages]
    except ValueError as e:
        raise MessageFormatError(f"Failed to parse messages: {e}", status=500) from None


def _parse_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError(f"Expected 'message' to be an object, got {_dump(message)}")
    if "role" not in message:
        raise ValueError(f"Missing 'role' in message: {_dump(message)}")
    role = message["role"]
    if not isinstance(role, str):
        raise ValueError(f"'role' must be a string, got {_dump(role)}")
    out: dict[str, Any] = {"role": role}
    has_content = "content" in message
    has_tool_calls = "tool_calls" in message
    content = ""
    if has_content:
        raw = message["content"]
        if isinstance(raw, str):
            content = raw
        elif isinstance(raw, list):
            texts: list[str] = []
            for part in raw:
                if not isinstance(part, dict) or "type" not in part:
                    raise ValueError(f"Missing content part type: {_dump(part)}")
                if part["type"] not in ("text", "media_marker"):
                    raise ValueError(f"Unsupported content part type: {_dump(part['type'])}")
                if not isinstance(part.get("text"), str):
                    raise ValueError(f"content part 'text' must be a string: {_dump(part)}")
                texts.append(part["text"])
            content = "\n".join(texts)
        elif raw is not None:
            raise ValueError(
                f"Invalid 'content' type: expected string or array, got {_dump(raw)} "
                "(ref: https://github.com/ggml-org/llama.cpp/issues/8367)"
            )
    out["content"] = content
    if has_tool_calls:
        calls = message["tool_calls"]
        if not isinstance(calls, list):
            raise ValueError(f"Expected 'tool_calls' to be an array, got {_dump(calls)}")
        out_calls = [_parse_tool_call(tc) for tc in calls]
    if not has_content and not has_tool_calls:
        raise ValueError(
            "Expected 'content' or 'tool_calls' (ref: https://github.com/ggml-org/llama.cpp/issues/8367 & "
            "https://github.com/ggml-org/llama.cpp/issues/12279)"
        )
    for key in ("reasoning_content", "name", "tool_call_id"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"'{key}' must be a string, got {_dump(value)}")
        if value:
            out[key] = value
    if has_tool_calls and out_calls:
        out["tool_calls"] = out_calls
    return out


def _parse_tool_call(tool_call: Any) -> dict[str, Any]:
    if not isinstance(tool_call, dict) or "type" not in tool_call:
        raise ValueError(f"Missing tool call type: {_dump(tool_call)}")
    if tool_call["type"] != "function":
        raise ValueError(f"Unsupported tool call type: {_dump(tool_call)}")
    fn = tool_call.get("function")
    if not isinstance(fn, dict):
        raise ValueError(f"Missing tool call function: {_dump(tool_call)}")
    if "name" not in fn:
        raise ValueError(f"Missing tool call name: {_dump(tool_call)}")
    args = fn.get("arguments", "")
    call: dict[str, Any] = {
        "type": "function",
        "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else _dump(args)},
    }
    if tool_call.get("id"):
        call["id"] = tool_call["id"]
    return call


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """``common_chat_tools_parse_oaicompat``: tools as templates see them."""
    if tools is None:
        return []
    try:
        if not isinstance(tools, list):
            raise ValueError(f"Expected 'tools' to be an array, got {_dump(tools)}")
        out: list[dict[str, Any]] = []
        for tool in tools:
            if not isinstance(tool, dict) or "type" not in tool:
                raise ValueError(f"Missing tool type: {_dump(tool)}")
            if tool["type"] != "function":
                raise ValueError(f"Unsupported tool type: {_dump(tool)}")
            fn = tool.get("function")
            if not isinstance(fn, dict):
                raise ValueError(f"Missing tool function: {_dump(tool)}")
            if "name" not in fn:
                raise ValueError(f"Missing tool function name: {_dump(tool)}")
            out.append({
                "type": "function",
                "function": {
                    "name": fn["name"],
                    "description": fn.get("description", ""),
                    "parameters": fn.get("parameters", {}),
                },
            })
        return out
    except ValueError as e:
        raise MessageFormatError(f"Failed to parse tools: {e}", status=500) from None


# --------------------------------------------------------------------------------------------------
# the template
# --------------------------------------------------------------------------------------------------


_NOT_SUPPORTED = "the supplied chat template is not supported"
_LEGACY_NOTE = "note: kvserve was started without --jinja, only llama.cpp's built-in chat formats are supported"


def resolve_override(override: str, jinja: bool) -> tuple[str, str | None]:
    """``--chat-template`` value -> (source, built-in format or None for Jinja), as llama-server does.

    ``chatml`` always means llama-server's ChatML Jinja source. With ``--jinja`` any other text is
    the Jinja template itself (so a built-in name renders as that literal text, exactly as
    llama-server does). Without it the text must be a built-in name or recognisable as one of the
    built-in formats (``llm_chat_detect_template``).
    """
    if override == "chatml":
        return CHATML_TEMPLATE, (None if jinja else "chatml")
    if jinja:
        return override, None
    fmt = detect_format(override)
    if fmt is None:
        raise ValueError(f"{_NOT_SUPPORTED}: {override}\n{_LEGACY_NOTE}")
    return override, fmt


class ChatTemplate:
    """A chat template plus the token strings and flags llama-server renders it with.

    ``builtin`` names the llama.cpp built-in format that renders it (``--no-jinja``, or a built-in
    name given to ``--chat-template``); None means the source is rendered as Jinja.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_bos: bool = False,
        add_eos: bool = False,
        builtin: str | None = None,
        has_explicit_template: bool = True,
    ) -> None:
        self._template: jinja2.Template | None = None
        try:
            self._template = _ENV.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            if builtin is None:
                raise ValueError(f"invalid chat template: {e} (line {e.lineno})") from None
        self.source = source
        self.builtin = builtin
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.has_explicit_template = has_explicit_template
        self.fallback_reason: str | None = None

    @property
    def name(self) -> str:
        """The template source, as ``/props`` reports it in ``chat_template``."""
        return self.source

    @classmethod
    def from_metadata(
        cls, meta: Mapping[str, Any], override: str | None = None, *, tokenizer: Tokenizer | None = None,
        jinja: bool = True,
    ) -> ChatTemplate:
        """The template llama-server would use for this model, ``--chat-template`` and ``--jinja``.

        ``override`` is a built-in name or a template (see ``resolve_override``); ValueError when it
        cannot be used. Without an override the model's ``tokenizer.chat_template`` is used (its
        ``tool_use`` variant, then ChatML, when missing). With Jinja, a model template that cannot
        render the startup example falls back to ChatML; without Jinja it must match a built-in
        format (ValueError otherwise, as llama-server then fails to start).
        """
        tokens: dict[str, Any]
        if tokenizer is not None:
            tokens = dict(bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token,
                          add_bos=tokenizer.add_bos, add_eos=tokenizer.add_eos)
        else:
            tokens = _token_strings(meta)

        if override:
            source, builtin = resolve_override(override, jinja)
            tmpl = cls(source, builtin=builtin, has_explicit_template=True, **tokens)
            try:
                tmpl.render([{"role": "user", "content": "test"}], add_generation_prompt=False)
            except (ChatTemplateError, MessageFormatError) as e:
                raise ValueError(f"{_NOT_SUPPORTED}: {e}") from None
            return tmpl.checked()

        source = meta.get("tokenizer.chat_template") or ""
        tool_use = meta.get("tokenizer.chat_template.tool_use") or ""
        explicit = bool(source or tool_use)
        if not source or source == "chatml":
            source = tool_use or CHATML_TEMPLATE
        if not jinja:
            builtin = detect_format(source)
            if builtin is None:
                raise ValueError("chat template parsing error: this custom template is not supported, "
                                 "try using --jinja (or --chat-template NAME)")
            return cls(source, builtin=builtin, has_explicit_template=explicit, **tokens)
        try:
            tmpl = cls(source, has_explicit_template=explicit, **tokens)
        except ValueError as e:
            return cls._chatml_fallback(tokens, explicit, str(e))
        return tmpl.checked()

    def checked(self) -> ChatTemplate:
        """This template, or ChatML if it cannot render llama-server's startup example."""
        if self.builtin is not None:
            return self
        try:
            self.render(_EXAMPLE_MESSAGES, add_generation_prompt=True)
        except (ChatTemplateError, MessageFormatError) as e:
            tokens = dict(bos_token=self.bos_token, eos_token=self.eos_token,
                          add_bos=self.add_bos, add_eos=self.add_eos)
            return self._chatml_fallback(tokens, self.has_explicit_template, str(e))
        return self

    @classmethod
    def _chatml_fallback(cls, tokens: dict[str, Any], explicit: bool, reason: str) -> ChatTemplate:
        tmpl = cls(CHATML_TEMPLATE, has_explicit_template=explicit, **tokens)
        tmpl.fallback_reason = reason
        return tmpl

    # ---- rendering -------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]] | Any,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        prefill_assistant: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt for ``messages``.

        ``kwargs`` become template variables (``chat_template_kwargs``). With ``prefill_assistant``
        (llama-server's default for chat requests) a trailing assistant message is not closed: the
        template is rendered without it, with the generation prompt, and its text is appended.
        A built-in format sees only roles and text (no tools, no kwargs), as in llama.cpp.
        """
        raw = list(messages) if isinstance(messages, tuple) else messages
        msgs = validate_messages(raw)
        tool_list = validate_tools(tools)
        if any("tool_calls" in m for m in msgs) and self._object_arguments():
            msgs = [_arguments_as_objects(m) for m in msgs]
        prefill = ""
        if prefill_assistant and msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
            if msgs and msgs[-1]["role"] == "assistant":
                raise MessageFormatError("Cannot have 2 or more assistant messages at the end of the list.")
            if kwargs.get("enable_thinking") is True:
                raise MessageFormatError("Assistant response prefill is incompatible with enable_thinking.")
            prefill = _prefill_text(raw[-1])
            add_generation_prompt = True
        if self.builtin is not None:
            chat = [(str(m["role"]), str(m.get("content") or "")) for m in msgs]
            return apply_format(self.builtin, chat, add_generation_prompt) + prefill
        assert self._template is not None

        context: dict[str, Any] = dict(kwargs)
        context.update(
            messages=msgs,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tool_list or None,
        )
        try:
            out = self._template.render(**context)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(str(e)) from None
        except Exception as e:  # template code can raise anything (TypeError on str + list, ...)
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from None

        if self.add_bos and self.bos_token and out.startswith(self.bos_token):
            out = out[len(self.bos_token):]
        if self.add_eos and self.eos_token and out.endswith(self.eos_token):
            out = out[: -len(self.eos_token)]
        return out + prefill

    # ---- capabilities ----------------------------------------------------------------------------

    def _object_arguments(self) -> bool:
        """Templates that ``tojson`` the arguments want them as an object, not a JSON string."""
        cached = getattr(self, "_object_args_cache", None)
        if cached is None:
            cached = self.caps()["supports_object_arguments"]
            self._object_args_cache = cached
        return bool(cached)

    def caps(self) -> dict[str, bool]:
        """Best-effort ``chat_template_caps`` for ``/props``, found by rendering probe conversations."""
        probe = "<<probe-4a7c>>"

        template = self._template

        def renders(messages: list[dict[str, Any]], **kw: Any) -> str | None:
            if template is None:
                return None
            try:
                return template.render(
                    messages=messages, bos_token=self.bos_token, eos_token=self.eos_token,
                    add_generation_prompt=False, **{"tools": None, **kw}
                )
            except Exception:
                return None

        user = {"role": "user", "content": "hi"}
        def call(name: str, args: Any) -> dict[str, Any]:
            return {"type": "function", "id": f"id_{name}", "function": {"name": name, "arguments": args}}

        tool = {"type": "function", "function": {"name": "probe_tool", "description": "", "parameters": {}}}

        out = renders([{"role": "user", "content": probe}])
        string_content = out is not None and probe in out
        out = renders([{"role": "user", "content": [{"type": "text", "text": probe}]}])
        typed_content = out is not None and probe in out and "'type'" not in out and '"type"' not in out
        out = renders([{"role": "system", "content": probe}, user])
        system_role = out is not None and probe in out
        out = renders([user], tools=[tool])
        supports_tools = out is not None and "probe_tool" in out
        def assistant_calls(*calls: dict[str, Any]) -> list[dict[str, Any]]:
            return [user, {"role": "assistant", "content": "", "tool_calls": list(calls)}]

        out = renders(assistant_calls(call("probe_fn", '{"a": 1}')))
        tool_calls = out is not None and "probe_fn" in out
        out = renders(assistant_calls(call("probe_fn", '{"a": 1}'), call("probe_fn2", '{"b": 2}')))
        parallel = tool_calls and out is not None and "probe_fn2" in out
        out = renders(assistant_calls(call("probe_fn", {"a": 1})))
        object_args = tool_calls and out is not None and '{"a": 1}' in out
        out = renders([user, {"role": "assistant", "content": "x", "reasoning_content": probe}, user])
        preserve_reasoning = out is not None and probe in out
        low = renders([user], reasoning_effort="low")
        high = renders([user], reasoning_effort="high")
        reasoning_effort = low is not None and high is not None and low != high
        return {
            "supports_object_arguments": bool(object_args),
            "supports_parallel_tool_calls": bool(parallel),
            "supports_preserve_reasoning": preserve_reasoning,
            "supports_reasoning_effort": reasoning_effort,
            "supports_string_content": string_content,
            "supports_system_role": system_role,
            "supports_tool_calls": tool_calls,
            "supports_tools": supports_tools,
            "supports_typed_content": typed_content,
        }


def _arguments_as_objects(message: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's ``func_args_not_string`` workaround: tool-call arguments decoded from JSON."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out_calls = []
    for call in calls:
        args = call["function"]["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError as e:
                raise MessageFormatError(f"Failed to parse tool call arguments as JSON: {e}", status=500) from None
        out_calls.append({**call, "function": {**call["function"], "arguments": args}})
    return {**message, "tool_calls": out_calls}


def _prefill_text(message: Mapping[str, Any]) -> str:
    """The prefilled assistant text: typed parts are concatenated without separators."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _token_strings(meta: Mapping[str, Any]) -> dict[str, Any]:
    vocab = VocabInfo.from_metadata(dict(meta))

    def text(tid: int | None) -> str:
        return "" if tid is None else vocab.piece_bytes(tid).decode("utf-8", errors="replace")

    return dict(
        bos_token=text(vocab.special_ids["bos"]),
        eos_token=text(vocab.special_ids["eos"]),
        add_bos=vocab.add_bos,
        add_eos=vocab.add_eos,
    )
