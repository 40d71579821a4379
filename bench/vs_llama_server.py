"""kvserve against the real llama-server on the same GGUF files, one model and one server at a time.

Per model and server (each started fresh with ``-np 1 -c 4096`` and its default threads):

    decode      a ~40-token prompt, a streamed 128-token greedy reply (``ignore_eos``); tok/s from
                the client's clock between the first and the last streamed token
    prompt      a fresh ~900-token prompt (new text every run: nothing cached), ``n_predict`` 1;
                tok/s = the server's ``prompt_n`` over the client's request time
    peak RSS    of the server's process tree over its whole life (load included), sampled at 10 Hz

Each measurement is the median of ``--runs`` (default 3). Ratios are kvserve / llama-server.

    python bench/vs_llama_server.py --llama-server /path/to/llama-server \\
        [--model PATH ...]     # default: the embedded SmolLM2-135M-Instruct Q4_1
        [--kvserve-args "..."] # extra kvserve flags, e.g. "--dtype f32" for the dense reference
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
from common import (  # noqa: E402
    MIB,
    ServerProcess,
    default_models,
    make_text,
    median,
    print_conditions,
    print_table,
    ratio,
)
from proc_memory import MemorySampler  # noqa: E402

SHORT_PROMPT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle on a stormy night. "
    "Describe the sea, the light and the message."
)


def decode_run(url: str, n_predict: int) -> tuple[float, int]:
    """(tok/s between the first and the last streamed token, tokens streamed)."""
    body = {"prompt": SHORT_PROMPT, "n_predict": n_predict, "temperature": 0, "top_k": 1, "stream": True,
            "ignore_eos": True, "cache_prompt": False}
    stamps: list[float] = []
    with httpx.Client(timeout=600) as c, c.stream("POST", url + "/completion", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if ev.get("content") or ev.get("tokens"):
                stamps.append(time.perf_counter())
            if ev.get("stop"):
                break
    if len(stamps) < 2:
        raise RuntimeError(f"{url}: fewer than two streamed tokens")
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def prompt_run(url: str, seed: int, n_words: int) -> tuple[float, int]:
    """(prompt tok/s, prompt tokens) for a fresh prompt."""
    body = {"prompt": make_text(seed, n_words), "n_predict": 1, "temperature": 0, "cache_prompt": False}
    t0 = time.perf_counter()
    r = httpx.post(url + "/completion", json=body, timeout=600)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    n = int(r.json()["timings"]["prompt_n"])
    return n / dt, n


def measure(cmd: str, args: argparse.Namespace, seed0: int) -> dict[str, Any]:
    with ServerProcess(cmd) as srv:
        mem = MemorySampler(srv.pid).start()
        try:
            ready_s = srv.wait_ready()
            decode_run(srv.url, 8)  # warm-up
            dec = [decode_run(srv.url, args.n_predict) for _ in range(args.runs)]
            pro = [prompt_run(srv.url, seed0 + i, args.prompt_words) for i in range(args.runs)]
        finally:
            mem.stop()
    return {
        "ready_s": ready_s,
        "decode": median([d[0] for d in dec]),
        "decode_n": dec[0][1],
        "prompt": median([p[0] for p in pro]),
        "prompt_n": pro[0][1],
        "rss": mem.peak / MIB,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", required=True, help="path of the llama-server binary")
    p.add_argument("--model", action="append", default=None, help="GGUF file (repeatable)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=640, help="words of the fresh prompt (~700 tokens)")
    p.add_argument("--kvserve-args", default="", help="extra kvserve flags")
    p.add_argument("--llama-args", default="", help="extra llama-server flags")
    args = p.parse_args(argv)
    if not args.model:
        args.model = default_models()
    common = "-np 1 -c 4096 --host 127.0.0.1"
    kv_cmd = f"python -m kvserve {common} {args.kvserve_args}".strip()
    ll_cmd = f"{shlex.quote(args.llama_server)} {common} {args.llama_args}".strip()
    print_conditions("kvserve vs llama-server, single stream on the CPU", {
        "kvserve": kv_cmd + " -m MODEL",
        "llama-server": ll_cmd + " -m MODEL",
        "decode": f"~40-token prompt, streamed {args.n_predict}-token greedy reply (ignore_eos), "
                  "client clock "
                  "first→last token",
        "prompt": f"fresh {args.prompt_words}-word prompt, n_predict 1, server prompt_n / client time",
        "runs": f"median of {args.runs} (after one warm-up reply)",
        "peak RSS": "process tree, sampled at 10 Hz over the server's life",
    })
    rows = []
    for i, model in enumerate(args.model):
        got = {}
        for name, cmd in (("kvserve", kv_cmd), ("llama-server", ll_cmd)):
            got[name] = measure(f"{cmd} -m {shlex.quote(model)}", args, seed0=1000 * (i + 1))
            print(f"{os.path.basename(model)} {name}: {got[name]}", file=sys.stderr, flush=True)
        k, ll = got["kvserve"], got["llama-server"]

        def cell(key: str, digits: int = 1) -> str:
            r = ratio(k[key], ll[key])
            return f"{k[key]:,.{digits}f} / {ll[key]:,.{digits}f} ({r:.2f}×)"

        rows.append([os.path.basename(model), cell("decode"), cell("prompt"), cell("rss", 0),
                     f"{k['prompt_n']} / {ll['prompt_n']}"])
    print_table(["model", "decode tok/s kvserve / llama-server", "cold prompt eval tok/s", "peak RSS MiB",
                 "prompt tokens"], rows)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
