"""Long request bodies are validated and tokenized in a worker thread (the event loop goes on
streaming meanwhile); the results and the errors are those of the inline path."""

from __future__ import annotations

import threading
from typing import Any

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


def test_requests_carry_the_prompt_bytes_made_at_validation() -> None:
    from kvserve.engine.slots import token_bytes
    from kvserve.server import completions
    from kvserve.server.engine_api import EngineAPI
    from kvserve.server.settings import ServerSettings

    eng = FakeEngine(n_ctx_slot=1 << 20)
    c, _ = client(eng)
    long_prompt = "word " * (PREPARE_IN_THREAD_BYTES // 4)
    for body in ({"prompt": "word " * 10}, {"prompt": long_prompt}, {"prompt": ["one two", [5, 6, 7]], "n": 2},
                 {"prompt": [1, 2, 3]}):
        eng.submitted.clear()
        r = c.post("/completion", json={**body, "n_predict": 1})
        assert r.status_code == 200, r.text
        assert eng.submitted and all(q.prompt_key == token_bytes(q.prompt_tokens) for q in eng.submitted)
    bad = c.post("/completion", json={"prompt": [1, -1]})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "Prompt contains invalid tokens"
    # prompts other than the ones validated get no bytes (the engine's intake makes them)
    e: EngineAPI = eng  # type: ignore[assignment]
    prompts, params = completions.prepare(completions.Kind.NATIVE, {"prompt": "one two"}, e, ServerSettings())
    reqs = completions.build_requests(e, [list(prompts[0])], params, completions.CacheIdentity())
    assert reqs[0].prompt_key is None
    reqs = completions.build_requests(e, prompts, params, completions.CacheIdentity())
    assert reqs[0].prompt_key == token_bytes(prompts[0])


def test_prepare_threads_are_a_pool_of_their_own_when_asked_for(monkeypatch) -> None:
    from kvserve.server import completions

    monkeypatch.setattr(completions, "_PREPARE_THREADS", 2)
    monkeypatch.setattr(completions, "_prepare_pool", None)
    eng, where = recording_engine()
    c, _ = client(eng)
    long_prompt = "word " * (PREPARE_IN_THREAD_BYTES // 4)
    for _ in range(3):
        r = c.post("/completion", json={"prompt": long_prompt, "n_predict": 1})
        assert r.status_code == 200, r.text
    assert len(where) == 3 and all(name.startswith("kvserve-prepare") for name in where)
    pool = completions._prepare_pool
    assert pool is not None and pool._max_workers == 2
    pool.shutdown()
