"""The built-in chat page in headless Chromium against real kvserve servers (SmolLM2-135M).

Engine-backed: a streamed reply equal to the API's own answer, the cache share of a second turn,
stop midway freeing the slot (seen in the page's /slots panel and on the server), reload keeping
the conversation, the API-key setting on a keyed server under --api-prefix. Page-only (canned
streams through route interception): loading state, the Markdown renderer's escaping, reasoning
block, edit/regenerate, errors shown, conversation switch/delete/export/import.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx
import pytest

from tests.compat.live import LiveServer
from tests.webui.conftest import API_KEY, PREFIX, UI_CONFIG

if os.environ.get("CI"):
    from playwright.sync_api import expect
else:
    expect = pytest.importorskip("playwright.sync_api").expect

pytestmark = pytest.mark.slow  # a model load and a few generations; `make test` runs them

WAIT_MS = 90_000  # one reply of a few tokens on a loaded 2-core machine
LOADING = json.dumps({"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}})


def wait_ready(page: Any) -> None:
    expect(page.locator("#status")).to_have_attribute("data-state", "ready", timeout=WAIT_MS)
    expect(page.locator("#loading")).to_be_hidden()
    expect(page.locator("#send")).to_be_enabled()


def set_settings(page: Any, **values: Any) -> None:
    page.click("#open-settings")
    for name, value in values.items():
        page.fill(f'#settings-form [name="{name}"]', str(value))
    page.click("#settings-save")
    expect(page.locator("#settings")).not_to_be_visible()


def send(page: Any, text: str) -> Any:
    page.fill("#input", text)
    page.click("#send")
    return page.locator(".message.assistant").last


def stored(page: Any) -> list[dict[str, Any]]:
    """The conversations in localStorage, newest first."""
    raw = page.evaluate("() => localStorage.getItem('kvserve.conversations.v1')")
    convs = list(json.loads(raw).values()) if raw else []
    return sorted(convs, key=lambda c: -c["updated"])


def chat_posts(s: Any) -> list[Any]:
    return [r for r in s.requests if r.method == "POST" and r.url.endswith("/v1/chat/completions")]


def sse(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta or {},
                                                            "finish_reason": finish}], **extra}


# --- page-only --------------------------------------------------------------------------------
def test_loading_state_then_ready_and_safe_markdown(browser_session: Any, chat_server: LiveServer) -> None:
    health_calls = {"n": 0}

    def health(route: Any) -> None:
        health_calls["n"] += 1
        if health_calls["n"] <= 3:  # what a loading server answers (the middleware's own test)
            route.fulfill(status=503, content_type="application/json; charset=utf-8", body=LOADING)
        else:
            route.fallback()

    s = browser_session(chat_server, routes=(("**/health", health),))
    s.allow_console_error(r"status of 503")
    page = s.page
    expect(page.locator("#loading")).to_be_visible()
    expect(page.locator("#loading-text")).to_have_text("Loading model…")
    expect(page.locator("#status")).to_have_attribute("data-state", "loading")
    wait_ready(page)
    assert health_calls["n"] >= 4
    expect(page.locator("#model")).to_contain_text("SmolLM2")
    expect(page.locator("#slots li")).to_have_count(2)
    expect(page.locator('#slots li[data-busy="false"]')).to_have_count(2)

    out = page.evaluate("""async () => {
        const m = await import(new URL('markdown.js', location.href));
        const r = m.renderMarkdown;
        return {
            script: r('<script>alert(1)</script> & <img src=x onerror=alert(1)>'),
            fence: r('Look:\\n```js\\nif (a < b && c) { x = "<b>"; }\\n```\\nafter'),
            open: r('```\\nstill streaming <i>'),
            inline: r('**bold**, *it*, `a<b>` and ~~gone~~'),
            lists: r('- one\\n- two\\n\\n3. three\\n4. four'),
            heading: r('## Title <x>'),
            quote: r('> quoted **text**'),
            badlink: r('[x](javascript:alert(1)) [y](data:text/html,hi)'),
            link: r('[site](https://example.com/?a=1&b="2")'),
            think: m.splitThink('<think>plan</think>\\n\\nanswer'),
            thinking: m.splitThink('<think>still planning'),
        };
    }""")
    assert "<script" not in out["script"] and "<img" not in out["script"]
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(1)&gt;" in out["script"]
    assert ('<pre data-lang="js"><code>if (a &lt; b &amp;&amp; c) { x = &quot;&lt;b&gt;&quot;; }</code></pre>'
            in out["fence"])
    assert out["fence"].startswith("<p>Look:</p>") and out["fence"].endswith("<p>after</p>")
    assert out["open"] == "<pre><code>still streaming &lt;i&gt;</code></pre>"
    assert out["inline"] == ("<p><strong>bold</strong>, <em>it</em>, <code>a&lt;b&gt;</code> and "
                             "<del>gone</del></p>")
    assert out["lists"] == '<ul><li>one</li><li>two</li></ul>\n<ol start="3"><li>three</li><li>four</li></ol>'
    assert out["heading"] == "<h2>Title &lt;x&gt;</h2>"
    assert out["quote"] == "<blockquote><p>quoted <strong>text</strong></p></blockquote>"
    assert "<a" not in out["badlink"]
    assert 'href="https://example.com/?a=1&amp;b=&quot;2&quot;"' in out["link"]
    assert out["think"] == {"reasoning": "plan", "content": "answer"}
    assert out["thinking"] == {"reasoning": "still planning", "content": ""}


def test_canned_streams_reasoning_errors_and_history(browser_session: Any, chat_server: LiveServer,
                                                    tmp_path: Any) -> None:
    replies: list[tuple[int, str]] = []  # (status, body) served in order to chat requests

    def chat(route: Any) -> None:
        status, body = replies.pop(0)
        ctype = "text/event-stream" if status == 200 else "application/json; charset=utf-8"
        route.fulfill(status=status, content_type=ctype, body=body)

    s = browser_session(chat_server, routes=(("**/v1/chat/completions", chat),))
    s.allow_console_error(r"status of 400")
    page = s.page
    wait_ready(page)

    timings = {"cache_n": 10, "prompt_n": 5, "predicted_n": 3, "predicted_per_second": 12.5,
               "prompt_ms": 40.0}
    answer = "Here:\n```py\nprint('<hi>')\n```\n<img src=x onerror=\"window.__pwned=1\"> **done**"
    good = sse(
        chunk({"role": "assistant", "content": None}, prompt_progress={"total": 15, "cache": 10,
                                                                        "processed": 15, "time_ms": 4}),
        chunk({"reasoning_content": "Think about <b>this</b>."}),
        chunk({"content": answer}, timings=timings),
        chunk({}, "stop", timings=timings),
    )
    # nothing set by the user: the server's --ui-config defaults apply
    replies.append((200, good))
    msg = send(page, "First question")
    expect(msg).to_have_attribute("data-state", "done")
    body = json.loads(chat_posts(s)[-1].post_data)
    assert body["messages"] == [{"role": "system", "content": UI_CONFIG["systemMessage"]},
                                {"role": "user", "content": "First question"}]
    assert body["max_tokens"] == UI_CONFIG["max_tokens"] and "temperature" not in body
    assert body["stream"] is True and body["return_progress"] is True and body["timings_per_token"] is True
    assert chat_posts(s)[-1].headers["authorization"] == f"Bearer {API_KEY}"

    # the user's settings override them; regenerate sends the same question again
    set_settings(page, system="Be brief.", temperature=0.5, top_k=7, top_p=0.9, min_p=0.1, max_tokens=12)
    replies.append((200, good))
    page.locator(".message.assistant .regenerate").click()
    expect(page.locator(".message")).to_have_count(2)
    msg = page.locator(".message.assistant").last
    expect(msg).to_have_attribute("data-state", "done")
    body = json.loads(chat_posts(s)[-1].post_data)
    assert body["messages"] == [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "First question"}]
    assert {k: body[k] for k in ("temperature", "top_k", "top_p", "min_p", "max_tokens")} == {
        "temperature": 0.5, "top_k": 7, "top_p": 0.9, "min_p": 0.1, "max_tokens": 12}

    reasoning = msg.locator("details.reasoning")
    expect(reasoning.locator("summary")).to_have_text("Reasoning")
    expect(reasoning.locator(".reasoning-body")).to_have_text("Think about <b>this</b>.")
    expect(msg.locator('pre[data-lang="py"] code')).to_have_text("print('<hi>')")
    expect(msg.locator(".content strong")).to_have_text("done")
    assert page.locator("#messages img").count() == 0 and page.locator("#messages b").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    stats = msg.locator(".stats")
    expect(stats).to_contain_text("3 tokens · 12.5 tok/s · prompt 15 tokens, 10 cached (67%)")
    expect(stats).to_have_attribute("data-cache-n", "10")

    # edit the question: later messages go, the new question is sent
    replies.append((200, good))
    page.locator(".message.user .edit").click()
    page.fill(".message.user .edit-text", "Second question")
    page.click(".save-edit")
    expect(page.locator(".message.assistant").last).to_have_attribute("data-state", "done")
    expect(page.locator(".message")).to_have_count(2)
    assert json.loads(chat_posts(s)[-1].post_data)["messages"][-1] == {"role": "user",
                                                                       "content": "Second question"}

    # an error inside the stream is shown on the message and in the banner
    replies.append((200, "data: " + json.dumps(chunk({"content": "par"})) + "\n\n" + "data: " + json.dumps(
        {"error": {"code": 500, "message": "engine exploded", "type": "server_error"}}) + "\n\n"))
    page.locator(".message.assistant .regenerate").click()
    expect(page.locator("#error-text")).to_contain_text("engine exploded")
    failed = page.locator(".message.assistant").last
    expect(failed).to_have_attribute("data-state", "error")
    expect(failed.locator(".error-text")).to_contain_text("engine exploded")
    assert len(chat_posts(s)) == 4

    # an HTTP error before the stream is shown too
    replies.append((400, json.dumps({"error": {"code": 400, "message": "bad field x",
                                               "type": "invalid_request_error"}})))
    page.locator(".message.assistant .regenerate").click()
    expect(page.locator("#error-text")).to_contain_text("bad field x (HTTP 400)")

    # a second conversation, switching, deleting, export and import
    page.click("#new-chat")
    expect(page.locator(".message")).to_have_count(0)
    replies.append((200, good))
    expect(send(page, "Other topic")).to_have_attribute("data-state", "done")
    items = page.locator("#conversations li")
    expect(items).to_have_count(2)
    expect(items.first.locator(".open")).to_have_text("Other topic")
    items.nth(1).locator(".open").click()
    expect(page.locator(".message.user .content")).to_have_text("Second question")
    expect(page.locator("#conversations li.active .open")).to_have_text("First question")

    with page.expect_download() as dl:
        page.click("#export")
    exported = tmp_path / "export.json"
    dl.value.save_as(exported)
    data = json.loads(exported.read_text())
    assert data["format"] == "kvserve-conversations" and len(data["conversations"]) == 2
    assert [m["content"] for m in data["conversations"][0]["messages"]] == ["Other topic", answer]

    items.first.locator(".delete").click()
    items.first.locator(".delete").click()
    expect(items).to_have_count(0)
    assert stored(page) == []
    page.set_input_files("#import-file", str(exported))
    expect(page.locator("#error-text")).to_have_text("Imported 2 conversations.")
    expect(items).to_have_count(2)
    assert [c["messages"] for c in stored(page)] == [c["messages"] for c in data["conversations"]]

    bad = tmp_path / "bad.json"
    bad.write_text('{"conversations": []}')
    page.set_input_files("#import-file", str(bad))
    expect(page.locator("#error-text")).to_contain_text("Import failed: not a conversation export")
    assert not replies


# --- engine-backed ----------------------------------------------------------------------------
MAX_TOKENS = 48


def test_streamed_reply_cache_share_and_reload(browser_session: Any, chat_server: LiveServer) -> None:
    s = browser_session(chat_server)
    page = s.page
    wait_ready(page)
    set_settings(page, temperature=0, max_tokens=MAX_TOKENS)
    # a reply of many tokens, so that it streams over many reads even when the server is fast and
    # the browser slow (a reply of a few tokens can reach the page in one read, drawn once, done)
    question = "Tell me a short story about a cat."
    # every redraw of the reply is observed: text must show while it is still streaming
    page.evaluate("""() => {
        window.__partial = new Set();
        new MutationObserver(() => {
            const m = [...document.querySelectorAll('.message.assistant')].pop();
            const text = m?.querySelector('.content')?.textContent;
            if (m?.dataset.state === 'streaming' && text) window.__partial.add(text);
        }).observe(document.getElementById('messages'),
                   {subtree: true, childList: true, characterData: true, attributes: true});
    }""")
    msg = send(page, question)
    expect(msg).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    conv = stored(page)[0]
    reply = conv["messages"][1]["content"]
    # exactly what the API answers for the same request (greedy)
    direct = httpx.post(chat_server.url + PREFIX + "/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "system", "content": UI_CONFIG["systemMessage"]},
                     {"role": "user", "content": question}], "temperature": 0, "max_tokens": MAX_TOKENS},
        headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert reply == direct["choices"][0]["message"]["content"] and reply.strip()
    partial = page.evaluate("() => [...window.__partial]")
    assert partial and all(reply.strip().startswith(p.strip()) for p in partial), partial
    assert min(len(p.strip()) for p in partial) < len(reply.strip()), partial
    n = int(msg.locator(".stats").get_attribute("data-predicted-n"))
    assert n == direct["usage"]["completion_tokens"] and 1 <= n <= MAX_TOKENS

    # the second turn reuses the first turn's KV: the page shows the cached share
    msg2 = send(page, "And of Germany?")
    expect(msg2).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    cache_n = int(msg2.locator(".stats").get_attribute("data-cache-n"))
    prompt_n = int(msg2.locator(".stats").get_attribute("data-prompt-n"))
    assert cache_n > prompt_n > 0
    expect(msg2.locator(".stats")).to_contain_text(f"{cache_n} cached (")
    expect(page.locator("#slots")).to_contain_text(f", {cache_n} cached")  # the slot that served it

    page.reload()
    wait_ready(page)
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.locator("#conversations li.active .open")).to_have_text(question)
    expect(page.locator(".message")).to_have_count(4)
    assert stored(page)[0]["messages"][:2] == conv["messages"]


def test_stop_midway_frees_the_slot(browser_session: Any, chat_server: LiveServer) -> None:
    s = browser_session(chat_server)
    page = s.page
    wait_ready(page)
    set_settings(page, temperature=0, max_tokens=2000)
    msg = send(page, "Write a long story about a dragon who learns to read.")
    page.wait_for_function("""() => {
        const m = [...document.querySelectorAll('.message.assistant')].pop();
        return m && m.dataset.state === 'streaming' && m.querySelector('.content').textContent.length > 0;
    }""", timeout=WAIT_MS)
    expect(page.locator('#slots li[data-busy="true"]')).to_have_count(1, timeout=WAIT_MS)
    page.click("#stop")
    expect(msg).to_have_attribute("data-state", "stopped")
    expect(page.locator("#stop")).to_be_hidden()
    expect(page.locator("#send")).to_be_visible()
    expect(page.locator('#slots li[data-busy="false"]')).to_have_count(2, timeout=WAIT_MS)
    slots = httpx.get(chat_server.url + PREFIX + "/slots", timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert not any(sl["is_processing"] for sl in slots)
    content = stored(page)[0]["messages"][1]
    assert content["stopped"] is True and content["content"]
    assert int(msg.locator(".stats").get_attribute("data-predicted-n")) < 2000

    # a reload mid-reply closes the stream too, and keeps the text saved so far (a new chat with
    # the same greedy prompt, whose reply is known to be long: a follow-up turn may end early)
    page.click("#new-chat")
    send(page, "Write a long story about a dragon who learns to read.")
    page.wait_for_function("""() => {
        const cs = Object.values(JSON.parse(localStorage.getItem('kvserve.conversations.v1')));
        const c = cs.sort((a, b) => b.updated - a.updated)[0];
        return cs.length === 2 && c.messages.length === 2 && c.messages[1].content.length > 0;
    }""", timeout=WAIT_MS)
    page.reload()
    wait_ready(page)
    cut = page.locator(".message.assistant").last
    expect(cut).to_have_attribute("data-state", "stopped")
    expect(cut.locator(".content")).not_to_be_empty()
    expect(page.locator('#slots li[data-busy="false"]')).to_have_count(2, timeout=WAIT_MS)


def test_api_key_setting_on_a_keyed_server(browser_session: Any, chat_server: LiveServer) -> None:
    s = browser_session(chat_server, api_key=None)
    s.allow_console_error(r"status of 401")
    page = s.page
    wait_ready(page)  # the page and /health are public
    expect(page.locator("#error-text")).to_contain_text("Invalid API Key")
    expect(page.locator("#slots")).to_contain_text("needs the API key")
    msg = send(page, "Hi")
    expect(msg).to_have_attribute("data-state", "error")
    expect(page.locator("#error-text")).to_contain_text("Invalid API Key (HTTP 401)")

    set_settings(page, api_key=API_KEY, max_tokens=4, temperature=0)
    expect(page.locator("#error")).to_be_hidden()
    expect(page.locator("#model")).to_contain_text("SmolLM2")
    expect(page.locator("#slots li[data-slot]")).to_have_count(2)
    page.locator(".message.assistant .regenerate").click()
    expect(page.locator(".message.assistant").last).to_have_attribute("data-state", "done", timeout=WAIT_MS)
    assert stored(page)[0]["messages"][-1]["content"]
    posts = chat_posts(s)
    assert [p.headers.get("authorization") for p in posts] == [None, f"Bearer {API_KEY}"]
    assert all(p.url == chat_server.url + PREFIX + "/v1/chat/completions" for p in posts)
