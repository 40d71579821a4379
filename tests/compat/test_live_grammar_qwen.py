"""Structured output with Qwen2.5-Coder-0.5B-Instruct (a 152k vocabulary) through the openai client:
``response_format`` ``json_object`` (llama-server b10621 drops the connection on it with this
model) and ``json_schema`` via ``chat.completions.parse`` with a pydantic model."""

from __future__ import annotations

import json

import pytest


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(qwen_server):
    from openai import OpenAI

    return OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", timeout=600)


def test_qwen_json_object_and_parse(client) -> None:
    from pydantic import BaseModel, Field

    msgs = [{"role": "user", "content": "Give the capital of France and its population in millions as JSON."}]
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=80, temperature=0,
                                       response_format={"type": "json_object"})
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(json.loads(choice.message.content), dict)

    class City(BaseModel):
        name: str = Field(max_length=40)
        population_millions: float
        is_capital: bool

    r = client.chat.completions.parse(model="x", messages=msgs, max_tokens=80, temperature=0, response_format=City)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and city.name
