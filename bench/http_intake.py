"""The HTTP side's Python per request: a 64-request burst through the server's ASGI app, in process.

    python bench/http_intake.py [--tree NAME=SRC ...] [--reps 10] [--inline]

The app is ``create_app`` as served (the pre-routing middleware, the sleep gate, routing, the
handlers, validation, tokenization with the trie of long texts' beginnings, the response's start)
over a stub engine that pickles each request as the engine process's pipe does and answers its
first token on the next turn of the event loop; no socket, no model. The bodies are those of the
cached round of ``bench/throughput.py --workloads shared --prefix-words 600 --prompt-words 10
--burst`` (a ~2,000-token shared prefix, distinct questions), sent again after three warm-up bursts
(so the trie holds them, as in a server's cached round). Each tree runs in a fresh interpreter
(``PYTHONPATH=SRC``), the heap frozen after start-up as the server's. Printed per tree: the mean and
the last of the 64 first tokens (ms from the burst's start; medians over ``--reps`` bursts).
``--inline`` prepares every body on the event loop (no prepare threads).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_text, print_table  # noqa: E402

N = 64


def child(model: str, reps: int, inline: bool) -> dict[str, list[float]]:
    import asyncio
    import gc
    import pickle
    import time

    from kvserve.config import load_config
    from kvserve.engine.request import TokenEvent
    from kvserve.engine_process import text_side
    from kvserve.server import completions
    from kvserve.server.app import create_app

    if inline:
        completions.PREPARE_IN_THREAD_BYTES = 1 << 62
    cfg = load_config(["-m", model, "-np", str(N), "-c", "262144"], {})
    tok, template = text_side(cfg)

    class Stub:
        n_slots, ready, n_ctx_slot, rerank_template = N, True, 4096, None
        tokenizer, chat_template = tok, template
        loop: asyncio.AbstractEventLoop

        def __init__(self) -> None:
            self._id = 0

        def new_request_id(self) -> int:
            self._id += 1
            return self._id

        def submit(self, req, emit) -> None:  # type: ignore[no-untyped-def]
            pickle.dumps(("submit", req), protocol=pickle.HIGHEST_PROTOCOL)  # as RemoteEngine's pipe
            self.loop.call_soon(emit, TokenEvent(req.id, req.index, " a", [10], 1, len(req.prompt_tokens)))

        def cancel(self, request_id: int) -> None:
            pass

    engine = Stub()
    app = create_app(engine, cfg.server)
    prefix = make_text(7 + N, 600)
    bodies = [json.dumps({"prompt": f"{prefix}\n\nQuestion {i}.0: {make_text(1_000_000 * (1 + N) + 1000 * i, 12)}"
                                    "\nAnswer:", "n_predict": 64, "temperature": 0, "ignore_eos": True,
                          "stream": True}).encode() for i in range(N)]

    async def one(body: bytes, firsts: list[float]) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/completion", "raw_path": b"/completion", "query_string": b"",
                 "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                 "headers": [(b"host", b"x"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(body)).encode())]}
        sent = False
        first = asyncio.Event()

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(msg: dict) -> None:
            if msg["type"] == "http.response.body" and msg.get("body"):
                firsts.append(time.perf_counter())
                first.set()

        task = asyncio.ensure_future(app(scope, receive, send))
        await first.wait()
        task.cancel()  # the client goes once it has its first token
        try:
            await task
        except BaseException:  # noqa: BLE001
            pass

    async def burst() -> list[float]:
        engine.loop = asyncio.get_running_loop()
        firsts: list[float] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(one(b, firsts) for b in bodies))
        return [(f - t0) * 1e3 for f in firsts]

    async def run() -> dict[str, list[float]]:
        for _ in range(3):
            await burst()
        out: dict[str, list[float]] = {"mean": [], "last": []}
        for _ in range(reps):
            f = await burst()
            out["mean"].append(sum(f) / len(f))
            out["last"].append(max(f))
        return out

    gc.collect()
    gc.freeze()
    return asyncio.run(run())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeatable; default this tree)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2, help="times each tree runs, the trees alternated")
    p.add_argument("--inline", action="store_true")
    p.add_argument("--model", help="GGUF (default: a random-weight file of the 1B vocabulary)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.reps, args.inline)))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = [t.split("=", 1) for t in args.tree] or [["this", os.path.join(here, "src")]]
    model = args.model
    if model is None:
        sys.path.insert(0, trees[0][1])
        from kvserve.model.synth import SynthSpec, write_random_gguf

        model = os.path.join(tempfile.mkdtemp(), "vocab.gguf")
        write_random_gguf(model, SynthSpec(arch="llama", n_vocab=49152, n_layer=1, n_embd=64, n_ff=64, tied=True))
    print(f"{os.cpu_count()} cores; {N} requests a burst, medians of {args.reps} bursts, trees alternated "
          f"{args.rounds}x{'; bodies prepared on the event loop' if args.inline else ''}\n")
    rows = []
    for rnd in range(args.rounds):
        for name, src in trees:
            rest = os.environ.get("PYTHONPATH", "")  # the tree first, then the libraries
            env = dict(os.environ, PYTHONPATH=src + (os.pathsep + rest if rest else ""))
            cmd = [sys.executable, os.path.abspath(__file__), "--child", model, "--reps", str(args.reps)]
            proc = subprocess.run(cmd + (["--inline"] if args.inline else []), env=env, capture_output=True,
                                  text=True)
            if proc.returncode:
                sys.exit(f"{name}: the burst failed\n{proc.stderr}")
            out = proc.stdout
            res = json.loads(out.strip().splitlines()[-1])
            rows.append([rnd + 1, name, round(statistics.median(res["mean"]), 2),
                         round(statistics.median(res["last"]), 2), round(min(res["mean"]), 2),
                         round(max(res["mean"]), 2)])
    print_table(["round", "tree", "first token mean ms", "last first token ms", "mean: min", "mean: max"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
