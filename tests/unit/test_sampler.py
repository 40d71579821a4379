from __future__ import annotations

import math
import random

import pytest
import torch

from kvserve.engine.sampler import (
    SequenceSampler,
    build_dry_breakers,
    build_plan,
    sample_batch,
    sample_one,
)
from kvserve.engine.sampling_params import (
    DEFAULT_SAMPLERS,
    SamplingParams,
    parse_samplers,
)

V = 64


def _logits(seed: int, b: int = 1, v: int = V, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, v, generator=g) * scale


def _survivors(params: SamplingParams, logits: torch.Tensor, history: list[int] = ()) -> dict[int, float]:
    """Final candidates of one row as {id: prob} (post-sampling probs, all of them)."""
    p = SamplingParams(**{**params.__dict__, "n_probs": logits.shape[-1], "post_sampling_probs": True})
    s = SequenceSampler(p, logits.shape[-1], history=history)
    return dict(sample_one(s, logits).top)


def _probs(x: list[float]) -> list[float]:
    m = max(x)
    e = [math.exp(v - m) if v != -math.inf else 0.0 for v in x]
    z = sum(e)
    return [v / z for v in e]


# -- reference filters (slow, one candidate at a time) -------------------------------------------


def ref_top_k(x: list[float], k: int) -> set[int]:
    return set(sorted(range(len(x)), key=lambda i: -x[i])[:k])


def ref_top_p(x: list[float], p: float, min_keep: int = 0) -> set[int]:
    pr = _probs(x)
    order = sorted(range(len(x)), key=lambda i: -x[i])
    cum, kept = 0.0, set()
    for n, i in enumerate(order):
        kept.add(i)
        cum += pr[i]
        if cum >= p and n + 1 >= min_keep:
            break
    return kept


def ref_min_p(x: list[float], p: float, min_keep: int = 0) -> set[int]:
    pr = _probs(x)
    kept = {i for i in range(len(x)) if pr[i] >= p * max(pr)}
    if len(kept) < min_keep:
        kept = set(sorted(range(len(x)), key=lambda i: -x[i])[:min_keep])
    return kept


def ref_typical(x: list[float], p: float) -> set[int]:
    pr = _probs(x)
    ent = -sum(q * math.log(q) for q in pr if q > 0)
    order = sorted(range(len(x)), key=lambda i: abs(-math.log(pr[i]) - ent))
    cum, kept = 0.0, set()
    for i in order:
        kept.add(i)
        cum += pr[i]
        if cum > p:
            break
    return kept


def ref_top_n_sigma(x: list[float], n: float) -> set[int]:
    mean = sum(x) / len(x)
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / len(x))
    return {i for i, v in enumerate(x) if v >= max(x) - n * std}


def ref_xtc(x: list[float], threshold: float) -> set[int]:
    pr = _probs(x)
    order = sorted(range(len(x)), key=lambda i: -pr[i])
    above = [i for i in order if pr[i] >= threshold]
    if len(above) < 2:
        return set(range(len(x)))
    return set(order) - set(above[:-1])


def ref_dry(hist: list[int], mult: float, base: float, allowed: int, breakers: set[int]) -> dict[int, float]:
    """Brute force: for every earlier position, the longest suffix match not crossing a breaker."""
    n = len(hist)
    limit = n
    for i, t in enumerate(reversed(hist)):
        if t in breakers:
            limit = i
            break
    best: dict[int, int] = {}
    for end in range(n - 1):  # hist[:end+1] ends a candidate repeat; hist[end+1] would extend it
        length = 0
        while length <= end and hist[end - length] == hist[n - 1 - length]:
            length += 1
        length = min(length, limit)
        if length >= allowed:
            tok = hist[end + 1]
            best[tok] = max(best.get(tok, 0), length)
    return {t: mult * base ** (L - allowed) for t, L in best.items() if t not in breakers}


# -- greedy ------------------------------------------------------------------------------------


def test_greedy_is_argmax_of_biased_and_penalised_logits() -> None:
    logits = _logits(1, b=6)
    hist = [int(logits[0].argmax()), 3, 3, 5]
    params = SamplingParams(temperature=0.0, repeat_penalty=1.3, presence_penalty=0.5, logit_bias=((7, 4.0),))
    samplers = [SequenceSampler(params, V, history=hist) for _ in range(6)]
    got = [r.token for r in sample_batch(logits, samplers)]
    want = []
    for row in logits:
        x = row.clone()
        x[7] += 4.0
        for t, c in {hist[0]: 1, 3: 2, 5: 1}.items():
            x[t] = x[t] * 1.3 if x[t] <= 0 else x[t] / 1.3
            x[t] -= 0.5
        want.append(int(x.argmax()))
    assert got == want
    assert build_plan(params) == (("penalties",), "greedy")


