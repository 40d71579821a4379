"""The reasoning-budget state machine: counting inside the thinking block, forcing its end."""

from __future__ import annotations

from kvserve.engine.reasoning_budget import COUNTING, DONE, FORCING, IDLE, ReasoningBudget

START, END, MSG = (1, 2), (3, 4), (9,)


def run(spec: ReasoningBudget, sampled: list[int]) -> list[int]:
    """The tokens a sequence ends up with when it would sample ``sampled``."""
    st = spec.new_state()
    out = []
    for t in sampled:
        f = st.forced_token()
        t = f if f is not None else t
        out.append(t)
        st.accept(t)
    return out


def test_budget_counts_only_inside_the_block_and_forces_message_and_end() -> None:
    spec = ReasoningBudget(3, START, (END,), MSG + END)
    out = run(spec, [7, 1, 2, 5, 5, 5, 5, 5, 8, 8])
    assert out == [7, 1, 2, 5, 5, 5, 9, 3, 4, 8]


def test_natural_end_within_budget_is_kept() -> None:
    spec = ReasoningBudget(5, START, (END,), END)
    assert run(spec, [1, 2, 5, 3, 4, 6, 6, 6, 6]) == [1, 2, 5, 3, 4, 6, 6, 6, 6]


def test_prompt_opened_block_and_zero_budget() -> None:
    spec = ReasoningBudget(0, START, (END,), END, prefill=(50, 1, 2))
    st = spec.new_state()
    assert st.state == FORCING and st.forced_token() == 3
    assert run(spec, [5, 5, 6, 6]) == [3, 4, 6, 6]
    assert ReasoningBudget(2, START, (END,), END).new_state().state == IDLE
    st = ReasoningBudget(2, START, (END,), END, prefill=(1, 2)).new_state()
    assert st.state == COUNTING
    for t in (5, 5, 3, 4):
        st.accept(t)
    assert st.state == DONE
