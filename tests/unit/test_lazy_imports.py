"""Modules a model server imports only when a request or a mode needs them (resident memory:
each is megabytes an idle server would hold; docs/benchmarks.md §6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
# what ``python -m kvserve -m MODEL`` imports before it serves (main, then build_engine)
SERVER_IMPORTS = (
    "kvserve.__main__", "kvserve.server.http_server", "kvserve.server.agent_tools", "kvserve.router.child",
    "kvserve.engine.engine", "kvserve.model.loader", "kvserve.model.tokenizer", "kvserve.model.chat_template",
)
LAZY = ("httpx", "kvserve.router.app", "kvserve.router.pool", "kvserve.router.serve", "kvserve.model.quant.cuda_pack")


def _imported_after(modules: tuple[str, ...]) -> set[str]:
    probe = f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n" \
            "print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_model_server_does_not_import_the_http_client_or_the_router() -> None:
    loaded = _imported_after(SERVER_IMPORTS)
    assert "fastapi" in loaded and "torch" in loaded  # the probe imported the server
    assert not loaded & set(LAZY), sorted(loaded & set(LAZY))


def test_the_lazy_modules_still_import_where_used() -> None:
    loaded = _imported_after(("kvserve.server.cors_proxy", "kvserve.router.serve"))
    assert {"httpx", "kvserve.router.app"} <= loaded
