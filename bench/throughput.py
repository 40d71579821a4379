"""HTTP throughput: streamed /completion requests at several concurrencies, against kvserve and
optionally a peer (any llama-server-compatible command) with the same workload.

Per (workload, concurrency): C client streams run at once, each sending ``--rounds`` requests
one after another. Reported: aggregate decode tok/s (all generated tokens over the wall time of
the level), per-stream decode tok/s (median over requests of (n - 1) / (t_last - t_first)),
TTFT p50/p95, mean prompt tokens evaluated and reused (``timings.prompt_n`` / ``cache_n``),
the engine's scheduler Python time share when the server's /metrics exposes it, and the CPU
time of this client process over the wall time (near 100% the client, one Python process on one
core, is what sets the pace, not the server).

Workloads (texts are generated from fixed seeds, so every server gets identical prompts):
    distinct   every request has its own prompt (no prefix in common with any other)
    shared     per concurrency level one fresh common prefix (``--prefix-words``) plus a
               distinct question per request: the first requests of a level pay for the prefix

    python bench/throughput.py --cmd "python -m kvserve -m M.gguf -np 16 -c 16384 --metrics"
    python bench/throughput.py --url http://127.0.0.1:8080
    python bench/throughput.py --cmd "python -m kvserve -m M.gguf -np 16" --peer "llama-server -m M.gguf -np 16"
    python bench/throughput.py --cmd "python -m kvserve -m M.gguf -np 4" --concurrency 1,4 --n-predict 8 \\
        --prompt-words 40 --prefix-words 100          # quick check
    python bench/throughput.py --cmd "python -m kvserve -m M.gguf -np 8" --concurrency 8 --workloads shared \\
        --rounds 2 --burst                            # a burst over a fresh prefix, then again cached

With ``--rounds`` above 1 a per-round table follows (TTFT mean / p50 / p95, prompt_n, cache_n).

A command gets ``--port P`` appended (or write ``{port}`` where it goes). Requests carry
``temperature 0``, ``ignore_eos true``, ``n_predict``; ``cache_prompt`` is left to the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
import sse_client  # noqa: E402
from common import (  # noqa: E402
    ReqResult,
    ServerProcess,
    fmt,
    make_text,
    median,
    percentile,
    print_conditions,
    print_table,
    ratio,
    scrape_metrics,
    stream_completion,
)


@dataclass
class Level:
    server: str
    workload: str
    concurrency: int
    wall_s: float
    results: list[ReqResult] = field(default_factory=list)
    sched_share: float | None = None
    rounds: list[int] = field(default_factory=list)  # round of each result
    client_cpu_s: float | None = None  # CPU time of this client process over the level
    # per burst round, the server's mean time to first token by stage (ms), when its /metrics
    # has them (kvserve:first_token_seconds_total{stage=...})
    round_stages: list[dict[str, float] | None] = field(default_factory=list)

    @property
    def client_cpu_pct(self) -> float | None:
        """The client's CPU time over the level's wall time: near 100 the client (one Python
        process, one core) and not the server sets the pace."""
        return 100 * self.client_cpu_s / self.wall_s if self.client_cpu_s is not None and self.wall_s > 0 else None

    def of_round(self, rnd: int) -> Level:
        res = [r for r, k in zip(self.results, self.rounds) if k == rnd]
        st = [self.round_stages[rnd]] if rnd < len(self.round_stages) else []
        return Level(self.server, self.workload, self.concurrency, self.wall_s, res, None, [rnd] * len(res),
                     None, st)

    def stage_ms(self, stage: str) -> float | None:
        """The server's mean ms of ``stage`` over this (one-round) level, if it has them."""
        st = self.round_stages[0] if len(self.round_stages) == 1 else None
        return None if st is None else st.get(stage)

    @property
    def ok(self) -> list[ReqResult]:
        return [r for r in self.results if r.error is None]

    @property
    def agg_tps(self) -> float | None:
        return sum(r.n_gen for r in self.ok) / self.wall_s if self.wall_s > 0 and self.ok else None

    @property
    def stream_tps(self) -> float | None:
        return median([x for r in self.ok if (x := r.decode_tps) is not None])

    def ttft_ms(self, q: float) -> float | None:
        v = percentile([r.ttft for r in self.ok if r.ttft is not None], q)
        return None if v is None else v * 1000

    def mean(self, attr: str) -> float | None:
        xs = [getattr(r, attr) for r in self.ok]
        return sum(xs) / len(xs) if xs else None


