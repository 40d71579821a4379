"""The sampler's fast path (``sampler_fast``) against the full chain it stands in for: the same
tokens (greedy exactly; seeded draws with the same seeds), the draw's distribution, batch
independence, and the per-step choice of the chain when a row needs a stage it lacks."""

from __future__ import annotations

import pytest
import torch

from kvserve.engine import sampler_fast
from kvserve.engine.sampler import SequenceSampler, sample_batch
from kvserve.engine.sampling_params import SamplingParams

V = 300
DEVS = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

MIXED = [
    SamplingParams(seed=1),  # the default chain: top_k 40, top_p 0.95, min_p 0.05, temperature 0.8
    SamplingParams(seed=2, top_k=5, top_p=1.0, min_p=0.0, temperature=1.0),  # top_k alone
    SamplingParams(seed=3, top_k=20, top_p=0.5, min_p=0.0, temperature=1.5),
    SamplingParams(seed=4, top_k=V, top_p=0.9, min_p=0.2, temperature=0.7),  # k covers the vocabulary
    SamplingParams(seed=5, top_k=1),
    SamplingParams(seed=6, temperature=0.0),  # greedy
    SamplingParams(seed=7, top_k=64, min_keep=1, temperature=2.0),
    SamplingParams(seed=8, logit_bias=((3, 5.0), (7, float("-inf")), (3, 1.0))),  # biases, one token twice
    SamplingParams(seed=9, temperature=0.0, logit_bias=((11, 4.0),)),  # greedy over biased logits
]

# llama-server's default chain with penalties (the window includes the prompt), and greedy ones
PENALIZED = [
    SamplingParams(seed=21, repeat_penalty=1.3),
    SamplingParams(seed=22, repeat_penalty=1.1, frequency_penalty=0.4, presence_penalty=0.6, repeat_last_n=8),
    SamplingParams(seed=23, temperature=0.0, repeat_penalty=1.5, repeat_last_n=-1),  # greedy, whole history
    SamplingParams(seed=24, temperature=0.0, presence_penalty=3.0, repeat_last_n=4),
    SamplingParams(seed=25, frequency_penalty=-0.5, repeat_last_n=16, logit_bias=((5, 2.0),)),  # negative
    SamplingParams(seed=26, repeat_penalty=0.8, top_k=10, top_p=1.0, min_p=0.0),  # < 1: favours repeats
    SamplingParams(seed=27, repeat_penalty=1.2, repeat_last_n=0),  # window 0: the stage is off
]


def _logits(seed: int, b: int, device: str, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, V, generator=g) * 3
    if ties:  # rounded logits: many equal values, broken by token id in both paths
        x = x.round()
    return x.to(device)


def _run(params: list[SamplingParams], steps: int, device: str, fast: bool, monkeypatch, ties: bool = False,
         history: tuple[int, ...] = ()):
    monkeypatch.setenv("KVSERVE_FAST_SAMPLER", "1" if fast else "0")
    samplers = [SequenceSampler(p, V, history=history) for p in params]
    out = []
    for step in range(steps):
        res = sample_batch(_logits(100 + step, len(params), device, ties), samplers)
        for s, r in zip(samplers, res):
            s.accept(r.token)
        out.append([r.token for r in res])
    return out


def test_eligibility() -> None:
    ok = [SamplingParams(), SamplingParams(temperature=0.0), SamplingParams(top_k=7, top_p=1.0, min_p=0.0),
          SamplingParams(samplers=("top_k", "min_p", "temperature")), SamplingParams(logit_bias=((3, 1.0),))]
    for p in ok:
        assert sampler_fast.eligible(SequenceSampler(p, V)), p
    ok += [SamplingParams(repeat_penalty=1.1), SamplingParams(temperature=0.0, repeat_penalty=1.2),
           SamplingParams(presence_penalty=0.5, frequency_penalty=0.5, repeat_last_n=-1)]
    for p in ok:
        assert sampler_fast.eligible(SequenceSampler(p, V)), p
    no = [SamplingParams(n_probs=3), SamplingParams(dry_multiplier=0.8),
          SamplingParams(temperature=0.0, dry_multiplier=0.8),
          SamplingParams(repeat_penalty=1.1, samplers=("top_k", "penalties", "temperature")),
          SamplingParams(top_k=0), SamplingParams(top_k=1000), SamplingParams(typical_p=0.5),
          SamplingParams(mirostat=2), SamplingParams(dynatemp_range=0.5), SamplingParams(min_keep=5),
          SamplingParams(samplers=("temperature", "top_k")), SamplingParams(xtc_probability=0.5),
          SamplingParams(repeat_penalty=1.2, top_k=0)]
    for p in no:
        assert not sampler_fast.eligible(SequenceSampler(p, V)), p
    ignore_eos = SequenceSampler(SamplingParams(ignore_eos=True, temperature=0.0), V, eog_ids=(0,))
    assert sampler_fast.eligible(ignore_eos)
    x = torch.zeros(1, V)
    x[0, 0] = 10.0  # the end-of-generation token is the argmax, and banned
    assert sampler_fast.sample_tokens(x, [ignore_eos]) == [1]


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("ties", [False, True])
def test_same_tokens_as_the_chain(device, ties, monkeypatch) -> None:
    fast = _run(MIXED, 40, device, True, monkeypatch, ties)
    chain = _run(MIXED, 40, device, False, monkeypatch, ties)
    assert fast == chain
    assert len({tuple(step[0] for step in fast)}) == 1 and len(set(step[0] for step in fast)) > 5  # it samples


