"""``SequenceSampler`` takes only the last tokens of a long prompt into its penalty and DRY
windows: the windows, counts and DRY penalties equal those of the whole history fed in."""

from __future__ import annotations

import random

from kvserve.engine.sampler_state import SequenceSampler
from kvserve.engine.sampling_params import SamplingParams


def test_windows_from_the_tail_equal_the_whole_history() -> None:
    rng = random.Random(7)
    vocab = 50
    for trial in range(400):
        p = SamplingParams(
            repeat_last_n=rng.choice([-1, 0, 1, 5, 64]),
            repeat_penalty=rng.choice([1.0, 1.1]),
            presence_penalty=rng.choice([0.0, 0.5]),
            dry_multiplier=rng.choice([0.0, 0.8]),
            dry_penalty_last_n=rng.choice([-1, 0, 3, 64]),
        )
        n_ctx_train = rng.choice([0, 10, 4096])
        # tokens outside the vocabulary are skipped; some histories are shorter than a window
        hist = [rng.randrange(-3, vocab + 3) for _ in range(rng.choice([0, 1, 4, 70, 2000]))]
        fast = SequenceSampler(p, vocab, history=hist, n_ctx_train=n_ctx_train)
        whole = SequenceSampler(p, vocab, history=iter(hist), n_ctx_train=n_ctx_train)  # read in full
        assert list(fast._pen_win) == list(whole._pen_win), trial
        assert fast.penalty_counts == whole.penalty_counts, trial
        assert list(fast._dry_win) == list(whole._dry_win), trial
        assert fast._pen_win.maxlen == whole._pen_win.maxlen and fast._dry_win.maxlen == whole._dry_win.maxlen
        if "dry" in fast.plan:
            assert fast.dry_penalties() == whole.dry_penalties(), trial
        for t in (rng.randrange(vocab) for _ in range(5)):  # and they go on alike
            fast.accept(t)
            whole.accept(t)
        assert list(fast._pen_win) == list(whole._pen_win) and list(fast._dry_win) == list(whole._dry_win)
        assert fast.penalty_counts == whole.penalty_counts
