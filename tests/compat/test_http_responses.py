"""/v1/responses and the Vertex AI predict route over HTTP with scripted model output (the fake
engine): the response object, its event stream (also through the openai client's stream helper),
tool calls, reasoning, progress and timings, and the 4xx cases."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvserve.server.app import create_app
from kvserve.server.settings import ServerSettings
from kvserve.server.vertex import VertexSettings

from .test_http_fake_engine import FakeEngine, client, settings
from .test_http_tools import CALL, HERMES_TEMPLATE, THINK_TEMPLATE, make, prompt_of

FN = {"type": "function", "name": "get_weather", "description": "Weather of a city",
      "parameters": {"type": "object", "properties": {"location": {"type": "string"}}}}


def events(text: str) -> list[dict[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        if not block.strip() or block.startswith(":"):
            continue
        name, data = block.split("\n", 1)
        obj = json.loads(data[len("data: "):])
        assert name == f"event: {obj['type']}"
        out.append(obj)
    return out


def post(c: TestClient, **body: Any) -> Any:
    return c.post("/v1/responses", json={"input": "Weather in Istanbul?", "max_output_tokens": 500, **body})


def test_response_object() -> None:
    c, eng = client(FakeEngine(output="Hello there.", eos_at_end=True))
    body = post(c, instructions="Be brief.").json()
    n_prompt = len(eng.submitted[-1].prompt_tokens)
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    (item,) = body["output"]
    assert item["id"].startswith("msg_") and item["type"] == "message" and item["role"] == "assistant"
    assert item["content"] == [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello there."}]
    assert body["usage"] == {"input_tokens": n_prompt, "output_tokens": 12, "total_tokens": n_prompt + 12,
                             "input_tokens_details": {"cached_tokens": n_prompt // 2}}
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt_of(eng)
    assert eng.submitted[-1].params.n_predict == 500
    assert c.post("/responses", json={"input": "x"}).json()["object"] == "response"


def test_stream_events_and_openai_stream_helper() -> None:
    c, _ = client(FakeEngine(output="Hello there.", eos_at_end=True))
    evs = events(post(c, stream=True).text)
    types = [e["type"] for e in evs]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    done = evs[-1]["response"]
    assert text == "Hello there." == done["output"][0]["content"][0]["text"]
    assert "timings" in evs[-1] and done["usage"]["output_tokens"] == 12

    from openai import OpenAI

    oc = OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c)
    with oc.responses.stream(model="x", input="Hi", max_output_tokens=500) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    assert final.output_text == "Hello there." and final.id.startswith("resp_")
    r = oc.responses.create(model="x", input="Hi", max_output_tokens=500)
    assert r.output_text == "Hello there."


def test_progress_and_timings_per_token() -> None:
    c, _ = client(FakeEngine(output="Hi", eos_at_end=True))
    evs = events(post(c, stream=True, return_progress=True, timings_per_token=True).text)
    prog = [e for e in evs if "prompt_progress" in e]
    assert prog and all(e["type"] == "response.in_progress" for e in prog)
    assert any("timings" in e for e in evs if e["type"] == "response.output_text.delta")


def test_function_calls_non_stream_and_stream() -> None:
    c, eng = make(HERMES_TEMPLATE, "Let me check. " + CALL, jinja=True)
    body = post(c, tools=[FN]).json()
    msg, call = body["output"]
    assert msg["type"] == "message" and msg["content"][0]["text"] == "Let me check."
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"location": "Istanbul"}
    assert call["id"] == "fc_" + call["call_id"][len("call_"):]
    assert '"name": "get_weather"' in prompt_of(eng)

    evs = events(post(c, tools=[FN], stream=True).text)
    added = [e for e in evs if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert len(added) == 1
    args = "".join(e["delta"] for e in evs if e["type"] == "response.function_call_arguments.delta")
    assert json.loads(args) == {"location": "Istanbul"}
    assert all(e["item_id"] == added[0]["item"]["id"] for e in evs
               if e["type"] == "response.function_call_arguments.delta")
    assert evs[-1]["response"]["output"][1]["arguments"] == args

    post(c, tools=[FN], tool_choice={"type": "function", "name": "get_weather"})
    assert eng.compiled  # the named function is forced by a grammar


def test_function_call_history_is_rendered() -> None:
    c, eng = make(HERMES_TEMPLATE, "Sunny.", jinja=True)
    r = post(c, tools=[FN], input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"location\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Rain"}])
    assert r.status_code == 200
    assert "<tool_response>\nRain\n</tool_response>" in prompt_of(eng) and "Oslo" in prompt_of(eng)


def test_reasoning_items() -> None:
    c, _ = make(THINK_TEMPLATE, "<think>\nThe user greets me.\n</think>\n\nHello!")
    body = post(c).json()
    rs, msg = body["output"]
    assert rs["type"] == "reasoning" and rs["id"].startswith("rs_")
    assert rs["content"] == [{"text": "The user greets me.", "type": "reasoning_text"}]
    assert msg["content"][0]["text"] == "Hello!"
    evs = events(post(c, stream=True).text)
    assert "".join(e["delta"] for e in evs if e["type"] == "response.reasoning_text.delta") == "The user greets me."
    assert [e["item"]["type"] for e in evs if e["type"] == "response.output_item.done"] == ["reasoning", "message"]


@pytest.mark.parametrize("body, msg", [
    ({"max_output_tokens": 5}, "'input' is required"),
    ({"input": "x", "previous_response_id": "resp_abc"}, "previous_response_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]},
     "image_url"),
    ({"input": "x", "n": 2}, "'n' must be 1"),
])
def test_bad_requests_are_400(body: dict[str, Any], msg: str) -> None:
    c, _ = client(FakeEngine())
    r = c.post("/v1/responses", json=body)
    assert r.status_code == 400 and msg in r.json()["error"]["message"], r.text


def test_input_tokens_uses_the_same_conversion() -> None:
    c, _ = client(FakeEngine())
    items = [{"role": "user", "content": "Hi"}, {"type": "message", "role": "assistant", "content": "Hello"},
             {"role": "user", "content": [{"type": "input_text", "text": "Again"}]}]
    n = c.post("/v1/responses/input_tokens", json={"input": items}).json()
    chat = c.post("/v1/chat/completions/input_tokens", json={"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"}]}).json()
    assert n == chat and n["object"] == "response.input_tokens"


# --- Vertex AI predict ---------------------------------------------------------------------------


def vertex_client(**kw: Any) -> tuple[TestClient, FakeEngine]:
    eng = FakeEngine(output="Hello there.", eos_at_end=True)
    app = create_app(eng, settings(vertex=VertexSettings(**kw)))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False), eng


def test_predict_runs_each_instance_on_its_route() -> None:
    c, eng = vertex_client()
    r = c.post("/predict", json={"instances": [
        {"@requestFormat": "chatCompletions", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
        {"@requestFormat": "/v1/completions", "max_tokens": 3, "prompt": "Hi", "stream": True},
        {"@requestFormat": "messages", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
        {"@requestFormat": "tokenize", "content": "ab"},
        {"@requestFormat": "nope"},
        {"@requestFormat": "chatCompletions", "messages": 3},
        {"max_tokens": 1},
        7,
    ]})
    assert r.status_code == 200
    p = r.json()["predictions"]
    assert p[0]["object"] == "chat.completion" and p[0]["choices"][0]["message"]["content"] == "Hell"
    assert p[1]["object"] == "text_completion" and p[1]["choices"][0]["text"] == "Hel"  # stream forced off
    assert p[2]["type"] == "message" and p[2]["content"][0]["text"] == "He"
    assert p[3] == {"tokens": [ord("a") + 10, ord("b") + 10]}
    assert p[4]["error"]["message"] == "no handler registered for @requestFormat: nope"
    assert p[5]["error"]["code"] == 400 and "array" in p[5]["error"]["message"]
    assert p[6]["error"]["message"] == "each instance must include a string @requestFormat"
    assert p[7]["error"]["message"] == "each instance must be a JSON object"


def test_predict_body_checks_and_routes() -> None:
    c, _ = vertex_client(predict_route="/v1/endpoints/x:predict", health_route="/hc")
    assert c.post("/predict", json={"instances": []}).status_code == 404
    r = c.post("/v1/endpoints/x:predict", json={"instances": []})
    assert r.status_code == 200 and r.json() == {"predictions": []}
    for body, msg in (({"x": 1}, "array field named instances"), ([1], "JSON object"),
                      ({"instances": [{}] * 129}, "exceeds maximum size of 128")):
        r = c.post("/v1/endpoints/x:predict", json=body)
        assert r.status_code == 400 and msg in r.json()["error"]["message"]
    assert c.get("/hc").json() == {"status": "ok"}


def test_predict_needs_the_api_key_and_aip_mode() -> None:
    c, _ = vertex_client()
    eng = FakeEngine()
    keyed = TestClient(create_app(eng, settings(vertex=VertexSettings(), api_keys=("k",))))
    assert keyed.post("/predict", json={"instances": []}).status_code == 401
    r = keyed.post("/predict", json={"instances": [{"@requestFormat": "tokenize", "content": "a"}]},
                   headers={"Authorization": "Bearer k"})
    assert r.json() == {"predictions": [{"tokens": [ord("a") + 10]}]}
    plain, _ = client(FakeEngine())
    assert plain.post("/predict", json={"instances": []}).status_code == 404


def test_aip_http_port_overrides_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HTTP_PORT", "9123")
    s = ServerSettings.from_config({"port": 8080})
    assert s.port == 9123 and s.vertex is not None and s.vertex.predict_route == "/predict"
    monkeypatch.delenv("AIP_MODE")
    s = ServerSettings.from_config({"port": 8080})
    assert s.port == 8080 and s.vertex is None
