"""--models-preset on real processes: a router whose INI file lists two SmolLM2 models with their
own flags; each child is started with its section's flags (seen in its /props through the router)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from kvserve.model.files import default_model_path

from .live import LiveServer, start_server


def _models(srv: LiveServer) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(srv.url + "/models", timeout=10).json()["data"]}


def _wait_loaded(srv: LiveServer, name: str, timeout: float = 120) -> None:
    t0 = time.time()
    while _models(srv)[name]["status"]["value"] != "loaded":
        assert time.time() - t0 < timeout, _models(srv)[name]
        time.sleep(0.1)


def test_router_with_presets(tmp_path: Path) -> None:
    m = default_model_path()
    ini = tmp_path / "models.ini"
    ini.write_text(f"version = 1\n[*]\nc = 1024\ntemp = 0.3\n\n"
                   f"[small]\nmodel = {m}\nctx-size = 512   ; its own context\nalias = tiny\ntags = a,b\n"
                   f"load-on-startup = true\n\n"
                   f"[large]\nmodel = {m}\nLLAMA_ARG_TOP_K = 7\nno-jinja = true\n\n"
                   f"[nofile]\nc = 256\n")
    srv = start_server("--models-preset", str(ini), "-np", "1", "--temp", "0.5", "--models-max", "3", router=True)
    try:
        models = _models(srv)
        assert {"small", "large", "nofile"} <= set(models)
        assert models["small"]["source"] == "preset" and models["small"]["aliases"] == ["tiny"]
        assert models["small"]["tags"] == ["a", "b"]
        assert "ctx-size = 512\n" in models["small"]["status"]["preset"]
        _wait_loaded(srv, "small")  # load-on-startup

        # routed by name and by alias; each child has its own flags, the router's -np/--temp over all
        small = httpx.get(srv.url + "/props", params={"model": "tiny"}, timeout=30).json()
        large = httpx.get(srv.url + "/props", params={"model": "large"}, timeout=120).json()
        assert small["model_alias"] == "small" and large["model_alias"] == "large"
        assert small["default_generation_settings"]["n_ctx"] == 512
        assert large["default_generation_settings"]["n_ctx"] == 1024  # from [*]
        sp, lp = small["default_generation_settings"]["params"], large["default_generation_settings"]["params"]
        assert sp["top_k"] == 40 and lp["top_k"] == 7
        assert abs(sp["temperature"] - 0.5) < 1e-6 and abs(lp["temperature"] - 0.5) < 1e-6  # command line wins
        args = _models(srv)["large"]["status"]["args"]
        assert "--no-jinja" in args and args[args.index("--top-k") + 1] == "7"
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3

        # a section without a model file fails to load with its reason, and nothing else breaks
        r = httpx.post(srv.url + "/completion", json={"model": "nofile", "prompt": "x"}, timeout=60)
        assert r.status_code == 503 and "failed to load" in r.json()["error"]["message"]
        assert "set `model = PATH`" in srv.log()

        # ?reload=1 re-reads the file: a removed section goes, a changed running one is stopped
        events: list[dict[str, Any]] = []

        def listen() -> None:
            with httpx.stream("GET", srv.url + "/models/sse", timeout=60) as s:
                for line in s.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if events[-1]["event"] == "models_reload":
                            return

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        time.sleep(0.5)
        ini.write_text(f"[*]\nc = 1024\n[small]\nmodel = {m}\nc = 768\nalias = tiny\n")
        models = httpx.get(srv.url + "/models", params={"reload": "1"}, timeout=60).json()["data"]
        listener.join(30)
        assert {"event": "models_reload", "model": "*"} in events
        assert {"event": "status_change", "model": "small", "data": {"status": "unloaded", "exit_code": 0}} in events
        by_id = {x["id"]: x for x in models}
        assert "large" not in by_id and "nofile" not in by_id
        assert by_id["small"]["status"]["value"] == "unloaded"
        small = httpx.get(srv.url + "/props", params={"model": "small"}, timeout=120).json()
        assert small["default_generation_settings"]["n_ctx"] == 768
    finally:
        srv.stop()


def test_bad_preset_file_stops_start_up(tmp_path: Path) -> None:
    runs = []  # (process, what its stderr must say); the three start side by side
    for i, (text, message) in enumerate((("[a]\nnope = 1\n", "option 'nope' not recognized in preset 'a'"),
                                         ("[a]\n  c = 1\n", "failed to parse server config file: "))):
        ini = tmp_path / f"bad{i}.ini"
        ini.write_text(text)
        runs.append((_kvserve("--models-preset", str(ini), "--port", "0"),
                     f"error: failed to initialize router models: {message}"))
    missing = {**os.environ, "LLAMA_ARG_MODELS_PRESET": str(tmp_path / "missing.ini")}
    runs.append((_kvserve("--port", "0", env=missing), "preset file does not exist: "))
    for proc, message in runs:
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 1 and message in stderr, stderr


def _kvserve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvserve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
