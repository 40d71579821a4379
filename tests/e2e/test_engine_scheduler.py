"""Slots and continuous batching on the real SmolLM2 model, stepped deterministically."""

from __future__ import annotations

import random

import pytest

from kvserve.engine.request import TokenEvent
from kvserve.engine.sampling_params import SamplingParams
from kvserve.engine.sequence import SeqState

from ..conftest import TEXTS
from .engine_harness import assert_idle, make_engine, run, submit


@pytest.fixture(scope="module")
def tok(smollm):
    from kvserve.model.tokenizer import Tokenizer

    return Tokenizer.from_metadata(smollm.metadata)


def _ids(tok, text):
    return tok.encode(text, add_special=True, parse_special=True)


def test_explicit_slot_and_busy_slot_deferral(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    _, a = submit(eng, _ids(tok, "Hello there"), n_predict=12, id_slot=1)
    eng._drain(block=False)
    eng.step()
    assert eng.scheduler.slots[1].busy and not eng.scheduler.slots[0].busy
    # Pinned to the busy slot: waits, untouched; a free request behind it is admitted to slot 0.
    _, b = submit(eng, _ids(tok, "Second"), n_predict=3, id_slot=1)
    _, c = submit(eng, _ids(tok, "Third"), n_predict=3)
    eng._drain(block=False)
    eng.step()
    assert eng.scheduler.n_deferred == 1
    assert eng.scheduler.slots[0].busy
    run(eng, [a, b, c])
    assert a.final.id_slot == 1 and b.final.id_slot == 1 and c.final.id_slot == 0
    assert_idle(eng)


def test_saturation_fifo(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    order = []
    cols = []
    for i in range(6):
        rid, col = submit(eng, _ids(tok, f"Count to {i}:"), n_predict=3)
        cols.append(col)

    def watch(e):
        for s in e.scheduler.running.values():
            if s.id not in order:
                order.append(s.id)

    run(eng, cols, on_step=watch)
    assert order == sorted(order)
    assert all(c.final is not None for c in cols)
    assert_idle(eng)


def test_cancellation_frees_slot_and_pages(smollm, tok):
    eng = make_engine(smollm, n_slots=2)
    rid, a = submit(eng, _ids(tok, TEXTS[0]), n_predict=50)
    _, b = submit(eng, _ids(tok, "Short one"), n_predict=5)
    for _ in range(3):
        eng._drain(block=False)
        eng.step()
    eng.cancel(rid)
    run(eng, [b])
    # One terminal event also after a cancel: what was generated, stop type "none".
    assert a.final is not None and a.final.stop_type == "none" and 0 < a.final.n_decoded < 50
    assert len(a.events) == 1 + sum(1 for e in a.events if not hasattr(e, "stop_type"))
    assert_idle(eng)


def test_long_prompt_never_stalls_decoding_streams(smollm, tok):
    n_batch = 256
    eng = make_engine(smollm, n_slots=4, n_batch=n_batch)
    streams = [submit(eng, _ids(tok, f"Story {i}:"), n_predict=40)[1] for i in range(3)]
    for _ in range(4):
        eng._drain(block=False)
        eng.step()
    long_ids = (_ids(tok, " ".join(TEXTS)) * 4)[:2000]
    _, big = submit(eng, long_ids, n_predict=2)
    steps_with_prefill = 0

    def check(e):
        nonlocal steps_with_prefill
        dec = [s for s in e.scheduler.running.values() if s.state is SeqState.DECODE]
        if any(s.state is SeqState.PREFILL and s.req.id != 0 for s in e.scheduler.running.values()):
            steps_with_prefill += 1
        # every stream that is decoding advanced by exactly one token this step
        for s in dec:
            assert s.n_computed == len(s.tokens) - 1

    before = [len([e for e in c.events if isinstance(e, TokenEvent)]) for c in streams]
    progress = []

    def on_step(e):
        check(e)
        progress.append(sum(s.n_decoded for s in e.scheduler.running.values() if s.req.id != big_id))

    big_id = max(e.scheduler.running.keys()) if (e := eng) and eng.scheduler.running else None
    run(eng, streams + [big], on_step=on_step)
    assert big.final is not None and big.final.n_prompt == 2000
    # The prompt needed ceil(2000 / n_batch) or more steps, and streams kept decoding meanwhile.
    assert steps_with_prefill >= 2000 // n_batch - 1
    assert all(c.final.n_decoded == 40 for c in streams), before
    assert_idle(eng)


def test_no_cont_batching_waits_for_generation(smollm, tok):
    eng = make_engine(smollm, n_slots=2, cont_batching=False)
    _, a = submit(eng, _ids(tok, "First:"), n_predict=6)
    eng._drain(block=False)
    eng.step()
    _, b = submit(eng, _ids(tok, "Second:"), n_predict=3)
    mixed = []

    def watch(e):
        states = [s.state for s in e.scheduler.running.values()]
        mixed.append(SeqState.DECODE in states and SeqState.PREFILL in states)

    # b is admitted to a slot but its prompt is not computed while a generates.
    eng._drain(block=False)
    plan = eng.scheduler.schedule()
    assert all(len(c.tokens) == 1 for c in plan.chunks)
    eng.scheduler.commit(plan, eng.runner.run(plan))
    run(eng, [a, b])
    assert a.final.n_decoded == 6 and b.final is not None
    assert_idle(eng)


def test_same_seed_same_text_alone_and_in_batch_of_8(smollm, tok):
    sp = SamplingParams(seed=1234, temperature=0.9)
    prompt = _ids(tok, "Write a short poem about the sea:")
    eng = make_engine(smollm, n_slots=8)
    _, alone = submit(eng, prompt, n_predict=16, sampling=sp)
    run(eng, [alone])
    cols = [submit(eng, _ids(tok, f"Other prompt {i}"), n_predict=16, sampling=SamplingParams(seed=i)) for i in range(7)]
    _, batched = submit(eng, prompt, n_predict=16, sampling=sp, cache_prompt=False)
    run(eng, [c for _, c in cols] + [batched])
    assert alone.final.content == batched.final.content
    assert alone.final.tokens == batched.final.tokens
    assert_idle(eng)


def test_stop_string_spanning_tokens(smollm, tok):
    eng = make_engine(smollm, n_slots=1)
    prompt = _ids(tok, "1, 2, 3, 4, 5,")
    _, free = submit(eng, prompt, n_predict=12)
    run(eng, [free])
    text = free.final.content
    # A stop string made of the end of one token and the start of the next.
    cut = len(text) // 2
    stop = text[cut - 2 : cut + 2]
    assert len(stop) == 4
    _, s = submit(eng, prompt, n_predict=12, stop=[stop], stream=True)
    run(eng, [s])
    assert s.final.stop_type == "word" and s.final.stopping_word == stop
    assert s.final.content == text[: text.index(stop)]
    assert s.streamed == s.final.content  # the stop string never went out in the stream
    _, w = submit(eng, prompt, n_predict=12, stop=[stop], n_probs=2)
    run(eng, [w])
    n_stop = len(tok.encode(stop, add_special=False, parse_special=False))
    assert len(w.final.probs) == max(0, w.final.n_decoded - n_stop)  # stop-word tokens trimmed
    assert_idle(eng)


def test_context_overflow_is_an_error_and_generation_truncates(smollm, tok):
    eng = make_engine(smollm, n_slots=1, n_ctx=256)
    _, over = submit(eng, list(range(100, 356)))
    eng._drain(block=False)
    assert over.error.code == 400 and over.error.type == "exceed_context_size_error"
    assert over.error.extra == {"n_prompt_tokens": 256, "n_ctx": 256}
    prompt = _ids(tok, "List every number:")
    _, t = submit(eng, prompt, n_predict=-1, sampling=SamplingParams(temperature=0.0, ignore_eos=True))
    run(eng, [t])
    assert t.final.truncated and t.final.stop_type == "limit"
    assert t.final.n_decoded == 256 - len(prompt)
    assert_idle(eng)


def test_context_shift_keeps_generating_with_n_keep(smollm, tok):
    eng = make_engine(smollm, n_slots=1, n_ctx=128, context_shift=True)
    prompt = _ids(tok, "Keep this header. Now count: 1 2 3")
    _, t = submit(eng, prompt, n_predict=300, n_keep=4, sampling=SamplingParams(temperature=0.0, ignore_eos=True))
    seen_prefix = []

    def watch(e):
        for s in e.scheduler.running.values():
            seen_prefix.append(s.tokens[:4] == prompt[:4])

    run(eng, [t], on_step=watch)
    assert t.final.n_decoded == 300 and t.final.truncated
    assert all(seen_prefix)
    assert_idle(eng)


def test_random_disconnects_leak_nothing(smollm, tok):
    eng = make_engine(smollm, n_slots=4, n_batch=64)
    rng = random.Random(7)
    cols = []
    live = []
    for i in range(200):
        rid, col = submit(eng, _ids(tok, f"Request {i} " + "word " * rng.randint(1, 40)), n_predict=rng.randint(1, 6))
        cols.append(col)
        live.append(rid)
        if rng.random() < 0.15:
            eng.cancel(rid)  # before the first token (possibly before admission)
    steps = 0
    while not all(c.done for c in cols) and steps < 5000:
        eng._drain(block=False)
        eng.step()
        steps += 1
        for rid in list(eng.scheduler.running):
            if rng.random() < 0.05:
                eng.cancel(rid)  # mid-prefill or mid-stream
        if not eng.scheduler.has_work():
            break
    eng._drain(block=False)
    while eng.step():
        pass
    assert_idle(eng)
    assert eng.scheduler.stats.requests_finished + eng.scheduler.stats.requests_cancelled >= 150


def test_slot_prompt_similarity_and_lru(smollm, tok):
    eng = make_engine(smollm, n_slots=3, slot_prompt_similarity=0.1)
    p = _ids(tok, TEXTS[0])
    _, a = submit(eng, p, n_predict=2)
    run(eng, [a])
    assert a.final.id_slot == 2  # LRU on a fresh server: ties go to the highest id
    _, b = submit(eng, _ids(tok, "Unrelated question about cooking pasta"), n_predict=2)
    run(eng, [b])
    assert b.final.id_slot == 1  # no similar slot: least recently used
    _, c = submit(eng, p[:-5] + _ids(tok, " And then?")[1:], n_predict=2)
    run(eng, [c])
    assert c.final.id_slot == 2  # LCP similarity picks the slot that served the same document
    snap = eng.slots_snapshot()
    assert snap[2].n_prompt_tokens == len(p) - 5 + len(_ids(tok, " And then?")) - 1 + 2 - 1
    assert snap[0].id_task == -1 and snap[2].is_processing is False


def test_embeddings_pool_hidden_states(smollm, tok):
    eng = make_engine(smollm, n_slots=1)
    ids = _ids(tok, "Embeddings of a short sentence.")
    # No engine thread in these tests: the test thread is the engine thread.
    mean, last, per_token = (eng._embed_one(ids, p) for p in ("mean", "last", "none"))
    assert len(mean) == 1 and len(mean[0]) == smollm.cfg.n_embd
    assert len(per_token) == len(ids) and per_token[-1] == last[0]
    import torch

    assert torch.allclose(torch.tensor(per_token).mean(0), torch.tensor(mean[0]), atol=1e-5)
    assert_idle(eng)  # the temporary pages were returned


def test_n_indent_stops_at_a_less_indented_line(tok):
    from kvserve.engine.output import TextOutput

    out = TextOutput(tok, [], special=False, n_indent=4)
    text = "    return a + b\n    # done\nprint(add(1, 2))\n"
    released, hit = "", None
    for t in tok.encode(text, add_special=False, parse_special=False):
        piece, hit = out.push_token(t, is_eog=False)
        released += piece
        if hit is not None:
            break
    assert hit is not None and hit.kind == "indent"
    assert released + out.flush(True) == "    return a + b\n    # done\n"


def test_progress_events_and_timings_per_token(smollm, tok):
    from kvserve.engine.request import ProgressEvent

    eng = make_engine(smollm, n_slots=1, n_batch=64)
    ids = _ids(tok, TEXTS[0])
    _, col = submit(eng, ids, n_predict=3, stream=True, return_progress=True, timings_per_token=True)
    run(eng, [col])
    progress = [e for e in col.events if isinstance(e, ProgressEvent)]
    assert progress[0].processed == 0 and progress[-1].processed == len(ids)
    assert len(progress) == 1 + -(-len(ids) // 64)  # the 0% event, then one per prompt chunk
    assert all(e.timings is not None for e in progress)  # timings_per_token: the prompt's timings so far
    assert [e.timings["prompt_n"] for e in progress] == [e.processed for e in progress]
    assert progress[0].timings["prompt_ms"] == 0.0 and progress[-1].timings["prompt_ms"] > 0
    toks = [e for e in col.events if isinstance(e, TokenEvent)]
    assert toks and all(e.timings is not None and e.timings["prompt_n"] == len(ids) for e in toks)
    assert [e.timings["predicted_n"] for e in toks] == list(range(1, len(toks) + 1))