def prompt_for(workload: str, c: int, stream: int, rnd: int, args: argparse.Namespace) -> str:
    rnd = 0 if args.burst else rnd  # a burst repeats itself
    seed = 1_000_000 * (1 + c) + 1000 * stream + rnd
    question = make_text(seed, args.prompt_words)
    if workload == "shared":
        prefix = make_text(7 + c, args.prefix_words)
        return f"{prefix}\n\nQuestion {stream}.{rnd}: {make_text(seed, 12)}\nAnswer:"
    return f"{question}\nSummary:"


# Metric names that give the scheduler's Python time and the total step (or forward) time.
SCHED_KEYS = ("kvserve:scheduler_seconds_total", "kvserve:schedule_seconds_total",
              "kvserve:scheduler_python_seconds_total")
STEP_KEYS = ("kvserve:step_seconds_total", "kvserve:engine_step_seconds_total")
FORWARD_KEYS = ("kvserve:forward_seconds_total", "kvserve:runner_seconds_total")


def _pick(m: dict[str, float], keys: tuple[str, ...]) -> float | None:
    for k in keys:
        if k in m:
            return m[k]
    return None


def sched_share(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """Δscheduler / Δstep, or Δscheduler / (Δscheduler + Δforward); None when not exposed."""
    if not before or not after:
        return None
    s0, s1 = _pick(before, SCHED_KEYS), _pick(after, SCHED_KEYS)
    if s0 is None or s1 is None:
        return None
    st0, st1 = _pick(before, STEP_KEYS), _pick(after, STEP_KEYS)
    if st0 is not None and st1 is not None and st1 > st0:
        return (s1 - s0) / (st1 - st0)
    f0, f1 = _pick(before, FORWARD_KEYS), _pick(after, FORWARD_KEYS)
    if f0 is not None and f1 is not None and (s1 - s0) + (f1 - f0) > 0:
        return (s1 - s0) / ((s1 - s0) + (f1 - f0))
    return None


async def run_level(url: str, server: str, workload: str, c: int, args: argparse.Namespace) -> Level:
    def body(i: int, rnd: int) -> dict:
        return {"prompt": prompt_for(workload, c, i, rnd, args), "n_predict": args.n_predict,
                "temperature": 0, "ignore_eos": True}

    limits = httpx.Limits(max_connections=c + 4, max_keepalive_connections=c + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout), limits=limits) as client:
        def one(i: int, rnd: int) -> Any:
            if args.client == "raw":
                return sse_client.stream_completion(url, body(i, rnd), args.timeout)
            return stream_completion(client, url, body(i, rnd))

        async def stream(i: int) -> list[tuple[int, ReqResult]]:
            return [(rnd, await one(i, rnd)) for rnd in range(args.rounds)]

        t0, c0 = time.monotonic(), time.process_time()
        stages: list[dict[str, float] | None] = []
        if args.burst:  # round r: all c requests at once, after every request of round r - 1 ended
            done: list[tuple[int, ReqResult]] = []
            for rnd in range(args.rounds):
                m0 = scrape_metrics(url)
                rs = await asyncio.gather(*(one(i, rnd) for i in range(c)))
                stages.append(stage_means(m0, scrape_metrics(url)))
                done += [(rnd, r) for r in rs]
        else:
            done = [x for rs in await asyncio.gather(*(stream(i) for i in range(c))) for x in rs]
        wall, cpu = time.monotonic() - t0, time.process_time() - c0
    return Level(server, workload, c, wall, [r for _, r in done], None, [k for k, _ in done], cpu, stages)


STAGES = ("intake", "queue", "prefill")