def test_greedy_plain() -> None:
    logits = _logits(2, b=4)
    res = sample_batch(logits, [SequenceSampler(SamplingParams(temperature=0.0), V) for _ in range(4)])
    assert [r.token for r in res] == logits.argmax(-1).tolist()


def test_top_k_1_equals_greedy() -> None:
    logits = _logits(3, b=5)
    res = sample_batch(logits, [SequenceSampler(SamplingParams(top_k=1, seed=i), V) for i in range(5)])
    assert [r.token for r in res] == logits.argmax(-1).tolist()


def test_greedy_with_typical_first_is_not_plain_argmax() -> None:
    # typical sampling before temperature may drop the argmax; llama.cpp then takes the best survivor
    p = SamplingParams(temperature=0.0, typical_p=0.2)
    assert build_plan(p)[1] == "dist"


# -- seeds -------------------------------------------------------------------------------------


def _run(params: SamplingParams, companions: list[SamplingParams], position: int) -> list[int]:
    me = SequenceSampler(params, V, history=[1, 2, 3])
    others = [SequenceSampler(p, V, history=[4, 5]) for p in companions]
    out = []
    for step in range(12):
        batch = others[:position] + [me] + others[position:]
        logits = _logits(100 + step, b=len(batch), scale=1.0)
        logits[position] = _logits(500 + step, scale=1.0)[0]  # my row does not depend on the batch
        res = sample_batch(logits, batch)
        for s, r in zip(batch, res):
            s.accept(r.token)
        out.append(res[position].token)
    return out


def test_same_seed_same_tokens_regardless_of_batch() -> None:
    mine = SamplingParams(seed=1234, top_k=0, top_p=1.0, min_p=0.0, temperature=1.5, repeat_penalty=1.1)
    alone = _run(mine, [], 0)
    mixed = _run(
        mine,
        [SamplingParams(temperature=0.0), SamplingParams(seed=7, xtc_probability=1.0),
         SamplingParams(seed=9, mirostat=2), SamplingParams(seed=5, samplers="kt", top_k=3)],
        2,
    )
    small = _run(mine, [SamplingParams(seed=99, typical_p=0.5)], 1)
    assert alone == mixed == small
    assert len(set(alone)) > 3  # really sampled, not greedy


def test_different_seeds_differ() -> None:
    base = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=2.0)
    a = _run(SamplingParams(seed=1, **base), [], 0)
    b = _run(SamplingParams(seed=2, **base), [], 0)
    assert a != b
    assert _run(SamplingParams(seed=1, **base), [], 0) == a


def test_random_seed_is_drawn() -> None:
    seeds = {SequenceSampler(SamplingParams(seed=sd), V).seed for sd in (-1, 0xFFFFFFFF, -1, -1)}
    assert len(seeds) > 1
    assert SequenceSampler(SamplingParams(seed=42), V).seed == 42


# -- bias / eos --------------------------------------------------------------------------------


def test_logit_bias_ban_and_boost() -> None:
    logits = _logits(4)
    best = int(logits[0].argmax())
    second = int(logits[0].topk(2).indices[1])
    banned = SequenceSampler(SamplingParams(temperature=0.0, logit_bias=((best, -math.inf),)), V)
    assert sample_one(banned, logits).token == second
    low = int(logits[0].argmin())
    boosted = SequenceSampler(SamplingParams(temperature=0.0, logit_bias=((low, 100.0),)), V)
    assert sample_one(boosted, logits).token == low
    # a banned token is never drawn, even at high temperature
    s = SequenceSampler(SamplingParams(seed=3, temperature=5.0, top_k=0, min_p=0.0, top_p=1.0,
                                       logit_bias=((best, -math.inf),)), V)
    assert all(sample_one(s, logits).token != best for _ in range(50))


