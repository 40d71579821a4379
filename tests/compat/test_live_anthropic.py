"""The real server (SmolLM2) spoken to through the Anthropic and OpenAI SDKs: /v1/messages,
/v1/messages/count_tokens, /v1/responses and the Vertex AI predict route give what the chat
path gives for the same conversation."""

from __future__ import annotations

import httpx
import pytest

from .live import free_port, start_server

anthropic = pytest.importorskip("anthropic")

SYSTEM = "You are terse."
USER = "Name a colour."
GREEDY = {"temperature": 0, "top_k": 1}


@pytest.fixture(scope="module")
def server():
    port = free_port()
    srv = start_server("-np", "2", "-c", "4096", port=port,
                       env={"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port)})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def chat_text(server) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
        "max_tokens": 12, **GREEDY})
    return r.json()["choices"][0]["message"]["content"]


def test_messages_create_and_stream_match_chat(claude, chat_text) -> None:
    msg = claude.messages.create(model="x", max_tokens=12, system=SYSTEM,
                                 messages=[{"role": "user", "content": USER}], extra_body=GREEDY)
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("chatcmpl-")
    assert msg.content[0].type == "text" and msg.content[0].text == chat_text
    assert msg.stop_reason in ("end_turn", "max_tokens") and 0 < msg.usage.output_tokens <= 12
    # the chat request above cached the prompt: all of it but the last token is read from the cache
    assert msg.usage.cache_read_input_tokens + msg.usage.input_tokens > msg.usage.cache_read_input_tokens > 0

    with claude.messages.stream(model="x", max_tokens=12, system=[{"type": "text", "text": SYSTEM}],
                                messages=[{"role": "user", "content": USER}], extra_body=GREEDY) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == chat_text == final.content[0].text
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_count_tokens_matches_chat_input_tokens(claude, server) -> None:
    n = claude.messages.count_tokens(model="x", system=SYSTEM, messages=[{"role": "user", "content": USER}])
    chat = httpx.post(server.url + "/v1/chat/completions/input_tokens", json={
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]}).json()
    assert n.input_tokens == chat["input_tokens"] > 5


def test_forced_tool_use(claude) -> None:
    tool = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    msg = claude.messages.create(model="x", max_tokens=60, tools=[tool], tool_choice={"type": "any"},
                                 messages=[{"role": "user", "content": "Weather in Paris?"}], extra_body=GREEDY)
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and calls and calls[0].name == "get_weather"
    assert isinstance(calls[0].input.get("city"), str)
    # and the result goes back in as a tool message
    follow = claude.messages.create(model="x", max_tokens=8, tools=[tool], extra_body=GREEDY, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "get_weather",
                                           "input": calls[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny"}]}])
    assert follow.type == "message" and follow.usage.output_tokens > 0


def test_image_blocks_are_a_clear_400(claude) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert "image input is not supported" in str(e.value)


def test_openai_responses_match_chat(server, chat_text) -> None:
    from openai import OpenAI

    oc = OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = oc.responses.create(model="x", instructions=SYSTEM, input=USER, max_output_tokens=12, temperature=0,
                            extra_body={"top_k": 1})
    assert r.id.startswith("resp_") and r.output[0].id.startswith("msg_") and r.output_text == chat_text
    assert r.usage.input_tokens_details.cached_tokens > 0
    with oc.responses.stream(model="x", instructions=SYSTEM, input=[{"role": "user", "content": USER}],
                             max_output_tokens=12, temperature=0, extra_body={"top_k": 1}) as s:
        deltas = "".join(ev.delta for ev in s if ev.type == "response.output_text.delta")
        final = s.get_final_response()
    assert deltas == final.output_text == chat_text


def test_vertex_predict(server, chat_text) -> None:
    chat = {"@requestFormat": "chatCompletions", "max_tokens": 12, **GREEDY,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]}
    r = httpx.post(server.url + "/predict", timeout=120, json={"instances": [
        chat, {**chat, "@requestFormat": "/v1/messages", "stream": True}, {"@requestFormat": "nope"}]})
    assert r.status_code == 200
    a, b, c = r.json()["predictions"]
    assert a["choices"][0]["message"]["content"] == chat_text
    assert b["type"] == "message" and b["content"][0]["text"] == chat_text
    assert c["error"]["code"] == 400
