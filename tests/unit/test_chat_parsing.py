"""Chat output parsing per tool-call family and for thinking blocks: whole, and fed one
character at a time (the reassembled deltas must equal the whole parse, and no partial
marker may leak into the content)."""

from __future__ import annotations

import json

import pytest

from kvserve.server.chat_parsing import ChatMsg, ChatStream, ChatSyntax, detect_tool_format, parse_final
from kvserve.server.chat_parsing.generic import GenericFormat
from kvserve.server.chat_parsing.hermes import HermesFormat
from kvserve.server.chat_parsing.llama3 import Llama3Format
from kvserve.server.chat_parsing.markers import partial_marker_len
from kvserve.server.chat_parsing.mistral import MistralFormat
from kvserve.server.chat_parsing.partial_json import partial_string
from kvserve.server.chat_parsing.reasoning import ThinkTags, starts_in_reasoning

NAMES = frozenset({"get_weather", "python"})
THINK = ThinkTags()


def streamed(syntax: ChatSyntax, text: str) -> tuple[ChatMsg, list[dict]]:
    """Feed ``text`` char by char; rebuild the message from the deltas alone."""
    s = ChatStream(syntax)
    deltas = []
    for ch in text:
        deltas += [d.to_delta() for d in s.update(ch)]
    deltas += [d.to_delta() for d in s.finish(text)]
    msg = ChatMsg()
    calls: dict[int, dict] = {}
    for d in deltas:
        msg.content += d.get("content", "")
        msg.reasoning_content += d.get("reasoning_content", "")
        for tc in d.get("tool_calls", []):
            if tc["index"] not in calls:
                # the first delta of a call carries its id, type and name
                assert tc["id"] and tc["type"] == "function" and tc["function"]["name"], tc
                calls[tc["index"]] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
            else:
                assert "id" not in tc and "name" not in tc.get("function", {}), tc
            calls[tc["index"]]["arguments"] += tc.get("function", {}).get("arguments", "")
    from kvserve.server.chat_parsing import ToolCall
    msg.tool_calls = [ToolCall(c["name"], c["arguments"], c["id"]) for _, c in sorted(calls.items())]
    return msg, deltas


def check(syntax: ChatSyntax, text: str) -> ChatMsg:
    whole = parse_final(syntax, text)
    msg, deltas = streamed(syntax, text)
    assert msg.content == whole.content
    assert msg.reasoning_content == whole.reasoning_content
    assert [(t.name, t.arguments) for t in msg.tool_calls] == [(t.name, t.arguments) for t in whole.tool_calls]
    return whole


def calls_of(msg: ChatMsg) -> list[tuple[str, object]]:
    return [(t.name, json.loads(t.arguments)) for t in msg.tool_calls]


# --- Hermes / Qwen ---------------------------------------------------------------------------

HERMES = ChatSyntax(tools=HermesFormat(NAMES))


def test_hermes_single_call() -> None:
    out = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Istanbul"}}\n</tool_call>'
    msg = check(HERMES, out)
    assert msg.content == ""
    assert calls_of(msg) == [("get_weather", {"location": "Istanbul"})]
    assert msg.tool_calls[0].arguments == '{"location": "Istanbul"}'  # the generated text, not re-dumped


def test_hermes_content_then_parallel_calls() -> None:
    out = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris, \\"FR\\""}}\n'
           '</tool_call>\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>')
    msg = check(HERMES, out)
    assert msg.content == "Let me look."
    assert calls_of(msg) == [("get_weather", {"location": 'Paris, "FR"'}), ("python", {"code": "print(1)"})]


def test_hermes_plain_text_and_partial_marker_held() -> None:
    msg = check(HERMES, "Just an answer <b>bold</b>.")
    assert msg.content == "Just an answer <b>bold</b>." and msg.tool_calls == []
    s = ChatStream(HERMES)
    assert [d.to_delta() for d in s.update("Hi <tool_c")] == [{"content": "Hi"}]
    assert s.update('all>\n{"name": "python", "arguments": {"code": "1"}}</tool_call>')[0].tool_name == "python"
    assert s.msg.content == "Hi"


def test_hermes_unknown_tool_or_bad_json_is_content() -> None:
    out = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    msg = check(HERMES, out)
    assert msg.tool_calls == [] and msg.content == out
    out = "<tool_call>\nnot json\n</tool_call>"
    assert check(HERMES, out).content == out