def test_ignore_eos_bans_every_eog() -> None:
    logits = _logits(5)
    logits[0, 10] = 50.0
    logits[0, 11] = 49.0
    s = SequenceSampler(SamplingParams(temperature=0.0, ignore_eos=True), V, eog_ids=[10, 11])
    want = logits.clone()
    want[0, 10:12] = -math.inf
    assert sample_one(s, logits).token == int(want.argmax())
    hot = SequenceSampler(SamplingParams(seed=1, temperature=3.0, ignore_eos=True), V, eog_ids=[10, 11])
    assert all(sample_one(hot, logits).token not in (10, 11) for _ in range(30))
    plain = SequenceSampler(SamplingParams(temperature=0.0), V, eog_ids=[10, 11])
    assert sample_one(plain, logits).token == 10


# -- penalties ---------------------------------------------------------------------------------


def test_penalties_numeric() -> None:
    x = [2.0, -1.0, 0.5, 3.0, 0.0]
    hist = [0, 1, 1, 4]
    params = SamplingParams(samplers=("penalties",), repeat_penalty=1.5, frequency_penalty=0.1,
                            presence_penalty=0.2)
    got = _survivors(params, torch.tensor([x]), hist)
    want_logits = [2.0 / 1.5 - 0.3, -1.0 * 1.5 - 0.4, 0.5, 3.0, 0.0 * 1.5 - 0.3]
    want = _probs(want_logits)
    for i in range(5):
        assert got[i] == pytest.approx(want[i], rel=1e-5)


def test_penalty_window_is_last_n_accepted_tokens() -> None:
    params = SamplingParams(samplers=("penalties",), repeat_last_n=2, presence_penalty=1.0, n_probs=4,
                            post_sampling_probs=True)
    s = SequenceSampler(params, 4, history=[0, 1])
    s.accept(2)  # the window is now [1, 2]
    assert dict(s._pen_counts) == {1: 1, 2: 1}
    top = dict(sample_one(s, torch.zeros(1, 4)).top)
    assert top[0] == pytest.approx(top[3])
    assert top[1] == pytest.approx(top[2])
    assert math.log(top[0] / top[1]) == pytest.approx(1.0, rel=1e-5)


# -- candidate sets against the references -----------------------------------------------------


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_filters_keep_expected_sets(seed: int) -> None:
    x = _logits(seed, scale=2.5)
    xs = x[0].tolist()
    cases = [
        (SamplingParams(samplers=("top_k",), top_k=7), ref_top_k(xs, 7)),
        (SamplingParams(samplers=("top_p",), top_p=0.8), ref_top_p(xs, 0.8)),
        (SamplingParams(samplers=("top_p",), top_p=0.3, min_keep=6), ref_top_p(xs, 0.3, 6)),
        (SamplingParams(samplers=("min_p",), min_p=0.1), ref_min_p(xs, 0.1)),
        (SamplingParams(samplers=("min_p",), min_p=0.9, min_keep=5), ref_min_p(xs, 0.9, 5)),
        (SamplingParams(samplers=("typ_p",), typical_p=0.6), ref_typical(xs, 0.6)),
        (SamplingParams(samplers=("top_n_sigma",), top_n_sigma=1.0), ref_top_n_sigma(xs, 1.0)),
        (SamplingParams(samplers=("xtc",), xtc_probability=1.0, xtc_threshold=0.05), ref_xtc(xs, 0.05)),
    ]
    for params, want in cases:
        got = _survivors(params, x)
        assert set(got) == want, params.samplers
        probs = _probs([xs[i] if i in want else -math.inf for i in range(V)])
        for i, q in got.items():
            assert q == pytest.approx(probs[i], rel=1e-4, abs=1e-7)


def test_top_p_large_vocab_uses_prefix_then_full_sort() -> None:
    v = 5000
    flat = torch.zeros(1, v)  # top_p 0.9 of a flat distribution needs 4500 candidates (> 256)
    flat[0, :10] = 0.001 * torch.arange(10)
    got = _survivors(SamplingParams(samplers=("top_p",), top_p=0.9), flat)
    assert len(got) == 4500
    peaked = _logits(20, v=v, scale=4.0)
    got = _survivors(SamplingParams(samplers=("top_p",), top_p=0.5), peaked)
    assert set(got) == ref_top_p(peaked[0].tolist(), 0.5)


def test_xtc_probability_zero_and_coin() -> None:
    x = _logits(14, scale=3.0)
    assert len(_survivors(SamplingParams(samplers=("xtc",), xtc_probability=0.0), x)) == V
    s = SequenceSampler(SamplingParams(seed=5, samplers=("xtc",), xtc_probability=0.5, xtc_threshold=0.05,
                                       n_probs=V, post_sampling_probs=True), V)
    sizes = {len(sample_one(s, x).top) for _ in range(40)}
    assert sizes == {V, len(ref_xtc(x[0].tolist(), 0.05))}


