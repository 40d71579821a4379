"""Long texts (encoded by the library's batch call, without the interpreter lock, in threads at once)
get the ids of its plain encode."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from kvserve.model.tokenizer import RELEASE_GIL_CHARS, Tokenizer

WORDS = ("alpha", "beta", "gamma", "delta", "über", "naïve", "日本語", "😀", "x=1;", "\n\n", "  ", "don't", "42")


def _long_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words: list[str] = []
        while sum(map(len, words)) < RELEASE_GIL_CHARS + rng.randrange(2000):
            words.append(rng.choice(WORDS))
        out.append(" ".join(words))
    return out


def _in_threads(fn: Any, args: Sequence[Any]) -> list[Any]:
    out: list[Any] = [None] * len(args)
    start = threading.Barrier(len(args))

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = fn(args[i])
        except Exception as err:  # noqa: BLE001 - compared by the test
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    return out


@pytest.mark.parametrize("model", ["smollm", "gemma"])
def test_long_texts_in_threads_at_once_get_the_ids_of_plain_encode(model: str, smollm_meta: dict[str, Any],
                                                           gemma_meta: dict[str, Any]) -> None:
    tok = Tokenizer.from_metadata({"smollm": smollm_meta, "gemma": gemma_meta}[model])
    texts = _long_texts(24) + ["<|im_start|>user\n" + _long_texts(1, 5)[0] + "<|im_end|>"]
    for parse_special in (True, False):
        hf = tok._hf if parse_special else tok._literal()
        want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
        for add_special in (True, False):
            got = _in_threads(lambda t: tok.encode(t, add_special, parse_special), texts)
            for g, w in zip(got, want):
                assert isinstance(g, list)
                bos = [tok.bos_id] if add_special and tok.add_bos else []
                eos = [tok.eos_id] if add_special and tok.add_eos else []
                assert g == bos + w + eos
