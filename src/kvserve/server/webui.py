"""The Web UI routes: the built-in chat page, or ``--path`` static files, at ``api_prefix + "/"``.

As llama-server (``server-http.cpp``):
- ``--ui`` (default) serves the embedded page at ``/`` and ``/index.html`` and its assets by name;
  ``--path DIR`` serves DIR instead (a directory request gets its ``index.html``);
  ``--no-ui`` serves neither, so ``/`` is the JSON 404.
- The front-end paths (``/``, ``/index.html``, the asset names, ``/sw.js``) are public and answer
  while the model loads, so the page can show its loading state; everything else keeps the
  middleware's rules.
- ``/index.html`` carries an ETag (304 on ``If-None-Match``), ``Cache-Control: no-cache`` and the
  cross-origin isolation headers.
- ``/sw.js``, when no embedded asset has that name, is a worker that unregisters itself: a browser
  that once ran another UI's service worker on this origin would otherwise keep showing it.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from kvserve import webui
from kvserve.server.settings import ServerSettings

SW_REMOVE_JS = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
"""

_ISOLATION = {"cross-origin-embedder-policy": "require-corp", "cross-origin-opener-policy": "same-origin"}


def frontend_paths(prefix: str) -> frozenset[str]:
    """Paths the middleware lets through while loading and without an API key."""
    names = {"", "index.html", "sw.js", *webui.ASSETS}
    return frozenset(f"{prefix}/{n}" for n in names)


class _Asset:
    def __init__(self, name: str):
        self.body = webui.read(name)
        self.type = webui.ASSETS[name]
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:32] + '"'

    def response(self, request: Request, isolation: bool) -> Response:
        headers = {"etag": self.etag, "cache-control": "no-cache"}
        inm = request.headers.get("if-none-match", "")
        if inm and inm in (self.etag, "W/" + self.etag):
            return Response(status_code=304, headers=headers)
        if isolation:
            headers.update(_ISOLATION)
        return Response(self.body, headers={**headers, "content-type": self.type})


class _StaticDir(StaticFiles):
    """``--path``: a directory request gets its ``index.html`` (as cpp-httplib mount points do);
    a missing file is the JSON 404 through the app's handler."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if scope["path"].endswith("/"):
            path = os.path.join(path, "index.html")
        return await super().get_response(path, scope)


def _sw_response(s: ServerSettings) -> Response:
    if s.static_path:
        own = os.path.join(s.static_path, "sw.js")
        if os.path.isfile(own):
            return FileResponse(own, headers={"cache-control": "no-cache"})
    return Response(SW_REMOVE_JS, headers={"cache-control": "no-cache",
                                           "content-type": "application/javascript"})


def install(app: FastAPI, s: ServerSettings) -> None:
    """Add the UI routes (after the API routes, which keep priority)."""
    p = s.api_prefix
    r = APIRouter(prefix=p, include_in_schema=False)

    @r.get("/sw.js")
    async def sw_js() -> Response:
        return _sw_response(s)

    if s.ui and not s.static_path:
        assets = {name: _Asset(name) for name in webui.ASSETS}

        def serve(name: str, isolation: bool) -> Any:
            async def handler(request: Request) -> Response:
                return assets[name].response(request, isolation)
            return handler

        r.add_api_route("/", serve("index.html", True), methods=["GET", "HEAD"])
        for name in webui.ASSETS:
            r.add_api_route("/" + name, serve(name, name == "index.html"), methods=["GET", "HEAD"])
    app.include_router(r)
    if s.ui and s.static_path:
        app.mount(p or "", _StaticDir(directory=s.static_path, check_dir=True), name="static")
