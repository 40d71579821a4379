"""Long request bodies are validated and tokenized in a worker thread (the event loop goes on
streaming meanwhile); the results and the errors are those of the inline path."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kvserve.server.completions import PREPARE_IN_THREAD_BYTES
from tests.compat.test_http_fake_engine import FakeEngine, client, sse_events


def recording_engine() -> tuple[FakeEngine, list[str]]:
    eng = FakeEngine(n_ctx_slot=1 << 20)
    where: list[str] = []
    encode = eng.tokenizer.encode

    def spy(text: str, add_special: bool, parse_special: bool) -> list[int]:
        where.append(threading.current_thread().name)
        return encode(text, add_special, parse_special)

    eng.tokenizer.encode = spy  # type: ignore[method-assign]
    return eng, where


def test_long_prompt_is_tokenized_off_the_loop_with_the_same_result() -> None:
    eng, where = recording_engine()
    c, _ = client(eng)
    long_prompt = "word " * (PREPARE_IN_THREAD_BYTES // 4)
    short = c.post("/completion", json={"prompt": "word " * 10, "n_predict": 2})
    long = c.post("/completion", json={"prompt": long_prompt, "n_predict": 2, "stream": True})
    assert short.status_code == 200 and long.status_code == 200
    loop_thread, worker = where
    assert worker != loop_thread
    assert eng.submitted[1].prompt_tokens == eng.tokenizer.encode(long_prompt, True, True)
    ev = sse_events(long.text)
    assert ev[-1]["stop"] is True and ev[-1]["tokens_evaluated"] == len(eng.submitted[1].prompt_tokens)


def test_long_body_errors_are_the_inline_ones() -> None:
    c, _ = client(FakeEngine(n_ctx_slot=1 << 20))
    pad = "x" * PREPARE_IN_THREAD_BYTES
    cases: list[dict[str, Any]] = [
        {"prompt": "hi", "n_probs": "many"},
        {"prompt": [1, 2, 10 ** 9]},
        {"n_predict": 2},
    ]
    for body in cases:
        small = c.post("/completion", json=body)
        big = c.post("/completion", json={**body, "padding": pad})
        assert small.status_code == big.status_code == 400, (small.text, big.text)
        assert small.json() == big.json()
    chat_small = c.post("/v1/chat/completions", json={"messages": [{"role": "nobody", "content": "hi"}]})
    chat_big = c.post("/v1/chat/completions", json={"messages": [{"role": "nobody", "content": pad}]})
    assert chat_small.status_code == chat_big.status_code == 400
    assert chat_small.json()["error"]["type"] == chat_big.json()["error"]["type"]


class BatchingTokenizer(FakeEngine().tokenizer.__class__):  # type: ignore[misc]
    """The fake tokenizer with the batch call of the real one (``encode_texts``, ``with_specials``),
    recording each batch and its thread."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[str, int]] = []

    def encode_texts(self, texts: list[str], parse_special: bool) -> list[list[int]]:
        self.batches.append((threading.current_thread().name, len(texts)))
        return [self.encode(t, False, parse_special) for t in texts]

    def with_specials(self, ids: list[int], add_special: bool) -> list[int]:
        return ([self.bos_id] if add_special and self.add_bos else []) + list(ids)


@pytest.mark.parametrize("keep", [0, 1 << 20])
def test_long_completion_prompts_are_batch_encoded_off_the_loop(monkeypatch: pytest.MonkeyPatch, keep: int) -> None:
    """... and with KVSERVE_TOKEN_CACHE (here ``keep`` ids) a text sent again is not encoded again."""
    from kvserve.model.tokenizer import RELEASE_GIL_CHARS
    from kvserve.server import batch_encode

    monkeypatch.setattr(batch_encode, "CACHE_TOKENS", keep)

    eng = FakeEngine(n_ctx_slot=1 << 20)
    tok = eng.tokenizer = BatchingTokenizer()
    c, _ = client(eng)
    long_prompt = "word " * (PREPARE_IN_THREAD_BYTES // 4)
    mixed = [5, 6, "x" * max(RELEASE_GIL_CHARS, PREPARE_IN_THREAD_BYTES), "short"]
    loop_threads: list[str] = []
    encode = tok.encode

    def spy(text: str, add_special: bool, parse_special: bool) -> list[int]:
        if text == "short prompt":  # a short body is tokenized on the loop
            loop_threads.append(threading.current_thread().name)
        return encode(text, add_special, parse_special)

    tok.encode = spy  # type: ignore[method-assign]
    assert c.post("/completion", json={"prompt": "short prompt", "n_predict": 2}).status_code == 200
    del eng.submitted[0]
    (loop_thread,) = loop_threads
    for path, body in (("/completion", {"prompt": long_prompt}), ("/v1/completions", {"prompt": mixed})):
        r = c.post(path, json={**body, "n_predict": 2, "stream": True})
        assert r.status_code == 200, r.text
    assert [n for _, n in tok.batches] == [1, 1] and all(t != loop_thread for t, _ in tok.batches)
    assert eng.submitted[0].prompt_tokens == tok.encode(long_prompt, True, True)
    assert eng.submitted[1].prompt_tokens == [5, 6] + tok.encode(mixed[2], False, True) \
        + tok.encode("short", False, True)
    again = c.post("/completion", json={"prompt": long_prompt, "n_predict": 2})
    assert again.status_code == 200 and len(tok.batches) == (2 if keep else 3)  # kept, or encoded again
    assert eng.submitted[2].prompt_tokens == eng.submitted[0].prompt_tokens
    # errors are the inline path's
    for body in ({"prompt": long_prompt, "n_probs": "many"}, {"prompt": [long_prompt, [1, 10 ** 9]]}):
        small = c.post("/completion", json={**body, "prompt": "hi" if isinstance(body["prompt"], str) else
                                             ["hi", [1, 10 ** 9]]})
        big = c.post("/completion", json=body)
        assert small.status_code == big.status_code == 400, (small.text, big.text)
        assert small.json() == big.json()
