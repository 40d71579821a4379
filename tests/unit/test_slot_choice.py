"""``SlotChooser`` (a sorted index of the slots' tokens) against ``choose_slot`` (the rule as
written: every idle slot compared): the same slot for every prompt, while slots change."""

from __future__ import annotations

import random

from kvserve.engine.slot_choice import SlotChooser
from kvserve.engine.slots import Slot, choose_slot


def _random_tokens(rng: random.Random, bases: list[list[int]]) -> list[int]:
    """Mostly a prefix of a shared document plus a tail: many ties and near ties."""
    kind = rng.random()
    if kind < 0.1:
        return []
    base = rng.choice(bases)
    cut = rng.choice([0, 1, 2, rng.randrange(len(base) + 1), len(base)])
    tail = [rng.randrange(6) for _ in range(rng.choice([0, 1, 3, 40]))]
    return base[:cut] + tail


def test_the_index_picks_what_the_rule_picks() -> None:
    rng = random.Random(0)
    for trial in range(60):
        n_slots = rng.choice([1, 2, 5, 16, 64])
        slots = [Slot(i, 1 << 20) for i in range(n_slots)]
        bases = [[rng.randrange(6) for _ in range(rng.choice([5, 50, 300]))] for _ in range(3)]
        chooser = SlotChooser()
        for step in range(80):
            # change some slots: a new token list, busy/idle, LRU stamps
            for s in rng.sample(slots, rng.randrange(min(4, n_slots) + 1)):
                r = rng.random()
                if r < 0.5:
                    s.prompt_tokens = _random_tokens(rng, bases)
                elif r < 0.8:
                    s.seq_id = None if s.busy else 1000 + step
                else:
                    s.t_last_used = rng.choice([-1.0, float(step), float(rng.randrange(5))])
            q = _random_tokens(rng, bases)
            sps = rng.choice([0.0, 0.1, 0.5, 0.99, 1.0])
            want = choose_slot(slots, q, -1, sps)
            got = chooser.choose(slots, q, -1, sps)
            assert got is want, (trial, step, sps)
            if want is not None and rng.random() < 0.5:
                want.seq_id = 5000 + step  # admitted: busy until a later step frees it
        chooser.choose(slots, [1], -1, 0.5)  # brings the index up to date
        assert len(chooser) == sum(1 for s in slots if s.prompt_tokens)


def test_an_explicit_slot_and_the_lru_rule_are_kept() -> None:
    slots = [Slot(i, 4096) for i in range(4)]
    chooser = SlotChooser()
    slots[1].prompt_tokens = [1, 2, 3]
    slots[2].seq_id = 7
    assert chooser.choose(slots, [1, 2, 3, 4], 2, 0.1) is slots[2]  # busy, returned all the same
    assert chooser.choose(slots, [1, 2, 3, 4], -1, 0.1) is slots[1]
    assert chooser.choose(slots, [9, 9], -1, 0.1) is slots[3]  # no similar slot: LRU, ties to the highest id
    slots[1].prompt_tokens = [9, 9, 9]  # replaced: indexed again
    assert chooser.choose(slots, [9, 9], -1, 0.1) is slots[1]


def test_a_slots_bytes_come_from_its_last_prompt_and_equal_a_fresh_pack() -> None:
    """A slot's next token list is usually its last prompt plus what was generated (or a
    prefix of it): indexed from the prompt's bytes, they equal ``token_bytes`` of the list,
    and the choice stays the rule's."""
    from kvserve.engine.slots import token_bytes

    rng = random.Random(3)
    slots = [Slot(i, 1 << 20) for i in range(8)]
    bases = [[rng.randrange(6) for _ in range(rng.choice([5, 50, 300]))] for _ in range(3)]
    chooser = SlotChooser()
    running: dict[int, list[int]] = {}
    for step in range(400):
        for sid in list(running):  # some requests end: the slot keeps prompt + generated
            if rng.random() < 0.4:
                prompt = running.pop(sid)
                r = rng.random()
                tokens = list(prompt) + [rng.randrange(6) for _ in range(rng.randrange(5))]
                if r < 0.2:
                    tokens = tokens[: rng.randrange(len(tokens) + 1)]  # cancelled early
                elif r < 0.3:
                    tokens = [rng.randrange(6) for _ in range(rng.randrange(1, 20))]  # not the prompt
                slots[sid].prompt_tokens = tokens
                slots[sid].seq_id = None
        q = _random_tokens(rng, bases)
        sps = rng.choice([0.1, 0.5])
        want = choose_slot(slots, q, -1, sps)
        key = token_bytes(q) if rng.random() < 0.5 else None
        got = chooser.choose(slots, q, -1, sps, key)
        assert got is want, step
        for sid, (src, n, b) in chooser._of.items():
            assert b == token_bytes(src[:n]), (step, sid)
        if want is not None and rng.random() < 0.6:
            want.seq_id = step
            running[want.id] = q
