"""/v1/messages and /v1/messages/count_tokens over HTTP with scripted model output (the fake
engine): the message object, the event stream, tool use, thinking blocks and the 4xx cases."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from .test_http_fake_engine import FakeEngine, client
from .test_http_tools import CALL, HERMES_TEMPLATE, PLAIN_TEMPLATE, THINK_TEMPLATE, make, prompt_of

USER = [{"role": "user", "content": "Weather in Istanbul?"}]
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}}}


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of an Anthropic SSE body; keep-alive comments skipped."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: "), block
        obj = json.loads(data[len("data: "):])
        assert name == "event: error" or obj["type"] == name[len("event: "):]
        out.append((name[len("event: "):], obj))
    return out


def post(c: TestClient, **body: Any) -> Any:
    return c.post("/v1/messages", json={"messages": USER, "max_tokens": 500, **body})


def assemble(evs: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The content blocks a client builds from the stream (checking the block protocol)."""
    blocks: list[dict[str, Any]] = []
    open_index = None
    for name, e in evs:
        if name == "content_block_start":
            assert open_index is None and e["index"] == len(blocks)
            blocks.append(dict(e["content_block"]))
            open_index = e["index"]
        elif name == "content_block_delta":
            assert e["index"] == open_index
            b, d = blocks[e["index"]], e["delta"]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                b["signature"] = d["signature"]
            else:
                assert d["type"] == "input_json_delta"
                b["_json"] = b.get("_json", "") + d["partial_json"]
        elif name == "content_block_stop":
            assert e["index"] == open_index
            open_index = None
    assert open_index is None
    for b in blocks:
        if "_json" in b:
            b["input"] = json.loads(b.pop("_json"))
    return blocks