@pytest.mark.parametrize("device", DEVS)
def test_greedy_is_argmax(device, monkeypatch) -> None:
    x = _logits(9, 16, device, ties=True)
    samplers = [SequenceSampler(SamplingParams(temperature=0.0), V) for _ in range(16)]
    assert [r.token for r in sample_batch(x, samplers)] == x.argmax(-1).tolist()


GREEDY_BIASED = [
    SamplingParams(temperature=0.0, logit_bias=((11, 4.0), (12, 0.5))),
    SamplingParams(temperature=0.0, logit_bias=((3, 5.0), (7, float("-inf")), (3, 1.0))),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repeat_penalty=1.5, repeat_last_n=-1),  # window empty at first
]


def _biased_argmax(logits: torch.Tensor) -> list[int]:
    """The tokens GREEDY_BIASED[:3] pick from these logits: their biases added, then argmax."""
    want = logits.clone()
    want[0, 11] += 4.0
    want[0, 12] += 0.5
    want[1, 3] += 6.0
    want[1, 7] = float("-inf")
    return want.argmax(-1).tolist()


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("ties", [False, True])
def test_greedy_with_biases_same_tokens_and_logits_untouched(device, ties, monkeypatch) -> None:
    """A step of greedy rows goes straight to argmax: biases written into the logits and put
    back (the logits afterwards are bit for bit the runner's), the same tokens as the chain."""
    assert _run(GREEDY_BIASED, 30, device, True, monkeypatch, ties) == _run(
        GREEDY_BIASED, 30, device, False, monkeypatch, ties)
    samplers = [SequenceSampler(p, V) for p in GREEDY_BIASED[:3]]
    x = _logits(5, 3, device, ties)
    x[0, 12] = x[0].max() + 0.25  # a bias that decides the row: 12 + 0.5 beats 12's neighbours
    before = x.clone()
    got = sampler_fast.sample_tokens(x, samplers)
    assert torch.equal(x, before)
    assert got == _biased_argmax(before)


def test_seeded_row_does_not_depend_on_the_batch(monkeypatch) -> None:
    alone = _run(MIXED[:1], 20, "cpu", True, monkeypatch)
    g = torch.Generator().manual_seed(0)
    wide = SamplingParams(seed=1)
    samplers = [SequenceSampler(wide, V)] + [SequenceSampler(SamplingParams(seed=50 + i, top_k=3), V) for i in range(5)]
    got = []
    for step in range(20):
        x = torch.randn(6, V, generator=g) * 3
        x[0] = _logits(100 + step, 1, "cpu")[0]
        got.append(sample_batch(x, samplers)[0].token)
        for s in samplers:
            s.accept(0)
    assert got == [row[0] for row in alone]


def test_draws_follow_the_truncated_distribution() -> None:
    """top_k 4, temperature 0.5 over fixed logits: frequencies match softmax(top-4 / 0.5)."""
    x = torch.tensor([[2.0, 1.5, 1.0, 0.2, 0.1] + [-5.0] * (V - 5)])
    p = SamplingParams(seed=11, top_k=4, top_p=1.0, min_p=0.0, temperature=0.5)
    s = SequenceSampler(p, V)
    n = 4000
    counts = torch.zeros(V)
    for _ in range(n):
        counts[sampler_fast.sample_tokens(x, [s])[0]] += 1
    want = torch.softmax(x[0, :4] / 0.5, -1)
    assert counts[4:].sum() == 0
    assert (counts[:4] / n - want).abs().max() < 0.03


