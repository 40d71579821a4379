"""The Web UI routes: built-in page at ``/`` (default on), ``--no-ui``, ``--api-prefix``, ``--path``
static files, the self-removing ``/sw.js``, and the middleware's front-end exemptions."""

from __future__ import annotations

from pathlib import Path

from kvserve import webui
from tests.compat.test_http_fake_engine import FakeEngine, client

NOT_FOUND = {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}


def test_page_served_at_root_by_default() -> None:
    c, _ = client()
    r = c.get("/")
    assert r.status_code == 200 and "<!doctype html>" in r.text  # what llama-server's own test checks
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["cross-origin-opener-policy"] == "same-origin"
    assert r.headers["server"] == "llama.cpp"
    assert c.get("/index.html").content == r.content
    head = c.head("/")
    assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == r.headers["etag"]
    again = c.get("/", headers={"If-None-Match": r.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    for name, ctype in webui.ASSETS.items():
        a = c.get("/" + name)
        assert a.status_code == 200 and a.headers["content-type"] == ctype, name
        assert a.content == webui.read(name) and a.content, name


def test_page_is_self_contained() -> None:
    """Nothing outside the origin is referenced: no absolute URLs in src/href/import/fetch."""
    import re

    for name in webui.ASSETS:
        text = webui.read(name).decode()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text), name
        assert not re.search(r"""(import|fetch)\s*\(?\s*["'`](https?:)?//""", text), name
        assert "@import" not in text and "url(http" not in text, name


def test_no_ui_is_404() -> None:
    c, _ = client(ui=False)
    for path in ("/", "/index.html", "/app.js"):
        r = c.get(path)
        assert r.status_code == 404 and r.json() == NOT_FOUND, path
    assert c.get("/props").json()["ui"] is False
    sw = c.get("/sw.js")
    assert sw.status_code == 200 and "unregister()" in sw.text


def test_page_public_and_served_while_loading() -> None:
    eng = FakeEngine(ready=False)
    c, _ = client(eng, api_keys=("k",))
    assert c.get("/").status_code == 200
    assert c.get("/app.js").status_code == 200
    assert c.get("/health").status_code == 503  # the page polls this for its loading state
    eng.ready = True
    assert c.get("/").status_code == 200  # no key needed for the page itself
    assert c.get("/slots").status_code == 401  # the API still needs it
    assert c.get("/props", headers={"Authorization": "Bearer k"}).json()["ui"] is True


def test_api_prefix() -> None:
    c, _ = client(api_prefix="/llm")
    assert c.get("/llm/").status_code == 200
    assert c.get("/llm/app.js").content == webui.read("app.js")
    assert c.get("/").status_code == 404 and c.get("/app.js").status_code == 404


def test_static_path(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<!doctype html><p>mine</p>")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("A")
    c, _ = client(static_path=str(tmp_path))
    assert c.get("/").text == "<!doctype html><p>mine</p>"
    assert c.get("/sub/a.txt").text == "A"
    assert c.get("/app.js").json() == NOT_FOUND  # the built-in page is replaced
    assert c.get("/nope.txt").json() == NOT_FOUND
    assert c.get("/sub/../../etc/passwd").status_code == 404
    assert c.get("/health").json() == {"status": "ok"}  # the API keeps priority
    assert c.post("/completion", json={"prompt": "x", "n_predict": 1}).status_code == 200
    assert "unregister()" in c.get("/sw.js").text
    (tmp_path / "sw.js").write_text("// own worker")
    assert c.get("/sw.js").text == "// own worker"  # a worker in --path is served first
    c, _ = client(static_path=str(tmp_path), api_prefix="/llm")
    assert c.get("/llm/sub/a.txt").text == "A" and c.get("/sub/a.txt").status_code == 404
    c, _ = client(static_path=str(tmp_path), ui=False)
    assert c.get("/").status_code == 404


def test_ui_settings_in_props() -> None:
    c, _ = client()
    assert c.get("/props").json()["ui_settings"] == {}
    c, _ = client(ui_settings={"systemMessage": "Be kind.", "temperature": 0.3})
    assert c.get("/props").json()["ui_settings"] == {"systemMessage": "Be kind.", "temperature": 0.3}
