"""Reasoning-budget request fields -> ``ReasoningBudget`` (llama-server's ``server-schema.cpp``).

``reasoning_budget_tokens`` (alias ``thinking_budget_tokens``, hard limits -1..INT32_MAX; -1 means
the server's ``--reasoning-budget``), ``reasoning_budget_start_tag``,
``reasoning_budget_end_tags`` (or ``reasoning_budget_end_tag``) and ``reasoning_budget_message``
(``--reasoning-budget-message``). The chat endpoint sets the tags from the template's thinking
tags; a budget without tags has nothing to count, so a request that asks for one is a 400.
"""

from __future__ import annotations

from typing import Any

from kvserve.engine.reasoning_budget import ReasoningBudget
from kvserve.server import fields as F
from kvserve.server.engine_api import TokenizerLike
from kvserve.server.errors import unsupported_field
from kvserve.server.settings import ServerSettings


def _tags(data: dict[str, Any]) -> list[str]:
    raw = data.get("reasoning_budget_end_tags")
    if raw is None:
        raw = data.get("reasoning_budget_end_tag")
        raw = [raw] if raw is not None else []
    if not isinstance(raw, list):
        raise F.type_error("reasoning_budget_end_tags", "array", raw)
    for t in raw:
        if not isinstance(t, str):
            raise F.type_error("reasoning_budget_end_tags", "string", t)
    return [t for t in raw if t]


def reasoning_budget(data: dict[str, Any], s: ServerSettings, tok: TokenizerLike) -> ReasoningBudget | None:
    asked = F.get_int(data, ("reasoning_budget_tokens", "thinking_budget_tokens"), -1, hard=(-1, F.INT32_MAX))
    budget = asked if asked != -1 else s.reasoning_budget
    start = F.get_str(data, "reasoning_budget_start_tag", "")
    ends = _tags(data)
    if budget < 0:
        return None
    if not start or not ends:
        if asked != -1:
            raise unsupported_field("reasoning_budget_tokens",
                                    "a reasoning budget needs a chat template with thinking tags "
                                    "(or reasoning_budget_start_tag and reasoning_budget_end_tags)")
        return None
    message = F.get_str(data, "reasoning_budget_message", s.reasoning_budget_message)

    def enc(text: str) -> tuple[int, ...]:
        return tuple(tok.encode(text, False, True)) if text else ()

    end_tokens = tuple(enc(t) for t in ends)
    prefill = enc(F.get_str(data, "generation_prompt", ""))
    return ReasoningBudget(budget, enc(start), end_tokens, enc(message) + end_tokens[0], prefill)
