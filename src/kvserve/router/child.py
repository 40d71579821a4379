"""What a model server needs of the router that may have started it: nothing of the router's
own modules (its HTTP client, pool and app), so that a plain server does not import them."""

from __future__ import annotations

import os
import sys
import threading


def watch_router_stdin() -> None:
    """In a child a router spawned (``LLAMA_SERVER_ROUTER_PORT`` set): exit when the router's end
    of stdin closes, so that no child outlives its router."""
    if "LLAMA_SERVER_ROUTER_PORT" not in os.environ:
        return

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        os._exit(0)

    threading.Thread(target=watch, name="kvserve-router-stdin", daemon=True).start()
