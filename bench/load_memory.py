"""Where kvserve's resident memory goes, phase by phase, and the whole server against llama-server.

Part 1, in-process (one fresh interpreter per model, the steps ``python -m kvserve`` takes):

    python            the bare interpreter
    import torch      torch and numpy
    import kvserve    the modules a server imports before the model (HTTP server, engine)
    GGUF header       metadata and tensor infos parsed; before it, as the server does on the
                      CPU, the libraries' pages importing read leave the resident set
                      (``heap.drop_library_pages``, where the tree has it)
    tokenizer         ``Tokenizer.from_metadata`` from the header, as the server builds it
                      before the weights (a tree that loads the weights first: after them, and
                      its header is dropped and parsed again by ``load_gguf``)
    weights           ``load_gguf`` (repacked weights)
    chat template     ``ChatTemplate.from_metadata``
    engine            ``Engine(...)`` with ``-np 1 -c 4096`` (KV pool, sampling buffers), then the
                      load's temporaries dropped as the server drops them
    prefill+decode    one ~700-token prompt then 32 greedy tokens through the engine

For each: the RSS after it and the peak during it (the kernel's VmHWM, reset between phases).

Part 2, servers (``--llama-server PATH`` adds the peer): ``python -m kvserve -np 1 -c 4096 -m M``
and ``llama-server -np 1 -c 4096 -m M``, each started fresh; RSS of the process tree sampled at
10 Hz: at ``/health`` ready, after one ~700-token prompt with 32 new tokens, and the peak over
the server's life (load included). Ratio = kvserve / llama-server.

    python bench/load_memory.py [--model PATH ...] [--llama-server PATH] [--no-servers]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import MIB, ServerProcess, make_text, print_conditions, print_table, ratio  # noqa: E402
from proc_memory import MemorySampler, peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
PROMPT_WORDS = 640  # ~700 tokens
N_PREDICT = 32


# -- part 1: in-process phases (runs in a child interpreter) ---------------------------------------
def child(model: str) -> None:
    out: list[dict[str, Any]] = []

    def phase(name: str) -> None:
        out.append({"phase": name, "rss": rss_bytes(os.getpid()) / MIB, "peak": peak_rss_bytes() / MIB})
        reset_peak_rss()

    phase("python")
    import numpy  # noqa: F401
    import torch

    phase("import torch")
    sys.path.insert(0, SRC)
    from kvserve.__main__ import drop_load_temporaries
    from kvserve.engine.engine import Engine, EngineOptions
    from kvserve.engine.request import ErrorEvent, FinalEvent, GenerationRequest, RequestParams
    from kvserve.engine.sampling_params import SamplingParams
    from kvserve.model.chat_template import ChatTemplate
    from kvserve.model.gguf_meta import read_gguf
    from kvserve.model.loader import load_gguf
    from kvserve.model.tokenizer import Tokenizer
    from kvserve.server import http_server  # noqa: F401

    phase("import kvserve")
    try:  # as build_engine does on the CPU before loading (trees that have it)
        from kvserve.model.heap import drop_library_pages
    except ImportError:
        pass
    else:
        drop_library_pages()
    gf = read_gguf(model)
    n_meta = len(gf.metadata)
    if "contents" in inspect.signature(load_gguf).parameters:  # as build_engine does: tokenizer first
        phase("GGUF header")
        tok = Tokenizer.from_metadata(gf.metadata)
        phase("tokenizer")
        loaded = load_gguf(model, contents=gf)
        del gf
        phase("weights")
    else:  # (trees that load the weights first and parse the header again)
        del gf
        phase("GGUF header")
        loaded = load_gguf(model)
        phase("weights")
        tok = Tokenizer.from_metadata(loaded.metadata)
        phase("tokenizer")
    tpl = ChatTemplate.from_metadata(loaded.metadata)
    phase("chat template")
    engine = Engine(loaded, tok, tpl, EngineOptions(n_slots=1, n_ctx=4096, kv_dtype=torch.float16))
    drop_load_temporaries(loaded)
    phase("engine")
    engine.start()
    try:
        ids = tok.encode(make_text(7, PROMPT_WORDS), True, False)
        done = threading.Event()
        got: list[Any] = []

        def emit(ev: Any) -> None:
            if isinstance(ev, (FinalEvent, ErrorEvent)):
                got.append(ev)
                done.set()

        greedy = SamplingParams(temperature=0.0, top_k=1, ignore_eos=True)
        engine.submit(GenerationRequest(engine.new_request_id(), ids,
                                        RequestParams(n_predict=N_PREDICT, sampling=greedy)), emit)
        if not done.wait(600) or not isinstance(got[0], FinalEvent):
            raise RuntimeError(f"generation failed: {got}")
        n_out = N_PREDICT
    finally:
        engine.stop()
    phase("prefill+decode")
    mem = engine.memory_info()
    print(json.dumps({"phases": out, "n_meta": n_meta, "prompt_n": len(ids), "n_out": n_out,
                      "weight_bytes": mem["weight_bytes"], "kv_pool_bytes": mem["kv_pool_bytes"],
                      "summary": loaded.summary.line() if loaded.summary else loaded.weights}))


def phases(model: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", model], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"phase run failed for {model}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- part 2: servers --------------------------------------------------------------------------------
def server_memory(cmd: str) -> dict[str, float]:
    import httpx

    with ServerProcess(cmd) as srv:
        mem = MemorySampler(srv.pid).start()
        try:
            srv.wait_ready()
            ready = mem.sample()
            body = {"prompt": make_text(7, PROMPT_WORDS), "n_predict": N_PREDICT, "temperature": 0,
                    "ignore_eos": True, "cache_prompt": False}
            r = httpx.post(srv.url + "/completion", json=body, timeout=900)
            r.raise_for_status()
            time.sleep(0.3)
            after = mem.sample()
        finally:
            mem.stop()
    return {"ready": ready / MIB, "after": after / MIB, "peak": mem.peak / MIB}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=None, help="GGUF file (repeatable; default SmolLM2)")
    p.add_argument("--llama-server", help="path of llama-server: measured beside kvserve")
    p.add_argument("--no-servers", action="store_true", help="part 1 only")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if not args.model:
        sys.path.insert(0, SRC)
        from kvserve.model.files import default_model_path

        args.model = [default_model_path()]
    common = "-np 1 -c 4096 --host 127.0.0.1"
    kv_cmd = f"python -m kvserve {common}"
    print_conditions("kvserve resident memory by load phase, and against llama-server", {
        "phases": "fresh interpreter per model; RSS after each phase, peak (VmHWM) during it; "
                  f"engine -np 1 -c 4096, KV f16; a {PROMPT_WORDS}-word prompt + {N_PREDICT} greedy tokens",
        "servers": f"`{kv_cmd} -m MODEL`" + (f", `{args.llama_server} {common} -m MODEL`" if args.llama_server
                                              else "") + "; process-tree RSS at 10 Hz",
        "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "unset"),
    })
    for model in args.model:
        got = phases(model)
        name = os.path.basename(model)
        print(f"## {name}\n\n{got['summary']}; KV pool {got['kv_pool_bytes'] / MIB:.1f} MiB; "
              f"prompt {got['prompt_n']} tokens, {got['n_out']} generated\n")
        print_table(["phase", "RSS after MiB", "peak during MiB"],
                    [[ph["phase"], ph["rss"], ph["peak"]] for ph in got["phases"]], digits=0)
    if args.no_servers:
        return 0
    rows = []
    for model in args.model:
        k = server_memory(f"{kv_cmd} -m {shlex.quote(model)}")
        ll = server_memory(f"{shlex.quote(args.llama_server)} {common} -m {shlex.quote(model)}") \
            if args.llama_server else None

        def cell(key: str) -> str:
            if ll is None:
                return f"{k[key]:,.0f}"
            return f"{k[key]:,.0f} / {ll[key]:,.0f} ({ratio(k[key], ll[key]):.2f}×)"

        rows.append([os.path.basename(model), cell("ready"), cell("after"), cell("peak")])
    who = "kvserve / llama-server" if args.llama_server else "kvserve"
    print_table(["model", f"ready MiB {who}", "after a request MiB", "peak MiB"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
