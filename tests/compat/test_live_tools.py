"""Tool calls and reasoning on the real server with real models, through the openai client and
raw SSE: Qwen2.5-Coder-0.5B-Instruct (a Hermes/Qwen tool-calling template) and SmolLM2 (no tool
support in its template: the generic JSON format; a thinking template from --chat-template-file)."""

from __future__ import annotations

import json

import httpx
import pytest

from .live import start_server

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_current_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "The city and country/state, e.g. 'Paris, France'"}},
        "required": ["location"]}}}
ASK = [{"role": "system", "content": "You are a chatbot that uses tools/functions. Dont overthink things."},
       {"role": "user", "content": "What is the weather in Istanbul?"}]


def test_qwen_tool_call_non_stream_and_streamed(qwen_server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", timeout=600)
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=48)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "get_current_weather" and len(tc.id) == 32
    assert "Istanbul" in json.loads(tc.function.arguments)["location"]

    stream = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], temperature=0,
                                            max_tokens=48, stream=True)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.index not in calls:
                assert d.id and d.type == "function" and d.function.name
                calls[d.index] = {"name": d.function.name, "arguments": ""}
            calls[d.index]["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls[0]["name"] == tc.function.name
    assert json.loads(calls[0]["arguments"]) == json.loads(tc.function.arguments)  # same call, reassembled


def test_qwen_tool_history_and_raw_sse(qwen_server) -> None:
    msgs = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "get_current_weather", "arguments": "{\"location\": \"Istanbul\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temperature\": \"21C\", \"sky\": \"sunny\"}"},
    ]
    url = qwen_server.url
    p = httpx.post(url + "/apply-template", json={"messages": msgs, "tools": [WEATHER]}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_current_weather", "arguments": {"location": "Istanbul"}}\n</tool_call>' in p
    assert "<tool_response>\n{\"temperature\"" in p and "# Tools" in p
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=600,
                      json={"messages": msgs, "tools": [WEATHER], "stream": True, "temperature": 0,
                            "max_tokens": 12}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]  # (":" lines are keep-alives)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert "<tool_call" not in text and (text or calls), deltas  # an answer, or another well-formed call
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert all(set(d) <= {"role", "content", "reasoning_content", "tool_calls"} for d in deltas)


THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}{# </think> #}")


@pytest.fixture(scope="module")
def smollm_think(tmp_path_factory):
    path = tmp_path_factory.mktemp("tmpl") / "think.jinja"
    path.write_text(THINK_TEMPLATE)
    srv = start_server("-c", "2048", "-np", "1", "--chat-template-file", str(path))
    yield srv
    srv.stop()


def test_smollm_reasoning_content_whole_and_streamed(smollm_think) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=smollm_think.url + "/v1", api_key="unused", timeout=600)
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    r = client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=16)
    msg = r.choices[0].message
    reasoning = getattr(msg, "reasoning_content", None) or ""
    assert reasoning  # the prompt opened <think>: what SmolLM2 writes first is reasoning
    assert "<think>" not in reasoning and "<think>" not in (msg.content or "")
    streamed = ""
    for chunk in client.chat.completions.create(model="x", messages=msgs, temperature=0, max_tokens=16,
                                                stream=True):
        if chunk.choices:
            streamed += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
    assert streamed == reasoning
    raw = httpx.post(smollm_think.url + "/v1/chat/completions", timeout=600,
                     json={"messages": msgs, "temperature": 0, "max_tokens": 16, "reasoning_format": "none"}).json()
    assert "reasoning_content" not in raw["choices"][0]["message"]
    assert raw["choices"][0]["message"]["content"].strip().startswith(reasoning)


@pytest.fixture(scope="module")
def smollm():
    srv = start_server("-c", "2048", "-np", "1")
    yield srv
    srv.stop()


def test_smollm_required_tool_call_is_valid(smollm) -> None:
    """SmolLM2's template cannot render tools: they are described in its system message (the
    generic JSON format) and the grammar of tool_choice "required" makes the 135M model's call valid."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=smollm.url + "/v1", api_key="unused", timeout=600)
    r = client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice="required",
                                       temperature=0, max_tokens=40)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (tc,) = choice.message.tool_calls
    assert tc.function.name == "get_current_weather"
    jsonschema.validate(json.loads(tc.function.arguments), WEATHER["function"]["parameters"])
    named = {"type": "function", "function": {"name": "get_current_weather"}}
    chunks = list(client.chat.completions.create(model="x", messages=ASK, tools=[WEATHER], tool_choice=named,
                                                 temperature=0, max_tokens=40, stream=True))
    args = "".join(d.function.arguments or "" for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [])
    assert json.loads(args) == json.loads(tc.function.arguments)  # same greedy call, streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_smollm_reasoning_budget_forces_the_end_of_thinking(smollm_think) -> None:
    """A budget of 4 tokens: the thinking block gets at most 4 generated tokens, then the
    message and </think> are forced and the model goes on with its answer."""
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0, "max_tokens": 24,
            "reasoning_budget_tokens": 4, "reasoning_budget_message": " Time to answer."}
    msg = httpx.post(smollm_think.url + "/v1/chat/completions", json=body, timeout=600).json()["choices"][0]["message"]
    assert msg["reasoning_content"].endswith("Time to answer.")
    raw = httpx.post(smollm_think.url + "/v1/chat/completions", timeout=600,
                     json={**body, "reasoning_format": "none"}).json()["choices"][0]["message"]["content"]
    assert " Time to answer.</think>" in raw  # the message and end tag were written into the output
    thought = raw.partition(" Time to answer.</think>")[0]
    tok = httpx.post(smollm_think.url + "/tokenize", json={"content": thought}).json()["tokens"]
    assert 1 <= len(tok) <= 5  # at most the budget (re-tokenizing may merge or split one piece)
