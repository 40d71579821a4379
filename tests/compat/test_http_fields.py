"""Request-field parsing (§2.4): aliases, null = absent, clamps, hard limits, wrong types,
prompt forms, fan-out (several prompts, n_cmpl), and refused (unimplemented) fields."""

from __future__ import annotations

from typing import Any

import pytest

from tests.compat.test_http_fake_engine import client


@pytest.fixture()
def http():  # type: ignore[no-untyped-def]
    return client()


def post(c: Any, body: dict[str, Any], path: str = "/completion") -> Any:
    return c.post(path, json=body)


def err(r: Any) -> str:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    return str(r.json()["error"]["message"])


# --- hard limits: one test per kind -----------------------------------------------------


def test_hard_limit_int_lower_bound(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "n_predict": -2})) == \
        "Field 'n_predict': Value must be between -1 <= value <= 2147483647, but got -2"


def test_hard_limit_via_alias_names_the_alias(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "max_tokens": -5})) == \
        "Field 'max_tokens': Value must be between -1 <= value <= 2147483647, but got -5"


def test_hard_limit_upper_bound_n_cmpl(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http  # n_parallel = 4
    assert err(post(c, {"prompt": "x", "n": 5})) == "Field 'n': Value must be between 1 <= value <= 4, but got 5"
    assert err(post(c, {"prompt": "x", "n_cmpl": 0})).startswith("Field 'n_cmpl': Value must be between 1")


def test_hard_limit_float(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "adaptive_decay": 1.5})) == \
        "Field 'adaptive_decay': Value must be between 0.000000 <= value <= 0.990000, but got 1.500000"


@pytest.mark.parametrize("name", ["n_keep", "n_discard", "n_indent", "n_cache_reuse", "repeat_last_n",
                                  "dry_allowed_length", "dry_penalty_last_n", "min_keep", "t_max_predict_ms",
                                  "sse_ping_interval"])
def test_hard_limited_fields(http, name: str) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", name: -7})).startswith(f"Field '{name}': Value must be between")


def test_clamped_fields_are_clamped_not_rejected(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"prompt": "x", "n_predict": 1, "top_p": 7, "min_p": -1, "temperature": -3, "mirostat": 9,
                 "top_k": -4, "xtc_probability": 2})
    assert r.status_code == 200, r.text
    s = eng.submitted[-1].params.sampling
    assert (s.top_p, s.min_p, s.temperature, s.mirostat, s.top_k, s.xtc_probability) == (1.0, 0.0, 0.0, 2, 0, 1.0)


# --- types ------------------------------------------------------------------------------


def test_wrong_type_number(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "temperature": "hot"})) == \
        "Field 'temperature': [json.exception.type_error.302] type must be number, but is string"


def test_wrong_type_bool(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "stream": "yes"})) == \
        "Field 'stream': [json.exception.type_error.302] type must be boolean, but is string"


def test_wrong_type_stop_element(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert "Field 'stop'" in err(post(c, {"prompt": "x", "stop": ["a", 3]}))


def test_dry_sequence_breakers_must_be_non_empty(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": "x", "dry_sequence_breakers": []})) == \
        "Field 'dry_sequence_breakers': Error: dry_sequence_breakers must be a non-empty array of strings"


def test_null_is_absent_and_numbers_accept_bools(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"prompt": "x", "n_predict": None, "temperature": None, "stop": None, "n_probs": False})
    assert r.status_code == 200
    p = eng.submitted[-1].params
    assert p.n_predict == -1 and p.sampling.temperature == 0.8 and p.stop == [] and p.n_probs == 0


def test_values_reach_the_engine(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"prompt": "x", "max_completion_tokens": 3, "stop": "END", "seed": -1, "n_keep": -1,
                 "samplers": "kt", "logprobs": 2, "dry_base": 0.5, "cache_prompt": False, "id_slot": 1,
                 "logit_bias": {"65": -1.0, "AB": False}, "return_tokens": True})
    assert r.status_code == 200
    p = eng.submitted[-1].params
    assert p.n_predict == 3 and p.stop == ["END"] and p.n_keep == -1 and p.n_probs == 2
    assert p.cache_prompt is False and p.id_slot == 1 and p.return_tokens is True
    s = p.sampling
    assert s.samplers == ("top_k", "temperature") and s.seed_u32 == 0xFFFFFFFF and s.dry_base == 1.75
    assert s.logit_bias[0] == (65, -1.0) and s.logit_bias[1][1] == float("-inf")
    assert r.json()["tokens"]  # return_tokens


