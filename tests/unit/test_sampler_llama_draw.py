"""Seeded draws are llama.cpp's: the uniforms of ``std::mt19937(seed)`` through libstdc++'s
``uniform_real_distribution<double>``, walked over the candidates in the order llama.cpp's
chain leaves them (by logit after top_k). A plain-Python transcription of llama.cpp's default
chain (top_k → top_p → min_p → temperature → dist, ``src/llama-sampler.cpp``) is the reference.

Regression: the draw used to walk candidates in token-id order with a torch generator, so with
seed 42 (first uniform 0.058) most first tokens were the lowest-id candidate, often the
end-of-generation token, and seeded replies came back empty."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.engine.mt19937 import Mt19937
from kvserve.engine.sampler import SequenceSampler, sample_batch
from kvserve.engine.sampling_params import SamplingParams

V = 300


def test_mt19937_is_std_mt19937() -> None:
    # the C++ standard ([rand.predef]): the 10000th output of a default-constructed mt19937 (5489)
    g = Mt19937(5489)
    assert g.next_u32(10000)[-1] == 4123659995
    assert Mt19937(42).next_u32(4) == [1608637542, 3421126067, 4083286876, 787846414]
    # generate_canonical<double, 53>: the first output is the low word
    assert Mt19937(42).uniform() == (1608637542 + 3421126067 * 2.0**32) / 2.0**64
    assert Mt19937(42).uniform_float() == pytest.approx(1608637542 / 2.0**32, rel=1e-7)


def _llama_chain(logits: list[float], p: SamplingParams, rng: Mt19937) -> int:
    """llama.cpp's default chain over one row, as its C++ does it (floats where it uses float)."""
    cur = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[: p.top_k]  # top_k sorts
    lg = {i: logits[i] for i in cur}
    # top_p: softmax over the sorted candidates, keep until the cumulative sum reaches p
    m = lg[cur[0]]
    e = [math.exp(lg[i] - m) for i in cur]
    s = sum(e)
    cum, last = 0.0, len(cur)
    for j, v in enumerate(e):
        cum += v / s
        if cum >= p.top_p and j + 1 >= p.min_keep:
            last = j + 1
            break
    cur = cur[:last]
    # min_p (sorted): keep logits >= max + log(p)
    floor = lg[cur[0]] + math.log(p.min_p)
    cur = [cur[0]] + [i for i in cur[1:] if lg[i] >= floor]
    # temperature, then dist: walk the sorted candidates until sum_run >= sum_cum * rnd
    x = [lg[i] / p.temperature for i in cur]
    w = [math.exp(v - x[0]) for v in x]
    target = sum(w) * rng.uniform()
    run = 0.0
    for i, v in zip(cur, w):
        run += v
        if run >= target:
            return i
    return cur[-1]


@pytest.mark.parametrize("fast", ["1", "0"])
def test_seeded_draws_follow_llama_cpp(fast: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSERVE_FAST_SAMPLER", fast)
    params = [SamplingParams(seed=42, temperature=1.0), SamplingParams(seed=7),
              SamplingParams(seed=123, top_k=20, top_p=0.8, min_p=0.02, temperature=1.3)]
    samplers = [SequenceSampler(p, V) for p in params]
    refs = [Mt19937(p.seed_u32) for p in params]
    g = torch.Generator().manual_seed(0)
    agree = 0
    for _ in range(40):
        x = torch.randn(len(params), V, generator=g) * 2.5
        got = [r.token for r in sample_batch(x, samplers)]
        want = [_llama_chain(x[i].tolist(), params[i], refs[i]) for i in range(len(params))]
        agree += sum(a == b for a, b in zip(got, want))
        for s, t in zip(samplers, got):
            s.accept(t)
    # float32 softmax against the double reference may flip a draw that lands on a boundary
    assert agree >= 40 * len(params) - 1, agree


def test_seed_42_does_not_favour_low_ids() -> None:
    """One token with a low id and 10% of the mass: with llama.cpp's first uniform for seed 42
    (0.797) over candidates by logit, it is not drawn (it was, in token-id order)."""
    x = torch.full((1, V), -1e9)
    x[0, 2] = math.log(0.10)  # the lowest id, e.g. an end-of-generation token
    x[0, 50], x[0, 60], x[0, 70] = math.log(0.5), math.log(0.25), math.log(0.15)
    s = SequenceSampler(SamplingParams(seed=42, temperature=1.0, min_p=0.0, top_p=1.0), V)
    # by logit: 50 (0.5), 60 (0.75), 70 (0.90) >= 0.797 → token 70
    assert sample_batch(x, [s])[0].token == 70
