"""Anthropic Messages and OpenAI Responses bodies -> chat bodies (as llama-server converts them)."""

from __future__ import annotations

import json

import pytest

from kvserve.server.anthropic import anthropic_to_chat, normalize_billing_header
from kvserve.server.errors import ApiError
from kvserve.server.responses_api import responses_to_chat
from kvserve.server.vertex import format_alias, from_env

# --- Anthropic ----------------------------------------------------------------------------------


def test_anthropic_system_string_and_blocks_and_defaults() -> None:
    out = anthropic_to_chat({"system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}]})
    assert out == {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                   "max_tokens": 4096}
    out = anthropic_to_chat({"system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
                             "messages": [], "max_tokens": 7, "temperature": 0.1, "top_k": 3, "top_p": 0.5,
                             "stream": True, "stop_sequences": ["END"], "metadata": {"user_id": "u"}})
    assert out == {"messages": [{"role": "system", "content": "AB"}], "max_tokens": 7, "temperature": 0.1,
                   "top_k": 3, "top_p": 0.5, "stream": True, "stop": ["END"]}


def test_anthropic_billing_header_stamp_is_masked() -> None:
    hdr = "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli; cch=a5145;You are Claude Code."
    assert normalize_billing_header(hdr) == hdr.replace("cch=a5145", "cch=fffff")
    assert normalize_billing_header("You are helpful. cch=a5145;") == "You are helpful. cch=a5145;"
    out = anthropic_to_chat({"system": [{"type": "text", "text": hdr}], "messages": []})
    assert out["messages"][0]["content"].count("cch=fffff;") == 1


def test_anthropic_tool_use_thinking_and_tool_results() -> None:
    body = {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need a tool.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "xxx"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Results:"},
            {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "a"},
                                                                     {"type": "text", "text": "b"}]},
            {"type": "tool_result", "tool_use_id": "t3", "is_error": True}]},
    ]}
    msgs = anthropic_to_chat(body)["messages"]
    assert msgs[1] == {"role": "assistant", "content": "", "reasoning_content": "Need a tool.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}
    assert json.loads(msgs[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    # the text part stays a user message; the results follow it as tool messages
    assert msgs[2] == {"role": "user", "content": [{"type": "text", "text": "Results:"}]}
    assert msgs[3:] == [{"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
                        {"role": "tool", "tool_call_id": "t2", "content": "ab"},
                        {"role": "tool", "tool_call_id": "t3", "content": ""}]
    # an assistant message without content is dropped (llama-server does the same)
    assert anthropic_to_chat({"messages": [{"role": "assistant"}]})["messages"] == []


def test_anthropic_tools_and_tool_choice() -> None:
    tools = [{"name": "calc", "description": "Math", "input_schema": {"type": "object"}}, {"name": "noop"}]
    out = anthropic_to_chat({"messages": [], "tools": tools, "tool_choice": {"type": "any"}})
    assert out["tools"] == [
        {"type": "function", "function": {"name": "calc", "description": "Math", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "noop", "description": "", "parameters": {}}}]
    assert out["tool_choice"] == "required"
    for choice, want in (({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
                         ({"type": "tool", "name": "calc"}, {"type": "function", "function": {"name": "calc"}})):
        assert anthropic_to_chat({"messages": [], "tool_choice": choice})["tool_choice"] == want
    out = anthropic_to_chat({"messages": [], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}})
    assert out["parallel_tool_calls"] is False


def test_anthropic_thinking_param() -> None:
    on = {"messages": [], "thinking": {"type": "enabled", "budget_tokens": 50}}
    assert anthropic_to_chat(on, template_thinks=True)["thinking_budget_tokens"] == 50
    assert "thinking_budget_tokens" not in anthropic_to_chat(on, template_thinks=False)
    off = anthropic_to_chat({"messages": [], "thinking": {"type": "disabled"}})
    assert off["chat_template_kwargs"] == {"enable_thinking": False}
    keep = anthropic_to_chat({"messages": [], "thinking": {"type": "disabled"},
                              "chat_template_kwargs": {"enable_thinking": True}})
    assert keep["chat_template_kwargs"] == {"enable_thinking": True}


@pytest.mark.parametrize("body, msg", [
    ({}, "'messages' is required"),
    ({"messages": "hi"}, "array"),
    ({"messages": [], "system": 5}, "'system'"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
     "image input is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [
        {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}]}, "image input is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document'"),
    ({"messages": [], "tools": [{"description": "no name"}]}, "'name'"),
    ({"messages": [], "tools": {"name": "x"}}, "'tools'"),
    ({"messages": [], "tool_choice": "auto"}, "'tool_choice'"),
    ({"messages": [], "tool_choice": {"type": "tool"}}, "'name'"),
    ({"messages": [], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ({"messages": [], "thinking": {"type": "enabled", "budget_tokens": "many"}}, "budget_tokens"),
    ({"messages": [], "thinking": {"type": "sometimes"}}, "thinking.type"),
])
def test_anthropic_bad_bodies_are_400(body: dict, msg: str) -> None:
    with pytest.raises(ApiError) as e:
        anthropic_to_chat(body)
    assert e.value.code == 400 and msg in e.value.message


# --- Responses ----------------------------------------------------------------------------------


def test_responses_string_input_and_renamed_fields() -> None:
    out = responses_to_chat({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9,
                             "reasoning": {"effort": "low"}, "temperature": 0.3, "model": "m"})
    assert out == {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                   "max_tokens": 9, "reasoning_effort": "low", "temperature": 0.3, "model": "m"}


def test_responses_item_list() -> None:
    out = responses_to_chat({"input": [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}],
         "status": "completed", "id": "msg_1"},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "Rain"},
    ]})
    assert out["messages"] == [
        {"role": "developer", "content": [{"text": "Rules.", "type": "text"}]},
        {"role": "user", "content": [{"text": "Weather?", "type": "text"}]},
        {"role": "assistant", "content": [{"text": "Checking.", "type": "text"}], "reasoning_content": "think",
         "tool_calls": [{"function": {"arguments": "{\"city\":\"Oslo\"}", "name": "get_weather"}, "id": "c1",
                         "type": "function"}]},
        {"content": "Rain", "role": "tool", "tool_call_id": "c1"},
    ]


def test_responses_tools_tool_choice_and_text_format() -> None:
    out = responses_to_chat({"input": "x", "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "web_search"}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}})
    assert out["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"},
                                                              "strict": True}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert out["response_format"] == {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object"}}}
    assert "response_format" not in responses_to_chat({"input": "x", "text": {"format": {"type": "text"}}})
    assert responses_to_chat({"input": "x", "text": {"format": {"type": "json_object"}}})["response_format"] == {
        "type": "json_object"}


@pytest.mark.parametrize("body, msg", [
    ({}, "'input' is required"),
    ({"input": 5}, "'input' must be"),
    ({"input": [5]}, "Cannot determine type"),
    ({"input": [{"type": "mystery"}]}, "Cannot determine type"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "'type' must be one of"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input_file"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "requires 'text'"),
    ({"input": [{"type": "reasoning", "summary": [], "content": []}]}, "is empty"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "tools": "f"}, "'tools' must be"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
])
def test_responses_bad_bodies_are_400(body: dict, msg: str) -> None:
    with pytest.raises(ApiError) as e:
        responses_to_chat(body)
    assert e.value.code == 400 and msg in e.value.message


# --- Vertex AI ----------------------------------------------------------------------------------


def test_vertex_env_and_aliases() -> None:
    assert from_env({}) is None and from_env({"AIP_MODE": "TRAINING"}) is None
    vs = from_env({"AIP_MODE": "PREDICTION"})
    assert vs is not None and (vs.predict_route, vs.health_route, vs.http_port) == ("/predict", "", 8080)
    vs = from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "v1/endpoints/p", "AIP_HEALTH_ROUTE": "/hc",
                   "AIP_HTTP_PORT": "9000"})
    assert vs is not None and (vs.predict_route, vs.health_route, vs.http_port) == ("/v1/endpoints/p", "/hc", 9000)
    with pytest.raises(ValueError):
        from_env({"AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": "http"})
    assert [format_alias(p) for p in ("/v1/chat/completions", "/apply-template", "/v1/messages/count_tokens",
                                      "/health", "/slots/:id_slot")] == [
        "chatCompletions", "applyTemplate", "messagesCountTokens", "health", "slots"]
