"""Flags kvserve accepts with a warning: a request that would use their feature gets a 400 naming it."""

from __future__ import annotations

from typing import Any

from kvserve.config import load_config
from kvserve.server.settings import ServerSettings

from .test_http_fake_engine import FakeEngine, client


def _http(*argv: str) -> Any:
    cfg = load_config(list(argv), {}, warn=lambda m: None)
    return client(FakeEngine(), **{"unsupported_features": dict(cfg.server.unsupported_features)})


def test_tools_and_cors_proxy_endpoints() -> None:
    c, _ = _http()
    for path in ("/tools", "/cors-proxy"):  # not enabled: llama-server's 403
        r = c.get(path)
        assert r.status_code == 403 and r.json() == {
            "error": {"message": "this feature is disabled", "type": "feature_disabled"}
        }


def test_tools_flag_makes_cors_default_localhost() -> None:
    assert load_config(["--tools", "all"], {}, warn=lambda m: None).server.cors_origins == "localhost"
    explicit = load_config(["--tools", "all", "--cors-origins", "*"], {}, warn=lambda m: None)
    assert explicit.server.cors_origins == "*"


def test_settings_carry_the_start_up_flags() -> None:
    cfg = load_config(
        ["--no-prefill-assistant", "--reuse-port", "-ctk", "q8_0", "-ctv", "q8_0"], {}, warn=lambda m: None
    )
    s = ServerSettings.from_config(cfg)
    assert s.prefill_assistant is False and s.reuse_port is True
    assert cfg.engine.cache_type_k == cfg.engine.cache_type_v == "f16"  # quantized types warn and use f16


def test_no_jinja_prefill_matches_llama_server(smollm_meta: dict[str, Any]) -> None:
    """Without --jinja llama-server renders a trailing assistant message closed, with no generation
    prompt (recorded from llama-server b10621 --no-jinja: /apply-template)."""
    from kvserve.model.chat_template import ChatTemplate

    eng = FakeEngine()
    eng.chat_template = ChatTemplate.from_metadata(smollm_meta, jinja=False)  # type: ignore[assignment]
    c, _ = client(eng, jinja=False)
    msgs = [
        {"role": "system", "content": "Sys"},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Wh"},
    ]
    r = c.post("/apply-template", json={"messages": msgs})
    assert r.json()["prompt"] == (
        "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nWh<|im_end|>\n"
    )
    r = c.post("/apply-template", json={"messages": msgs[:2]})
    assert r.json()["prompt"].endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_jinja_prefill_joins_text_parts_with_a_blank_line(smollm_meta: dict[str, Any]) -> None:
    """A continued assistant message's text parts are joined by a blank line, other messages' by a
    newline (recorded from llama-server b10621 --jinja: /apply-template)."""
    from kvserve.model.chat_template import ChatTemplate

    eng = FakeEngine()
    eng.chat_template = ChatTemplate.from_metadata(smollm_meta)  # type: ignore[assignment]
    c, _ = client(eng)
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": parts}]
    prompt = c.post("/apply-template", json={"messages": msgs}).json()["prompt"]
    assert prompt.endswith("<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\nWh\n\nill")
    msgs[1]["content"] = "Whill"
    assert c.post("/apply-template", json={"messages": msgs}).json()["prompt"].endswith("<|im_start|>assistant\nWhill")


def test_header_names_are_capitalized_like_llama_server() -> None:
    """cpp-httplib writes ``Content-Type``, ``Access-Control-Allow-Origin``...; clients that copy the
    headers into a plain dict (llama.cpp's own test suite does) look them up with that case."""
    c, _ = client()
    for method, path in (("GET", "/metrics"), ("OPTIONS", "/completions"), ("GET", "/health")):
        r = c.request(method, path, headers={"Origin": "web.mydomain.fr"})
        names = [k for k, _ in r.headers.raw]
        assert b"Server" in names and b"Access-Control-Allow-Origin" in names and b"Content-Type" in names, (
            names
        )
        assert all(n == b"-".join(p[:1].upper() + p[1:] for p in n.split(b"-")) for n in names), names
    r = c.get("/metrics")
    assert b"Process-Start-Time-Unix" in [k for k, _ in r.headers.raw]
