"""CPU time of the engine thread's work for a burst and for streams, with no HTTP and no device.

The engine of the server (scheduler, prefix cache, slots, sampling glue) over
``host_overhead.NullRunner`` with a zero device timeline, stepped in this thread until every
request is done; what is timed is this thread's CPU clock from the first step to the last:

    burst_fresh    64 requests at once over a fresh ~2,000-token shared prefix + distinct suffix
                   (the 63 followers wait for the first one's prefix), 4 tokens each
    burst_cached   the same 64 requests again (the prefix cached)
    admit_cached   of burst_cached, the scheduler's ``schedule`` calls alone (admission: slot
                   choice, cache lookup and pages, samplers), without the steps' other work
    streams        64 distinct ~128-token prompts, 64 tokens each

The requests are validated and tokenized before the clock starts. The greedy argmax over the
49,152-token vocabulary of each step is this CPU's work here (a GPU's in a real server), in every
tree alike. Each tree runs in its own process, trees alternately:

    python bench/admission_cpu.py --tree before=/path/to/old/src --tree after=src --repeat 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

WORKLOADS = ("burst_fresh", "burst_cached", "admit_cached", "streams")


def measure(model: str, reps: int) -> dict[str, list[float]]:
    from common import make_text
    from host_overhead import NullRunner

    from kvserve.__main__ import build_engine
    from kvserve.config import load_config
    from kvserve.engine.request import CacheIdentity
    from kvserve.server import completions
    from kvserve.server.settings import ServerSettings

    cfg = load_config(["-m", model, "-c", "262144", "-np", "64"], {})
    engine = build_engine(cfg)
    engine.runner = NullRunner(engine.runner, 0.0, 0.0, False, 64)
    engine.loop.runner = engine.runner
    engine.loop.overlap = False
    settings = ServerSettings.from_config(cfg, 64)
    schedule = engine.scheduler.schedule
    in_schedule = [0.0]

    def timed_schedule():  # this thread's CPU time in schedule(), summed
        t0 = time.thread_time()
        try:
            return schedule()
        finally:
            in_schedule[0] += time.thread_time() - t0

    engine.scheduler.schedule = timed_schedule

    def requests(texts: list[str], n_predict: int) -> list:
        out = []
        for t in texts:
            body = {"prompt": t, "n_predict": n_predict, "stream": True, "temperature": 0, "ignore_eos": True}
            prompts, params = completions.prepare(completions.Kind.NATIVE, body, engine, settings)
            out += completions.build_requests(engine, prompts, params, CacheIdentity())
        return out

    def run(reqs: list) -> float:
        for r in reqs:
            engine.submit(r, lambda ev: None)
        t = time.thread_time()
        engine._drain(False)
        while engine.scheduler.has_work() or engine.loop.in_flight is not None:
            engine.step()
        return time.thread_time() - t

    out: dict[str, list[float]] = {w: [] for w in WORKLOADS}
    for rep in range(reps):
        engine.cache.clear()
        prefix = make_text(71, 600)  # the same document every repetition (the cache is cleared)
        burst = [f"{prefix}\n\nQuestion {i}.0: {make_text(1000 + i, 12)}\nAnswer:" for i in range(64)]
        out["burst_fresh"].append(run(requests(burst, 4)))
        reqs = requests(burst, 4)
        in_schedule[0] = 0.0
        out["burst_cached"].append(run(reqs))
        out["admit_cached"].append(in_schedule[0])
        out["streams"].append(run(requests([make_text(5000 + 64 * rep + i, 38) + "\nSummary:"
                                            for i in range(64)], 64)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeatable; default this tree)")
    p.add_argument("--repeat", type=int, default=2, help="rounds over the trees")
    p.add_argument("--reps", type=int, default=3, help="workload repetitions per process (the minimum is kept)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from engine_trees import TINY, tiny_model, tree_env, trees_of

    model = tiny_model()
    if args.child:
        res = measure(model, args.reps)
        print(" ".join(f"{w}={min(v)}" for w, v in res.items()))
        return 0
    from common import print_conditions, print_table

    trees = trees_of(args.tree, HERE)
    print_conditions("engine thread CPU time, null runner, no HTTP", {
        "trees": "; ".join(f"{n}: {s}" for n, s in trees),
        "model": f"{TINY} (random weights; its vocabulary and tokenizer matter here)",
        "engine": "-c 262144 -np 64, stepped synchronously (no overlap), device time 0",
        "workloads": "burst_fresh / burst_cached: 64 requests over one ~2,000-token prefix, 4 tokens each; "
                     "admit_cached: burst_cached's schedule() calls alone; "
                     "streams: 64 distinct ~128-token prompts, 64 tokens each",
        "figure": f"this thread's CPU ms per workload, the minimum of {args.reps} in one process",
    })
    rows = []
    for rnd in range(args.repeat):
        for name, src in trees:
            env = tree_env(src)
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "1", "--reps", str(args.reps)],
                               env=env, capture_output=True, text=True, check=True)
            vals = dict(kv.split("=") for kv in r.stdout.split()[-len(WORKLOADS):])
            rows.append([rnd + 1, name] + [1e3 * float(vals[w]) for w in WORKLOADS] + [os.getloadavg()[0]])
    print_table(["round", "tree"] + [f"{w} ms" for w in WORKLOADS] + ["load average"], rows, digits=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
