"""pytest plugin for llama.cpp's server tests: run them with local GGUF files, never downloading.

Every ``utils.ServerPreset`` (and a bare ``utils.ServerProcess``) gets the file named by
UPSTREAM_MODEL_DEFAULT (SmolLM2) instead of its Hugging Face repository; ``tinygemma3`` gets
UPSTREAM_MODEL_GEMMA3 (Gemma 3). The router preset keeps having no model. ``load_all`` (which
starts each preset once to download its model) has nothing to fetch. Each pytest-xdist worker
gets a free port of its own (the suite's default is 8080 + 10 * worker). Nothing else is changed.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import utils  # the suite's own module (its directory is on PYTHONPATH)

DEFAULT = os.environ["UPSTREAM_MODEL_DEFAULT"]
GEMMA3 = os.environ["UPSTREAM_MODEL_GEMMA3"]


def _local(preset: Any, model: str) -> Any:
    def make() -> utils.ServerProcess:
        server = preset()
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_file = model
        return server

    return staticmethod(make)


for _name, _fn in list(vars(utils.ServerPreset).items()):
    if isinstance(_fn, staticmethod) and _name not in ("load_all", "router"):
        setattr(utils.ServerPreset, _name, _local(_fn.__func__, GEMMA3 if _name == "tinygemma3" else DEFAULT))
utils.ServerPreset.load_all = staticmethod(lambda: None)
utils.ServerProcess.model_hf_repo = None
utils.ServerProcess.model_hf_file = None
utils.ServerProcess.model_file = DEFAULT


@pytest.fixture(scope="session", autouse=True)
def free_port_per_worker(configure_worker_port: None) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        os.environ["PORT"] = str(sock.getsockname()[1])
