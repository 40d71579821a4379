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
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports (held together while they are chosen)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
    return launch(*args, env=env, health=health, port=port, router=router, tls=tls).wait(timeout)


@dataclass
class Starting:
    """A ``python -m kvserve`` started, not yet known healthy (``launch``): several start side by
    side, each then ``wait``-ed for."""

    proc: subprocess.Popen
    url: str
    log_path: str
    health: str
    tls: bool

    def wait(self, timeout: float = 120.0) -> LiveServer:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                with open(self.log_path, encoding="utf-8", errors="replace") as f:
                    raise RuntimeError(f"server exited with {self.proc.returncode}: {f.read()[-2000:]}")
            try:
                if httpx.get(self.url + self.health, timeout=2, verify=not self.tls).status_code == 200:
                    return LiveServer(self.proc, self.url, self.log_path)
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # start-ups take ~2 s on 2 cores: wait for the answer, not for the poll
        self.proc.kill()
        raise RuntimeError("server did not become healthy")

    def stop(self) -> None:
        LiveServer(self.proc, self.url, self.log_path).stop()


def launch(*args: str, env: dict[str, str] | None = None, health: str = "/health", port: int | None = None,
           router: bool = False, tls: bool = False) -> Starting:
    """The process of ``start_server`` (same arguments), without waiting for it."""
    if not router and "-m" not in args and "--model" not in args:
        from kvserve.model.files import default_model_path

        args = ("-m", default_model_path(), *args)
    port = port if port is not None else free_port()
    log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "kvserve", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return Starting(proc, f"{'https' if tls else 'http'}://127.0.0.1:{port}", log.name, health, tls)
