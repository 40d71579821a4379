"""Structured output through the real server: the openai client (response_format json_schema,
chat.completions.parse with a pydantic model) and raw HTTP on every completion endpoint."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from .live import start_server

pytestmark = pytest.mark.slow

PET = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                        "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
       "required": ["name", "legs"]}


@pytest.fixture(scope="module")
def server():
    srv = start_server("-np", "2", "-c", "2048")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused")


MSGS = [{"role": "user", "content": "Describe a dog as JSON."}]


def test_openai_response_format_json_schema(client) -> None:
    r = client.chat.completions.create(
        model="x", messages=MSGS, max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PET)


def test_openai_parse_with_pydantic_model(client) -> None:
    from pydantic import BaseModel, Field

    class Pet(BaseModel):
        name: str = Field(max_length=16)
        legs: int = Field(ge=0, le=8)
        friendly: bool

    r = client.chat.completions.parse(model="x", messages=MSGS, max_tokens=60, temperature=0, response_format=Pet)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8


def test_raw_http_every_endpoint_and_shape(server) -> None:
    url = server.url
    bodies = [
        ("/completion", {"prompt": "Is the sky blue? Answer:", "grammar": 'root ::= " " ("yes" | "no") "."'}),
        ("/completion", {"prompt": "A pet as JSON:", "json_schema": PET}),
        ("/v1/completions", {"prompt": "A pet as JSON:", "json_schema": PET}),
        ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "json_object", "schema": PET}}),
        ("/v1/chat/completions", {"messages": MSGS, "response_format": {"type": "json_schema", "schema": PET}}),
        ("/v1/chat/completions", {"messages": MSGS, "json_schema": PET}),
    ]
    for path, body in bodies:
        r = httpx.post(url + path, json={**body, "max_tokens": 48, "temperature": 0}, timeout=300)
        assert r.status_code == 200, (path, r.text)
        d = r.json()
        text = d.get("content") if path == "/completion" else (
            d["choices"][0].get("text") if path == "/v1/completions" else d["choices"][0]["message"]["content"])
        if "grammar" in body:
            assert text in (" yes.", " no.")
            assert d["generation_settings"]["grammar"] == body["grammar"]
        else:
            jsonschema.validate(json.loads(text), PET)
    r = httpx.post(url + "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 40, "temperature": 0,
                                                       "response_format": {"type": "json_object"}}, timeout=300)
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":  # any object; a long one may be cut by max_tokens
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["message"]["content"].lstrip().startswith("{")


def test_streaming_with_a_grammar(server) -> None:
    body = {"prompt": "Count:", "grammar": 'root ::= (" " [0-9]){3} "."', "stream": True, "n_predict": 20,
            "temperature": 0}
    text, last = "", {}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                text += last.get("content", "")
    assert last["stop"] is True and last["stop_type"] in ("eos", "grammar")
    assert len(text) == 7 and text.endswith(".") and all(text[i] == " " for i in (0, 2, 4))


@pytest.mark.parametrize("body,message", [
    ({"prompt": "x", "grammar": "root ::= nope"}, "Undefined rule identifier 'nope'"),
    ({"prompt": "x", "grammar": 'root ::= "a'}, "failed to parse grammar: unexpected end of input"),
    ({"prompt": "x", "json_schema": {"type": "nope"}}, '"json_schema": '),
    ({"prompt": "x", "json_schema": "{}"}, '"json_schema": '),
    ({"prompt": "x", "grammar": 'root ::= "a"', "grammar_lazy": True}, "no triggers set for lazy grammar"),
    ({"messages": MSGS, "grammar": 'root ::= "a"', "json_schema": {}}, "Cannot use both json_schema and grammar"),
    ({"messages": MSGS, "response_format": {"type": "xml"}}, 'response_format type must be one of'),
])
def test_bad_grammars_are_400_with_the_parse_error(server, body, message) -> None:
    path = "/v1/chat/completions" if "messages" in body else "/completion"
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"], err


def test_server_default_json_schema(tmp_path) -> None:
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(PET))
    srv = start_server("-c", "1024", "-jf", str(f))
    try:
        r = httpx.post(srv.url + "/completion", json={"prompt": "A pet:", "n_predict": 48, "temperature": 0},
                       timeout=300)
        jsonschema.validate(json.loads(r.json()["content"]), PET)
        # a request grammar replaces the default
        r = httpx.post(srv.url + "/completion", json={"prompt": "A pet:", "n_predict": 8, "temperature": 0,
                                                      "grammar": 'root ::= "cat"'}, timeout=300)
        assert r.json()["content"] == "cat"
    finally:
        srv.stop()