def stage_means(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """Mean ms per first token of each stage between two scrapes (None when not exposed)."""
    key = "kvserve:first_tokens_total"
    if not before or not after or key not in before or key not in after:
        return None
    n = after[key] - before[key]
    if n <= 0:
        return None
    out = {}
    for st in STAGES:
        k = f'kvserve:first_token_seconds_total{{stage="{st}"}}'
        out[st] = 1e3 * (after.get(k, 0.0) - before.get(k, 0.0)) / n
    return out


async def warm_up(url: str, args: argparse.Namespace) -> None:
    body = {"prompt": "Warm-up: the quick brown fox", "n_predict": 4, "temperature": 0, "ignore_eos": True}
    if args.client == "raw":
        r = await sse_client.stream_completion(url, body, args.timeout)
    else:
        async with httpx.AsyncClient(timeout=httpx.Timeout(args.timeout)) as client:
            r = await stream_completion(client, url, body)
    if r.error:
        raise RuntimeError(f"warm-up request failed: {r.error}")


def bench_server(name: str, url: str, args: argparse.Namespace) -> list[Level]:
    asyncio.run(warm_up(url, args))
    levels = []
    for workload in args.workloads:
        for c in args.concurrency:
            before = scrape_metrics(url)
            lv = asyncio.run(run_level(url, name, workload, c, args))
            lv.sched_share = sched_share(before, scrape_metrics(url))
            errs = [r.error for r in lv.results if r.error]
            print(f"{name} {workload} c={c}: {lv.agg_tps or 0:.1f} tok/s, client CPU {lv.client_cpu_pct or 0:.0f}% "
                  f"of the wall time, {len(errs)} errors"
                  + (f" (first: {errs[0]})" if errs else ""), file=sys.stderr, flush=True)
            levels.append(lv)
    return levels


def run_target(name: str, cmd: str | None, url: str | None, args: argparse.Namespace) -> list[Level]:
    if url:
        return bench_server(name, url, args)
    assert cmd
    srv = ServerProcess(cmd)
    ok = False
    try:
        ready = srv.wait_ready(args.start_timeout)
        print(f"{name}: ready in {ready:.1f} s ({' '.join(srv.argv)})", file=sys.stderr, flush=True)
        levels = bench_server(name, srv.url, args)
        ok = all(r.error is None for lv in levels for r in lv.results)
        return levels
    finally:
        srv.stop(keep_log=not ok)


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--cmd", help="server command to start (kvserve or any llama-server-compatible one)")
    g.add_argument("--url", help="an already running server")
    p.add_argument("--name", default="kvserve", help="label of the --cmd/--url server")
    p.add_argument("--peer", help="a second server command, run with the same workload after the first")
    p.add_argument("--peer-url", help="an already running peer")
    p.add_argument("--peer-name", default="peer")
    p.add_argument("--concurrency", type=ints, default=[1, 4, 8, 16])
    p.add_argument("--workloads", default="distinct,shared", help="distinct,shared")
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--prompt-words", type=int, default=200, help="words of each distinct prompt (~1.1 tok/word)")
    p.add_argument("--prefix-words", type=int, default=1500, help="words of the shared prefix")
    p.add_argument("--rounds", type=int, default=2, help="requests per stream, one after another")
    p.add_argument("--burst", action="store_true",
                   help="each round is one burst of all streams at once, started when the previous round has "
                        "ended, with the same prompts every round (round 1 of 'shared' is the fresh prefix, "
                        "later rounds find it cached)")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw",
                   help="raw: bench/sse_client.py (a plain asyncio connection per request, parsed as bytes "
                        "arrive); httpx: an httpx.AsyncClient (about 4x the client CPU per token)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument("--start-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    for w in args.workloads:
        if w not in ("distinct", "shared"):
            p.error(f"unknown workload {w!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    targets = [(args.name, args.cmd, args.url)]
    if args.peer or args.peer_url:
        targets.append((args.peer_name, args.peer, args.peer_url))
    print_conditions(
        "kvserve HTTP throughput",
        {
            "servers": "; ".join(f"{n}: {c or u}" for n, c, u in targets),
            "endpoint": "POST /completion, stream true, temperature 0, ignore_eos true, cache_prompt server default",
            "concurrency": args.concurrency,
            "requests": (f"{args.rounds} bursts of one request per stream, the same prompts each time"
                         if args.burst else f"{args.rounds} per stream, sequential within a stream"),
            "n_predict": args.n_predict,
            "workloads": ", ".join(args.workloads),
            "prompt lengths": f"distinct ~{args.prompt_words} words; shared {args.prefix_words}-word prefix "
                              f"(fresh per concurrency level) + ~12-word question; ~1.1 tokens/word on SmolLM2",
            "servers run": "one at a time, each started fresh (unless --url), one warm-up request first",
            "client": {"raw": "bench/sse_client.py: one asyncio connection per request, SSE parsed as bytes arrive",
                       "httpx": "httpx.AsyncClient"}[args.client] + "; one process",
        },
    )
    all_levels: list[Level] = []
    for name, cmd, url in targets:
        all_levels += run_target(name, cmd, url, args)

    base = {(lv.server, lv.workload): lv for lv in all_levels if lv.concurrency == args.concurrency[0]}
    rows = []
    for lv in all_levels:
        b = base.get((lv.server, lv.workload))
        rows.append([lv.server, lv.workload, lv.concurrency, len(lv.ok), len(lv.results) - len(lv.ok),
                     lv.agg_tps, fmt(ratio(lv.agg_tps, b.agg_tps if b else None), 2), lv.stream_tps,
                     lv.ttft_ms(50), lv.ttft_ms(95), lv.mean("prompt_n"), lv.mean("cache_n"),
                     None if lv.sched_share is None else 100 * lv.sched_share, lv.client_cpu_pct])
    print("## Per server\n")
    print_table(["server", "workload", "conc", "ok", "err", "agg tok/s", f"agg / c={args.concurrency[0]}",
                 "stream tok/s p50", "TTFT p50 ms", "TTFT p95 ms", "prompt_n mean", "cache_n mean",
                 "sched % of step", "client CPU %"], rows)
    if args.rounds > 1:
        rrows = []
        for lv in all_levels:
            for rnd in range(args.rounds):
                x = lv.of_round(rnd)
                ttft = [r.ttft for r in x.ok if r.ttft is not None]
                rrows.append([lv.server, lv.workload, lv.concurrency, rnd + 1, len(x.ok),
                              1000 * sum(ttft) / len(ttft) if ttft else None, x.ttft_ms(50), x.ttft_ms(95),
                              x.mean("prompt_n"), x.mean("cache_n")] + [x.stage_ms(st) for st in STAGES])
        print("## Per round" + (" (bursts: round 1 fresh, later rounds cached)" if args.burst else "") + "\n")
        print_table(["server", "workload", "conc", "round", "ok", "TTFT mean ms", "TTFT p50 ms", "TTFT p95 ms",
                     "prompt_n mean", "cache_n mean"] + [f"server {st} ms" for st in STAGES], rrows)
        if args.burst:
            print("Server columns (bursts, where /metrics has them): the server's mean time to each first "
                  "token by stage: intake = validation and tokenization up to the engine's queue, queue = "
                  "until admitted to a slot, prefill = until the first token is sampled. TTFT minus their sum "
                  "is the HTTP path before them (parsing, routing) and after (the first event's write), and "
                  "the client.\n")
    if len(targets) == 2:
        a, p = targets[0][0], targets[1][0]
        by = {(lv.server, lv.workload, lv.concurrency): lv for lv in all_levels}
        rows2 = []
        for w in args.workloads:
            for c in args.concurrency:
                x, y = by.get((a, w, c)), by.get((p, w, c))
                if x is None or y is None:
                    continue
                rows2.append([w, c, x.agg_tps, y.agg_tps, ratio(x.agg_tps, y.agg_tps), x.ttft_ms(50), y.ttft_ms(50),
                              ratio(x.ttft_ms(50), y.ttft_ms(50))])
        print(f"## Side by side ({a} vs {p}, same run)\n")
        print_table(["workload", "conc", f"{a} agg tok/s", f"{p} agg tok/s", f"{a}/{p}", f"{a} TTFT p50 ms",
                     f"{p} TTFT p50 ms", f"{a}/{p} TTFT"], rows2, digits=2)
    n_err = sum(len(lv.results) - len(lv.ok) for lv in all_levels)
    if n_err:
        print(f"{n_err} requests failed")
    return 1 if n_err else 0


if __name__ == "__main__":
    sys.exit(main())
