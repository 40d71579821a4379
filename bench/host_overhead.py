"""Host overhead of the serving path: the real HTTP layer, engine and scheduler over a null runner.

The runner is replaced by ``NullRunner``: it executes a plan's bookkeeping only (no model) and
stands for the GPU with a device timeline, each step costing ``--step-ms`` plus ``--token-us``
per token. Where the engine supports an asynchronous runner (``RunOutput.ready``), ``run``
returns at once and the step's results are ready when the timeline reaches its end, as a CUDA
step's are; otherwise ``run`` sleeps for the step, which is what a synchronous engine waits for
anyway. Logits rows come from a few fixed random tensors, so greedy tokens vary and
detokenization and SSE do real work; the greedy argmax over the vocabulary runs on this CPU (on
a GPU it is device work), so it is part of the host time here.

Everything else is the server as shipped: uvicorn, FastAPI routes, tokenization, admission and
the prompt cache, sampling glue, stop strings, SSE. The workloads are ``bench/throughput.py``'s
(64 streams of distinct prompts; a 64-request burst over a fresh shared prefix, then again
cached), on a tiny random-weight model with the 1B shape's vocabulary (49,152 tokens).

    python bench/host_overhead.py                                   # this tree
    python bench/host_overhead.py --tree before=/path/to/old/src --tree after=src --profile
    python bench/host_overhead.py serve --step-ms 2.7 -m M.gguf -np 64 --port 8099   # server alone

Per tree it prints aggregate tok/s, engine steps and host ms per step (from ``/metrics``:
scheduler Python time over steps), the CPU time of the engine thread, of the HTTP thread and of
the whole server per generated token (thread CPU clocks, so time spent waiting for the
interpreter lock counts in neither thread), TTFT per burst round, and with ``--profile`` the top
functions of the engine thread and of the HTTP thread (cProfile, own time) for the 64-stream run.
cProfile's own times include waits for the interpreter lock, which other threads hold in turn;
``--pyspy PY_SPY`` samples the measured run with py-spy instead (from outside the process, no
instrumentation; shares of each thread's active samples, ``bench/pyspy_top.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

HERE = os.path.dirname(os.path.abspath(__file__))
from engine_trees import TINY, null_logits, tiny_model  # noqa: E402


# -- the null runner ---------------------------------------------------------------------------
class NullRunner:
    """Plans in, logits out, no model; the GPU is a timeline (see the module docstring)."""

    def __init__(self, real: Any, step_ms: float, token_us: float, asynchronous: bool, max_rows: int) -> None:
        import torch

        self._real = real
        self.step_s = step_ms / 1e3
        self.token_s = token_us / 1e6
        self.asynchronous = asynchronous
        self._busy_until = 0.0
        v = real.cfg.n_vocab
        g = torch.Generator().manual_seed(0)
        self._pool = [torch.randn(max_rows, v, generator=g) for _ in range(3)]
        self._i = 0

    def __getattr__(self, name: str) -> Any:  # kv, cfg, hidden_states (warm-up, embeddings) ...
        return getattr(self._real, name)

    @staticmethod
    def _until(t: float) -> None:
        left = t - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def run(self, plan: Any, prev_tokens: Any = None) -> Any:
        n_tok = sum(len(c.tokens) for c in plan.chunks)
        now = time.perf_counter()
        end = self._busy_until = max(now, self._busy_until) + self.step_s + self.token_s * n_tok
        self._i = (self._i + 1) % len(self._pool)
        out = null_logits(plan, self._pool[self._i])
        if self.asynchronous:
            out.ready = lambda: self._until(end)
        else:
            self._until(end)
        return out


def serve_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="host_overhead.py serve")
    p.add_argument("--step-ms", type=float, default=2.7, help="GPU time of a step (default: the 1B b64 step)")
    p.add_argument("--token-us", type=float, default=10.0, help="GPU time per token of a step")
    p.add_argument("--profile", help="write cProfile stats of the engine and HTTP threads under this prefix")
    p.add_argument("--real-runner", action="store_true", help="keep the model runner (profile a real server)")
    ours, rest = p.parse_known_args(argv)
    from kvserve.__main__ import build_engine
    from kvserve.config import load_config
    from kvserve.plan import RunOutput

    cfg = load_config(rest, os.environ)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname).1s %(name)s: %(message)s")
    engine = build_engine(cfg)
    if ours.real_runner:
        _serve(engine, cfg, ours.profile)
        return
    asynchronous = any(f.name == "ready" for f in dataclasses.fields(RunOutput))
    engine.runner = NullRunner(engine.runner, ours.step_ms, ours.token_us, asynchronous, engine.n_slots)
    loop = getattr(engine, "loop", None)  # the engine's step loop holds the runner too
    if loop is not None:
        from kvserve.engine.pipeline import overlap_wanted

        loop.runner = engine.runner
        loop.overlap = overlap_wanted(engine.runner, None)
    _serve(engine, cfg, ours.profile)


def _thread_cpu(engine: Any) -> None:
    """``/metrics`` also carries the CPU seconds of the engine thread and of the HTTP thread
    (this one) and of the whole process: CPU time, not wall time, so waiting for the
    interpreter lock or the device counts in neither (``kvserve:bench_cpu_seconds_total``); and
    the garbage collections by generation, their number and wall time (every thread waits
    while one runs: ``kvserve:bench_gc_total``, ``kvserve:bench_gc_seconds_total``)."""
    http = threading.get_ident()
    snap = engine.metrics_snapshot

    def clock(ident: int | None) -> float:
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(ident)) if ident else 0.0
        except (OSError, ValueError):
            return 0.0

    import gc

    gc_s, gc_n, started = [0.0, 0.0, 0.0], [0, 0, 0], [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:  # any thread; the collector holds the GIL
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            gc_s[info["generation"]] += time.perf_counter() - started[0]
            gc_n[info["generation"]] += 1

    gc.callbacks.append(on_gc)

    def with_cpu() -> dict[str, float]:
        m = snap()
        for g in range(3):
            m[f'kvserve:bench_gc_seconds_total{{generation="{g}"}}'] = gc_s[g]
            m[f'kvserve:bench_gc_total{{generation="{g}"}}'] = gc_n[g]
        t = getattr(engine, "_thread", None)
        m['kvserve:bench_cpu_seconds_total{thread="engine"}'] = clock(t.ident if t is not None else None)
        m['kvserve:bench_cpu_seconds_total{thread="http"}'] = clock(http)
        m['kvserve:bench_cpu_seconds_total{thread="process"}'] = time.process_time()
        return m

    engine.metrics_snapshot = with_cpu


def _serve(engine: Any, cfg: Any, profile: str | None) -> None:
    from kvserve.server.http_server import serve

    _thread_cpu(engine)
    profs: list[Any] = []
    if profile:
        import cProfile

        loop = engine._loop
        eng_prof = cProfile.Profile()

        def profiled_loop() -> None:
            eng_prof.enable()
            try:
                loop()
            finally:
                eng_prof.disable()
                eng_prof.dump_stats(profile + ".engine")

        engine._loop = profiled_loop  # type: ignore[method-assign]
        http_prof = cProfile.Profile()
        profs.append(http_prof)
    engine.start()
    from kvserve.model import heap

    freeze = getattr(heap, "freeze", None)  # as the server's start-up does (trees that have it)
    if freeze is not None:
        freeze()
    # uvicorn re-raises the SIGTERM it caught once it has shut down: end with SystemExit then, so
    # that the profiles below are written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    for pr in profs:
        try:
            pr.enable()
        except ValueError:  # Python 3.12+: one profiler per process, and the engine's sees every thread
            profs.remove(pr)
    try:
        serve(engine, cfg)
    finally:
        for pr in profs:
            pr.disable()
            pr.dump_stats(profile + ".http")
        engine.stop()


# -- the driver --------------------------------------------------------------------------------
def _metric_delta(before: dict | None, after: dict | None, key: str) -> float | None:
    if not before or not after or key not in before or key not in after:
        return None
    return after[key] - before[key]


def top_functions(path: str, n: int, by: str = "own") -> list[list[Any]]:
    if not os.path.exists(path):
        return []
    st = pstats.Stats(path)
    total = sum(v[2] for v in st.stats.values()) or 1.0  # type: ignore[attr-defined]
    rows = []
    col = 2 if by == "own" else 3
    for (fn, line, name), (_cc, nc, tt, ct, _callers) in sorted(
            st.stats.items(), key=lambda kv: -kv[1][col])[:n]:  # type: ignore[attr-defined]
        where = f"{os.path.basename(fn)}:{line}" if line else fn
        rows.append([f"{name} ({where})"[:80], tt, 100 * tt / total, nc, ct])
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        serve_main(argv[1:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[],
                   help="NAME=SRC: run the server on the kvserve package under SRC, a PYTHONPATH (repeatable; "
                        "default this tree)")
    p.add_argument("--step-ms", type=float, default=2.7)
    p.add_argument("--token-us", type=float, default=10.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--n-predict", type=int, default=64, help="tokens per request of the 64-stream run")
    p.add_argument("--burst-n-predict", type=int, default=16)
    p.add_argument("--workloads", default="streams,burst", help="streams,burst")
    p.add_argument("--profile", action="store_true", help="cProfile the engine and HTTP threads (slower)")
    p.add_argument("--model", help="GGUF to serve (default: a tiny random model with the 1B vocabulary)")
    p.add_argument("--real-runner", action="store_true",
                   help="serve with the model runner instead of the null one (a GPU server's real host costs)")
    p.add_argument("--pyspy", metavar="PY_SPY", help="py-spy executable: sample each measured run with it "
                   "(py-spy record --nonblocking --threads) and print each thread's top functions")
    p.add_argument("--top", type=int, default=18)
    p.add_argument("--sort", choices=("own", "cumulative"), default="own", help="order of the profile tables")
    p.add_argument("--repeat", type=int, default=1, help="run the trees alternately this many times")
    args = p.parse_args(argv)
    trees = [t.split("=", 1) for t in args.tree] or [["this", os.path.join(os.path.dirname(HERE), "src")]]

    import throughput
    from common import print_conditions, print_table, scrape_metrics
    model = args.model or tiny_model()
    c = args.concurrency
    workloads = [w for w in args.workloads.split(",") if w]
    print_conditions("kvserve host overhead (null runner)", {
        "trees": "; ".join(f"{n}: {s}" for n, s in trees),
        "model": args.model or f"{TINY} (random weights; only its vocabulary and tokenizer matter here)",
        "runner": "the model's (--real-runner)" if args.real_runner else
                  f"null: device timeline of {args.step_ms} ms per step + {args.token_us} us per token",
        "server": f"-c 262144 -np {c} --metrics (kvserve's HTTP layer, engine and scheduler as shipped)",
        "streams": f"{c} streams, distinct ~128-token prompts, n_predict {args.n_predict}, one request each",
        "burst": f"{c} requests at once over a fresh ~2,000-token shared prefix + distinct suffix, "
                 f"n_predict {args.burst_n_predict}, then the same again (cached)",
        "cpu": f"{os.cpu_count()} cores; client and server on the same machine",
    })
    rows, rrows, crows, grows, profiles, spies = [], [], [], [], [], []
    started: list[Any] = []  # the server processes throughput.run_target starts

    class Recorded(throughput.ServerProcess):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            started.append(self)

    throughput.ServerProcess = Recorded
    for rep in range(args.repeat):
        for name, src in trees:
            env_pp = os.environ.get("PYTHONPATH", "")
            # the tree first; what the caller had after it (installed libraries)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [os.path.abspath(x) for x in src.split(os.pathsep)] + ([env_pp] if env_pp else []))
            try:
                for w in workloads:
                    prof = os.path.join(tempfile.gettempdir(), f"kvserve-host-{os.getpid()}-{name}-{w}")
                    cmd = (f"{sys.executable} {os.path.join(HERE, 'host_overhead.py')} serve --step-ms {args.step_ms} "
                           f"--token-us {args.token_us} -m {model} -c 262144 -np {c} --metrics"
                           + (f" --profile {prof}" if args.profile else "")
                           + (" --real-runner" if args.real_runner else ""))
                    if w == "streams":
                        targs = throughput.parse_args(["--cmd", cmd, "--concurrency", str(c), "--workloads", "distinct",
                                                       "--n-predict", str(args.n_predict), "--prompt-words", "38",
                                                       "--rounds", "1", "--start-timeout", "300"])
                    else:
                        targs = throughput.parse_args(["--cmd", cmd, "--concurrency", str(c), "--workloads", "shared",
                                                       "--n-predict", str(args.burst_n_predict), "--prefix-words",
                                                       "600", "--prompt-words", "10", "--rounds", "2", "--burst",
                                                       "--start-timeout", "300"])
                    box: dict[str, Any] = {}
                    orig = throughput.run_level

                    spy_out = os.path.join(tempfile.gettempdir(), f"kvserve-spy-{os.getpid()}-{rep}-{name}-{w}.txt")

                    async def run_level(url: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
                        spy = None
                        if args.pyspy and started:
                            spy = subprocess.Popen([args.pyspy, "record", "-p", str(started[-1].pid), "--threads",
                                                    "--nonblocking", "-r", "200", "-f", "raw", "-o", spy_out],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            time.sleep(1.0)  # attached
                        box["before"] = scrape_metrics(url)
                        lv = await _orig(url, *a, **k)
                        box["after"] = scrape_metrics(url)
                        if spy is not None:
                            spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                            try:
                                spy.wait(timeout=30)
                            except subprocess.TimeoutExpired:
                                spy.kill()
                            spies.append((rep + 1, name, w, spy_out))
                        return lv

                    throughput.run_level = run_level
                    try:
                        (lv,) = throughput.run_target(name, cmd, None, targs)
                    finally:
                        throughput.run_level = orig
                    b, a = box.get("before"), box.get("after")
                    steps = _metric_delta(b, a, "llamacpp:n_decode_total")
                    sched = _metric_delta(b, a, "kvserve:scheduler_seconds_total")
                    wait = _metric_delta(b, a, "kvserve:device_wait_seconds_total")
                    per = 1e3 * (sched - (wait or 0.0)) / steps if sched is not None and steps else None
                    wait_ms = 1e3 * wait / steps if wait is not None and steps else None
                    n_tok = sum(r.n_gen for r in lv.ok)
                    cpu = {t: _metric_delta(b, a, f'kvserve:bench_cpu_seconds_total{{thread="{t}"}}')
                           for t in ("engine", "http", "process")}
                    crows.append([rep + 1, name, w, n_tok, steps,
                                  1e3 * cpu["engine"] / steps if cpu["engine"] is not None and steps else None,
                                  1e6 * cpu["engine"] / n_tok if cpu["engine"] is not None and n_tok else None,
                                  1e6 * cpu["http"] / n_tok if cpu["http"] is not None and n_tok else None,
                                  1e6 * cpu["process"] / n_tok if cpu["process"] is not None and n_tok else None])
                    gcs = [(_metric_delta(b, a, f'kvserve:bench_gc_total{{generation="{g}"}}'),
                            _metric_delta(b, a, f'kvserve:bench_gc_seconds_total{{generation="{g}"}}')) for g in range(3)]
                    grows.append([rep + 1, name, w] + [f"{n:.0f} / {1e3 * t:.1f}" if n is not None and t is not None
                                                       else None for n, t in gcs])
                    rows.append([rep + 1, name, w, len(lv.ok), len(lv.results) - len(lv.ok), lv.agg_tps,
                                 lv.stream_tps, steps, 1e3 * lv.wall_s / steps if steps else None, per,
                                 wait_ms, lv.ttft_ms(50), lv.client_cpu_pct])
                    if w == "burst":
                        for rnd in range(2):
                            x = lv.of_round(rnd)
                            tt = [r.ttft for r in x.ok if r.ttft is not None]
                            rrows.append([rep + 1, name, rnd + 1, len(x.ok), 1e3 * sum(tt) / len(tt) if tt else None,
                                          x.ttft_ms(50), x.ttft_ms(95), x.mean("prompt_n"), x.mean("cache_n")]
                                         + [x.stage_ms(st) for st in throughput.STAGES])
                    if args.profile:
                        time.sleep(0.5)
                        profiles.append((rep + 1, name, w, prof))
            finally:
                os.environ["PYTHONPATH"] = env_pp
    print("## Runs\n")
    print_table(["rep", "tree", "workload", "ok", "err", "agg tok/s", "stream tok/s p50", "engine steps",
                 "wall ms / step", "engine host ms / step", "device wait ms / step", "TTFT p50 ms",
                 "client CPU %"], rows,
                digits=2)
    if crows:
        print("## CPU time of the server's threads (thread CPU clocks: waits for the GIL or the device excluded)\n")
        print_table(["rep", "tree", "workload", "tokens", "engine steps", "engine CPU ms / step",
                     "engine CPU us / token", "HTTP thread CPU us / token", "process CPU us / token"], crows, digits=1)
    if grows:
        print("## Garbage collections in the server during the run (count / ms of wall time, by generation)\n")
        print_table(["rep", "tree", "workload", "young (0)", "middle (1)", "full (2)"], grows)
    if rrows:
        print("## Bursts (round 1 fresh prefix, round 2 cached)\n")
        print_table(["rep", "tree", "round", "ok", "TTFT mean ms", "TTFT p50 ms", "TTFT p95 ms", "prompt_n mean",
                     "cache_n mean"] + [f"server {st} ms" for st in throughput.STAGES], rrows, digits=1)
    for rep, name, w, prof in profiles:
        for thread in ("engine", "http"):
            if not os.path.exists(f"{prof}.{thread}"):
                continue
            label = "every thread (one profiler per process on Python 3.12+)" \
                if thread == "engine" and not os.path.exists(f"{prof}.http") else f"{thread} thread"
            print(f"## Profile: {name}, {w}, {label} (cProfile, by {args.sort} time; rep {rep})\n")
            print_table(["function", "own s", "% of thread", "calls", "cumulative s"],
                        top_functions(f"{prof}.{thread}", args.top, args.sort), digits=3)
    if spies:
        import pyspy_top

        for rep, name, w, path in spies:
            if not os.path.exists(path):
                print(f"## py-spy: {name}, {w}, rep {rep}: no profile (py-spy could not attach?)\n")
                continue
            print(f"## py-spy: {name}, {w}, rep {rep} (shares of each thread's active samples)\n")
            pyspy_top.print_tables(path, args.top)
            os.unlink(path)
    for _rep, _name, _w, prof in profiles:
        for ext in (".engine", ".http"):
            try:
                os.unlink(prof + ext)
            except OSError:
                pass
    return 1 if any(r[4] for r in rows) else 0


if __name__ == "__main__":
    threading.current_thread().name = "main"
    sys.exit(main())
