"""llama.cpp's built-in chat formats against prompts recorded from llama-server --no-jinja.

tests/golden/chat-formats.json holds, for every built-in name and every template file of
llama.cpp's models/templates, the prompts /apply-template rendered for two conversations (null:
llama-server refused the template). The built-in name cases check each format; the file cases
check format detection from a template's source.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvserve.model.chat_detect import detect_format
from kvserve.model.chat_formats import BUILTIN_NAMES, FORMATS, apply_format, trim
from kvserve.model.chat_template import ChatTemplate, resolve_override

from ..conftest import GOLDEN_DIR

GOLDEN = json.loads((GOLDEN_DIR / "chat-formats.json").read_text())
CHATS: list[list[dict[str, str]]] = GOLDEN["chats"]
NAMED = [c for c in GOLDEN["cases"] if "name" in c]
FILES = [c for c in GOLDEN["cases"] if "file" in c]


def _pairs(chat: list[dict[str, str]]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in chat]


def test_every_llama_cpp_name_is_known() -> None:
    assert sorted(c["name"] for c in NAMED) == list(BUILTIN_NAMES)
    assert set(FORMATS) == set(BUILTIN_NAMES) | {"dots1"}  # dots1 is detected, never named


@pytest.mark.parametrize("case", NAMED, ids=[c["name"] for c in NAMED])
def test_named_format_matches_llama_server(case: dict[str, Any]) -> None:
    assert case["prompts"] is not None
    for chat, prompt in zip(CHATS, case["prompts"], strict=True):
        assert apply_format(case["name"], _pairs(chat), add_ass=True) == prompt


@pytest.mark.parametrize("case", FILES, ids=[c["file"] for c in FILES])
def test_detected_format_matches_llama_server(case: dict[str, Any]) -> None:
    fmt = detect_format(case["template"])
    if case["prompts"] is None:  # llama-server refused it without --jinja
        assert fmt is None
        return
    assert fmt is not None
    for chat, prompt in zip(CHATS, case["prompts"], strict=True):
        assert apply_format(fmt, _pairs(chat), add_ass=True) == prompt


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_generation_prompt_is_only_a_suffix(name: str) -> None:
    chat = _pairs(CHATS[0])
    closed, open_ = apply_format(name, chat, add_ass=False), apply_format(name, chat, add_ass=True)
    assert open_.startswith(closed)


def test_trim_is_c_isspace_only() -> None:
    assert trim("\t\n x \v\f\r ") == "x"
    assert trim("\u00a0x\u3000") == "\u00a0x\u3000"  # not C whitespace


def test_detection_order_details() -> None:
    assert detect_format("mistral-v7") == "mistral-v7"  # a name selects itself
    assert detect_format("mistral something") == "llama2"  # starts with "mistral"
    assert detect_format("<|im_start|><|im_sep|>") == "phi4"
    assert detect_format("<|im_start|><end_of_utterance>") == "smolvlm"
    assert detect_format("[INST] <<SYS>> content.strip()") == "llama2-sys-strip"
    assert detect_format("<|assistant|><|user|></s>") == "falcon3"
    assert detect_format("<|assistant|><|user|>") == "glmedge"
    assert detect_format("USER: ASSISTANT: SYSTEM: ") == "vicuna-orca"
    assert detect_format("<|start_of_role|><tools>g4_default_system_message") == "granite-4.0"
    assert detect_format("<|endofuserprompt|>") == "dots1"
    assert detect_format("{{ messages }}") is None


def test_resolve_override_rules() -> None:
    assert resolve_override("llama3", jinja=False) == ("llama3", "llama3")
    assert resolve_override("llama3", jinja=True) == ("llama3", None)  # literal Jinja text
    assert resolve_override("{% x %}<start_of_turn>", jinja=False)[1] == "gemma"
    with pytest.raises(ValueError, match="not supported"):
        resolve_override("plain text", jinja=False)


def test_template_without_jinja_renders_the_format(smollm_meta: dict[str, Any]) -> None:
    tmpl = ChatTemplate.from_metadata(smollm_meta, "command-r", jinja=False)
    typed = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert tmpl.render(typed) == (
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>a\nb<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )
    assert tmpl.source == "command-r"
