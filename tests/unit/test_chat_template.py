"""Chat template tests against llama-server goldens (/apply-template and /props)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvserve.model.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    MessageFormatError,
    validate_messages,
)

from ..conftest import GOLDEN_DIR

GOLDEN = GOLDEN_DIR




def _meta(request: pytest.FixtureRequest, model: str) -> dict[str, Any]:
    return request.getfixturevalue({"smollm2": "smollm_meta", "gemma3": "gemma_meta"}[model])


def _responses(model: str) -> dict[str, Any]:
    return json.loads((GOLDEN / f"responses-{model}.json").read_text())["responses"]


USER = {"role": "user", "content": "hi"}

# --------------------------------------------------------------------------------------------------
# goldens
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_apply_template_goldens(request: pytest.FixtureRequest, model: str) -> None:
    tmpl = ChatTemplate.from_metadata(_meta(request, model))
    cases = json.loads((GOLDEN / f"apply-template-{model}.json").read_text())["cases"]
    assert cases
    for case in cases:
        assert tmpl.render(case["messages"]) == case["prompt"]


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_props_template_fields(request: pytest.FixtureRequest, model: str) -> None:
    tmpl = ChatTemplate.from_metadata(_meta(request, model))
    props = _responses(model)["GET /props"][1]
    assert tmpl.name == tmpl.source == props["chat_template"]
    assert tmpl.bos_token == props["bos_token"]
    assert tmpl.eos_token == props["eos_token"]
    assert tmpl.caps() == props["chat_template_caps"]


def test_gemma_without_template_falls_back_to_chatml(gemma_meta: dict[str, Any]) -> None:
    assert "tokenizer.chat_template" not in gemma_meta
    tmpl = ChatTemplate.from_metadata(gemma_meta)
    assert tmpl.source == CHATML_TEMPLATE
    assert tmpl.builtin is None  # rendered as Jinja, like llama-server with --jinja
    assert tmpl.has_explicit_template is False
    assert tmpl.add_bos is True


def test_apply_template_endpoint_golden(smollm_meta: dict[str, Any]) -> None:
    prompt = _responses("smollm2")["POST /apply-template"][1]["prompt"]
    msgs = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three primes."},
    ]
    assert ChatTemplate.from_metadata(smollm_meta).render(msgs) == prompt


def test_typed_content_is_joined_with_newlines(smollm_meta: dict[str, Any]) -> None:
    tmpl = ChatTemplate.from_metadata(smollm_meta)
    parts = [{"type": "text", "text": "Line one"}, {"type": "text", "text": "Line two"}]
    assert tmpl.render([{"role": "user", "content": parts}]) == tmpl.render(
        [{"role": "user", "content": "Line one\nLine two"}]
    )
    # null content is an empty string
    out = tmpl.render([{"role": "system", "content": None}, USER])
    assert out.startswith("<|im_start|>system\n<|im_end|>\n")


def test_add_generation_prompt_false(smollm_meta: dict[str, Any]) -> None:
    out = ChatTemplate.from_metadata(smollm_meta).render([USER], add_generation_prompt=False)
    assert out.endswith("<|im_start|>user\nhi<|im_end|>\n")


# --------------------------------------------------------------------------------------------------
# --chat-template
# --------------------------------------------------------------------------------------------------

CONVERSATION = [
    {"role": "system", "content": " Be brief. "},
    {"role": "user", "content": "Hello "},
    {"role": "assistant", "content": "Hi"},
    {"role": "user", "content": "Bye"},
]

BUILTIN_EXPECTED = {
    "chatml": "<|im_start|>system\n Be brief. <|im_end|>\n<|im_start|>user\nHello <|im_end|>\n"
    "<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\nHi<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n<start_of_turn>model\nHi<end_of_turn>\n"
    "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "zephyr": "<|system|>\n Be brief. <|endoftext|>\n<|user|>\nHello <|endoftext|>\n"
    "<|assistant|>\nHi<|endoftext|>\n<|user|>\nBye<|endoftext|>\n<|assistant|>\n",
}


@pytest.mark.parametrize("name", sorted(BUILTIN_EXPECTED))
def test_builtin_names_without_jinja(smollm_meta: dict[str, Any], name: str) -> None:
    tmpl = ChatTemplate.from_metadata(smollm_meta, name, jinja=False)
    assert tmpl.builtin == name
    assert tmpl.render(CONVERSATION) == BUILTIN_EXPECTED[name]


def test_builtin_name_with_jinja_is_literal_text(smollm_meta: dict[str, Any]) -> None:
    # llama-server b10621 with --jinja --chat-template llama3 renders the text "llama3" (recorded)
    tmpl = ChatTemplate.from_metadata(smollm_meta, "llama3")
    assert tmpl.builtin is None and tmpl.render(CONVERSATION) == "llama3"
    assert ChatTemplate.from_metadata(smollm_meta, "This is not").render([USER]) == "This is not"


def test_chatml_override_is_llama_server_source(smollm_meta: dict[str, Any]) -> None:
    assert ChatTemplate.from_metadata(smollm_meta, "chatml").source == CHATML_TEMPLATE
    assert ChatTemplate.from_metadata(smollm_meta, "chatml", jinja=False).source == CHATML_TEMPLATE


def test_without_jinja_the_model_template_is_detected(smollm_meta: dict[str, Any], gemma_meta: dict[str, Any]) -> None:
    smol = ChatTemplate.from_metadata(smollm_meta, jinja=False)
    assert smol.builtin == "chatml" and smol.source == smollm_meta["tokenizer.chat_template"]
    assert ChatTemplate.from_metadata(gemma_meta, jinja=False).builtin == "chatml"  # no template: ChatML


def test_undetectable_template_without_jinja_is_refused(smollm_meta: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="the supplied chat template is not supported"):
        ChatTemplate.from_metadata(smollm_meta, "{{ messages }}", jinja=False)
    with pytest.raises(ValueError, match="try using --jinja"):
        ChatTemplate.from_metadata(dict(smollm_meta, **{"tokenizer.chat_template": "{{ x }}"}), jinja=False)


def test_inline_jinja_override(smollm_meta: dict[str, Any]) -> None:
    src = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    src += "{% if add_generation_prompt %}>{% endif %}"
    tmpl = ChatTemplate.from_metadata(smollm_meta, src)
    assert tmpl.builtin is None and tmpl.source == src
    assert tmpl.render([USER, {"role": "assistant", "content": "yo"}]) == "[user] hi\n[assistant] yo\n>"


def test_invalid_inline_jinja_is_refused(smollm_meta: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="invalid chat template"):
        ChatTemplate.from_metadata(smollm_meta, "{% for m in messages %}")
    with pytest.raises(ValueError, match="not supported"):
        ChatTemplate.from_metadata(smollm_meta, "{{ raise_exception('nope') }}")


def test_model_template_that_cannot_render_falls_back_to_chatml(smollm_meta: dict[str, Any]) -> None:
    bad = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
    bad += "{% endif %}x"
    tmpl = ChatTemplate.from_metadata(dict(smollm_meta, **{"tokenizer.chat_template": bad}))
    assert tmpl.source == CHATML_TEMPLATE
    assert tmpl.fallback_reason is not None and "System role not supported" in tmpl.fallback_reason


def test_tool_use_variant_used_when_default_missing(gemma_meta: dict[str, Any]) -> None:
    src = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tmpl = ChatTemplate.from_metadata(dict(gemma_meta, **{"tokenizer.chat_template.tool_use": src}))
    assert tmpl.source == src and tmpl.has_explicit_template


# --------------------------------------------------------------------------------------------------
# Jinja environment
# --------------------------------------------------------------------------------------------------


def _inline(meta: dict[str, Any], src: str) -> ChatTemplate:
    return ChatTemplate.from_metadata(meta, src)


def test_hf_environment_features(smollm_meta: dict[str, Any]) -> None:
    src = (
        "{{ messages | tojson }}|{{ {'k': 'é'} | tojson(indent=1) }}|{{ strftime_now('%Y') | length }}|"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}|"
        "{{ bos_token }}{{ eos_token }}|{{ tools is none }}|{{ extra }}"
    )
    out = _inline(smollm_meta, src).render([{"role": "user", "content": "é"}], extra="kw")
    assert out == (
        '[{"role": "user", "content": "é"}]|{\n "k": "é"\n}|4||<|im_start|><|im_end|>|True|kw'
    )


def test_generation_tag_renders_its_body(smollm_meta: dict[str, Any]) -> None:
    src = "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    assert _inline(smollm_meta, src).render([USER]) == "<hi>"


def test_trim_and_lstrip_blocks(smollm_meta: dict[str, Any]) -> None:
    src = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n"
    assert _inline(smollm_meta, src).render([USER]) == "hi\n"


def test_tools_are_passed(smollm_meta: dict[str, Any]) -> None:
    src = "{% for t in tools or [] %}{{ t.function.name }};{% endfor %}{{ messages[-1].content }}"
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    assert _inline(smollm_meta, src).render([USER], tools=tools) == "get_weather;hi"


def test_raise_exception_refuses_the_messages(smollm_meta: dict[str, Any]) -> None:
    # (the startup example has four messages: a template failing on it would be replaced by ChatML)
    src = "{% if messages | length > 4 %}{{ raise_exception('too many messages') }}{% endif %}ok"
    tmpl = _inline(smollm_meta, src)
    assert tmpl.render([USER]) == "ok"
    with pytest.raises(MessageFormatError, match="too many messages"):  # a client error (400)
        tmpl.render([USER] * 5)


def test_sandbox_blocks_mutation(smollm_meta: dict[str, Any]) -> None:
    tmpl = _inline(smollm_meta, "{% if messages | length > 4 %}{{ messages.append(1) }}{% endif %}ok")
    with pytest.raises(ChatTemplateError):
        tmpl.render([USER] * 5)


def test_bos_prefix_removed_when_tokenizer_adds_bos(gemma_meta: dict[str, Any]) -> None:
    tmpl = _inline(gemma_meta, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert tmpl.add_bos is True
    assert tmpl.render([USER]) == "hi"


# --------------------------------------------------------------------------------------------------
# messages
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (None, "'messages' is required"),
        ({"role": "user"}, "Expected 'messages' to be an array"),
        ([{"role": "user"}], "All non-assistant messages must contain 'content'"),
        ([{"role": "assistant"}], "Assistant message must contain either 'content' or 'tool_calls'!"),
        ([{"role": "user", "content": 3}], "Expected 'content' to be a string or an array"),
        ([{"role": "user", "content": [{"type": "video"}]}], "unsupported content[].type"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
         "image input is not supported"),
        ([{"content": "x"}], "Failed to parse messages: Missing 'role' in message: {\"content\":\"x\"}"),
        ([{"role": "user", "content": [{"type": "text"}]}], "Failed to parse messages:"),
    ],
)
def test_message_validation(messages: Any, message: str) -> None:
    with pytest.raises(MessageFormatError) as err:
        validate_messages(messages)
    assert str(err.value).startswith(message)
    assert isinstance(err.value, ValueError)


def test_validated_messages_shape() -> None:
    msgs = validate_messages([
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "x": 1},
        {"role": "assistant", "tool_calls": [
            {"type": "function", "id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}
        ]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ])
    assert msgs == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": '{"x":1}'}, "id": "c1"}]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ]


def test_prefill_assistant(smollm_meta: dict[str, Any]) -> None:
    tmpl = ChatTemplate.from_metadata(smollm_meta)
    parts = [{"type": "text", "text": "The"}, {"type": "text", "text": " end"}]
    msgs = [USER, {"role": "assistant", "content": parts}]
    prefilled = tmpl.render(msgs, add_generation_prompt=False, prefill_assistant=True)
    assert prefilled == tmpl.render([USER]) + "The\n\n end"  # text parts joined as llama.cpp continues them
    with pytest.raises(MessageFormatError, match="Cannot have 2 or more assistant messages"):
        tmpl.render([USER, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}],
                    prefill_assistant=True)
    # without prefill the assistant turn is closed as usual
    closed = tmpl.render(msgs, add_generation_prompt=False)
    assert closed.endswith("<|im_start|>assistant\nThe\n end<|im_end|>\n")


def test_strings_concatenate_with_undefined_and_none_as_in_llama_cpp() -> None:
    from kvserve.model.jinja_env import make_env

    env = make_env()
    out = env.from_string("{{ 'a' + missing + 'b' }}|{{ nothing + 'c' }}|{{ 'd' + nothing }}|{{ 1 + 2 }}")
    assert out.render(nothing=None) == "ab|c|d|3"
    with pytest.raises(Exception):
        env.from_string("{{ 1 + missing }}").render()  # only string concatenation is relaxed


def test_templates_see_todays_date_as_llama_server_passes_it(smollm_meta: dict[str, Any]) -> None:
    import datetime

    meta = {**smollm_meta, "tokenizer.chat_template": "{{ date_string }}|{{ datetime }}"}
    tmpl = ChatTemplate.from_metadata(meta)
    today = datetime.date.today()
    assert tmpl.render([USER]) == today.strftime("%d %b %Y") + "|" + today.strftime("%b %d %Y")
    assert tmpl.render([USER], date_string="x") == "x|" + today.strftime("%b %d %Y")  # chat_template_kwargs win
