"""Headless Chromium (the distribution's ``/usr/bin/chromium``, driven by Playwright; never a
downloaded browser) against real kvserve processes.

Every test gets a fresh browser profile and a ``Session``: route interception records every URL
the page asks for and refuses any outside the server's origin; console errors and uncaught page
errors are collected. At teardown both must be empty (a test may allow named console errors,
e.g. the 401s it provokes), and a failed test leaves ``failure.png`` in its tmp folder.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.compat.live import LiveServer, start_server

CHROMIUM = os.environ.get("KVSERVE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
API_KEY = "sesame"
PREFIX = "/llm"
UI_CONFIG = {"systemMessage": "You are terse.", "max_tokens": 6}  # the page's defaults (--ui-config)
TIMEOUT_MS = 60_000  # a loaded 2-core machine: generous, every wait is for a condition

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (make install adds it)"
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing (make install runs: apt-get install -y chromium)"
    return None


@pytest.fixture(scope="session")
def playwright_driver() -> Iterator[Any]:
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)  # never let CI pass without the browser tests
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


@dataclass
class Session:
    origin: str
    page: Any
    urls: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    allowed_console: list[str] = field(default_factory=list)  # regexes

    def allow_console_error(self, pattern: str) -> None:
        self.allowed_console.append(pattern)

    def unexpected_console(self) -> list[str]:
        return [m for m in self.console_errors if not any(re.search(p, m) for p in self.allowed_console)]


def _same_origin(url: str, origin: str) -> bool:
    return url == origin or url.startswith(origin + "/") or url.startswith(("data:", "blob:"))


@pytest.fixture
def browser_session(playwright_driver: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: ``open(server, path="/")`` → a ``Session`` on that server's page."""
    ctx = playwright_driver.chromium.launch_persistent_context(
        tmp_path / "profile", executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        accept_downloads=True, downloads_path=tmp_path / "downloads", service_workers="block",
        viewport={"width": 1200, "height": 800},
    )
    ctx.set_default_timeout(TIMEOUT_MS)
    sessions: list[Session] = []

    def open_page(server: LiveServer, path: str = PREFIX + "/", routes: tuple[tuple[str, Any], ...] = (),
                  api_key: str | None = API_KEY) -> Session:
        """``routes``: (glob, handler) pairs installed before the page loads; they run before the
        recorder and may ``route.fallback()`` to it. ``api_key``: saved in the page's settings
        before it loads, as by an earlier visit (None: a first visit)."""
        origin = server.url
        page = ctx.pages[0] if ctx.pages and not sessions else ctx.new_page()
        s = Session(origin, page)
        if api_key is not None:
            page.add_init_script(
                "if (!localStorage.getItem('kvserve.settings.v1')) localStorage.setItem("
                f"'kvserve.settings.v1', JSON.stringify({{api_key: {json.dumps(api_key)}}}));")

        def on_request(req: Any) -> None:
            s.urls.append(req.url)
            s.requests.append(req)
            if not _same_origin(req.url, origin):
                s.foreign.append(req.url)

        def on_route(route: Any) -> None:  # the last line of defence: nothing foreign goes out
            if _same_origin(route.request.url, origin):
                route.fallback()
            else:
                route.abort()

        page.on("request", on_request)
        page.route("**/*", on_route)
        for glob, handler in routes:
            page.route(glob, handler)
        page.on("console", lambda msg: msg.type == "error" and s.console_errors.append(msg.text))
        page.on("pageerror", lambda exc: s.page_errors.append(str(exc)))
        sessions.append(s)
        page.goto(origin + path)
        return s

    try:
        yield open_page
        if request.node.stash.get(_FAILED, False):
            for i, s in enumerate(sessions):
                try:
                    s.page.screenshot(path=str(tmp_path / f"failure-{i}.png"), full_page=True)
                except Exception as e:  # noqa: BLE001 - a screenshot must not hide the failure
                    print(f"screenshot failed: {e}")
        for s in sessions:
            assert s.urls, "no request was recorded"
            assert not s.foreign, f"requests left the origin: {s.foreign}"
            assert not s.page_errors, f"page errors: {s.page_errors}"
            assert not s.unexpected_console(), f"console errors: {s.unexpected_console()}"
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def chat_server() -> Iterator[LiveServer]:
    """The default SmolLM2-135M on two slots, keyed, under an API prefix and with UI defaults
    (one model load serves every test)."""
    srv = start_server("-np", "2", "-c", "4096", "--api-key", API_KEY, "--api-prefix", PREFIX,
                       "--ui-config", json.dumps(UI_CONFIG), health=PREFIX + "/health")
    yield srv
    srv.stop()