def test_hermes_arguments_stream_in_fragments() -> None:
    out = '<tool_call>\n{"name": "python", "arguments": {"code": "x = 1"}}\n</tool_call>'
    _, deltas = streamed(HERMES, out)
    frags = [tc["function"].get("arguments", "") for d in deltas for tc in d.get("tool_calls", [])]
    assert len(frags) > 3 and "".join(frags) == '{"code": "x = 1"}'


def test_hermes_truncated_call_keeps_what_was_generated() -> None:
    msg = check(HERMES, '<tool_call>\n{"name": "python", "arguments": {"code": "pri')
    assert msg.tool_calls[0].name == "python" and msg.tool_calls[0].arguments == '{"code": "pri'


def test_hermes_bare_json_call_without_tags() -> None:
    # small models (Qwen2.5-Coder-0.5B) often drop the <tool_call> tags
    out = '{"name": "get_weather", "arguments": {"location": "Istanbul"}}'
    msg = check(HERMES, out)
    assert msg.content == "" and calls_of(msg) == [("get_weather", {"location": "Istanbul"})]
    msg = check(HERMES, '```json\n' + out + '\n```')
    assert calls_of(msg) == [("get_weather", {"location": "Istanbul"})]
    # JSON that is not a call of a known tool stays content
    assert check(HERMES, '{"name": "Bob", "age": 3}').content == '{"name": "Bob", "age": 3}'
    assert check(HERMES, '```python\nprint(1)\n```').content == '```python\nprint(1)\n```'


# --- Llama 3.x --------------------------------------------------------------------------------

LLAMA3 = ChatSyntax(tools=Llama3Format(NAMES))


@pytest.mark.parametrize("out", [
    '{"name": "get_weather", "parameters": {"location": "Rome"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"location": "Rome"}}',
    '  {"name": "get_weather", "arguments": {"location": "Rome"}}',
])
def test_llama3_call(out: str) -> None:
    msg = check(LLAMA3, out)
    assert msg.content == "" and calls_of(msg) == [("get_weather", {"location": "Rome"})]


def test_llama3_several_calls_and_content() -> None:
    out = '{"name": "get_weather", "parameters": {"location": "A"}}; {"name": "python", "parameters": {"code": "1"}}'
    assert calls_of(check(LLAMA3, out)) == [("get_weather", {"location": "A"}), ("python", {"code": "1"})]
    assert check(LLAMA3, "The weather is fine.").content == "The weather is fine."
    # JSON that is not a call is content
    assert check(LLAMA3, '{"answer": 42}').content == '{"answer": 42}'


# --- Mistral ----------------------------------------------------------------------------------

MISTRAL = ChatSyntax(tools=MistralFormat(NAMES))


def test_mistral_nemo_array() -> None:
    out = ('Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"location": "Oslo"}, "id": "abc123def"}, '
           '{"name": "python", "arguments": {"code": "2"}}]')
    msg = check(MISTRAL, out)
    assert msg.content == "Sure."
    assert calls_of(msg) == [("get_weather", {"location": "Oslo"}), ("python", {"code": "2"})]
    assert msg.tool_calls[0].id == "abc123def" and len(msg.tool_calls[1].id) == 32


def test_mistral_tagged_args() -> None:
    out = '[TOOL_CALLS]get_weather[ARGS]{"location": "Bern"}[TOOL_CALLS]python[CALL_ID]x1[ARGS]{"code": "3"}'
    msg = check(MISTRAL, out)
    assert calls_of(msg) == [("get_weather", {"location": "Bern"}), ("python", {"code": "3"})]
    assert msg.tool_calls[1].id == "x1"
    s = ChatStream(MISTRAL)
    assert [d.to_delta() for d in s.update("ok [TOOL_")] == [{"content": "ok"}]


# --- generic JSON -----------------------------------------------------------------------------

GENERIC = ChatSyntax(tools=GenericFormat(NAMES))


