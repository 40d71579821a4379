"""DRY ("don't repeat yourself") penalties and the restart sequences they stop at.

``build_dry_breakers`` maps a vocabulary's tokens to the sequence breakers they start (built once
per breaker list); ``dry_penalties`` scores the next position of one sequence from its window of
accepted tokens, as llama.cpp's DRY sampler does.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Sequence

from kvserve.engine.sampling_params import SamplingParams

# head token -> tails (token tuples) of the DRY sequence breakers that start with it.
DryBreakers = Mapping[int, Sequence[tuple[int, ...]]]

_DRY_MAX_CHARS = 40
_DRY_MAX_TAIL = 20


def dry_penalties(p: SamplingParams, window: Sequence[int], breakers: DryBreakers) -> dict[int, float]:
    """token -> DRY logit penalty for the next position (llama.cpp's four steps).

    ``window``: the accepted tokens DRY looks at, oldest first; ``breakers``: from
    ``build_dry_breakers``.
    """
    allowed = p.dry_allowed_length
    rat = list(reversed(window))  # rat[i]: i-th most recent token
    n = len(rat)
    if n <= allowed:
        return {}
    rep_limit = n  # step 1: the most recent restart sequence bounds the repeat length
    for i, tok in enumerate(rat):
        tails = breakers.get(tok)
        if not tails:
            continue
        longest = -1
        for tail in tails:
            m = len(tail)
            if longest < m <= i and all(tail[o] == rat[i - o - 1] for o in range(m)):
                longest = m
        if longest >= 0:
            rep_limit = i - longest
            break
    if rep_limit < allowed:
        return {}
    z = _z_function(rat)  # step 2: z[k] = length of the suffix repeated ending k tokens back
    best: dict[int, int] = {}
    for k in range(1, n):  # step 3: the token after each repeat would extend it
        length = min(z[k], rep_limit)
        if length >= allowed:
            tok = rat[k - 1]
            if best.get(tok, -1) < length:
                best[tok] = length
    max_exp = int(88.7228391 / math.log(p.dry_base)) if p.dry_base > 1.000001 else 0
    out: dict[int, float] = {}
    for tok, length in best.items():  # step 4: single-token breakers are never penalised
        if () in breakers.get(tok, ()):
            continue
        e = length - allowed
        if max_exp > 0 and e > max_exp:
            e = max_exp
        out[tok] = p.dry_multiplier * p.dry_base**e
    return out


def _z_function(s: Sequence[int]) -> list[int]:
    n = len(s)
    z = [0] * n
    if n:
        z[0] = n
    lt = rt = 0
    for k in range(1, n):
        if k < rt:
            z[k] = min(rt - k, z[k - lt])
        while k + z[k] < n and s[z[k]] == s[k + z[k]]:
            z[k] += 1
        if k + z[k] > rt:
            lt, rt = k, k + z[k]
    return z


def build_dry_breakers(
    breakers: Iterable[str],
    token_bytes: Sequence[bytes],
    tokenize: Callable[[str], list[int]],
) -> dict[int, tuple[tuple[int, ...], ...]]:
    """DRY restart sequences over a vocabulary (llama.cpp's ``get_overlapping_token_sequences``).

    A token whose text contains a breaker is a single-token breaker (empty tail). A token whose
    text ends with a prefix of a breaker is a head; the tail is the tokenization (no specials)
    of the rest of the breaker, at most 20 tokens. Breakers are cut to 40 bytes. This scans the
    whole vocabulary: build it once per distinct breaker list and reuse it.
    """
    out: dict[int, list[tuple[int, ...]]] = {}
    for raw in breakers:
        brk = raw.encode("utf-8")[:_DRY_MAX_CHARS]
        if not brk:
            continue
        first = brk[0:1]
        for tok, word in enumerate(token_bytes):
            if brk in word:
                out.setdefault(tok, [])
                if () not in out[tok]:
                    out[tok].append(())
                continue
            pos = word.find(first)
            while pos != -1:
                rest = len(word) - pos
                if rest < len(brk) and word[pos:] == brk[:rest]:
                    tail = tuple(tokenize(brk[rest:].decode("utf-8", "ignore"))[:_DRY_MAX_TAIL])
                    lst = out.setdefault(tok, [])
                    if tail not in lst:
                        lst.append(tail)
                pos = word.find(first, pos + 1)
    return {t: tuple(v) for t, v in out.items()}
