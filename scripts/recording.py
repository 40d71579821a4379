"""What the golden-recording scripts share: a free port, a JSON POST, and a server started for the
length of a ``with`` block (ready once ``/health`` answers 200)."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def post_json(url: str, body: object, timeout: float = 60) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@contextmanager
def serving(cmd: list[str], wait_s: float = 60) -> Iterator[str | None]:
    """Start ``cmd`` with ``--port`` appended; yields its base URL once ``/health`` answers 200, or
    None when the process exits first (a flag it refuses). The process is killed afterwards."""
    port = free_port()
    proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            if proc.poll() is not None:
                yield None
                return
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{cmd[0]} did not become ready in {wait_s:.0f} s")
            time.sleep(0.1)
        yield url
    finally:
        proc.kill()
        proc.wait()