def test_stop_empty_strings_fall_back_to_reverse_prompt() -> None:
    c, eng = client(reverse_prompt=("User:",))
    post(c, {"prompt": "x", "n_predict": 1, "stop": ["", ""]})
    assert eng.submitted[-1].params.stop == ["User:"]


# --- prompts ----------------------------------------------------------------------------


def test_prompt_forms(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    post(c, {"prompt": [40, 41], "n_predict": 1})
    assert eng.submitted[-1].prompt_tokens == [40, 41]
    post(c, {"prompt": ["ab", 40, "c"], "n_predict": 1})  # mixed: BOS only for the first string
    assert eng.submitted[-1].prompt_tokens == [1, ord("a") + 10, ord("b") + 10, 40, ord("c") + 10]
    post(c, {"prompt": [40, "c"], "n_predict": 1})  # mixed starting with a token: no BOS
    assert eng.submitted[-1].prompt_tokens == [40, ord("c") + 10]
    post(c, {"prompt": {"prompt_string": "a"}, "n_predict": 1})
    assert eng.submitted[-1].prompt_tokens == [1, ord("a") + 10]


def test_several_prompts_give_an_array(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"prompt": ["a", [40, 41], "c"], "n_predict": 2})
    body = r.json()
    assert isinstance(body, list) and [b["index"] for b in body] == [0, 1, 2]
    assert [req.index for req in eng.submitted[-3:]] == [0, 1, 2]


def test_n_cmpl_fans_out_with_seeds_and_merges_oai(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"prompt": "x", "n": 3, "seed": 10, "max_tokens": 2, "id_slot": 2}, "/v1/completions")
    body = r.json()
    assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
    reqs = eng.submitted[-3:]
    assert [q.params.sampling.seed for q in reqs] == [10, 11, 12]
    assert [q.params.id_slot for q in reqs] == [2, -1, -1]
    assert body["usage"]["completion_tokens"] == 6 and body["usage"]["prompt_tokens"] == 2


def test_invalid_tokens_and_bad_prompt(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, {"prompt": [1, 99999]})) == "Prompt contains invalid tokens"
    assert "prompt" in err(post(c, {"prompt": [{"x": 1}]}))


