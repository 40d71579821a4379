"""The engine in a process of its own beside the HTTP side (``KVSERVE_ENGINE_PROCESS``).

``python -m kvserve`` then serves HTTP in the process it started as (``server/remote_engine``)
and runs the engine in a spawned process (``engine_process``, ``engine/host``): two
interpreters, so that the requests' intake and the engine's steps never wait for each other's
Python.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from .config import Config, ConfigError, load_config


def engine_process_wanted(cfg: Config) -> bool:
    """Whether the engine runs in a process of its own beside the HTTP side (``KVSERVE_ENGINE_PROCESS``:
    1 on, 0 off; by default on where the model runs on CUDA, where a step's host work is the engine's
    Python and a burst's intake would wait with it for one interpreter). Not with
    ``--sleep-idle-seconds`` (the sleeping engine is dropped and rebuilt in the serving process)."""
    want = os.environ.get("KVSERVE_ENGINE_PROCESS", "")
    if cfg.engine.sleep_idle_seconds > 0:
        if want and want != "0":
            logging.getLogger("kvserve").warning(
                "KVSERVE_ENGINE_PROCESS=%s: not with --sleep-idle-seconds; the engine runs in the serving process", want)
        return False
    if want:
        return want != "0"
    if cfg.engine.device == "cpu":
        return False
    import torch

    try:
        return cfg.engine.resolve_device(torch.cuda.is_available()) == "cuda"
    except ConfigError:  # reported by the load as before (--device cuda without CUDA)
        return False


def text_side(cfg: Config) -> tuple[Any, Any]:
    """The tokenizer and chat template of the model file, as ``build_engine`` builds them."""
    from .model.chat_template import ChatTemplate
    from .model.files import default_model_path
    from .model.gguf_meta import read_gguf
    from .model.tokenizer import Tokenizer

    contents = read_gguf(cfg.engine.model_path or default_model_path())
    tokenizer = Tokenizer.from_metadata(contents.metadata)
    try:
        template = ChatTemplate.from_metadata(contents.metadata, cfg.server.chat_template, jinja=cfg.server.jinja)
    except ValueError as err:
        raise ConfigError(f"error: {err}") from None
    return tokenizer, template


def engine_process(conn: Any, argv: list[str], log_args: dict[str, Any], more: Sequence[Any] = ()) -> None:
    """The engine process (``KVSERVE_ENGINE_PROCESS``): the configuration of ``argv`` (and the
    environment, inherited), load, start, then serve the engine to the HTTP process over
    ``conn`` until it closes, and to the other HTTP processes (``server/http_workers``) over
    ``more`` meanwhile."""
    # Ctrl-C reaches every process of the terminal's group: the HTTP side shuts down, then closes
    # the pipe, and that ends this process (an interrupt here would end it first, the HTTP side
    # then reporting a lost engine)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(**log_args)
    cfg = load_config(argv, os.environ)
    from .__main__ import build_engine
    from .engine.host import EngineHost
    from .grammar.compiler import set_process_compiler
    from .model.heap import freeze

    try:
        engine = build_engine(cfg)
        engine.start()
    except ConfigError as e:
        print(e.message, file=sys.stderr, flush=True)
        os._exit(1)
    except Exception:  # noqa: BLE001 - a model that cannot load ends the server
        logging.getLogger("kvserve").exception("failed to load the model")
        os._exit(1)
    set_process_compiler(lambda: engine.grammar_compiler)
    freeze()
    for i, other in enumerate(more):
        threading.Thread(target=EngineHost(engine, other).serve, name=f"kvserve-host-{i + 1}", daemon=True).start()
    EngineHost(engine, conn).serve()
    engine.stop()
    from .engine import ttft_trace

    ttft_trace.write()  # KVSERVE_TTFT_TRACE: a spawned process's exit runs no atexit hooks
    os._exit(0)


def text_side_or_exit(cfg: Config) -> tuple[Any, Any]:
    try:
        return text_side(cfg)
    except ConfigError as e:
        print(e.message, file=sys.stderr, flush=True)
        os._exit(1)
