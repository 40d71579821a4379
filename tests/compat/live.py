"""Start a real ``python -m kvserve`` process on a free port and talk HTTP to it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveServer:
    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_server(*args: str, env: dict[str, str] | None = None, timeout: float = 120.0,
                 health: str = "/health", port: int | None = None, router: bool = False,
                 tls: bool = False) -> LiveServer:
    """``health``: the path polled until it answers 200 (``/PREFIX/health`` with --api-prefix).
    Without ``-m`` the server gets the embedded SmolLM2 (``router``: no model, the router).
    ``tls``: the server was given a key and certificate; it is polled over HTTPS (not verified)."""
    if not router and "-m" not in args and "--model" not in args:
        from kvserve.model.files import default_model_path

        args = ("-m", default_model_path(), *args)
    port = port if port is not None else free_port()
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "kvserve", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {open(log.name).read()[-2000:]}")
        try:
            if httpx.get(url + health, timeout=2, verify=not tls).status_code == 200:
                return LiveServer(proc, url, log.name)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # start-ups take ~2 s on 2 cores: wait for the answer, not for the poll
    proc.kill()
    raise RuntimeError("server did not become healthy")
