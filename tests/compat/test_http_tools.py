"""Tool calls and reasoning over HTTP, with scripted model output (the fake engine): the openai
client (non-streamed ``message.tool_calls``, streamed deltas reassembled), raw SSE, the prompt
the template renders, and the request checks."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from kvserve.model.chat_template import ChatTemplate
from kvserve.server.app import create_app

from .test_http_fake_engine import FakeEngine, settings, sse_events

# A Hermes-style template (tools listed in the system turn, calls in <tool_call> tags).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call a tool with <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>assistant\n"
    "{%- for tc in m.tool_calls %}<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": "
    "{{ tc.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Thinking templates: one lets the model open the block, one opens it in the generation prompt.
THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                  "{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
                  "{% endif %}{# <think> </think> #}")
OPEN_THINK_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}{# </think> #}")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Istanbul"}}\n</tool_call>'
USER = [{"role": "user", "content": "Weather in Istanbul?"}]


def make(template: str, output: str, **kw: Any) -> tuple[TestClient, FakeEngine]:
    eng = FakeEngine(n_ctx_slot=8192, output=output, eos_at_end=True,
                     chat_template=ChatTemplate(template, bos_token="<s>", eos_token="</s>"))  # type: ignore[arg-type]
    return TestClient(create_app(eng, settings(**kw)), raise_server_exceptions=False), eng


def chat(c: TestClient, **body: Any) -> Any:
    return c.post("/v1/chat/completions", json={"messages": USER, "max_tokens": 500, **body})


def prompt_of(eng: FakeEngine) -> str:
    return eng.tokenizer.decode(eng.submitted[-1].prompt_tokens, special=True)


def openai_client(c: TestClient) -> Any:
    from openai import OpenAI

    return OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=c)


# --- tool calls --------------------------------------------------------------------------------


def test_openai_non_stream_tool_calls() -> None:
    c, eng = make(HERMES_TEMPLATE, "I will check.\n" + CALL)
    r = openai_client(c).chat.completions.create(model="x", messages=USER, tools=[WEATHER], max_tokens=500)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will check."
    (tc,) = choice.message.tool_calls
    assert tc.type == "function" and tc.function.name == "get_weather" and len(tc.id) == 32
    assert json.loads(tc.function.arguments) == {"location": "Istanbul"}
    # the template listed the tool in the prompt
    assert '"name": "get_weather"' in prompt_of(eng)


def test_openai_stream_tool_call_deltas_reassemble() -> None:
    c, _ = make(HERMES_TEMPLATE, CALL)
    stream = openai_client(c).chat.completions.create(model="x", messages=USER, tools=[WEATHER], max_tokens=500,
                                                      stream=True)
    calls: dict[int, dict[str, str]] = {}
    finish, content = None, ""
    n_arg_chunks = 0
    for chunk in stream:
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            if tc.index not in calls:
                assert tc.id and tc.type == "function" and tc.function.name == "get_weather"
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            else:
                assert tc.id is None and (tc.function.name is None)
                n_arg_chunks += 1
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = ch.finish_reason or finish
    assert finish == "tool_calls" and content == ""
    assert list(calls) == [0] and json.loads(calls[0]["arguments"]) == {"location": "Istanbul"}
    assert n_arg_chunks > 3  # arguments arrive in fragments


def test_raw_sse_tool_call_shapes_and_held_markers() -> None:
    c, _ = make(HERMES_TEMPLATE, "Sure " + CALL)
    r = chat(c, tools=[WEATHER], stream=True)
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    deltas = [ch["choices"][0]["delta"] for ch in chunks if ch["choices"]]
    text = "".join(d.get("content") or "" for d in deltas)
    assert text == "Sure"  # "<tool_call>" never leaked, even partially
    first = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert set(first) == {"index", "id", "type", "function"} and first["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls" and chunks[-1]["choices"][0]["delta"] == {}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)


def test_tool_choice_none_renders_tools_but_does_not_parse() -> None:
    c, eng = make(HERMES_TEMPLATE, CALL)
    body = chat(c, tools=[WEATHER], tool_choice="none").json()
    msg = body["choices"][0]["message"]
    assert "tool_calls" not in msg and msg["content"] == CALL
    assert body["choices"][0]["finish_reason"] == "stop"
    assert "get_weather" in prompt_of(eng)


def test_named_tool_choice_accepts_only_that_function() -> None:
    other = {"type": "function", "function": {"name": "other", "parameters": {}}}
    c, _ = make(HERMES_TEMPLATE, CALL)
    named = {"type": "function", "function": {"name": "other"}}
    msg = chat(c, tools=[WEATHER, other], tool_choice=named).json()["choices"][0]["message"]
    assert "tool_calls" not in msg  # the model called a function it was not allowed to
    msg = chat(c, tools=[WEATHER, other], tool_choice="required").json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"


def test_required_and_named_choice_constrain_with_a_grammar() -> None:
    other = {"type": "function", "function": {"name": "other", "parameters": {}}}
    c, eng = make(HERMES_TEMPLATE, '{"name": "get_weather", "arguments": {"location": "Oslo"}}')
    msg = chat(c, tools=[WEATHER, other], tool_choice="required").json()["choices"][0]["message"]
    assert msg["tool_calls"][0]["function"]["name"] == "get_weather"  # bare JSON: what the grammar forces
    spec = eng.submitted[-1].params.grammar
    assert spec.kind == "lark" and not spec.lazy
    assert '"{\\"name\\": \\"get_weather\\", \\"arguments\\": " args0' in spec.text and "other" in spec.text
    chat(c, tools=[WEATHER, other], tool_choice={"type": "function", "function": {"name": "other"}})
    spec = eng.submitted[-1].params.grammar
    assert "other" in spec.text and "get_weather" not in spec.text
    chat(c, tools=[WEATHER])  # auto: unconstrained
    assert eng.submitted[-1].params.grammar is None
    r = chat(c, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"})
    assert r.status_code == 400 and "cannot be combined" in r.json()["error"]["message"]


def test_tool_history_is_rendered() -> None:
    c, eng = make(HERMES_TEMPLATE, "It is sunny.")
    msgs = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": "{\"location\": \"Istanbul\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"},
    ]
    body = c.post("/v1/chat/completions", json={"messages": msgs, "tools": [WEATHER], "max_tokens": 100}).json()
    assert body["choices"][0]["message"]["content"] == "It is sunny."
    p = prompt_of(eng)
    # arguments are given to the template as an object (not a JSON string dumped twice)
    assert '"arguments": {"location": "Istanbul"}}' in p
    assert "<tool_response>\nsunny, 21C\n</tool_response>" in p


def test_generic_format_for_templates_without_tools() -> None:
    out = '{"tool_call": {"name": "get_weather", "arguments": {"location": "Lima"}}}'
    c, eng = make(PLAIN_TEMPLATE, out)
    body = chat(c, tools=[WEATHER]).json()
    (tc,) = body["choices"][0]["message"]["tool_calls"]
    assert tc["function"]["name"] == "get_weather" and json.loads(tc["function"]["arguments"]) == {"location": "Lima"}
    p = prompt_of(eng)
    assert p.startswith("<s><|im_start|>system\nYou can call any of the following tools") and '"get_weather"' in p
    c, _ = make(PLAIN_TEMPLATE, '{"response": "Hello there"}')
    msg = chat(c, tools=[WEATHER]).json()["choices"][0]["message"]
    assert msg["content"] == "Hello there" and "tool_calls" not in msg


@pytest.mark.parametrize("body,status,message", [
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, 400, "Invalid tool_choice: sometimes"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "unknown function"),
    ({"tools": [WEATHER], "grammar": "root ::= \"x\""}, 400, "Cannot use custom grammar constraints with tools."),
    ({"tools": [WEATHER], "logprobs": True, "stream": True}, 400, "logprobs is not supported with tools + stream"),
    ({"tools": [{"type": "function"}]}, 400, "Missing tool function"),
    ({"tools": "x"}, 400, "Expected 'tools' to be an array"),
])
def test_tool_request_errors(body: dict[str, Any], status: int, message: str) -> None:
    c, eng = make(HERMES_TEMPLATE, CALL)
    r = chat(c, **body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    assert eng.submitted == []


ALTERNATING_TEMPLATE = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
                        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
                        "{{ m.role }}: {{ m.content }}\n{% endfor %}")


@pytest.mark.parametrize("template,messages,message", [
    (PLAIN_TEMPLATE, [{"content": "x"}], "Missing 'role' in message"),
    (ALTERNATING_TEMPLATE, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
     "Conversation roles must alternate"),
])
def test_malformed_messages_are_client_errors(template: str, messages: Any, message: str) -> None:
    """llama-server answers 500 for these; they are the client's mistake, so kvserve answers 400."""
    c, eng = make(template, "x")
    r = chat(c, messages=messages)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert eng.submitted == []


