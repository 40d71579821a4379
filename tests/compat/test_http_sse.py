"""SSE framing: native (no [DONE]) and OpenAI streams, errors before/after the first event,
keep-alive pings, progress events, per-token timings and probabilities."""

from __future__ import annotations

from typing import Any

from tests.compat.test_http_fake_engine import FakeEngine, client, sse_events

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def stream(c: Any, path: str, body: dict[str, Any]) -> tuple[Any, list[Any]]:
    r = c.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/event-stream"
    assert r.headers["x-accel-buffering"] == "no"
    return r, sse_events(r.text)


def test_native_stream_has_no_done_and_ends_with_final() -> None:
    c, _ = client()
    r, ev = stream(c, "/completion", {"prompt": "x", "n_predict": 3})
    assert "[DONE]" not in r.text and r.text.endswith("}\n\n")
    assert [e["content"] for e in ev[:3]] == ["H", "e", "l"]
    assert all(e["stop"] is False and e["id_slot"] == -1 for e in ev[:3])
    assert [e["tokens_predicted"] for e in ev[:3]] == [1, 2, 3]
    final = ev[-1]
    assert final["stop"] is True and final["content"] == "" and final["tokens"] == []
    assert final["generation_settings"]["stream"] is True
    assert "completion_probabilities" not in final


def test_oai_completion_stream_ends_with_done() -> None:
    c, _ = client()
    r, ev = stream(c, "/v1/completions", {"prompt": "x", "max_tokens": 2})
    assert ev[-1] == "[DONE]" and r.text.endswith("data: [DONE]\n\n")
    final = ev[-2]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["text"] == ""
    assert "usage" in final and "timings" in final
    assert len({e["id"] for e in ev[:-1]}) == 1 and ev[0]["id"].startswith("chatcmpl-")
    assert len(ev[0]["id"]) == len("chatcmpl-") + 32


def test_chat_stream_role_first_timings_last_without_usage() -> None:
    c, _ = client()
    _, ev = stream(c, "/v1/chat/completions", {**CHAT, "max_tokens": 2})
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [e["choices"][0]["delta"] for e in ev[1:3]] == [{"content": "H"}, {"content": "e"}]
    finish = ev[3]
    assert finish["choices"][0] == {"finish_reason": "length", "index": 0, "delta": {}}
    assert "timings" in finish and "usage" not in finish
    assert ev[4] == "[DONE]"
    assert all(e["system_fingerprint"].startswith("b") for e in ev[:-1])


def test_chat_stream_logprobs_on_deltas() -> None:
    c, _ = client()
    _, ev = stream(c, "/v1/chat/completions", {**CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": 2})
    lp = ev[1]["choices"][0]["logprobs"]["content"]
    assert lp[0]["token"] == "H" and len(lp[0]["top_logprobs"]) == 2


def test_native_stream_probs_and_timings_per_token() -> None:
    c, _ = client()
    _, ev = stream(c, "/completion", {"prompt": "x", "n_predict": 2, "n_probs": 1, "timings_per_token": True})
    assert ev[0]["completion_probabilities"][0]["top_logprobs"][0]["id"] == ev[0]["tokens"][0]
    assert "timings" in ev[0]


def test_error_before_first_event_is_plain_json() -> None:
    c, _ = client()
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "w" * 300}], "stream": True})
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert r.json()["error"]["type"] == "exceed_context_size_error"


def test_error_after_start_is_an_sse_error_without_done() -> None:
    c, _ = client(FakeEngine(error_after=2))
    r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    ev = sse_events(r.text)
    assert ev[-1] == {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}
    assert "[DONE]" not in r.text


def test_keepalive_ping_in_silence() -> None:
    c, _ = client(FakeEngine(delay=1.2))
    r = c.post("/completion", json={"prompt": "x", "n_predict": 2, "stream": True, "sse_ping_interval": 1})
    assert ":\n\n" in r.text
    assert len([e for e in sse_events(r.text) if e.get("stop") is False]) == 2


def test_progress_events() -> None:
    c, _ = client()
    _, ev = stream(c, "/completion", {"prompt": "abc", "n_predict": 1, "return_progress": True})
    assert ev[0]["prompt_progress"] == {"total": 4, "cache": 0, "processed": 4, "time_ms": 1}  # int, as llama-server
    assert ev[0]["content"] == "" and "timings" not in ev[0]
    for path, body in (("/completion", {"prompt": "abc", "n_predict": 1}),
                       ("/v1/chat/completions", {**CHAT, "max_tokens": 1})):
        _, ev = stream(c, path, {**body, "return_progress": True, "timings_per_token": True})
        prog = ev[0]["prompt_progress"]  # the fake engine reports the whole prompt processed
        assert ev[0]["timings"]["prompt_n"] == prog["processed"] and ev[0]["timings"]["prompt_ms"] == 1.5
        assert ev[0]["timings"]["predicted_n"] == 0 and "prompt_progress" in ev[0]
    _, ev = stream(c, "/v1/chat/completions", {**CHAT, "max_tokens": 1, "return_progress": True})
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert "prompt_progress" in ev[0]


def test_several_prompts_stream_with_indexes() -> None:
    c, _ = client()
    _, ev = stream(c, "/completion", {"prompt": ["a", "b"], "n_predict": 2})
    finals = [e for e in ev if e["stop"]]
    assert sorted(e["index"] for e in finals) == [0, 1]
    assert sorted({e["index"] for e in ev}) == [0, 1]


def test_chat_stream_n2_role_chunk_per_choice() -> None:
    c, _ = client()
    _, ev = stream(c, "/v1/chat/completions", {**CHAT, "max_tokens": 1, "n": 2})
    roles = [e["choices"][0]["index"] for e in ev[:-1] if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert sorted(roles) == [0, 1]
