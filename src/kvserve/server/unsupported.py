"""Request fields kvserve does not implement: refused with a 400 naming the field.

llama-server would honour these; silently ignoring them would change results without the
client noticing (an adapter that is not used). Fields whose default/neutral value is harmless
(``lora: []``, ``tools: []``) pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvserve.server.errors import unsupported_field


def _truthy(v: Any) -> bool:
    return v is not None and v is not False and v != "" and v != [] and v != {}


# field -> why (checked on every completion-like body, after chat conversion too)
_REFUSED: dict[str, str] = {
    "preserved_tokens": "rendering preserved special tokens is not implemented",
    "lora": "LoRA adapters are not implemented",
    "reasoning_control": "reasoning control is not implemented",
    "parse_tool_calls": "tool calls are not implemented",
    "chat_parser": "chat output parsers are not implemented",
}


# For docs/compat.md: every request field refused with a 400, and when.
REFUSED_FIELDS: list[tuple[str, str]] = [(k, f"{why} (any non-empty value)") for k, why in _REFUSED.items()] + [
    ("reasoning_budget_tokens, thinking_budget_tokens", "a budget (other than -1) without thinking tags: the "
     "template has none and no reasoning_budget_start_tag/end_tags were given"),
    ("echo", "echoing the prompt is not implemented (true)"),
    ("best_of", "use 'n' for several completions (> 1)"),
    ("suffix", "use /infill for fill-in-the-middle (non-empty)"),
    ("modalities", "audio output is not implemented (contains \"audio\")"),
    ("audio", "audio output is not implemented (chat)"),
    ("messages[].content[].type", "multimodal input is not implemented (image_url, input_audio, input_video, "
     "audio_url, video_url parts)"),
]


def check_completion(body: dict[str, Any], features: Mapping[str, str] | None = None) -> None:
    """``features``: server-wide features kvserve was asked for but lacks."""
    for name, why in _REFUSED.items():
        if _truthy(body.get(name)):
            raise unsupported_field(name, why)
    if body.get("echo") is True:
        raise unsupported_field("echo", "echoing the prompt is not implemented")
    best_of = body.get("best_of")
    if isinstance(best_of, (int, float)) and not isinstance(best_of, bool) and best_of > 1:
        raise unsupported_field("best_of", "use 'n' for several completions")
    if _truthy(body.get("suffix")):
        raise unsupported_field("suffix", "use /infill for fill-in-the-middle")
    mods = body.get("modalities")
    if isinstance(mods, list) and "audio" in mods:
        raise unsupported_field("modalities", "audio output is not implemented")


def check_chat(body: dict[str, Any]) -> None:
    """Chat-only fields (before conversion to completion parameters)."""
    if _truthy(body.get("audio")):
        raise unsupported_field("audio", "audio output is not implemented")