def test_sampler_order_matters() -> None:
    x = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    # min_p 0.3 on the raw logits keeps {0, 1}; after temperature 0.5 only {0} passes
    before = SamplingParams(samplers=("min_p", "temperature"), min_p=0.3, temperature=0.5)
    after = SamplingParams(samplers=("temperature", "min_p"), min_p=0.3, temperature=0.5)
    assert set(_survivors(before, x)) == {0, 1}
    assert set(_survivors(after, x)) == {0}
    # the char form gives the same chain
    assert SamplingParams(samplers="mt").samplers == ("min_p", "temperature")
    # temperature rescales the survivors' probabilities
    got = _survivors(before, x)
    want = _probs([4.0, 2.0])
    assert got[0] == pytest.approx(want[0], rel=1e-5)


def test_default_chain_probabilities() -> None:
    x = _logits(15, scale=3.0)
    xs = x[0].tolist()
    keep = ref_top_k(xs, 40)
    sub = [xs[i] if i in keep else -math.inf for i in range(V)]
    keep &= ref_top_p(sub, 0.95)
    sub = [xs[i] if i in keep else -math.inf for i in range(V)]
    keep &= ref_min_p(sub, 0.05)
    got = _survivors(SamplingParams(), x)
    assert set(got) == keep
    want = _probs([xs[i] / 0.8 if i in keep else -math.inf for i in range(V)])
    for i, q in got.items():
        assert q == pytest.approx(want[i], rel=1e-4)


def test_dynatemp_uses_entropy() -> None:
    x = _logits(16, v=8)
    xs = x[0].tolist()
    params = SamplingParams(samplers=("temperature",), temperature=1.0, dynatemp_range=0.5,
                            dynatemp_exponent=2.0)
    pr = _probs(xs)
    ent = -sum(q * math.log(q) for q in pr)
    t = 0.5 + 1.0 * (ent / math.log(8)) ** 2.0
    want = _probs([v / t for v in xs])
    got = _survivors(params, x)
    for i in range(8):
        assert got[i] == pytest.approx(want[i], rel=1e-4)


# -- stateful samplers -------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_mirostat_updates_mu(version: int) -> None:
    x = _logits(17, scale=2.0)
    s = SequenceSampler(SamplingParams(seed=3, mirostat=version, n_probs=V, post_sampling_probs=True), V,
                        history=[1, 1, 1])
    assert s.mu == 10.0
    r = sample_one(s, x)
    assert s.mu == 10.0  # committed on accept
    s.accept(r.token)
    assert s.mu == pytest.approx(10.0 - 0.1 * (-math.log2(r.logprob) - 5.0), rel=1e-6)
    assert r.token in dict(r.top)
    mus = {s.mu}
    for _ in range(5):
        s.accept(sample_one(s, x).token)
        mus.add(s.mu)
    assert len(mus) > 3
    # penalties are not part of a mirostat chain
    assert build_plan(SamplingParams(mirostat=version, repeat_penalty=2.0))[0] == ("temp",)


def test_mirostat_v2_truncates_by_surprise() -> None:
    x = _logits(18, scale=2.0)
    p = SamplingParams(seed=1, mirostat=2, temperature=1.0, mirostat_tau=0.5, n_probs=V,
                       post_sampling_probs=True)
    s = SequenceSampler(p, V)  # mu = 1.0: keep candidates with -log2(p) <= 1 (at least one)
    pr = _probs(x[0].tolist())
    want = {i for i in range(V) if -math.log2(pr[i]) <= 1.0} or {int(x.argmax())}
    assert set(dict(sample_one(s, x).top)) == want


def test_dry_penalises_repeated_continuation() -> None:
    hist = [5, 6, 7, 8, 9, 5, 6, 7]  # "5 6 7" repeats: 8 would continue it (length 3)
    params = SamplingParams(samplers=("dry",), dry_multiplier=0.8, dry_base=1.75, dry_allowed_length=2)
    x = torch.zeros(1, 16)
    got = _survivors(params, x, hist)
    base = got[0]
    assert math.log(base / got[8]) == pytest.approx(0.8 * 1.75 ** (3 - 2), rel=1e-5)
    assert all(got[t] == pytest.approx(base) for t in range(16) if t != 8)
    # a breaker token inside the repeated suffix bounds the repeat length
    hist = [1, 2, 3, 4, 9, 1, 2, 3]
    assert SequenceSampler(params, 16, history=hist).dry_penalties() == {4: pytest.approx(1.4)}
    assert SequenceSampler(params, 16, history=hist, dry_breakers={2: ((),)}).dry_penalties() == {}


