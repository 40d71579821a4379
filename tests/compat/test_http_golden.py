"""Every body recorded from the real llama-server (tests/golden/responses-smollm2.json) has
the same keys and value types in ours; model-dependent values may differ."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.compat.test_http_fake_engine import client, sse_events
from tests.conftest import GOLDEN_DIR

GOLDEN = GOLDEN_DIR / "responses-smollm2.json"


def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())["responses"]


def kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    return type(v).__name__


def same_shape(gold: Any, ours: Any, path: str = "$") -> None:
    """Same dict keys (in order), same JSON types; lists compared element-wise on the first
    element when both are non-empty. A float in the golden accepts only a float."""
    assert kind(gold) == kind(ours), f"{path}: golden {kind(gold)} ({gold!r:.60}) vs ours {kind(ours)} ({ours!r:.60})"
    if isinstance(gold, dict):
        assert list(gold) == list(ours), f"{path}: keys differ\n golden {list(gold)}\n ours   {list(ours)}"
        for k in gold:
            same_shape(gold[k], ours[k], f"{path}.{k}")
    elif isinstance(gold, list) and gold and ours:
        same_shape(gold[0], ours[0], f"{path}[0]")


@pytest.fixture(scope="module")
def http():  # type: ignore[no-untyped-def]
    c, eng = client()
    with c:
        yield c, eng


G = golden()

CASES: list[tuple[str, str, str, Any]] = [
    ("GET /health", "GET", "/health", None),
    ("GET /props", "GET", "/props", None),
    ("GET /slots", "GET", "/slots", None),
    ("GET /v1/models", "GET", "/v1/models", None),
    ("GET /models", "GET", "/models", None),
    ("POST /completion", "POST", "/completion", {"prompt": "The capital of France is", "n_predict": 12,
                                                  "temperature": 0}),
    ("POST /completion (n_probs)", "POST", "/completion", {"prompt": "The capital of France is", "n_predict": 3,
                                                           "temperature": 0, "n_probs": 3}),
    ("POST /v1/completions", "POST", "/v1/completions", {"prompt": "Count: 1, 2,", "max_tokens": 6}),
    ("POST /v1/chat/completions", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}),
    ("POST /v1/chat/completions (logprobs)", "POST", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2}),
    ("POST /tokenize (with_pieces)", "POST", "/tokenize", {"content": "Hello world!", "with_pieces": True}),
    ("POST /detokenize", "POST", "/detokenize", {"tokens": [82, 111]}),
    ("POST /apply-template", "POST", "/apply-template",
     {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]}),
    ("ERR malformed JSON", "POST", "/completion", b"{no"),
    ("ERR missing prompt", "POST", "/completion", {"n_predict": 1}),
    ("ERR chat without messages", "POST", "/v1/chat/completions", {"max_tokens": 1}),
    ("ERR wrong type n_predict", "POST", "/completion", {"prompt": "x", "n_predict": "many"}),
    ("ERR prompt exceeds context", "POST", "/completion", {"prompt": "word " * 100}),
    ("ERR unknown endpoint", "GET", "/no/such/path", None),
    ("ERR slot action without save path", "POST", "/slots/0?action=save", {"filename": "a.bin"}),
    ("ERR invalid slot id", "POST", "/completion", {"prompt": "x", "id_slot": 99, "n_predict": 1}),
    ("cache: same prompt twice (2nd)", "POST", "/completion", {"prompt": "word " * 20, "n_predict": 2}),
    ("cache: cache_prompt false", "POST", "/completion", {"prompt": "word " * 20, "n_predict": 2,
                                                          "cache_prompt": False}),
]


# Where kvserve deliberately answers a client error with 400 (llama-server: 500 for a malformed
# body, and it wraps an out-of-range id_slot around): (status, the error body's shape).
DEVIATIONS: dict[str, tuple[int, dict[str, Any]]] = {
    "ERR malformed JSON": (400, {"error": {"code": 400, "message": "", "type": "invalid_request_error"}}),
    "ERR invalid slot id": (400, {"error": {"code": 400, "message": "", "type": "invalid_request_error"}}),
}


def expected(name: str, gold: dict[str, Any]) -> tuple[int, Any]:
    if name in DEVIATIONS:
        return DEVIATIONS[name]
    return gold[name][0], gold[name][1]


@pytest.mark.parametrize("name,method,path,body", CASES, ids=[c[0] for c in CASES])
def test_body_shape(http, name: str, method: str, path: str, body: Any) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    status, gold = expected(name, G)
    if isinstance(body, bytes):
        r = c.request(method, path, content=body)
    else:
        r = c.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.headers["server"] == "llama.cpp"
    ours = r.json()
    same_shape(gold, ours)
    if name.startswith("ERR") and name not in ("ERR malformed JSON", "ERR prompt exceeds context",
                                                 "ERR invalid slot id"):
        assert ours == gold  # fixed messages are identical
    if name == "ERR malformed JSON":  # llama-server's message, with a 4xx status
        assert ours["error"]["message"].startswith(G[name][1]["error"]["message"][:60])


def test_exceed_context_message_format(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = c.post("/completion", json={"prompt": "word " * 100})
    err = r.json()["error"]
    n = err["n_prompt_tokens"]
    assert err["message"] == (f"request ({n} tokens) exceeds the available context size "
                              f"({eng.n_ctx_slot} tokens), try increasing it")
    assert err["n_ctx"] == eng.n_ctx_slot


def test_metrics_names_and_order(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    _, gold = G["GET /metrics"]
    r = c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/plain; version=0.0.4"
    assert "process-start-time-unix" in r.headers
    ours_llama = [ln for ln in r.text.splitlines() if "llamacpp:" in ln]
    gold_lines = gold.splitlines()
    assert [ln.rsplit(" ", 1)[0] for ln in ours_llama] == [ln.rsplit(" ", 1)[0] for ln in gold_lines]
    assert "llamacpp:prompt_tokens_total 42" in r.text


def _sse_cases() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("POST /completion (stream, raw SSE)", "/completion", {"prompt": "Count: 1, 2,", "n_predict": 4,
                                                                "stream": True}),
        ("POST /v1/chat/completions (stream+usage, raw SSE)", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
          "stream_options": {"include_usage": True}}),
        ("POST /v1/completions (stream, raw SSE)", "/v1/completions", {"prompt": "Count: 1, 2,", "max_tokens": 3,
                                                                       "stream": True}),
    ]


@pytest.mark.parametrize("name,path,body", _sse_cases(), ids=[c[0] for c in _sse_cases()])
def test_sse_shape(http, name: str, path: str, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    status, gold_headers, gold_text = G[name]
    r = c.post(path, json=body)
    assert r.status_code == status
    assert r.headers["content-type"] == gold_headers["Content-Type"]
    assert r.headers["x-accel-buffering"] == "no"
    assert r.headers["server"] == "llama.cpp"
    gold_ev, ours_ev = sse_events(gold_text), sse_events(r.text)
    assert len(ours_ev) == len(gold_ev)  # same n of tokens requested -> same number of events
    for g, o in zip(gold_ev, ours_ev):
        if isinstance(g, str):
            assert o == g
        else:
            same_shape(g, o)
