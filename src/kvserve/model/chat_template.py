"""Chat templates: the GGUF's ``tokenizer.chat_template`` rendered with Jinja, llama-server style.

* The template comes from ``--chat-template`` (see ``resolve_override``) or the model metadata;
  without one, llama-server's ChatML template is used (also when the model's template fails to render
  the startup example).
* Rendering follows HuggingFace's environment (sandboxed, ``trim_blocks``/``lstrip_blocks``,
  ``raise_exception``, ``strftime_now``, ``tojson``) with the variables llama-server passes
  (``messages``, ``bos_token``, ``eos_token``, ``add_generation_prompt``, ``tools``, today's
  ``date_string``/``datetime`` and extra kwargs, which may replace those two).
* Messages are validated by ``chat_messages`` (llama-server's checks and messages); llama.cpp's
  built-in formats (``--no-jinja``) live in ``chat_formats`` and ``chat_detect``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from kvserve.model.chat_caps import template_caps
from kvserve.model.chat_detect import detect_format
from kvserve.model.chat_formats import apply_format
from kvserve.model.chat_messages import (
    MessageFormatError,
    arguments_as_objects,
    prefill_text,
    validate_messages,
    validate_tools,
)
from kvserve.model.jinja_env import TemplateRaised, date_variables, make_env
from kvserve.model.tokenizer import Tokenizer, VocabInfo

__all__ = ["CHATML_TEMPLATE", "ChatTemplate", "ChatTemplateError", "MessageFormatError", "resolve_override",
           "validate_messages", "validate_tools"]

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
    """Rendering failed inside the template itself (a template bug): a 500. A template's own
    ``raise_exception`` is a ``MessageFormatError`` instead (llama-server answers 500 for both)."""


_ENV = make_env()

# --------------------------------------------------------------------------------------------------
# the template
# --------------------------------------------------------------------------------------------------


_NOT_SUPPORTED = "the supplied chat template is not supported"
_LEGACY_NOTE = ("note: kvserve was started without --jinja, only llama.cpp's built-in chat formats "
                "are supported")


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
            msgs = [arguments_as_objects(m) for m in msgs]
        prefill = ""
        if prefill_assistant and msgs and msgs[-1]["role"] == "assistant":
            msgs.pop()
            if msgs and msgs[-1]["role"] == "assistant":
                raise MessageFormatError("Cannot have 2 or more assistant messages at the end of the list.")
            if kwargs.get("enable_thinking") is True:
                raise MessageFormatError("Assistant response prefill is incompatible with enable_thinking.")
            prefill = prefill_text(raw[-1])
            add_generation_prompt = True
        if self.builtin is not None:
            chat = [(str(m["role"]), str(m.get("content") or "")) for m in msgs]
            return apply_format(self.builtin, chat, add_generation_prompt) + prefill
        assert self._template is not None

        context: dict[str, Any] = {**date_variables(), **kwargs}
        context.update(
            messages=msgs,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            add_generation_prompt=add_generation_prompt,
            tools=tool_list or None,
        )
        try:
            out = self._template.render(**context)
        except TemplateRaised as e:  # the template refuses these messages: the client's mistake
            raise MessageFormatError(str(e)) from None
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
        """Best-effort ``chat_template_caps`` for ``/props`` (see ``chat_caps``)."""
        return template_caps(self._template, self.bos_token, self.eos_token)


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