def test_dry_matches_brute_force() -> None:
    rnd = random.Random(0)
    for trial in range(60):
        hist = [rnd.randrange(4) for _ in range(rnd.randrange(3, 30))]
        allowed = rnd.randrange(1, 4)
        breakers = {3} if trial % 2 else set()
        params = SamplingParams(dry_multiplier=1.0, dry_base=1.5, dry_allowed_length=allowed,
                                dry_penalty_last_n=-1)
        s = SequenceSampler(params, 8, history=hist, dry_breakers={b: ((),) for b in breakers})
        want = ref_dry(hist, 1.0, 1.5, allowed, breakers) if len(hist) > allowed else {}
        assert s.dry_penalties() == pytest.approx(want), (hist, allowed)


def test_dry_window_and_multi_token_breaker() -> None:
    params = SamplingParams(dry_multiplier=1.0, dry_penalty_last_n=4)
    s = SequenceSampler(params, 16, history=[1, 2, 3, 9, 9, 1, 2])
    assert s.dry_penalties() == {}  # the earlier "1 2 3" is outside the last 4 tokens
    # breaker "10 11": head 10, tail (11,); it limits the repeat to the tokens after it
    s = SequenceSampler(SamplingParams(dry_multiplier=1.0), 16, history=[1, 2, 3, 4, 10, 11, 1, 2, 3],
                        dry_breakers={10: ((11,),)})
    assert s.dry_penalties() == {4: pytest.approx(1.0 * 1.75 ** 1)}
    s = SequenceSampler(SamplingParams(dry_multiplier=1.0), 16, history=[1, 2, 3, 4, 1, 2, 10, 11, 3],
                        dry_breakers={10: ((11,),)})
    assert s.dry_penalties() == {}


def test_build_dry_breakers() -> None:
    vocab = [b"a", b"\n", b"x\ny", b"ab", b"b:", b"b", b"*a"]

    def tokenize(text: str) -> list[int]:
        return [vocab.index(ch.encode()) for ch in text]

    table = build_dry_breakers(["\n", "ab"], vocab, tokenize)
    # containing a breaker: single-token breakers; ending with "a" (a prefix of "ab"): head + tail "b"
    assert table == {1: ((),), 2: ((),), 3: ((),), 0: ((5,),), 6: ((5,),)}


def test_adaptive_p_ema_and_final_pick() -> None:
    x = _logits(19, scale=2.0)
    p = SamplingParams(seed=2, samplers=("top_k", "adaptive_p"), top_k=10, adaptive_target=0.3,
                       adaptive_decay=0.5)
    s = SequenceSampler(p, V)
    assert build_plan(p) == (("top_k",), "adaptive_p")
    before = (s._ap_sum, s._ap_weight)
    r = sample_one(s, x)
    s.accept(r.token)
    assert (s._ap_sum, s._ap_weight) != before
    assert s._ap_weight == pytest.approx(1.0 + 0.5 * 2.0)
    assert r.token in ref_top_k(x[0].tolist(), 10)


# -- probabilities -----------------------------------------------------------------------------


def test_n_probs_are_raw_log_softmax() -> None:
    logits = _logits(21, b=3)
    params = [SamplingParams(seed=1, n_probs=5), SamplingParams(temperature=0.0, n_probs=3,
                                                                logit_bias=((0, 50.0),)),
              SamplingParams(seed=2)]
    res = sample_batch(logits, [SequenceSampler(p, V) for p in params])
    ref = torch.log_softmax(logits, -1)
    for r, row, p in zip(res, ref, params):
        assert len(r.top) == p.n_probs and not r.is_prob
        vals, ids = row.topk(max(p.n_probs, 1))
        assert [t for t, _ in r.top] == ids[: p.n_probs].tolist()
        assert [v for _, v in r.top] == pytest.approx(vals[: p.n_probs].tolist(), abs=1e-5)
        assert r.logprob == pytest.approx(float(row[r.token]), abs=1e-5)
    assert res[1].token == 0  # the bias decides the token, not the reported raw probabilities


