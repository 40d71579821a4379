"""The other endpoints: tokenize/detokenize, infill, embeddings, slots and slot actions,
props, metrics, models, input_tokens, disabled-endpoint 501s, OpenAPI request bodies."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from tests.compat.test_http_fake_engine import MODEL, FakeEngine, client


def ids(text: str) -> list[int]:
    return [b + 10 for b in text.encode()]


# --- tokenizer utilities ----------------------------------------------------------------


def test_tokenize_defaults_and_options() -> None:
    c, _ = client()
    assert c.post("/tokenize", json={"content": "a<s>"}).json() == {"tokens": ids("a") + [1]}  # parse_special
    assert c.post("/tokenize", json={"content": "a", "add_special": True}).json() == {"tokens": [1] + ids("a")}
    assert c.post("/tokenize", json={"content": "<s>", "parse_special": False}).json() == {"tokens": ids("<s>")}
    assert c.post("/tokenize", json={}).json() == {"tokens": []}
    pieces = c.post("/tokenize", json={"content": "é", "with_pieces": True}).json()["tokens"]
    assert pieces == [{"id": 0xC3 + 10, "piece": [0xC3]}, {"id": 0xA9 + 10, "piece": [0xA9]}]
    assert c.post("/tokenize", json={"content": ["a", 40]}).json() == {"tokens": ids("a") + [40]}


def test_detokenize() -> None:
    c, _ = client()
    assert c.post("/detokenize", json={"tokens": [1] + ids("hé")}).json() == {"content": "<s>hé"}
    assert c.post("/detokenize", json={}).json() == {"content": ""}
    assert c.post("/detokenize", json={"tokens": [100000]}).status_code == 400


def test_input_tokens() -> None:
    c, _ = client()
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = c.post("/v1/chat/completions/input_tokens", json=body).json()
    prompt = c.post("/apply-template", json=body).json()["prompt"]
    assert r == {"input_tokens": len(c.post("/tokenize", json={"content": prompt, "add_special": True})
                                     .json()["tokens"]), "object": "response.input_tokens"}
    r2 = c.post("/v1/responses/input_tokens", json={"input": "hi"}).json()
    assert r2["input_tokens"] == r["input_tokens"]


# --- infill -----------------------------------------------------------------------------


def test_infill_builds_fim_prompt() -> None:
    c, eng = client(n_batch=64)  # extra context fits in n_ctx - n_batch - 2 * n_predict
    r = c.post("/infill", json={"input_prefix": "ab", "input_suffix": "cd", "prompt": "P", "n_predict": 2,
                                "input_extra": [{"filename": "f.py", "text": "X"}]})
    assert r.status_code == 200, r.text
    assert r.json()["stop"] is True and "generation_settings" in r.json()
    toks = eng.submitted[-1].prompt_tokens
    extra = [7] + ids("myproject\n") + [8] + ids("f.py\n") + ids("X") + [8] + ids("filename\n")
    assert toks == extra + [1, 4] + ids("ab") + ids("P") + [5] + ids("cd") + [6]


def test_infill_spm_order() -> None:
    c, eng = client(spm_infill=True)
    c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "n_predict": 1})
    toks = eng.submitted[-1].prompt_tokens
    assert toks[-7:] == [1, 5] + ids("b") + [4] + ids("a") + [6]


def test_infill_errors() -> None:
    c, _ = client()
    assert c.post("/infill", json={"input_suffix": "b"}).status_code == 400
    r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": 1}]})
    assert r.status_code == 400 and "input_extra" in r.json()["error"]["message"]
    c2, _ = client(FakeEngine(fim=False))
    r = c2.post("/infill", json={"input_prefix": "a", "input_suffix": "b"})
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
    assert r.json()["error"]["message"].startswith("Infill is not supported by this model: prefix token is missing.")


# --- embeddings -------------------------------------------------------------------------


def test_embeddings_disabled_is_501() -> None:
    c, _ = client()
    r = c.post("/embedding", json={"content": "x"})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "This server does not support embeddings. Start it with `--embeddings`"


def test_native_embeddings_normalized() -> None:
    c, eng = client(embedding=True)
    r = c.post("/embeddings", json={"content": ["a", "b"]})
    assert [e["index"] for e in r.json()] == [0, 1]
    assert r.json()[1]["embedding"] == [pytest.approx([0.6, 0.8])]
    r = c.post("/embedding", json={"content": "a", "embd_normalize": -1})
    assert r.json() == [{"index": 0, "embedding": [[3.0, 4.0]]}]
    assert eng.embed_calls[-1] == ([[1] + ids("a")], "mean")


def test_oai_embeddings_float_and_base64() -> None:
    c, _ = client(embedding=True)
    r = c.post("/v1/embeddings", json={"input": "ab", "model": "m"}).json()
    assert r["object"] == "list" and r["model"] == "m"
    assert r["data"] == [{"embedding": pytest.approx([0.6, 0.8]), "index": 0, "object": "embedding"}]
    assert r["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    r = c.post("/v1/embeddings", json={"input": ["a"], "encoding_format": "base64"}).json()
    raw = base64.b64decode(r["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == pytest.approx((0.6, 0.8))
    assert r["model"] == MODEL and r["data"][0]["encoding_format"] == "base64"
    # content instead of input: native format
    assert isinstance(c.post("/v1/embeddings", json={"content": "a"}).json(), list)


def test_embedding_oai_content_entries_are_their_text() -> None:
    """``{"content": [text parts]}`` entries embed the parts' text concatenated (llama-server's
    tokenize_oai_content_array); media parts and unknown part types are 400s."""
    c, eng = client(embedding=True)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    r = c.post("/v1/embeddings", json={"input": ["ab", {"content": parts}]})
    assert r.status_code == 200 and len(r.json()["data"]) == 2
    assert eng.embed_calls[-1][0][0] == eng.embed_calls[-1][0][1] == [1] + ids("ab")
    for bad in ({"content": "ab"}, {"content": [{"type": "unknown"}]},
                {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}):
        assert c.post("/v1/embeddings", json={"input": [bad]}).status_code == 400


def test_embedding_errors() -> None:
    c, _ = client(embedding=True)
    assert c.post("/v1/embeddings", json={"input": "a", "encoding_format": "int8"}).status_code == 400
    r = c.post("/embedding", json={"content": [[]]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Input content cannot be empty"
    c2, _ = client(embedding=True, pooling="none")
    assert c2.post("/v1/embeddings", json={"input": "a"}).status_code == 400
    per_token = c2.post("/embedding", json={"content": "a"}).json()[0]["embedding"]
    assert per_token == [[1.0, 1.0], [float(ids("a")[0]), 1.0]]


# --- slots, props, metrics, models ------------------------------------------------------


def test_slots_and_fail_on_no_slot() -> None:
    c, eng = client()
    assert len(c.get("/slots").json()) == 4
    assert c.get("/slots?fail_on_no_slot=1").status_code == 200
    eng.busy = True
    r = c.get("/slots?fail_on_no_slot=1")
    assert r.status_code == 503 and r.json()["error"] == {"code": 503, "message": "no slot available",
                                                          "type": "unavailable_error"}
    c2, _ = client(endpoint_slots=False)
    r = c2.get("/slots")
    assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]


@pytest.mark.parametrize("url,body,status,message", [
    ("/slots/abc?action=save", {"filename": "a"}, 400, "Invalid slot ID"),
    ("/slots/0?action=fly", {"filename": "a"}, 400, "Invalid action"),
    ("/slots/0?action=save", {"filename": "../etc/passwd"}, 400, "Invalid filename"),
    ("/slots/0?action=restore", {"filename": "a/b"}, 400, "Invalid filename"),
    ("/slots/0?action=save", {}, 400, "Invalid filename"),
    ("/slots/0?action=restore", {"filename": "missing.bin"}, 400,
     "Unable to restore slot: No available space in KV cache or invalid slot save file"),
])
def test_slot_action_errors(url: str, body: Any, status: int, message: str) -> None:
    c, _ = client(slot_save_path="/tmp/slots/")
    r = c.post(url, json=body)
    assert r.status_code == status and r.json()["error"]["message"] == message


def test_slot_actions_reach_engine() -> None:
    c, eng = client(slot_save_path="/tmp/slots/", api_keys=("key",))
    h = {"Authorization": "Bearer key"}
    assert c.post("/slots/3?action=save", json={"filename": "s.bin"}, headers=h).json()["n_saved"] == 5
    assert c.post("/slots/1?action=erase", headers=h).json() == {"id_slot": 1, "n_erased": 5}
    assert eng.slot_calls == [(3, "save", "s.bin", "key"), (1, "erase", "", "key")]
    r = c.post("/slots/4?action=save", json={"filename": "s.bin"}, headers=h)  # 4 slots: 0..3
    assert r.status_code == 400 and r.json()["error"]["message"] == "Invalid slot ID"


def test_props_post_and_get() -> None:
    c, _ = client()
    r = c.post("/props", json={})
    assert r.status_code == 501 and "--props" in r.json()["error"]["message"]
    c2, _ = client(endpoint_props=True)
    assert c2.post("/props", json={"x": 1}).json() == {"success": True}
    p = c2.get("/props").json()
    assert p["endpoint_props"] is True and p["total_slots"] == 4 and p["model_path"] == MODEL
    assert p["default_generation_settings"]["n_ctx"] == 256
    assert "stop" not in p["default_generation_settings"]["params"]  # metrics-only variant


def test_metrics_disabled_and_kvserve_series() -> None:
    c, _ = client(endpoint_metrics=False)
    r = c.get("/metrics")
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "This server does not support metrics endpoint. Start it with `--metrics`"
    c2, _ = client()
    text = c2.get("/metrics").text
    assert "# TYPE kvserve:cache_lookups_total counter\nkvserve:cache_lookups_total 3" in text
    assert 'kvserve:cache_tokens_reused_total{source="prefix"} 10' in text
    assert text.count("# HELP kvserve:cache_tokens_reused_total") == 1


def test_models_aliases_and_tags() -> None:
    c, _ = client(aliases=("a-model", "b-model"), model_name="a-model", tags=("chat", "small"))
    body = c.get("/v1/models").json()
    d = body["data"][0]
    assert d["id"] == "a-model" and d["aliases"] == ["a-model", "b-model"] and d["tags"] == ["chat", "small"]
    assert d["meta"]["n_ctx"] == 256 and d["owned_by"] == "llamacpp"
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1,
                                             "model": "whatever"})
    assert r.json()["model"] == "a-model"  # the requested model is not echoed


def test_rerank_and_lora() -> None:
    c, _ = client()
    assert c.post("/rerank", json={"query": "q", "documents": ["a"]}).status_code == 501
    assert c.get("/lora-adapters").json() == []
    assert c.post("/lora-adapters", json=[]).json() == {"success": True}
    assert c.post("/lora-adapters", json=[{"id": 0, "scale": 1}]).status_code == 400


def test_response_fields_projection() -> None:
    c, _ = client()
    r = c.post("/completion", json={"prompt": "x", "n_predict": 2,
                                    "response_fields": ["content", "generation_settings/n_predict", "nope"]})
    assert r.json() == {"content": "He", "generation_settings/n_predict": 2}


def test_verbose_adds_native_object() -> None:
    c, _ = client()
    r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "verbose": True}).json()
    assert r["__verbose"]["content"] == "H" and r["__verbose"]["prompt"] == "<s>x"


def test_openapi_documents_request_bodies() -> None:
    c, _ = client()
    spec = c.get("/openapi.json").json()
    for path, model in (("/completion", "CompletionRequest"), ("/v1/chat/completions", "ChatCompletionRequest"),
                        ("/tokenize", "TokenizeRequest"), ("/v1/embeddings", "EmbeddingRequest"),
                        ("/infill", "InfillRequest")):
        ref = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}"
        assert model in spec["components"]["schemas"]
    assert "prompt" in spec["components"]["schemas"]["CompletionRequest"]["properties"]
    assert "ChatMessage" in spec["components"]["schemas"]


def test_health_reports_an_engine_that_cannot_serve() -> None:
    c, eng = client()
    assert c.get("/health").json() == {"status": "ok"}
    eng.unhealthy = "engine stopped after an internal error: boom"
    r = c.get("/health")
    assert r.status_code == 503
    assert r.json() == {"error": {"code": 503, "message": "engine stopped after an internal error: boom",
                                  "type": "unavailable_error"}}
    assert c.get("/v1/health").status_code == 503


def test_generation_and_other_routes_share_no_path() -> None:
    """The app tries the generation routes first (the hot path is matched early); that order
    changes nothing only while no request could match a route of both routers."""
    from starlette.routing import Match

    from kvserve.server import routes_generate, routes_misc

    gen, misc = routes_generate.make_router(""), routes_misc.make_router("")
    for a, b in ((gen, misc), (misc, gen)):
        for r in a.routes:
            for method in getattr(r, "methods", None) or ("GET",):
                scope = {"type": "http", "path": r.path, "method": method, "root_path": ""}
                assert all(q.matches(scope)[0] is Match.NONE for q in b.routes), (r.path, method)
