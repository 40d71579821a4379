"""Router mode on real processes: kvserve started without a model serves the GGUFs of --models-dir
(here two names for SmolLM2) through one child kvserve per loaded model."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvserve.model.files import default_model_path

from .live import LiveServer, start_server

CHAT = {"max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "hello"}]}


def _status(srv: LiveServer, name: str) -> str:
    for m in httpx.get(srv.url + "/models", timeout=10).json()["data"]:
        if m["id"] == name:
            return str(m["status"]["value"])
    raise AssertionError(name)


def _wait(srv: LiveServer, name: str, want: str, timeout: float = 90) -> None:
    t0 = time.time()
    while _status(srv, name) != want:
        assert time.time() - t0 < timeout, (name, want)
        time.sleep(0.1)


def _children(srv: LiveServer) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == srv.proc.pid:
                        out.append(int(pid))
            except (OSError, IndexError, ValueError):
                pass
    return out


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta"):
        (d / f"{name}.gguf").symlink_to(default_model_path())
    return d


def test_router(models_dir: Path) -> None:
    srv = start_server("--models-dir", str(models_dir), "--models-max", "1", "-c", "512", "-np", "1",
                       router=True)
    try:
        url = srv.url
        props = httpx.get(url + "/props", timeout=10).json()
        assert props["role"] == "router" and props["max_instances"] == 1 and props["models_autoload"] is True
        assert props["build_info"].startswith("b")
        ids = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
        assert {"alpha", "beta"} <= set(ids) and ids["alpha"]["source"] == "models_dir"
        assert all(m["status"]["value"] == "unloaded" for m in ids.values())

        # llama-server's errors: no model, an unknown one (before any stream starts)
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model name is missing from the request"
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": "nope", "stream": True}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model 'nope' not found"

        # autoload: the first request loads alpha and streams its answer through the router
        with httpx.stream("POST", url + "/v1/chat/completions", json={**CHAT, "model": "alpha", "stream": True},
                          timeout=120) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[0]["model"] == "alpha"
        assert _status(srv, "alpha") == "loaded" and len(_children(srv)) == 1
        direct = httpx.post(url + "/completion", json={"model": "alpha", "prompt": "Hi", "n_predict": 2,
                                                       "temperature": 0}, timeout=60)
        assert direct.status_code == 200 and direct.json()["tokens_predicted"] == 2
        assert httpx.get(url + "/props", params={"model": "alpha"}, timeout=10).json()["model_alias"] == "alpha"

        # --models-max 1: loading beta stops alpha (least recently used)
        assert httpx.post(url + "/models/load", json={"model": "beta"}, timeout=10).json() == {"success": True}
        _wait(srv, "beta", "loaded")
        assert _status(srv, "alpha") == "unloaded"
        r = httpx.post(url + "/models/load", json={"model": "beta"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is already running"
        r = httpx.post(url + "/models/load", json={"model": "nope"}, timeout=10)
        assert r.status_code == 404

        # unload; then a request without autoload is refused, with autoload it loads again
        assert httpx.post(url + "/models/unload", json={"model": "beta"}, timeout=10).json() == {"success": True}
        _wait(srv, "beta", "unloaded")
        r = httpx.post(url + "/models/unload", json={"model": "beta"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is not running"
        r = httpx.post(url + "/tokenize?autoload=false", json={"model": "beta", "content": "hi"}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
        r = httpx.post(url + "/tokenize", json={"model": "beta", "content": "hi"}, timeout=120)
        assert r.status_code == 200 and r.json()["tokens"]

        # no downloads; a models-dir model is not removable
        assert httpx.post(url + "/models", json={"model": "org/x:Q8_0"}, timeout=10).status_code == 501
        r = httpx.delete(url + "/models", params={"model": "alpha"}, timeout=10)
        assert r.status_code == 400 and "not removable" in r.json()["error"]["message"]
        assert httpx.delete(url + "/models", params={"model": "nope"}, timeout=10).status_code == 404

        # a file added later appears with ?reload=1
        (models_dir / "gamma.gguf").symlink_to(default_model_path())
        ids2 = {m["id"] for m in httpx.get(url + "/models", params={"reload": "1"}, timeout=10).json()["data"]}
        assert "gamma" in ids2
    finally:
        kids = _children(srv)
        srv.stop()
    deadline = time.time() + 1.0  # the children go with the router, within a second
    while not (gone := all(not os.path.exists(f"/proc/{pid}") or "zombie" in _state(pid) for pid in kids)):
        if time.time() > deadline:
            break
        time.sleep(0.05)
    assert gone, kids


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return f.read()
    except OSError:
        return "zombie"


def test_router_without_autoload_under_an_api_prefix() -> None:
    srv = start_server("--models-max", "2", "--no-models-autoload", "--api-prefix", "/p", "-c", "512", "-np", "1",
                       router=True, health="/p/health")
    try:
        url = srv.url + "/p"
        props: dict[str, Any] = httpx.get(url + "/props", timeout=10).json()
        assert (props["role"], props["max_instances"], props["models_autoload"]) == ("router", 2, False)
        name = httpx.get(url + "/models", timeout=10).json()["data"][0]["id"]  # the embedded model
        r = httpx.post(url + "/v1/chat/completions", json={**CHAT, "model": name}, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["message"] == "model is not loaded"
        assert httpx.post(url + "/models/load", json={"model": name}, timeout=10).status_code == 200
        t0 = time.time()
        while True:
            m = httpx.get(url + "/models", timeout=10).json()["data"][0]
            if m["status"]["value"] == "loaded":
                break
            assert time.time() - t0 < 90
            time.sleep(0.1)
        r = httpx.post(url + "/tokenize", json={"model": name, "content": "hi"}, timeout=30)
        assert r.status_code == 200 and r.json()["tokens"]
    finally:
        srv.stop()


def test_a_model_that_cannot_load_fails_its_request(tmp_path: Path) -> None:
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file")
    srv = start_server("--models-dir", str(tmp_path), router=True)
    try:
        r = httpx.post(srv.url + "/completion", json={"model": "broken", "prompt": "x"}, timeout=120)
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]
        m = next(m for m in httpx.get(srv.url + "/models", timeout=10).json()["data"] if m["id"] == "broken")
        assert m["status"]["value"] == "unloaded" and m["status"]["failed"] is True
        assert m["status"]["exit_code"] != 0
    finally:
        srv.stop()