def test_post_sampling_probs() -> None:
    logits = _logits(22)
    greedy = SamplingParams(temperature=0.0, n_probs=4, post_sampling_probs=True)
    r = sample_one(SequenceSampler(greedy, V), logits)
    assert r.is_prob and r.top == [(int(logits.argmax()), 1.0)] and r.logprob == 1.0
    r = sample_one(SequenceSampler(SamplingParams(seed=4, n_probs=3, post_sampling_probs=True), V), logits)
    assert len(r.top) <= 3 and all(q > 0 for _, q in r.top)
    assert [q for _, q in r.top] == sorted((q for _, q in r.top), reverse=True)
    assert dict(_survivors(SamplingParams(seed=4), logits))[r.token] == pytest.approx(r.logprob)


def test_vocab_padding_columns_ignored() -> None:
    logits = torch.cat([_logits(23), torch.full((1, 8), 100.0)], dim=1)
    s = SequenceSampler(SamplingParams(temperature=0.0), V)
    assert sample_one(s, logits).token == int(logits[0, :V].argmax())


# -- params ------------------------------------------------------------------------------------


def test_parse_samplers() -> None:
    assert parse_samplers("edskypmxt") == DEFAULT_SAMPLERS
    assert parse_samplers(["top-k", "nucleus", "typical_p", "temp", "bogus", "min_p"]) == (
        "top_k", "top_p", "typ_p", "temperature", "min_p")
    assert parse_samplers("kz?t") == ("top_k", "temperature")
    assert SamplingParams(samplers=["top-k", "temp"]).samplers == ("top_k", "temperature")


def test_to_json_generation_settings() -> None:
    p = SamplingParams(temperature=0.0, logit_bias=((5, -math.inf), (6, 1.5)), ignore_eos=True, n_probs=3)
    full = p.to_json(False, eog_ids=[2], extra={"stop": [], "n_predict": 3, "max_tokens": 3, "stream": False,
                                                "lora": [], "zz_custom": 1})
    keys = list(full)
    assert keys[:5] == ["seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k"]
    assert keys.index("dry_sequence_breakers") < keys.index("mirostat") < keys.index("stop")
    assert keys.index("max_tokens") < keys.index("n_predict") < keys.index("ignore_eos")
    assert keys.index("ignore_eos") < keys.index("stream")
    assert keys.index("logit_bias") < keys.index("n_probs") < keys.index("samplers") < keys.index("lora")
    assert keys[-1] == "zz_custom"
    assert full["seed"] == 4294967295
    assert full["top_p"] == 0.949999988079071 and full["min_p"] == 0.05000000074505806
    assert full["adaptive_decay"] == 0.8999999761581421 and full["dry_base"] == 1.75
    assert full["logit_bias"] == [{"bias": None, "token": 5}, {"bias": 1.5, "token": 6},
                                  {"bias": None, "token": 2}]
    assert full["samplers"] == list(DEFAULT_SAMPLERS)
    metrics = p.to_json(True, extra={"stop": ["x"], "n_predict": 3})
    assert "logit_bias" not in metrics and "dry_sequence_breakers" not in metrics and "stop" not in metrics
    assert metrics["n_predict"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    configs = [SamplingParams(temperature=0.0, repeat_penalty=1.2, n_probs=3),
               SamplingParams(seed=3, n_probs=2, post_sampling_probs=True),
               SamplingParams(seed=4, top_k=0, typical_p=0.7, min_keep=2),
               SamplingParams(seed=5, xtc_probability=0.5, top_n_sigma=2.0, dry_multiplier=0.5),
               SamplingParams(seed=6, mirostat=1), SamplingParams(seed=7, mirostat=2),
               SamplingParams(seed=8, samplers=("top_k", "adaptive_p"), adaptive_target=0.4)]
    v = 4096
    cpu = [SequenceSampler(p, v, eog_ids=[0], history=[5, 6, 7]) for p in configs]
    gpu = [SequenceSampler(p, v, eog_ids=[0], history=[5, 6, 7]) for p in configs]
    for step in range(6):
        logits = _logits(300 + step, b=len(configs), v=v, scale=3.0)
        a = sample_batch(logits, cpu)
        b = sample_batch(logits.cuda(), gpu)
        assert [r.token for r in a] == [r.token for r in b]
        for ra, rb in zip(a, b):
            assert [t for t, _ in ra.top] == [t for t, _ in rb.top]
            assert ra.logprob == pytest.approx(rb.logprob, rel=1e-4, abs=1e-5)
        for s, r in zip(cpu + gpu, a + b):
            s.accept(r.token)
