"""Prompt texts tokenized in batches (``server/batch_encode.py``): the ids are ``Tokenizer.encode``'s,
concurrent requests share worker jobs, a text sent again is answered from the kept ids within
their budget."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from kvserve.model.tokenizer import RELEASE_GIL_CHARS, Tokenizer
from kvserve.server.batch_encode import BatchEncoder, Pretokenized, long_prompt_texts


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    meta = request.getfixturevalue({"smollm2": "smollm_meta", "gemma3": "gemma_meta"}[request.param])
    return Tokenizer.from_metadata(meta)


def texts_for(tok: Tokenizer) -> list[str]:
    special = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
    piece = "Hello wörld, 12 tokens!\n" + special + "  tabs\tand more text "
    long = piece * (RELEASE_GIL_CHARS // len(piece) + 2)
    return [long, long + " tail", "short one", "", "bad \ud800 surrogate " + long, special * 3]


def test_encode_texts_with_specials_equal_encode(tok: Tokenizer) -> None:
    texts = texts_for(tok)
    for parse_special in (True, False):
        core = tok.encode_texts(texts, parse_special)
        for t, ids in zip(texts, core):
            for add_special in (True, False):
                assert tok.with_specials(ids, add_special) == tok.encode(t, add_special, parse_special), (t[:20],)


def test_pretokenized_answers_from_its_ids_and_falls_back(tok: Tokenizer) -> None:
    texts = texts_for(tok)
    table = dict(zip([(t, True) for t in texts], tok.encode_texts(texts, True)))
    pre = Pretokenized(tok, table)
    for t in texts + ["not in the table"]:
        for add_special, ps in ((True, True), (False, True), (True, False)):
            assert pre.encode(t, add_special, ps) == tok.encode(t, add_special, ps)
    assert pre.n_vocab == tok.n_vocab  # everything else is the tokenizer's
    seen: list[str] = []
    pre = Pretokenized(SpyTokenizer(tok, seen), {(texts[0], True): [7, 8]})
    assert pre.encode(texts[0], False, True) == [7, 8] and seen == []  # from the table, not encoded
    pre.encode(texts[0], False, False)  # the other parse_special setting is not in it
    assert seen == [texts[0]]


class SpyTokenizer:
    """A tokenizer that records what it encodes and where (threads), and each batch call."""

    def __init__(self, tok: Tokenizer, seen: list[str]) -> None:
        self._tok = tok
        self.seen = seen
        self.batches: list[int] = []
        self.threads: set[str] = set()

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        self.seen.append(text)
        return self._tok.encode(text, add_special, parse_special)

    def encode_texts(self, texts: list[str], parse_special: bool) -> list[list[int]]:
        self.batches.append(len(texts))
        self.threads.add(threading.current_thread().name)
        return self._tok.encode_texts(texts, parse_special)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def test_concurrent_requests_share_jobs_and_a_repeat_is_kept(tok: Tokenizer) -> None:
    long = texts_for(tok)[0]
    prompts = [f"{long} question {i}" for i in range(24)]
    spy = SpyTokenizer(tok, [])

    async def burst(enc: BatchEncoder) -> list[dict[Any, list[int]]]:
        return await asyncio.gather(*(enc.encode([(p, True)]) for p in prompts))

    enc = BatchEncoder(spy, cache_tokens=1 << 20)
    got = asyncio.run(burst(enc))
    for p, ids in zip(prompts, got):
        assert ids[(p, True)] == tok.encode(p, False, True)
    assert sum(spy.batches) == len(prompts)  # each text encoded once
    assert enc.n_jobs == len(spy.batches) < len(prompts)  # in fewer jobs than requests
    assert threading.current_thread().name not in spy.threads  # in a worker thread
    again = asyncio.run(burst(enc))
    assert again == got and enc.n_jobs == len(spy.batches)  # kept: no job the second time
    # the same text twice in one call, and both parse_special settings of one text
    both = asyncio.run(enc.encode([(long, True), (long, False), (long, True)]))
    assert both == {(long, True): tok.encode(long, False, True), (long, False): tok.encode(long, False, False)}


def test_kept_ids_stay_within_their_budget(tok: Tokenizer) -> None:
    long = texts_for(tok)[0]
    prompts = [f"{long} question {i}" for i in range(6)]
    n = len(tok.encode(prompts[0], False, True))
    spy = SpyTokenizer(tok, [])
    enc = BatchEncoder(spy, cache_tokens=int(2.5 * n))  # two of them fit

    async def one(p: str) -> list[int]:
        return (await enc.encode([(p, True)]))[(p, True)]

    for p in prompts:
        asyncio.run(one(p))
    assert enc._cache_tokens <= int(2.5 * n) and len(enc._cache) == 2
    jobs = enc.n_jobs
    assert asyncio.run(one(prompts[-1])) == tok.encode(prompts[-1], False, True) and enc.n_jobs == jobs  # kept
    assert asyncio.run(one(prompts[0])) == tok.encode(prompts[0], False, True) and enc.n_jobs == jobs + 1  # evicted
    off = BatchEncoder(spy, cache_tokens=0)
    for _ in range(2):
        asyncio.run(off.encode([(long, True)]))
    assert off.n_jobs == 2 and not off._cache


def test_a_failed_job_fails_its_waiters_and_the_next_one_runs(tok: Tokenizer) -> None:
    class Flaky(SpyTokenizer):
        fail = True

        def encode_texts(self, texts: list[str], parse_special: bool) -> list[list[int]]:
            if self.fail:
                self.fail = False
                raise RuntimeError("library error")
            return super().encode_texts(texts, parse_special)

    enc = BatchEncoder(Flaky(tok, []))
    long = texts_for(tok)[0]
    with pytest.raises(RuntimeError):
        asyncio.run(enc.encode([(long, True)]))
    assert asyncio.run(enc.encode([(long, True)])) == {(long, True): tok.encode(long, False, True)}


def test_long_prompt_texts_finds_the_long_strings_of_every_prompt_form() -> None:
    long, short = "x" * RELEASE_GIL_CHARS, "y" * (RELEASE_GIL_CHARS - 1)
    assert long_prompt_texts(long) == [long]
    assert long_prompt_texts(short) is None
    assert long_prompt_texts([1, 2, 3]) is None and long_prompt_texts(None) is None
    assert long_prompt_texts([long, short, [5, long + "a"], {"prompt_string": long + "b"},
                              {"prompt_string": [1, long + "c"]}]) == [long, long + "a", long + "b", long + "c"]


def test_at_most_max_jobs_run_at_once_and_each_takes_what_is_queued(
        tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from kvserve.server import batch_encode

    monkeypatch.setattr(batch_encode, "MAX_JOBS", 2)
    lock = threading.Lock()
    now = [0, 0]  # running, most at once

    class Slow(SpyTokenizer):
        def encode_texts(self, texts: list[str], parse_special: bool) -> list[list[int]]:
            with lock:
                now[0] += 1
                now[1] = max(now[1], now[0])
            time.sleep(0.05)
            try:
                return super().encode_texts(texts, parse_special)
            finally:
                with lock:
                    now[0] -= 1

    long = texts_for(tok)[0]
    prompts = [f"{long} question {i}" for i in range(12)]
    spy = Slow(tok, [])
    enc = BatchEncoder(spy, cache_tokens=0)

    async def burst() -> list[dict[Any, list[int]]]:
        return await asyncio.gather(*(enc.encode([(p, True)]) for p in prompts))

    got = asyncio.run(burst())
    assert [g[(p, True)] for g, p in zip(got, prompts)] == [tok.encode(p, False, True) for p in prompts]
    assert now[1] == 2  # two jobs overlapped, never more
    assert spy.batches[:2] == [1, 1] and sum(spy.batches) == len(prompts) and len(spy.batches) < len(prompts)
