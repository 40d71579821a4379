"""Middleware: API keys, CORS (echo rule, localhost mode, verbatim), OPTIONS preflight,
503 while loading (/health included), Server header, JSON 404, --api-prefix."""

from __future__ import annotations

from tests.compat.test_http_fake_engine import FakeEngine, client

AUTH_401 = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}
LOADING = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


def test_api_key_bearer_and_x_api_key() -> None:
    c, _ = client(api_keys=("k1", "k2"))
    r = c.get("/props")
    assert r.status_code == 401 and r.json() == AUTH_401
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert c.get("/props", headers={"Authorization": "Bearer k2"}).status_code == 200
    assert c.get("/props", headers={"Authorization": "k1"}).status_code == 200  # prefix optional
    assert c.get("/props", headers={"X-Api-Key": "k1"}).status_code == 200
    assert c.get("/props", headers={"Authorization": "Bearer nope"}).status_code == 401
    # X-Api-Key is only read when Authorization is empty
    assert c.get("/props", headers={"Authorization": "Bearer nope", "X-Api-Key": "k1"}).status_code == 401


def test_protected_and_public_paths() -> None:
    c, _ = client(api_keys=("k",))
    assert c.get("/health").status_code == 200
    assert c.get("/v1/health").status_code == 200
    for path in ("/metrics", "/models", "/v1/models", "/slots", "/props"):
        assert c.get(path).status_code == 401, path
    assert c.post("/completion", json={"prompt": "x"}).status_code == 401
    # unknown paths are checked for the key first, as llama-server does
    assert c.get("/nope").status_code == 401
    assert c.get("/nope", headers={"Authorization": "Bearer k"}).status_code == 404


def test_api_key_becomes_cache_tenant() -> None:
    c, eng = client(api_keys=("alice", "bob"))
    r = c.post("/completion", json={"prompt": "x", "n_predict": 1}, headers={"Authorization": "Bearer bob"})
    assert r.status_code == 200
    assert eng.submitted[-1].identity.tenant == "bob"
    c2, eng2 = client()
    c2.post("/completion", json={"prompt": "x", "n_predict": 1})
    assert eng2.submitted[-1].identity.tenant == ""


def test_api_key_is_the_tokenizer_tenant() -> None:
    """Prompts are tokenized as their API key's (``prefix_tokens.TENANT``: the trie of long texts'
    beginnings is the key's own), short ones on the event loop and long ones in a prepare thread,
    for completions and chat; a request outside generation (/tokenize) has no tenant (no trie)."""
    from kvserve.model import prefix_tokens

    c, eng = client(api_keys=("alice", "bob"))
    seen: list[str | None] = []
    real = eng.tokenizer.encode

    def encode(text: str, add_special: bool, parse_special: bool) -> list[int]:
        seen.append(prefix_tokens.TENANT.get())
        return real(text, add_special, parse_special)

    eng.tokenizer.encode = encode  # type: ignore[method-assign]
    long = {"stop": ["q" * 3000]}  # a body over PREPARE_IN_THREAD_BYTES: prepared in a thread
    for key, extra in (("bob", {}), ("alice", long), ("bob", long)):
        r = c.post("/completion", json={"prompt": "y " * 50, "n_predict": 1, **extra},
                   headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200 and seen[-1] == key
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "w " * 50}], "max_tokens": 1,
                                             **long}, headers={"Authorization": "Bearer alice"})
    assert r.status_code == 200 and seen[-1] == "alice"
    seen.clear()
    assert c.post("/tokenize", json={"content": "v " * 50}, headers={"Authorization": "Bearer bob"}).status_code == 200
    assert seen and set(seen) == {None}


def test_cors_echoes_origin_by_default() -> None:
    c, _ = client()
    r = c.get("/health", headers={"Origin": "https://app.example"})
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    assert c.get("/health").headers["access-control-allow-origin"] == ""


def test_cors_localhost_mode() -> None:
    c, _ = client(cors_origins="localhost")
    assert c.get("/health", headers={"Origin": "http://localhost:3000"}).headers[
        "access-control-allow-origin"] == "http://localhost:3000"
    assert c.get("/health", headers={"Origin": "http://127.0.0.1"}).headers[
        "access-control-allow-origin"] == "http://127.0.0.1"
    assert "access-control-allow-origin" not in c.get("/health", headers={"Origin": "http://evil.example"}).headers


def test_cors_verbatim_and_no_credentials() -> None:
    c, _ = client(cors_origins="https://a.example,https://b.example")
    r = c.get("/health", headers={"Origin": "https://other"})
    assert r.headers["access-control-allow-origin"] == "https://a.example,https://b.example"
    c2, _ = client(cors_credentials=False)
    assert c2.get("/health", headers={"Origin": "https://x"}).headers["access-control-allow-origin"] == "*"


def test_options_preflight_no_auth() -> None:
    c, _ = client(api_keys=("k",), cors_methods="GET, POST", cors_headers="Content-Type")
    r = c.options("/v1/chat/completions", headers={"Origin": "https://x", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-type"] == "text/html"
    assert r.headers["access-control-allow-origin"] == "https://x"
    assert r.headers["access-control-allow-credentials"] == "true"
    assert r.headers["access-control-allow-methods"] == "GET, POST"
    assert r.headers["access-control-allow-headers"] == "Content-Type"
    assert r.headers["server"] == "llama.cpp"


def test_loading_503_everywhere_including_health() -> None:
    eng = FakeEngine(ready=False)
    c, _ = client(eng, api_keys=("k",))
    for method, path in (("GET", "/health"), ("GET", "/v1/health"), ("GET", "/props"), ("POST", "/completion"),
                         ("GET", "/nope")):
        r = c.request(method, path)
        assert r.status_code == 503 and r.json() == LOADING, path
        assert r.headers["server"] == "llama.cpp"
    assert c.options("/health").status_code == 200  # preflight answers while loading
    eng.ready = True
    assert c.get("/health").json() == {"status": "ok"}


def test_not_found_is_json_and_wrong_method_too() -> None:
    c, _ = client()
    body = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
    r = c.get("/v2/unknown")
    assert r.status_code == 404 and r.json() == body
    assert r.headers["content-type"] == "application/json; charset=utf-8"
    assert c.get("/completion").json() == body  # POST-only route


def test_api_prefix() -> None:
    c, _ = client(api_prefix="/llm", api_keys=("k",))
    assert c.get("/llm/health").status_code == 200  # public under the prefix
    assert c.get("/health").status_code == 401
    h = {"Authorization": "Bearer k"}
    assert c.get("/health", headers=h).status_code == 404
    r = c.post("/llm/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=h)
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_server_header_on_errors_and_streams() -> None:
    c, _ = client()
    assert c.post("/completion", content=b"{").headers["server"] == "llama.cpp"
    r = c.post("/completion", json={"prompt": "x", "n_predict": 2, "stream": True})
    assert r.headers["server"] == "llama.cpp"
