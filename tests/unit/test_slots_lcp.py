"""The common-prefix length that slot choice and prefix sharing use, against the plain loop."""

from __future__ import annotations

import random

from kvserve.engine.slots import lcp_len


def _naive(a, b) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def test_lcp_len_matches_the_plain_loop() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.choice([0, 1, 5, 127, 128, 129, 256, 1000, 2500])
        a = [rng.randrange(50) for _ in range(n)]
        cut = rng.randrange(n + 1)
        b = a[:cut] + [rng.randrange(50) for _ in range(rng.randrange(300))]
        assert lcp_len(a, b) == _naive(a, b)
        assert lcp_len(tuple(a), b) == _naive(a, b)  # mixed sequence types


def test_lcp_bytes_matches_the_plain_loop() -> None:
    from kvserve.engine.slots import lcp_bytes, token_bytes

    rng = random.Random(1)
    for _ in range(300):
        n = rng.choice([0, 1, 2, 5, 127, 1000, 2500])
        a = [rng.randrange(70_000) for _ in range(n)]
        cut = rng.randrange(n + 1)
        b = a[:cut] + [rng.randrange(70_000) for _ in range(rng.randrange(300))]
        assert lcp_bytes(token_bytes(a), token_bytes(b)) == _naive(a, b)
        assert lcp_bytes(token_bytes(b), token_bytes(a)) == _naive(a, b)


def test_slot_choice_follows_the_slots_token_list() -> None:
    from kvserve.engine.slots import Slot, choose_slot

    slots = [Slot(i, 4096) for i in range(3)]
    slots[0].prompt_tokens = [1, 2, 3, 4, 5, 6]
    slots[1].prompt_tokens = [1, 2, 9, 9]
    assert choose_slot(slots, [1, 2, 3, 4, 7], -1, 0.1) is slots[0]
    slots[0].prompt_tokens = [5, 5]  # replaced: the cached bytes must not be reused
    assert choose_slot(slots, [1, 2, 3, 4, 7], -1, 0.1) is slots[1]
    slots[1].prompt_tokens.extend([3, 4])  # grown in place
    slots[1].prompt_tokens[2:4] = [3, 4]
    slots[1].prompt_tokens = list(slots[1].prompt_tokens)
    assert choose_slot(slots, [1, 2, 3, 4, 7], -1, 0.1) is slots[1]


def test_prompt_key_checks_the_range_like_min_and_max() -> None:
    from kvserve.engine.slots import prompt_key, token_bytes

    rng = random.Random(2)
    for _ in range(300):
        toks = [rng.randrange(-2, 102) for _ in range(rng.choice([0, 1, 3, 50, 2000]))]
        n_vocab = rng.choice([1, 50, 100, 101])
        ok, key = prompt_key(toks, n_vocab)
        assert ok == (not toks or (min(toks) >= 0 and max(toks) < n_vocab))
        assert key == token_bytes(toks)
    ok, key = prompt_key([1, 1 << 40], 100)  # not a 32-bit integer: no bytes, Python's test
    assert not ok and key is None
    ok, key = prompt_key([1, 2.0], 100)
    assert ok and key is None
