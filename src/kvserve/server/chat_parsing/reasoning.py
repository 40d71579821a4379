"""Thinking blocks: ``<think>…</think>`` split from the answer (``--reasoning-format``).

Formats: ``none`` leaves the output untouched in ``content``; ``deepseek``, ``auto`` and
``deepseek-legacy`` move the block into ``reasoning_content`` (llama-server b10621 parses the
legacy format like ``deepseek``: its parser does not read ``reasoning_in_content``).

When the generation prompt already opened the block (templates that end the prompt with
``<think>\\n``), the output starts inside it. A block that never closes is reasoning.
Whitespace around the block is dropped; a whitespace-only block yields no reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.server.chat_parsing.markers import hold_back

REASONING_FORMATS = ("none", "auto", "deepseek", "deepseek-legacy")


@dataclass(frozen=True)
class ThinkTags:
    start: str = "<think>"
    end: str = "</think>"


# Tag pairs recognised in chat templates, first match wins.
KNOWN_TAGS = (
    ThinkTags("<think>", "</think>"),
    ThinkTags("[THINK]", "[/THINK]"),
    ThinkTags("<|START_THINKING|>", "<|END_THINKING|>"),
)


def detect_think_tags(template_source: str) -> ThinkTags | None:
    for tags in KNOWN_TAGS:
        if tags.start in template_source and tags.end in template_source:
            return tags
    return None


def starts_in_reasoning(generation_prompt: str, tags: ThinkTags) -> bool:
    """Whether the prompt ends inside an open thinking block."""
    i = generation_prompt.rfind(tags.start)
    return i >= 0 and generation_prompt.find(tags.end, i) < 0


def split_reasoning(text: str, tags: ThinkTags, opened: bool, is_partial: bool) -> tuple[str, str]:
    """``(reasoning, rest)`` of the output ``text``; ``rest`` is parsed further for content and
    tool calls. While partial, a tag that may be arriving is held back."""
    if not opened:
        lead = text.lstrip()
        if not lead.startswith(tags.start):
            if is_partial and tags.start.startswith(lead):
                return "", ""  # may still become "<think>"
            return "", text
        body = lead[len(tags.start):]
    else:
        body = text
    j = body.find(tags.end)
    if j < 0:
        return hold_back(body, [tags.end], is_partial).strip(), ""
    return body[:j].strip(), body[j + len(tags.end):].lstrip()