def test_tools_need_jinja() -> None:
    c, _ = make(HERMES_TEMPLATE, CALL, jinja=False)
    r = chat(c, tools=[WEATHER])
    assert r.status_code == 400 and r.json()["error"]["message"] == "tools param requires --jinja flag"


# --- reasoning ---------------------------------------------------------------------------------

THOUGHT = "<think>\nThe user greets me.\n</think>\n\nHello!"


def test_reasoning_content_non_stream_and_formats() -> None:
    c, _ = make(THINK_TEMPLATE, THOUGHT)
    msg = chat(c).json()["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "Hello!", "reasoning_content": "The user greets me."}
    msg = chat(c, reasoning_format="none").json()["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": THOUGHT}
    c, _ = make(THINK_TEMPLATE, THOUGHT, reasoning_format="none")
    assert chat(c).json()["choices"][0]["message"]["content"] == THOUGHT
    assert chat(c, reasoning_format="deepseek").json()["choices"][0]["message"]["reasoning_content"]


def test_reasoning_content_stream_deltas() -> None:
    c, _ = make(THINK_TEMPLATE, THOUGHT)
    stream = openai_client(c).chat.completions.create(model="x", messages=USER, max_tokens=500, stream=True)
    reasoning, content = "", ""
    for chunk in stream:
        if chunk.choices:
            d = chunk.choices[0].delta
            reasoning += getattr(d, "reasoning_content", None) or ""
            content += d.content or ""
            assert "<" not in (d.content or "") and "<" not in (getattr(d, "reasoning_content", None) or "")
    assert reasoning == "The user greets me." and content == "Hello!"


def test_reasoning_opened_by_the_generation_prompt() -> None:
    c, _ = make(OPEN_THINK_TEMPLATE, "Two plus two is four.\n</think>\n\n4")
    r = chat(c)
    msg = r.json()["choices"][0]["message"]
    assert msg["reasoning_content"] == "Two plus two is four." and msg["content"] == "4"


def test_enable_thinking_defaults_and_switches() -> None:
    c, eng = make(THINK_TEMPLATE, "Hi")
    chat(c)
    assert not prompt_of(eng).endswith("</think>\n\n")  # on by default for a thinking template
    chat(c, chat_template_kwargs={"enable_thinking": False})
    assert prompt_of(eng).endswith("<think>\n\n</think>\n\n")
    chat(c, reasoning_effort="none")
    assert prompt_of(eng).endswith("<think>\n\n</think>\n\n")
    c, eng = make(THINK_TEMPLATE, "Hi", reasoning="off")
    chat(c)
    assert prompt_of(eng).endswith("<think>\n\n</think>\n\n")


def test_skip_chat_parsing() -> None:
    c, _ = make(HERMES_TEMPLATE, CALL, skip_chat_parsing=True)
    msg = chat(c, tools=[WEATHER]).json()["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": CALL}


def test_reasoning_budget_fields() -> None:
    c, eng = make(OPEN_THINK_TEMPLATE, "Hmm</think>ok")
    assert chat(c, reasoning_budget_tokens=5, reasoning_budget_message="Enough.").status_code == 200
    b = eng.submitted[-1].params.reasoning_budget
    assert b.budget == 5
    assert eng.tokenizer.decode(list(b.forced)) == "Enough.</think>"
    assert eng.tokenizer.decode(list(b.start)) == "<think>" and eng.tokenizer.decode(list(b.ends[0])) == "</think>"
    assert eng.tokenizer.decode(list(b.prefill)).endswith("assistant\n<think>\n")  # the prompt opened the block
    chat(c)
    assert eng.submitted[-1].params.reasoning_budget is None  # -1: unlimited, no budget
    c, eng = make(OPEN_THINK_TEMPLATE, "x", reasoning_budget=0, reasoning_budget_message="Stop.")
    chat(c)
    b = eng.submitted[-1].params.reasoning_budget
    assert b.budget == 0 and eng.tokenizer.decode(list(b.forced)) == "Stop.</think>"
    c, eng = make(PLAIN_TEMPLATE, "x")
    r = chat(c, reasoning_budget_tokens=5)
    assert r.status_code == 400 and "thinking tags" in r.json()["error"]["message"]
    r = chat(c, reasoning_budget_tokens=-2)
    assert r.status_code == 400 and "Value must be between -1" in r.json()["error"]["message"]


def test_streamed_tool_calls_per_choice_with_n() -> None:
    c, _ = make(HERMES_TEMPLATE, CALL)
    r = chat(c, tools=[WEATHER], stream=True, n=2)
    events = [e for e in sse_events(r.text) if e != "[DONE]"]
    per_index: dict[int, str] = {}
    for e in events:
        for ch in e["choices"]:
            for tc in ch["delta"].get("tool_calls", []):
                per_index[ch["index"]] = per_index.get(ch["index"], "") + tc.get("function", {}).get("arguments", "")
    # the fake engine shifts choice 1's output by one character: only choice 0 is a whole call
    assert json.loads(per_index[0]) == {"location": "Istanbul"}
    finishes = {ch["index"]: ch["finish_reason"] for e in events for ch in e["choices"] if ch["finish_reason"]}
    assert finishes[0] == "tool_calls"
