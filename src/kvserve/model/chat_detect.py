"""Which built-in chat format a template string means (llama.cpp's ``llm_chat_detect_template``).

A built-in name selects itself; otherwise the first rule whose markers occur in the template text
wins, in llama.cpp's order. ``None``: no built-in format fits (llama-server then refuses the
template when Jinja is off).
"""

from __future__ import annotations

from collections.abc import Callable

from kvserve.model.chat_formats import BUILTIN_NAMES


def _mistral_or_llama2(has: Callable[[str], bool]) -> str:
    if has("[SYSTEM_PROMPT]"):
        return "mistral-v7"
    if has("' [INST] ' + system_message") or has("[AVAILABLE_TOOLS]"):
        if has(" [INST]"):
            return "mistral-v1"
        if has('"[INST]"'):
            return "mistral-v3-tekken"
        return "mistral-v3"
    if has("content.strip()"):
        return "llama2-sys-strip"
    if has("bos_token + '[INST]"):
        return "llama2-sys-bos"
    if has("<<SYS>>"):
        return "llama2-sys"
    return "llama2"


# (all markers that must occur, format) after the special cases handled in ``detect_format``.
_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|{{ item['role'] }}|>", "<|begin_of_image|>"), "glmedge"),
    (("<|user|>", "<|endoftext|>"), "zephyr"),
    (("bos_token + message['role']",), "monarch"),
    (("<start_of_turn>",), "gemma"),
    (("'\\n\\nAssistant: ' + eos_token",), "orion"),
    (("GPT4 Correct ",), "openchat"),
)
_RULES_AFTER_VICUNA: tuple[tuple[tuple[str, ...], str], ...] = (
    (("### Instruction:", "<|EOT|>"), "deepseek"),
    (("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"), "command-r"),
    (("<|start_header_id|>", "<|end_header_id|>"), "llama3"),
    (("[gMASK]sop",), "chatglm3"),
    (("<用户>",), "minicpm"),
    (("'Assistant: ' + message['content'] + eos_token",), "deepseek2"),
    (("<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>"), "deepseek3"),
)
_RULES_TAIL: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        (
            "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]",
        ),
        "gigachat",
    ),
    (("<|role_start|>",), "megrez"),
    ((" Ассистент:",), "yandex"),
    (("<role>ASSISTANT</role>", "'HUMAN'"), "bailing"),
    (("<role>ASSISTANT</role>", '"HUMAN"', "<think>"), "bailing-think"),
    (("<role>ASSISTANT</role>", "<role>HUMAN</role>", "<|role_end|>"), "bailing2"),
    (("<|header_start|>", "<|header_end|>"), "llama4"),
    (("<|endofuserprompt|>",), "dots1"),
    (("<|extra_0|>", "<|extra_4|>"), "hunyuan-moe"),
    (("<|start|>", "<|channel|>"), "gpt-oss"),
    (("<｜hy_Assistant｜>", "<｜hy_begin▁of▁sentence｜>"), "hunyuan-vl"),
    (("<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"), "hunyuan-dense"),
    (("<|im_assistant|>assistant<|im_middle|>",), "kimi-k2"),
    (("<seed:bos>",), "seed_oss"),
    (("'Assistant: '  + message['content'] + '<|separator|>",), "grok-2"),
    (("[unused9]系统：[unused10]",), "pangu-embedded"),
    (("<|begin|>", "<|end|>", "<|content|>"), "solar-open"),
)


def _first(tmpl: str, rules: tuple[tuple[tuple[str, ...], str], ...]) -> str | None:
    for markers, name in rules:
        if all(m in tmpl for m in markers):
            return name
    return None


def detect_format(tmpl: str) -> str | None:
    """The built-in format for ``tmpl`` (a name or a template's source), or None."""
    if tmpl in BUILTIN_NAMES:
        return tmpl

    def has(marker: str) -> bool:
        return marker in tmpl

    if has("<|im_start|>"):
        return "phi4" if has("<|im_sep|>") else "smolvlm" if has("<end_of_utterance>") else "chatml"
    if tmpl.startswith("mistral") or has("[INST]"):
        return _mistral_or_llama2(has)
    if has("<|assistant|>") and has("<|end|>"):
        return "phi3"
    if has("[gMASK]<sop>"):
        return "chatglm4"
    if has("<|assistant|>") and has("<|user|>"):
        if has("<|tool_declare|>"):
            return "exaone-moe"
        return "falcon3" if has("</s>") else "glmedge"
    found = _first(tmpl, _RULES)
    if found is not None:
        return found
    if has("USER: ") and has("ASSISTANT: "):
        return "vicuna-orca" if has("SYSTEM: ") else "vicuna"
    found = _first(tmpl, _RULES_AFTER_VICUNA)
    if found is not None:
        return found
    if has("[|system|]") and has("[|assistant|]") and has("[|endofturn|]"):
        return "exaone4" if has("[|tool|]") else "exaone3"
    if has("rwkv-world") or has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"):
        return "rwkv-world"
    if has("<|start_of_role|>"):
        if has("<tool_call>") or has("<tools>"):
            return "granite-4.0" if has("g4_default_system_message") else "granite-4.1"
        return "granite"
    return _first(tmpl, _RULES_TAIL)