def test_message_object_usage_and_stop_reasons() -> None:
    c, eng = client(FakeEngine(output="Hello there.", eos_at_end=True))
    r = post(c, system="Be brief.")
    assert r.status_code == 200
    body = r.json()
    n_prompt = len(eng.submitted[-1].prompt_tokens)
    assert body["id"].startswith("chatcmpl-") and body["type"] == "message" and body["role"] == "assistant"
    assert body["content"] == [{"type": "text", "text": "Hello there."}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("end_turn", None)
    assert body["usage"] == {"cache_read_input_tokens": n_prompt // 2, "input_tokens": n_prompt - n_prompt // 2,
                             "output_tokens": 12}
    assert "timings" not in body and "<|im_start|>system\nBe brief.<|im_end|>" in prompt_of(eng)
    assert post(c, max_tokens=3).json()["stop_reason"] == "max_tokens"
    b = post(c, stop_sequences=["there"]).json()
    assert (b["stop_reason"], b["stop_sequence"], b["content"][0]["text"]) == ("end_turn", "there", "Hello ")
    assert eng.submitted[-1].params.n_predict == 500
    c.post("/v1/messages", json={"messages": USER})
    assert eng.submitted[-1].params.n_predict == 4096  # max_tokens is optional here


def test_sampling_fields_reach_the_engine() -> None:
    c, eng = client(FakeEngine(output="Hi", eos_at_end=True))
    post(c, temperature=0.25, top_k=7, top_p=0.5)
    s = eng.submitted[-1].params.sampling
    assert (s.temperature, s.top_k, s.top_p) == (0.25, 7, 0.5)


def test_stream_events_in_order() -> None:
    c, eng = client(FakeEngine(output="Hello there.", eos_at_end=True))
    r = post(c, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in r.text
    evs = events(r.text)
    names = [n for n, _ in evs]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    start = evs[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert start["usage"]["input_tokens"] > 0
    assert assemble(evs) == [{"type": "text", "text": "Hello there."}]
    delta = evs[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {"output_tokens": 12}
    assert all("timings" not in e for _, e in evs)


def test_tool_use_non_stream_and_stream() -> None:
    c, eng = make(HERMES_TEMPLATE, "Let me check. " + CALL, jinja=True)
    body = post(c, tools=[TOOL]).json()
    assert body["stop_reason"] == "tool_use"
    text, call = body["content"]
    assert text == {"type": "text", "text": "Let me check."}
    assert call["type"] == "tool_use" and call["name"] == "get_weather" and call["input"] == {"location": "Istanbul"}
    assert call["id"]
    assert '"name": "get_weather"' in prompt_of(eng)  # the tool reached the template as a function

    evs = events(post(c, tools=[TOOL], stream=True).text)
    blocks = assemble(evs)
    assert [b["type"] for b in blocks] == ["text", "tool_use"]
    assert blocks[1]["name"] == "get_weather" and blocks[1]["input"] == {"location": "Istanbul"}
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_tool_choice_forces_the_named_tool() -> None:
    c, eng = make(HERMES_TEMPLATE, CALL, jinja=True)
    post(c, tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"})
    assert eng.compiled, "a named tool choice is grammar-constrained"
    r = post(c, tools=[TOOL], tool_choice={"type": "tool", "name": "other"})
    assert r.status_code == 400 and "unknown function" in r.json()["error"]["message"]


def test_history_with_tool_use_and_results_is_rendered() -> None:
    c, eng = make(HERMES_TEMPLATE, "It is sunny.", jinja=True)
    r = post(c, tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"location": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny, 25C"}]}])
    assert r.status_code == 200 and r.json()["content"][0]["type"] == "text"
    p = prompt_of(eng)
    assert '"location": "Paris"' in p or '"location":"Paris"' in p
    assert "<tool_response>\nSunny, 25C\n</tool_response>" in p


def test_thinking_blocks_non_stream_and_stream() -> None:
    thought = "<think>\nThe user greets me.\n</think>\n\nHello!"
    c, _ = make(THINK_TEMPLATE, thought)
    body = post(c, thinking={"type": "enabled", "budget_tokens": 100}).json()
    assert body["content"] == [{"type": "thinking", "thinking": "The user greets me.", "signature": ""},
                               {"type": "text", "text": "Hello!"}]
    evs = events(post(c, stream=True).text)
    assert assemble(evs) == [{"type": "thinking", "thinking": "The user greets me.", "signature": ""},
                             {"type": "text", "text": "Hello!"}]
    sig = [i for i, (_, e) in enumerate(evs) if e.get("delta", {}).get("type") == "signature_delta"]
    assert len(sig) == 1 and evs[sig[0] + 1][0] == "content_block_stop"


def test_thinking_disabled_and_budget() -> None:
    c, eng = make(THINK_TEMPLATE, "Hi")
    post(c, thinking={"type": "disabled"})
    assert prompt_of(eng).endswith("<think>\n\n</think>\n\n")
    post(c, thinking={"type": "enabled", "budget_tokens": 5})
    assert eng.submitted[-1].params.reasoning_budget.budget == 5
    c, eng = make(PLAIN_TEMPLATE, "Hi")  # a template without thinking: nothing to budget
    r = post(c, thinking={"type": "enabled", "budget_tokens": 5})
    assert r.status_code == 200 and eng.submitted[-1].params.reasoning_budget is None


def test_thinking_history_reaches_the_template() -> None:
    tmpl = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>"
            "{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
            "<|im_start|>assistant\n")
    c, eng = make(tmpl, "ok")
    r = c.post("/v1/messages/count_tokens", json={"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Plan it."},
                                          {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "Again"}]})
    plain = c.post("/v1/messages/count_tokens", json={"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"}]})
    assert r.json()["input_tokens"] == plain.json()["input_tokens"] + len("<think>Plan it.</think>")


def test_count_tokens_matches_the_chat_prompt() -> None:
    c, eng = client(FakeEngine())
    r = c.post("/v1/messages/count_tokens", json={"system": "Sys", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200 and list(r.json()) == ["input_tokens"]
    chat = c.post("/v1/chat/completions/input_tokens", json={"messages": [
        {"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]}).json()
    assert r.json()["input_tokens"] == chat["input_tokens"] > 0


def test_bad_requests_are_4xx() -> None:
    c, _ = client(FakeEngine())
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    cases = [
        ({"max_tokens": 5}, "'messages' is required"),
        ({"messages": [{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}]},
         "image input is not supported"),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                      "content": [image]}]}]}, "image input is not supported"),
        ({"messages": [{"role": "user"}]}, "must contain 'content'"),
        ({"messages": USER, "tool_choice": {"type": "tool", "name": ""}}, "needs a 'name'"),
    ]
    for body, msg in cases:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = c.post(path, json=body)
            assert r.status_code == 400, (path, body, r.text)
            assert msg in r.json()["error"]["message"], r.text
    assert c.post("/v1/messages", content=b"{").status_code == 400
    r = c.post("/v1/messages", json={"messages": []})  # permissive, as llama-server
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_error_after_start_is_an_error_event() -> None:
    c, _ = client(FakeEngine(error_after=3))
    evs = events(post(c, stream=True).text)
    assert evs[0][0] == "message_start"
    assert evs[-1] == ("error", {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"})
