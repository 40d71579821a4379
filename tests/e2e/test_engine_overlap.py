"""Overlap on the real model and runner (CPU): the engine launched with ``overlap=True`` plans
decode steps from the previous step's sampled tokens before committing it (``Plan.feed``: the
runner copies those tokens into the step's inputs itself). Every request gives exactly what the
engine gives step by step: tokens, text, streamed text, stop decisions; the cache's invariants
hold after every step (``check_integrity``) and nothing is left held."""

from __future__ import annotations

from kvserve.engine.sampling_params import SamplingParams

from .engine_harness import assert_idle, make_engine, run, submit


def _batch(smollm, overlap: bool):
    from kvserve.model.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(smollm.metadata)
    eng = make_engine(smollm, n_slots=4, overlap=overlap)
    prompts = ["The capital of France is", "1, 2, 3, 4, 5,", "Once upon a time", "The capital of France is a"]
    cols = []
    for i, text in enumerate(prompts):
        ids = tok.encode(text, add_special=True, parse_special=True)
        kw = {}
        if i == 1:
            kw["stop"] = [" 9"]
        if i == 2:
            kw["sampling"] = SamplingParams(seed=7, temperature=0.8, top_k=40)
        cols.append(submit(eng, ids, n_predict=10 + 3 * i, stream=True, **kw)[1])
    run(eng, cols)
    assert_idle(eng)
    out = [(c.final.tokens, c.final.content, c.streamed, c.final.stop_type) for c in cols]
    return out, eng.loop.n_ahead, eng.runner


def test_overlap_matches_step_by_step(smollm):
    plain, n0, _ = _batch(smollm, overlap=False)
    fed, n_ahead, _ = _batch(smollm, overlap=True)
    assert n0 == 0 and n_ahead > 5  # decode steps really were planned ahead
    assert fed == plain
    assert plain[1][3] == "word"  # the stop string ended one request while others decoded
