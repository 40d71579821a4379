"""The built-in chat page: plain HTML, CSS and JavaScript files shipped as package data.

Nothing is built or fetched: the files below are served as they are. ``ASSETS`` maps each
served name to its content type; ``read(name)`` returns a file's bytes.
"""

from __future__ import annotations

from importlib import resources

ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "store.js": "text/javascript; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
}


def read(name: str) -> bytes:
    if name not in ASSETS:
        raise KeyError(name)
    return resources.files(__name__).joinpath(name).read_bytes()