def test_a_row_needing_another_stage_takes_the_chain_for_the_step(monkeypatch) -> None:
    calls = []
    orig = sampler_fast.sample_tokens
    monkeypatch.setattr(sampler_fast, "sample_tokens", lambda *a: calls.append(1) or orig(*a))
    x = _logits(3, 2, "cpu")
    plain = [SequenceSampler(SamplingParams(seed=1), V), SequenceSampler(SamplingParams(seed=2), V)]
    sample_batch(x, plain)
    assert calls == [1]
    probs = [SequenceSampler(SamplingParams(seed=1), V), SequenceSampler(SamplingParams(seed=2, n_probs=2), V)]
    res = sample_batch(x, probs)
    assert calls == [1] and len(res[1].top) == 2 and res[1].logprob < 0  # the chain's result
    assert res[0].token == sample_batch(x[:1], [SequenceSampler(SamplingParams(seed=1), V)])[0].token


@pytest.mark.parametrize("device", DEVS)
@pytest.mark.parametrize("ties", [False, True])
def test_penalties_same_tokens_as_the_chain(device, ties, monkeypatch) -> None:
    """Penalised rows (beside plain ones) on the fast path draw the chain's tokens step after step,
    the windows sliding over a prompt history and the generated tokens."""
    params = PENALIZED + MIXED[:3] + MIXED[5:6]
    assert all(sampler_fast.eligible(SequenceSampler(p, V)) for p in params)
    prompt = tuple(int(t) for t in torch.randint(0, 40, (50,), generator=torch.Generator().manual_seed(5)))
    fast = _run(params, 60, device, True, monkeypatch, ties, history=prompt)
    chain = _run(params, 60, device, False, monkeypatch, ties, history=prompt)
    assert fast == chain
    plain = _run([SamplingParams(seed=23, temperature=0.0, repeat_last_n=-1)], 60, device, True, monkeypatch,
                 ties, history=prompt)
    assert [row[2] for row in fast] != [row[0] for row in plain]  # the penalties change the tokens


def test_penalties_values(monkeypatch) -> None:
    """The penalised logits themselves: llama.cpp's formula on the window counts, nothing else moved."""
    x = torch.tensor([[2.0, -1.0, 0.5, 3.0] + [0.0] * (V - 4)])
    p = SamplingParams(temperature=0.0, repeat_penalty=2.0, frequency_penalty=0.25, presence_penalty=1.0,
                       repeat_last_n=3)
    s = SequenceSampler(p, V, history=[3, 0, 1, 1])  # window of 3: [0, 1, 1]
    got = sampler_fast._penalize(x, [s], cloned=False)
    want = x.clone()
    want[0, 0] = 2.0 / 2.0 - (1 * 0.25 + 1.0)
    want[0, 1] = -1.0 * 2.0 - (2 * 0.25 + 1.0)
    assert torch.equal(got, want) and x[0, 0] == 2.0  # the input is left alone
    assert sampler_fast.sample_tokens(x, [s]) == [3]
    s.accept(3)  # the window slides: [1, 1, 3]
    assert sampler_fast.sample_tokens(x, [s]) == [0]


def test_top_k_cut_among_equal_logits_keeps_the_lowest_ids() -> None:
    """Equal logits at top_k's cut: the lowest token ids survive whatever k is (both paths)."""
    from kvserve.engine.sampler_stages import topk_by_id

    x = torch.zeros(2, V)
    x[:, 100] = 1.0
    x[1, 7] = -0.0  # -0.0 ties with 0.0
    for k in (1, 3, 5, 40):
        vals, cols = topk_by_id(x, k)
        assert cols[0].tolist() == [100] + list(range(k - 1))
        assert cols[1].tolist() == [100] + list(range(k - 1))
    ids = torch.tensor([[9, 4, 6, 2]])
    vals, cols = topk_by_id(torch.tensor([[1.0, 2.0, 1.0, 1.0]]), 3, ids)
    assert ids.gather(-1, cols).tolist() == [[4, 2, 6]] and vals.tolist() == [[2.0, 1.0, 1.0]]


@pytest.mark.parametrize("device", DEVS)
def test_greedy_biases_on_the_runners_logits(device) -> None:
    """The runner returns logits made under ``torch.inference_mode``; the engine thread samples
    outside it (a request with ``ignore_eos`` or ``logit_bias``). The biases still apply and the
    logits come back unchanged."""
    samplers = [SequenceSampler(p, V) for p in GREEDY_BIASED[:3]]
    with torch.inference_mode():
        x = _logits(5, 3, device, False)
    assert x.is_inference()
    before = x.clone()
    got = sampler_fast.sample_tokens(x, samplers)
    assert torch.equal(x, before)
    assert got == _biased_argmax(before)