def test_not_an_object_body(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert c.post("/completion", json=[1, 2]).status_code == 400


@pytest.mark.parametrize("raw", [b'{"prompt": NaN}', b"{no", b"", b'{"prompt": "x"', b"[" * 100000])
def test_malformed_json_is_400(http, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    for path in ("/completion", "/v1/chat/completions", "/tokenize", "/apply-template", "/v1/embeddings"):
        r = c.post(path, content=raw)
        assert r.status_code == 400, (path, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] == 400
        assert err["message"].startswith("[json.exception.parse_error.101]")


def test_invalid_utf8_body_is_400(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    r = c.post("/completion", content=b'{"prompt": "\xff\xfe"}')
    assert r.status_code == 400
    assert r.json()["error"] == {"code": 400, "type": "invalid_request_error",
                                 "message": "[json.exception.parse_error.316] invalid UTF-8 byte at index 12: 0xFF"}


@pytest.mark.parametrize("id_slot", [4, 99, -2])
def test_unknown_id_slot_is_400(http, id_slot: int) -> None:  # type: ignore[no-untyped-def]
    c, _ = http  # the fake engine has 4 slots
    r = c.post("/completion", json={"prompt": "x", "id_slot": id_slot, "n_predict": 1})
    assert r.status_code == 400 and f"Invalid id_slot: {id_slot}" in r.json()["error"]["message"]
    assert c.post("/completion", json={"prompt": "x", "id_slot": 3, "n_predict": 1}).status_code == 200


# --- refused fields ---------------------------------------------------------------------


@pytest.mark.parametrize("path,field,value", [
    ("/completion", "lora", [{"id": 0, "scale": 1.0}]),
    ("/v1/completions", "echo", True),
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "suffix", "tail"),
])
def test_unsupported_fields_are_refused(http, path: str, field: str, value: Any) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    body: dict[str, Any] = {"prompt": "x", "messages": [{"role": "user", "content": "x"}], field: value}
    n = len(eng.submitted)
    msg = err(post(c, body, path))
    assert f"'{field}'" in msg and "not supported" in msg
    assert len(eng.submitted) == n  # nothing reached the engine


def test_neutral_values_of_unsupported_fields_pass(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    r = post(c, {"prompt": "x", "n_predict": 1, "grammar": "", "lora": [], "tools": [], "echo": False})
    assert r.status_code == 200


def test_multimodal_content_part_is_refused(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    msg = err(post(c, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, "/v1/chat/completions"))
    assert "image_url" in msg and "not supported" in msg


# --- chat parsing (§2.7) ----------------------------------------------------------------


@pytest.mark.parametrize("body,message", [
    ({"messages": "hi"}, "Expected 'messages' to be an array"),
    ({"messages": [{"role": "user"}]}, "All non-assistant messages must contain 'content'"),
    ({"messages": [{"role": "assistant"}]}, "Assistant message must contain either 'content' or 'tool_calls'!"),
    ({"messages": [{"role": "user", "content": 5}]}, "Expected 'content' to be a string or an array"),
    ({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2},
     "top_logprobs requires logprobs to be set to true"),
    ({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "xml"}},
     'response_format type must be one of "text" or "json_object", but got: xml'),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "assistant", "content": "c"}]},
     "Cannot have 2 or more assistant messages at the end of the list."),
    ({"messages": [{"role": "user", "content": "a"}], "chat_template_kwargs": {"enable_thinking": "yes"}},
     'invalid type for "enable_thinking" (expected boolean, got string)'),
    ({"messages": [{"role": "robot", "content": "a"}]}, "unknown role 'robot'"),
])
def test_chat_validation(http, body: dict[str, Any], message: str) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    assert err(post(c, body, "/v1/chat/completions")) == message


def test_chat_prompt_prefill_and_kwargs(http) -> None:  # type: ignore[no-untyped-def]
    c, eng = http
    r = post(c, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                           {"type": "text", "text": "b"}]},
                              {"role": "assistant", "content": "Sure:"}],
                 "chat_template_kwargs": {"enable_thinking": False}}, "/apply-template")
    assert r.json()["prompt"] == "<|im_start|>user\na\nb<|im_end|>\n[no-think]<|im_start|>assistant\nSure:"
    r = post(c, {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "max_tokens": 2,
                 "n_predict": 1, "temperature": 0.5}, "/v1/chat/completions")
    p = eng.submitted[-1].params
    assert p.n_probs == 20 and p.n_predict == 1 and p.sampling.temperature == 0.5  # n_predict beats max_tokens
    assert eng.submitted[-1].prompt_tokens[0] == 1  # tokenized with add_special


def test_chat_stop_string_and_logprobs_response(http) -> None:  # type: ignore[no-untyped-def]
    c, _ = http
    r = post(c, {"messages": [{"role": "user", "content": "hi"}], "stop": "wo", "logprobs": True,
                 "top_logprobs": 1}, "/v1/chat/completions")
    ch = r.json()["choices"][0]
    assert ch["message"]["content"] == "Hello " and ch["finish_reason"] == "stop"
    assert len(ch["logprobs"]["content"][0]["top_logprobs"]) == 1
