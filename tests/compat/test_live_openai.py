"""The real server, spoken to like real clients: the openai package and raw SSE."""

from __future__ import annotations

import json

import httpx
import pytest

from .live import start_server

SECRET = "zebra-quartz-unique-prompt-marker"


@pytest.fixture(scope="module")
def server():
    srv = start_server("-np", "2", "-c", "4096", "--metrics", "--slot-save-path", "/tmp")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_openai_chat_completion_and_cached_tokens(client):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"Say {SECRET} once."}]
    r1 = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
    r2 = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0)
    assert r1.choices[0].message.role == "assistant"
    assert r1.choices[0].message.content == r2.choices[0].message.content
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1
    assert r1.system_fingerprint.startswith("b") and r1.id.startswith("chatcmpl-")


def test_openai_stream_models_completions_logprobs(client):
    chunks = list(
        client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Count: 1 2 3"}], max_tokens=6, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    models = client.models.list()
    assert len(models.data) == 1
    comp = client.completions.create(model="x", prompt="The sky is", max_tokens=5, temperature=0, logprobs=2)
    assert comp.object == "text_completion" and comp.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0, logprobs=True, top_logprobs=3
    )
    lp = chat.choices[0].logprobs.content
    assert len(lp) == 3 and all(len(t.top_logprobs) == 3 for t in lp)
    assert all(t.logprob <= 0 for t in lp)


def test_native_stream_has_no_done_and_keeps_stop_out(server):
    body = {"prompt": "1, 2, 3, 4,", "n_predict": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = [json.loads(line[6:]) for line in raw.split("\n") if line.startswith("data: ")]
    assert "[DONE]" not in raw
    assert events[-1]["stop"] is True and events[-1]["timings"]["predicted_n"] == 8
    assert all(e["stop"] is False for e in events[:-1])


def test_errors_and_health_stay_good(server):
    r = httpx.post(server.url + "/completion", content=b"{not json", timeout=30)
    assert r.status_code in (400, 500) and "error" in r.json()
    r = httpx.post(server.url + "/completion", json={"prompt": "x " * 5000}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "exceed_context_size_error"
    r = httpx.get(server.url + "/nope", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}


def test_metrics_and_slots(server):
    text = httpx.get(server.url + "/metrics", timeout=30).text
    assert "llamacpp:prompt_tokens_total" in text and "llamacpp:prompt_tokens_cached_total" in text
    assert "kvserve:cache_retained_bytes" in text
    slots = httpx.get(server.url + "/slots", timeout=30).json()
    assert len(slots) == 2 and {"id", "n_ctx", "is_processing"} <= set(slots[0])


def test_header_names_go_out_capitalized(server):
    """On the wire, as llama-server writes them: clients (and llama.cpp's own tests) compare
    header names exactly, e.g. ``"Access-Control-Allow-Origin" in dict(response.headers)``."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(server.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nOrigin: http://example.com\r\n"
                     b"Connection: close\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = sock.recv(4096)
            if not chunk:
                break
            raw += chunk
    names = [line.split(b":", 1)[0].decode() for line in raw.split(b"\r\n\r\n")[0].split(b"\r\n")[1:]]
    assert {"Content-Type", "Access-Control-Allow-Origin", "Process-Start-Time-Unix"} <= set(names), names


def test_slot_save_restore_roundtrip(server):
    body = {"prompt": "Slot persistence check: the quick brown fox", "n_predict": 2, "temperature": 0, "id_slot": 0}
    assert httpx.post(server.url + "/completion", json=body, timeout=60).status_code == 200
    r = httpx.post(server.url + "/slots/0?action=save", json={"filename": "kvserve-test-slot.bin"}, timeout=60)
    assert r.status_code == 200 and r.json()["n_saved"] > 0
    r = httpx.post(server.url + "/slots/0?action=restore", json={"filename": "kvserve-test-slot.bin"}, timeout=60)
    assert r.status_code == 200 and r.json()["n_restored"] > 0
    r = httpx.post(server.url + "/slots/0?action=save", json={"filename": "../etc/passwd"}, timeout=60)
    assert r.status_code == 400


def test_no_prompt_text_in_logs(server):
    assert SECRET not in server.log()


def test_props_show_the_cache_budget(server):
    props = httpx.get(server.url + "/props", timeout=30).json()
    cache = props["kvserve_cache"]
    pages = min((8192 << 20) // cache["page_bytes"], cache["pool_pages"])  # --cache-ram default 8192 MiB
    assert cache["cache_ram_budget_bytes"] == pages * cache["page_bytes"]
    assert cache["retained_bytes"] <= cache["cache_ram_budget_bytes"]
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 2048
    mem = props["kvserve_memory"]  # weights stay quantized: well under the f32 size of 135M parameters
    assert mem["weights"] == "quant" and 50 << 20 < mem["weight_bytes"] < 200 << 20
    assert mem["kv_pool_bytes"] == cache["pool_pages"] * cache["page_bytes"]
    assert mem["cache_ram_budget_bytes"] == cache["cache_ram_budget_bytes"]
    from kvserve.model.quant import native

    assert set(mem["weight_paths"]) == ({"native", "rows"} if native.available() else {"int4", "rows"})


def test_n_choices_fan_out_to_slots(client):
    r = client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "Pick a colour."}], max_tokens=4, n=2, seed=5
    )
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)
    assert 2 <= r.usage.completion_tokens <= 8  # both choices counted, 4 tokens at most each
