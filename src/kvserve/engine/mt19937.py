"""The seeded uniforms of llama.cpp's samplers: ``std::mt19937`` and libstdc++'s
``std::uniform_real_distribution``.

llama.cpp seeds one ``std::mt19937`` per sampler with the request's seed; its final draw
(``dist``, mirostat, adaptive-p) takes ``uniform_real_distribution<double>``, XTC's coin (a
generator of its own, seeded the same) ``uniform_real_distribution<float>``. libstdc++'s
``generate_canonical`` builds a double from two 32-bit outputs ``a`` then ``b`` as
``(a + b·2³²) / 2⁶⁴`` and a float from one as ``a / 2³²``, a result of 1 becoming the largest
number below 1. numpy's legacy ``RandomState(seed)`` seeds MT19937 exactly as
``std::mt19937(seed)`` does (``init_genrand``), so the outputs are the same 32-bit numbers.
"""

from __future__ import annotations

import math

import numpy as np


class Mt19937:
    """One ``std::mt19937(seed)`` stream (seed: 0 ≤ seed < 2³²)."""

    def __init__(self, seed: int) -> None:
        # MT19937 with the legacy seeding (init_genrand), as RandomState(seed) has it; built from
        # a fixed seed first, which (unlike RandomState's) reads no OS entropy
        self._bits = np.random.MT19937(0)
        self._bits._legacy_seeding(seed)

    def next_u32(self, n: int = 1) -> list[int]:
        return [int(v) for v in self._bits.random_raw(n)]

    def uniform(self) -> float:
        """``std::uniform_real_distribution<double>(0, 1)(rng)``."""
        a, b = self.next_u32(2)
        u = (a + b * 2.0**32) / 2.0**64
        return u if u < 1.0 else math.nextafter(1.0, 0.0)

    def uniform_float(self) -> float:
        """``std::uniform_real_distribution<float>(0, 1)(rng)`` (a float32 value)."""
        u = np.float32(self.next_u32(1)[0]) / np.float32(2.0**32)
        return float(u) if u < 1 else float(np.nextafter(np.float32(1), np.float32(0)))
