"""The per-token shortcuts of the commit path against the slow paths they stand in for:
``records.maker`` against the dataclasses' constructors, ``TextOutput``'s plain path against the
stop-string streamer, ``sampler_fast``'s kept eligibility and bias sums against working them out
again (and when they must be), ``Sequence.id``."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from kvserve.engine import sampler_fast
from kvserve.engine.output import TextOutput
from kvserve.engine.records import maker
from kvserve.engine.request import GenerationRequest, RequestParams, TokenEvent
from kvserve.engine.sampler import SampleResult
from kvserve.engine.sampler_state import SequenceSampler
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.sequence import Sequence
from kvserve.engine.snapshot import NextToken
from kvserve.plan import SeqChunk


@pytest.mark.parametrize("cls,values", [
    (SampleResult, (5, 0.0, [], False, False)),
    (SampleResult, (7, -1.5, [(1, 0.5)], True, True)),
    (NextToken, (True, False, 3, 4)),
    (SeqChunk, (9, (-1,), 17, (1, 2), "last")),
    (TokenEvent, (1, 0, "ab", [5], 3, 128, [], None, 2)),
    (TokenEvent, (1, 2, "", [], 1, 4, [], {"x": 1.0}, 0)),
])
def test_maker_builds_what_the_constructor_builds(cls, values) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert len(values) == len(names)  # maker takes every field: a new field fails here
    a, b = maker(cls)(*values), cls(*values)
    assert type(a) is cls and a == b and repr(a) == repr(b)
    assert [getattr(a, n) for n in names] == [getattr(b, n) for n in names]
    assert dataclasses.replace(a) == b
    if cls.__dataclass_params__.frozen:
        if all(v.__hash__ is not None for v in values):
            assert hash(a) == hash(b)
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.__setattr__(names[0], None)
    with pytest.raises(TypeError):
        maker(cls)(*values[:-1])


def test_maker_refuses_what_it_cannot_build() -> None:
    @dataclasses.dataclass
    class Post:
        x: int

        def __post_init__(self) -> None:
            self.x += 1

    @dataclasses.dataclass
    class Hidden:
        x: int
        y: int = dataclasses.field(init=False, default=0)

    @dataclasses.dataclass(slots=True)
    class Slots:
        x: int

    for cls in (Post, Hidden, Slots, int):
        with pytest.raises(TypeError):
            maker(cls)


class _Decoder:
    """Pieces of 0-3 characters, some of them newlines (an incomplete UTF-8 tail held to flush)."""

    def __init__(self) -> None:
        self.n = 0

    def feed(self, token: int) -> str:
        self.n += 1
        return ["", "a", "b\n", "xyz", " ", "\n\n", "é"][token % 7]

    def flush(self) -> str:
        return "~" if self.n % 2 else ""


class _Tok:
    def stream_decoder(self, special: bool = False) -> _Decoder:
        return _Decoder()


@pytest.mark.parametrize("special", [False, True])
def test_plain_text_output_is_the_streamers(special: bool) -> None:
    rnd = random.Random(3)
    for trial in range(50):
        tokens = [rnd.randrange(50) for _ in range(rnd.randrange(1, 40))]
        eog = {0, 13}
        outs = []
        for plain in (True, False):
            out = TextOutput(_Tok(), ["", ""] if trial % 2 else [], special)
            assert out._plain
            out._plain = plain  # False: through TextStreamer, as with stop strings
            got = [out.push_token(t, t in eog) for t in tokens]
            outs.append((got, out.flush(False)))
        assert outs[0] == outs[1]
    assert not TextOutput(_Tok(), ["x"], False)._plain
    assert not TextOutput(_Tok(), [], False, n_indent=2)._plain


def test_eligibility_is_kept_and_worked_out_again_for_new_params() -> None:
    s = SequenceSampler(SamplingParams(temperature=0.0), 50)
    assert sampler_fast._eligible(s) is sampler_fast.eligible(s) is True
    assert s._fast_eligible[2] is True
    s.params = SamplingParams(temperature=0.0, n_probs=3)  # probabilities: the chain's
    assert sampler_fast._eligible(s) is sampler_fast.eligible(s) is False
    s.grammar = object()  # type: ignore[assignment]
    s.params = SamplingParams(temperature=0.0)
    assert sampler_fast._eligible(s) is sampler_fast.eligible(s) is False


def _summed_slow(samplers):
    summed: dict = {}
    for i, s in enumerate(samplers):
        for t, b in s.bias:
            summed[(i, t)] = summed.get((i, t), 0.0) + b
    return summed


def test_bias_sums_are_reused_only_for_the_same_samplers_in_the_same_rows() -> None:
    a = SequenceSampler(SamplingParams(temperature=0.0, logit_bias=((3, 1.0), (3, 2.0))), 50)
    b = SequenceSampler(SamplingParams(temperature=0.0, ignore_eos=True), 50, eog_ids=(0, 1))
    c = SequenceSampler(SamplingParams(temperature=0.0), 50)
    first = sampler_fast._summed_biases([a, b, c])
    assert first == _summed_slow([a, b, c]) == {(0, 3): 3.0, (1, 0): float("-inf"), (1, 1): float("-inf")}
    assert sampler_fast._summed_biases([a, b, c]) is first
    for rows in ([b, a, c], [a, b], [a, b, c, c], [a, c, b], [c], []):
        got = sampler_fast._summed_biases(rows)
        assert got == _summed_slow(rows)
    d = SequenceSampler(SamplingParams(temperature=0.0, logit_bias=((3, 1.0), (3, 2.0))), 50)  # a's twin
    assert sampler_fast._summed_biases([a, b, c]) is not sampler_fast._summed_biases([d, b, c])


def test_bias_tensors_follow_the_sums() -> None:
    dev = torch.device("cpu")
    s1 = {(0, 3): 1.0, (1, 5): -2.0}
    r1 = sampler_fast._bias_tensors(s1, torch.float32, dev)
    assert sampler_fast._bias_tensors(s1, torch.float32, dev) is r1
    assert sampler_fast._bias_tensors(dict(s1), torch.float32, dev) is r1  # equal sums: the same tensors
    r2 = sampler_fast._bias_tensors(s1, torch.float64, dev)
    assert r2 is not r1 and r2[2].dtype == torch.float64
    s2 = {(0, 3): 1.0, (1, 6): -2.0}
    r3 = sampler_fast._bias_tensors(s2, torch.float32, dev)
    assert r3[1].tolist() == [3, 6] and r3[2].tolist() == [1.0, -2.0] and r3[0].tolist() == [0, 1]


def test_sequence_id_is_its_requests() -> None:
    req = GenerationRequest(42, [1, 2], RequestParams())
    seq = Sequence(req, lambda ev: None, 0, (), None, None, [1, 2], 2)
    assert seq.id == 42
    f = next(f for f in dataclasses.fields(Sequence) if f.name == "id")
    assert not f.init and not f.repr and not f.compare  # repr and == as when it was a property