def test_generic_shapes() -> None:
    msg = check(GENERIC, '{"tool_call": {"name": "get_weather", "arguments": {"location": "Lima"}}}')
    assert calls_of(msg) == [("get_weather", {"location": "Lima"})] and msg.content == ""
    msg = check(GENERIC, '```json\n{"tool_calls": [{"name": "python", "arguments": {"code": "1"}}, '
                         '{"name": "get_weather", "arguments": {"location": "B"}}]}\n```')
    assert calls_of(msg) == [("python", {"code": "1"}), ("get_weather", {"location": "B"})]
    msg = check(GENERIC, '{"response": "Hello \\u00e9t\\u00e9 \\"x\\"\\n"}')
    assert msg.content == 'Hello été "x"\n' and msg.tool_calls == []
    assert check(GENERIC, "plain words").content == "plain words"
    assert check(GENERIC, '{"foo": 1}').content == '{"foo": 1}'


def test_generic_prompt_names_tools() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {}}}]
    assert "get_weather" in GenericFormat(NAMES).system_prompt(tools)
    assert '"tool_calls"' in GenericFormat(NAMES, parallel=True).system_prompt(tools)


def test_not_parallel_keeps_first_call() -> None:
    syntax = ChatSyntax(tools=HermesFormat(NAMES), parallel=False)
    out = ('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>'
           '<tool_call>{"name": "python", "arguments": {"code": "2"}}</tool_call>')
    assert calls_of(check(syntax, out)) == [("python", {"code": "1"})]


# --- detection --------------------------------------------------------------------------------


def test_detection_from_template_source() -> None:
    assert isinstance(detect_tool_format("... <tool_call>\\n{{ tool_call | tojson }} ..."), HermesFormat)
    assert isinstance(detect_tool_format("{{ '[TOOL_CALLS]' }}"), MistralFormat)
    assert isinstance(detect_tool_format('<|start_header_id|>{"name": ..., "parameters": ...}<|python_tag|>'),
                      Llama3Format)
    assert isinstance(detect_tool_format("{% for m in messages %}{{ m.content }}{% endfor %}"), GenericFormat)


# --- reasoning --------------------------------------------------------------------------------


def test_reasoning_block() -> None:
    syntax = ChatSyntax(think=THINK)
    msg = check(syntax, "<think>\nLet me think.\n</think>\n\nThe answer is 4.")
    assert msg.reasoning_content == "Let me think." and msg.content == "The answer is 4."
    # no block: everything is content, untouched
    assert check(syntax, "  plain  ").content == "  plain  "
    # empty block: no reasoning
    msg = check(syntax, "<think>\n\n</think>\n\nHi")
    assert msg.reasoning_content == "" and msg.content == "Hi"


def test_reasoning_opened_by_prompt_and_unterminated() -> None:
    assert starts_in_reasoning("<|im_start|>assistant\n<think>\n", THINK)
    assert not starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    syntax = ChatSyntax(think=THINK, opened=True)
    msg = check(syntax, "step 1, step 2</think>Done.")
    assert msg.reasoning_content == "step 1, step 2" and msg.content == "Done."
    msg = check(syntax, "still thinking when the budget ran out")
    assert msg.reasoning_content == "still thinking when the budget ran out" and msg.content == ""


def test_reasoning_partial_tags_held_back() -> None:
    s = ChatStream(ChatSyntax(think=THINK))
    assert s.update("<thi") == []
    assert [d.to_delta() for d in s.update("nk>abc </th")] == [{"reasoning_content": "abc"}]
    assert [d.to_delta() for d in s.update("ink>ok")] == [{"content": "ok"}]


def test_reasoning_then_tool_call() -> None:
    syntax = ChatSyntax(tools=HermesFormat(NAMES), think=THINK)
    out = '<think>need weather</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "X"}}\n</tool_call>'
    msg = check(syntax, out)
    assert msg.reasoning_content == "need weather" and calls_of(msg) == [("get_weather", {"location": "X"})]


# --- helpers ----------------------------------------------------------------------------------


def test_partial_marker_and_string_helpers() -> None:
    assert partial_marker_len("abc <tool", ["<tool_call>"]) == 5
    assert partial_marker_len("abc", ["<tool_call>"]) == 0
    assert partial_string('"ab\\') == "ab"
    assert partial_string('"ab\\u00') == "ab"
    assert partial_string('"ab\\u00e9') == "abé"
    assert partial_string('"\\ud83d') == ""
    assert partial_string('"\\ud83d\\ude00"') == "😀"
