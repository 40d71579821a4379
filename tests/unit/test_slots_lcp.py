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
