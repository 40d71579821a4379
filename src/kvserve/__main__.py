"""kvserve command line: ``kvserve [llama-server flags]`` / ``python -m kvserve``."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

# torch's CPU thread pool (OpenMP) keeps its own wait policy: its workers spin between kernels,
# which on otherwise idle cores doubles decode speed against sleeping workers (bench/wait_policy.py:
# SmolLM2 71 vs 33 tok/s on a quiet 2-core machine). Where other processes share the cores,
# spinning workers starve the busy ones (under 2 tok/s at load average ~15); set
# OMP_WAIT_POLICY=PASSIVE in the environment there. The test suite does (tests/conftest.py).
from .config import Config, ConfigError, load_config


def _log_level(verbosity: int) -> int:
    if verbosity >= 5:
        return logging.DEBUG
    if verbosity >= 3:
        return logging.INFO
    if verbosity == 2:
        return logging.WARNING
    return logging.ERROR


# The vocabulary arrays of the GGUF metadata (151k strings each for Qwen2.5's vocabulary).
_VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                 "tokenizer.ggml.scores")


def drop_load_temporaries(loaded: Any) -> None:
    """Once the tokenizer and the engine exist: the metadata's vocabulary arrays (read once by
    the tokenizer, which keeps what it needs) and the source lines importing cached go, and
    freed memory goes back to the OS. On the CPU, where the process's resident memory is the
    server's footprint, the libraries' pages that only loading read are unmapped too
    (``heap.drop_library_pages``: ~60 MiB of torch's)."""
    import linecache

    from .model.heap import drop_library_pages, release_free_memory

    for key in _VOCAB_ARRAYS:
        loaded.metadata.pop(key, None)
    linecache.clearcache()  # source lines importing read (torch's config modules: ~1.7 MiB)
    release_free_memory()
    if loaded.device.type == "cpu":
        drop_library_pages()


def build_engine(cfg: Config):
    """Load the model and build the engine the config describes (not started)."""
    import torch

    from .engine.engine import Engine, EngineOptions
    from .model.chat_template import ChatTemplate
    from .model.files import default_model_path
    from .model.gguf_meta import read_gguf
    from .model.loader import DTYPES, load_gguf
    from .model.tokenizer import Tokenizer

    e, s = cfg.engine, cfg.server
    if e.threads:
        torch.set_num_threads(e.threads)
    device = e.resolve_device(torch.cuda.is_available())
    dtype = DTYPES[e.resolve_dtype(device)]
    if e.cache_type_k != e.cache_type_v:
        raise ConfigError("error: -ctk and -ctv must name the same type in kvserve (one KV page layout)")
    path = e.model_path or default_model_path()
    if device == "cpu":
        from .model.heap import drop_library_pages

        drop_library_pages()  # what importing read, before the load's peak (again once loaded)
    # the tokenizer first, from the header: its build's temporaries (Qwen2.5: ~60 MiB for a 151k
    # vocabulary) peak before the weights are resident, not on top of them
    contents = read_gguf(path)
    tokenizer = Tokenizer.from_metadata(contents.metadata)
    loaded = load_gguf(path, dtype=dtype, device=device, weights=e.resolve_weights(device), rope=e.rope,
                       contents=contents)
    del contents
    log = logging.getLogger("kvserve")
    log.info(
        "model loaded: %s (%s, %d layers) in %.1f s", loaded.cfg.name, loaded.cfg.arch, loaded.cfg.n_layer, loaded.load_s
    )
    if loaded.summary is not None:
        log.info("%s", loaded.summary.line())
    try:
        template = ChatTemplate.from_metadata(loaded.metadata, s.chat_template, jinja=s.jinja)
    except ValueError as err:
        raise ConfigError(f"error: {err}") from None
    plan = e.ctx_plan(loaded.cfg.n_ctx_train)
    opts = EngineOptions(
        n_slots=plan.n_parallel,
        n_ctx=plan.n_ctx,
        n_ctx_slot=plan.n_ctx_slot,
        n_batch=e.n_batch,
        n_ubatch=e.n_ubatch,
        cont_batching=e.cont_batching,
        context_shift=e.context_shift,
        slot_prompt_similarity=e.slot_prompt_similarity,
        n_predict=e.n_predict,
        cache_ram_mib=e.cache_ram_mib,
        cache_idle_slots=e.cache_idle_slots,
        kv_dtype=DTYPES[e.cache_type_k],
        special=s.special,
        slot_save_path=s.slot_save_path,
        warmup=e.warmup,
    )
    logging.getLogger("kvserve").info(
        "initializing, n_slots = %d, n_ctx_slot = %d, kv_unified = %s", plan.n_parallel, plan.n_ctx_slot,
        str(plan.kv_unified).lower(),
    )
    engine = Engine(loaded, tokenizer, template, opts)
    drop_load_temporaries(loaded)
    mem = engine.memory_info()
    budget = mem["cache_ram_budget_bytes"]
    log.info(
        "memory: weights %.1f MiB (%s), KV pool %.1f MiB (%d pages), prompt-cache budget %s%s",
        mem["weight_bytes"] / 2**20, loaded.weights, mem["kv_pool_bytes"] / 2**20, mem["kv_pool_pages"],
        "unlimited" if budget < 0 else f"{budget / 2**20:.1f} MiB",
        " of host RAM for pages the device pool evicts (host tier)" if mem["host_tier"] else "",
    )
    return engine


def _release_device_memory() -> None:
    """After the engine is dropped (sleeping): freed host memory back to the OS, and CUDA's cache."""
    import torch

    from .model.heap import release_free_memory

    release_free_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class LoadingEngine:
    """Stands in for the engine while the model loads: the HTTP server answers 503
    ``Loading model`` (``ready`` is false) until ``attach`` hands over the real engine."""

    def __init__(self, n_slots: int) -> None:
        self.n_slots = n_slots
        self._engine: Any = None

    def attach(self, engine: Any) -> None:
        self._engine = engine

    @property
    def ready(self) -> bool:
        return self._engine is not None and bool(self._engine.ready)

    def __getattr__(self, name: str) -> Any:
        engine = self.__dict__.get("_engine")
        if engine is None:
            raise AttributeError(name)
        return getattr(engine, name)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = load_config(argv, os.environ)
    except ConfigError as e:
        print(e.message, file=sys.stderr)
        sys.exit(1)
    log_args = dict(
        level=_log_level(cfg.server.verbosity) if not cfg.server.log_disable else logging.CRITICAL,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        filename=cfg.server.log_file,
    )
    logging.basicConfig(**log_args)
    from .server.agent_tools import ToolSetupError

    if cfg.server.model_path is None:  # no model: llama-server's router (router/)
        if "LLAMA_SERVER_ROUTER_PORT" in os.environ:  # a router's child is never a router itself
            print("error: no model to load: set `model = PATH` in the model's --models-preset section",
                  file=sys.stderr)
            sys.exit(1)
        from .router.serve import serve_router

        s = cfg.server
        serve_router(cfg, argv, s.models_dir, s.models_max, s.models_autoload,
                     s.models_preset)
        return
    from .router.child import watch_router_stdin
    from .server.http_server import serve

    watch_router_stdin()
    n_slots = cfg.engine.resolve_parallel().n_parallel
    engine: Any
    from .engine_process import engine_process_wanted

    if engine_process_wanted(cfg):
        from .engine_process import engine_process, text_side_or_exit
        from .server.remote_engine import RemoteEngine

        from .server import http_workers
        from .server.settings import ServerSettings

        n_http = http_workers.wanted(ServerSettings.from_config(cfg, n_slots=n_slots), True)
        remote = RemoteEngine(n_slots, engine_process, (list(argv), log_args), lambda: text_side_or_exit(cfg),
                              workers=n_http)
        logging.getLogger("kvserve").info("engine process started (pid %d)", remote.process.pid)

        def more_http(port: int) -> http_workers.Workers:
            w = http_workers.Workers()
            w.start(remote.worker_conns, n_slots, list(argv), log_args, port, text_side_or_exit)
            remote.others_ready = w.listening  # /health says ready once every HTTP process listens
            return w

        try:
            serve(remote, cfg, more_http if n_http > 1 else None)
        except ToolSetupError as e:
            print(f"tools setup failed: {e}", file=sys.stderr, flush=True)
            os._exit(1)
        finally:
            remote.close()
        return
    if cfg.engine.sleep_idle_seconds > 0:
        from .engine.sleeper import SleepingEngine

        engine = SleepingEngine(lambda: build_engine(cfg), cfg.engine.sleep_idle_seconds, n_slots,
                                release=_release_device_memory)
    else:
        engine = LoadingEngine(n_slots)

    def load() -> None:
        try:
            real = build_engine(cfg)
            real.start()
            engine.attach(real)
            from .model.heap import freeze

            freeze()  # what start-up left lives as long as the server: out of every full collection
        except ConfigError as e:
            print(e.message, file=sys.stderr)
            os._exit(1)
        except Exception:  # noqa: BLE001 - a model that cannot load ends the process
            logging.getLogger("kvserve").exception("failed to load the model")
            os._exit(1)

    threading.Thread(target=load, name="kvserve-load", daemon=True).start()
    try:
        serve(engine, cfg)
    except ToolSetupError as e:
        print(f"tools setup failed: {e}", file=sys.stderr, flush=True)
        os._exit(1)


if __name__ == "__main__":
    main()
