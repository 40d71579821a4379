"""Long prompt texts of concurrent requests tokenized together, off the event loop.

A completion request whose prompt has long texts (``RELEASE_GIL_CHARS`` or more) hands them to the
``BatchEncoder`` of its event loop and waits; the encoder runs a few worker-thread jobs at a time
(``MAX_JOBS``), and a job takes every text queued when it starts: one ``Tokenizer.encode_texts``
call (the library's batch encode, without the interpreter lock, the texts on several cores at
once; several jobs at once keep the cores busy where the library runs a batch on one). The 64
requests of a burst then cost a few worker hand-offs, not one each (a thread-pool submission,
the worker taking the interpreter lock to run the request's validation, the result's way back to
the loop), and their validation runs on the loop with the ids at hand (``Pretokenized``): no
interpreter-lock hand-off between the loop and a worker per request while the engine thread
holds the lock in between. This is how vLLM's API server batches its tokenizer calls.

``KVSERVE_TOKEN_CACHE=N`` (default 0, off) keeps the ids of texts tokenized lately, up to N ids
(4 bytes each), keyed by the text itself and ``parse_special``: the same prompt sent again (a
repeated burst, retries) is then answered on the loop without a worker. Tokenization is
deterministic, so a kept entry is what encoding the text again gives. Off by default: on an
H200 it did not shorten the repeated burst (docs/benchmarks.md), where the interpreter lock and
not the tokenizer's CPU time sets the pace.
"""

from __future__ import annotations

import asyncio
import os
from array import array
from collections import OrderedDict
from typing import Any

from kvserve.model.tokenizer import RELEASE_GIL_CHARS

CACHE_TOKENS = int(os.environ.get("KVSERVE_TOKEN_CACHE", "0"))

# worker jobs at once: each takes what is queued when it starts
MAX_JOBS = max(1, min(4, os.cpu_count() or 1))

Key = tuple[str, bool]  # (text, parse_special)


class BatchEncoder:
    """The texts of one event loop's requests, encoded in batches (see the module docstring)."""

    def __init__(self, tokenizer: Any, cache_tokens: int | None = None) -> None:
        self.tokenizer = tokenizer
        self._queued: dict[Key, list[asyncio.Future[list[int]]]] = {}
        self._running = 0  # worker jobs under way
        self._cache: OrderedDict[Key, array[int]] = OrderedDict()
        self._cache_cap = max(0, CACHE_TOKENS if cache_tokens is None else cache_tokens)
        self._cache_tokens = 0
        self.n_jobs = 0  # worker jobs run (tests, metrics of the benchmarks)

    async def encode(self, keys: list[Key]) -> dict[Key, list[int]]:
        """Each (text, parse_special)'s ids without BOS/EOS (``Tokenizer.encode_texts``)."""
        out: dict[Key, list[int]] = {}
        waits: list[tuple[Key, asyncio.Future[list[int]]]] = []
        loop = asyncio.get_running_loop()
        for k in keys:
            if k in out:
                continue
            hit = self._cache.get(k)
            if hit is not None:
                self._cache.move_to_end(k)
                out[k] = hit.tolist()
                continue
            fut: asyncio.Future[list[int]] = loop.create_future()
            self._queued.setdefault(k, []).append(fut)
            waits.append((k, fut))
        if waits:
            self._start(loop)
            for k, fut in waits:
                out[k] = list(await fut)
        return out

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._running >= MAX_JOBS or not self._queued:
            return
        self._running += 1
        job, self._queued = self._queued, {}
        self.n_jobs += 1
        work = loop.run_in_executor(None, self._run, list(job))
        work.add_done_callback(lambda f: self._done(loop, job, f))

    def _run(self, keys: list[Key]) -> list[list[int]]:  # worker thread
        out: list[list[int]] = [[]] * len(keys)
        for special in (True, False):
            idx = [i for i, k in enumerate(keys) if k[1] is special]
            if idx:
                for i, ids in zip(idx, self.tokenizer.encode_texts([keys[i][0] for i in idx], special)):
                    out[i] = ids
        return out

    def _done(self, loop: asyncio.AbstractEventLoop, job: dict[Key, list[asyncio.Future[list[int]]]],
              work: asyncio.Future[list[list[int]]]) -> None:  # on the loop
        self._running -= 1
        err = work.exception() if not work.cancelled() else asyncio.CancelledError()
        results = None if err is not None else work.result()
        for i, (k, futs) in enumerate(job.items()):
            if results is not None:
                self._keep(k, results[i])
            for f in futs:
                if f.done():
                    continue
                if err is not None:
                    f.set_exception(err)
                else:
                    f.set_result(results[i])  # type: ignore[index]
        self._start(loop)  # what was queued meanwhile

    def _keep(self, k: Key, ids: list[int]) -> None:
        n = len(ids)
        if n == 0 or n > self._cache_cap or k in self._cache:
            return
        self._cache[k] = array("i", ids)
        self._cache_tokens += n
        while self._cache_tokens > self._cache_cap:
            _, old = self._cache.popitem(last=False)
            self._cache_tokens -= len(old)


class Pretokenized:
    """``tokenizer`` whose ``encode`` of the texts in ``ids`` answers from them (what encoding
    gives, with BOS/EOS added as asked); everything else is the tokenizer's."""

    def __init__(self, tokenizer: Any, ids: dict[Key, list[int]]) -> None:
        self._tok = tokenizer
        self._ids = ids

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        ids = self._ids.get((text, parse_special))
        if ids is None:
            return self._tok.encode(text, add_special, parse_special)
        return self._tok.with_specials(ids, add_special)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)


def long_prompt_texts(prompt: Any) -> list[str] | None:
    """The texts of a completion ``prompt`` (a string, or an array of strings, token ids,
    ``{"prompt_string": ...}`` objects and arrays of them) that are long enough to tokenize off
    the loop; None when the prompt has no such text."""
    out: list[str] = []

    def walk(p: Any, depth: int) -> None:
        if isinstance(p, str):
            if len(p) >= RELEASE_GIL_CHARS:
                out.append(p)
        elif depth < 4 and isinstance(p, list):
            for e in p:
                walk(e, depth + 1)
        elif depth < 4 and isinstance(p, dict):
            walk(p.get("prompt_string"), depth + 1)

    walk(prompt, 0)
    return out or None


def encoder_of(state: Any, tokenizer: Any) -> BatchEncoder:
    """The app's encoder for ``tokenizer`` (made on first use, again when the model changed)."""
    enc = getattr(state, "batch_encoder", None)
    if enc is None or enc.tokenizer is not tokenizer:
        enc = state.batch_encoder = BatchEncoder(tokenizer)
    return enc
