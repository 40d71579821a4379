"""Reasoning budgets (``--reasoning-budget``, ``reasoning_budget_tokens``): at most N tokens
inside a thinking block, then its end is forced (llama.cpp's reasoning-budget sampler).

States, advanced by every token of the sequence (the generation prompt's tokens first, so a
prompt that opened the block starts the count)::

    IDLE --start tag--> COUNTING --end tag--> DONE
                          | N tokens counted
                          v
                        FORCING: the next tokens are ``forced`` (message + end tag), one per step --> DONE

While FORCING, ``forced_token()`` is the token the sequence must take instead of its sample.
Tags are matched as token sequences, as llama.cpp matches them. Pure Python, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE, COUNTING, FORCING, DONE = "idle", "counting", "forcing", "done"


@dataclass(frozen=True)
class ReasoningBudget:
    """What a request asks for (built by the server from the template's thinking tags)."""

    budget: int  # tokens allowed inside the block (0: end it at once)
    start: tuple[int, ...]  # the start tag's tokens
    ends: tuple[tuple[int, ...], ...]  # tokens of each end tag (the first is forced)
    forced: tuple[int, ...]  # message + first end tag
    prefill: tuple[int, ...] = ()  # the generation prompt's tokens (they may open the block)

    def new_state(self) -> BudgetState:
        return BudgetState(self)


class BudgetState:
    def __init__(self, spec: ReasoningBudget) -> None:
        self.spec = spec
        self.state = IDLE
        self.remaining = spec.budget
        self._recent: list[int] = []
        self._forced_i = 0
        for t in spec.prefill:
            self._observe(t)
        self._maybe_force()

    def forced_token(self) -> int | None:
        return self.spec.forced[self._forced_i] if self.state == FORCING else None

    def accept(self, token: int) -> None:
        if self.state == FORCING:
            self._forced_i += 1
            if self._forced_i >= len(self.spec.forced):
                self.state = DONE
            return
        was_counting = self.state == COUNTING
        self._observe(token)
        if was_counting and self.state == COUNTING:
            self.remaining -= 1
        self._maybe_force()

    def _observe(self, token: int) -> None:
        self._recent.append(int(token))
        n = max([len(self.spec.start), *(len(e) for e in self.spec.ends)], default=1)
        del self._recent[:-n]
        if self.state == IDLE and self.spec.start and self._ends_with(self.spec.start):
            self.state = COUNTING
            self.remaining = self.spec.budget
        elif self.state == COUNTING and any(e and self._ends_with(e) for e in self.spec.ends):
            self.state = DONE

    def _ends_with(self, seq: tuple[int, ...]) -> bool:
        return len(self._recent) >= len(seq) and tuple(self._recent[-len(seq):]) == seq

    def _maybe_force(self) -> None:
        if self.state == COUNTING and self.remaining <= 0:
            self.state = FORCING if self.spec.forced else DONE
            self._forced_i = 0
