"""CPU time of the engine thread's per-step commit path in the steady decode state: no HTTP, no device.

The server's engine (scheduler, prefix cache, slots, sampling glue, the real tokenizer's
detokenizer) with 64 streams that are all decoding, stepped through the engine's ``StepLoop``
with overlap on, as on a GPU: each step plans the next one ahead (``plan_ahead``), launches it
(``Scheduler.launch``: the sampling queued) and commits the one before (``Scheduler.complete``:
counters, pages, stop rules, token events). The requests are the benchmark's (stream, greedy,
``ignore_eos``); their events go through a real ``Dispatch`` / ``Mailbox`` (the engine-side
half of delivery), delivered to their queues between steps, outside the clock.

Timed, this thread's CPU clock over ``--steps`` decode steps: the whole ``StepLoop.step``, less
the runner's call (a null runner: logits rows from a few fixed random tensors) and less the
greedy argmax over the 49,152-token vocabulary (``sampler_fast._biased_argmax``: device work on a
GPU, this CPU's here); and the three parts on their own. The heap is collected before the timed
steps, and the garbage collections during them are counted (a full one over the server's heap
costs far more than any step: one falling into a run or not moves its mean). Each tree runs in
its own process, trees alternately:

    python bench/commit_path.py --tree before=/path/to/old/src --tree after=src --repeat 3
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PARTS = ("step", "plan_ahead", "launch", "complete")


class _Loop:
    """Stands for the HTTP side's event loop: what ``Mailbox`` and ``Dispatch`` call on it."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))

    def time(self) -> float:
        return time.monotonic()

    def run_pending(self) -> None:
        calls, self.calls = self.calls, []
        for fn, args in calls:
            fn(*args)


class _Runner:
    """Logits rows from a few fixed random tensors, at once (an asynchronous device of no time)."""

    asynchronous = True

    def __init__(self, n_vocab: int, max_rows: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        self._pool = [torch.randn(max_rows, n_vocab, generator=g) for _ in range(3)]
        self._i = 0
        self.cpu = 0.0

    def run(self, plan: Any, prev_tokens: Any = None) -> Any:
        from engine_trees import null_logits

        t0 = time.thread_time()
        self._i = (self._i + 1) % len(self._pool)
        out = null_logits(plan, self._pool[self._i])
        out.ready = lambda: None
        self.cpu += time.thread_time() - t0
        return out


def measure(model: str, n_streams: int, n_steps: int, profile: str | None, freeze: bool = False) -> dict[str, float]:
    from common import make_text

    from kvserve.__main__ import build_engine
    from kvserve.config import load_config
    from kvserve.engine import pipeline, sampler_fast
    from kvserve.engine.request import CacheIdentity
    from kvserve.server import completions
    from kvserve.server.dispatch import Dispatch
    from kvserve.server.settings import ServerSettings

    cfg = load_config(["-m", model, "-c", str(4096 * n_streams), "-np", str(n_streams)], {})
    engine = build_engine(cfg)
    runner = _Runner(engine.runner.cfg.n_vocab, n_streams)
    engine.runner = engine.loop.runner = runner
    engine.loop.overlap = True
    settings = ServerSettings.from_config(cfg, n_streams)
    loop = _Loop()

    class _Api:  # what Dispatch asks of the engine here
        def submit(self, req: Any, emit: Any) -> None:
            engine.submit(req, emit)

        def cancel(self, rid: int) -> None:
            engine.cancel(rid)

    dispatches = []
    for i in range(n_streams):
        body = {"prompt": make_text(5000 + i, 38) + "\nSummary:", "n_predict": 100_000, "stream": True,
                "temperature": 0, "ignore_eos": True}
        prompts, params = completions.prepare(completions.Kind.NATIVE, body, engine, settings)
        d = Dispatch(_Api(), loop)  # type: ignore[arg-type]
        d.submit(completions.build_requests(engine, prompts, params, CacheIdentity()))
        dispatches.append(d)
    engine._drain(False)

    def deliver() -> None:
        loop.run_pending()
        for d in dispatches:
            while d.next_nowait() is not None:
                pass

    sch = engine.scheduler
    while len(sch.running) < n_streams or any(s.n_decoded < 2 for s in sch.running.values()):
        engine.loop.step()
        deliver()

    spent = dict.fromkeys(PARTS, 0.0)
    argmax = [0.0]

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.thread_time() - t0
        return wrapper

    def argmax_timed(*a: Any) -> Any:
        t0 = time.thread_time()
        try:
            return biased(*a)
        finally:
            argmax[0] += time.thread_time() - t0

    biased = sampler_fast._biased_argmax
    sampler_fast._biased_argmax = argmax_timed
    pipeline.plan_ahead = timed("plan_ahead", pipeline.plan_ahead)
    sch.launch = timed("launch", sch.launch)
    sch.complete = timed("complete", sch.complete)
    step = timed("step", engine.loop.step)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
    runner.cpu = 0.0
    gc.collect()  # the timed steps start from a collected heap: a full collection falls into them
    # only as their own garbage makes one due, not as the start-up's did
    if freeze:  # --gc-freeze: what is alive now is left out of every later collection
        gc.freeze()
    n_gc = sum(g["collections"] for g in gc.get_stats())
    n_tokens = sum(s.n_decoded for s in sch.running.values())
    for _ in range(n_steps):
        if prof is not None:
            prof.enable()
        step()
        if prof is not None:
            prof.disable()
        deliver()
    n_tokens = sum(s.n_decoded for s in sch.running.values()) - n_tokens
    assert len(sch.running) == n_streams and n_tokens == n_steps * n_streams, (len(sch.running), n_tokens)
    if prof is not None:
        prof.dump_stats(profile)
    spent["gc"] = sum(g["collections"] for g in gc.get_stats()) - n_gc
    spent["step"] -= runner.cpu + argmax[0]
    spent["launch"] -= argmax[0]
    return {k: v if k == "gc" else 1e6 * v / n_steps for k, v in spent.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", default=[], help="NAME=SRC (repeatable; default this tree)")
    p.add_argument("--repeat", type=int, default=3, help="rounds over the trees")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--steps", type=int, default=300, help="decode steps timed per process")
    p.add_argument("--profile", help="(one tree) write the cProfile stats of the timed steps to this file")
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() the started server before the timed "
                   "steps (an experiment: the collections then skip the model, tokenizer and server objects)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from engine_trees import TINY, tiny_model, tree_env, trees_of

    model = tiny_model()
    if args.child:
        res = measure(model, args.streams, args.steps, args.profile, args.gc_freeze)
        print(" ".join(f"{k}={v}" for k, v in res.items()))
        return 0
    from common import print_conditions, print_table

    trees = trees_of(args.tree, HERE)
    print_conditions("engine thread CPU per decode step, steady state, no HTTP, no device", {
        "trees": "; ".join(f"{n}: {s}" for n, s in trees),
        "model": f"{TINY} (random weights; its vocabulary and tokenizer matter here)",
        "engine": f"-np {args.streams}, every slot decoding (stream, greedy, ignore_eos), overlap on"
                  + (", gc.freeze() before the timed steps" if args.gc_freeze else ""),
        "figure": f"this thread's CPU us per step over {args.steps} steps, less the runner and the argmax",
    })
    rows = []
    for rnd in range(args.repeat):
        for name, src in trees:
            env = tree_env(src)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--streams", str(args.streams),
                   "--steps", str(args.steps)] + (["--profile", args.profile] if args.profile else []) \
                + (["--gc-freeze"] if args.gc_freeze else [])
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                sys.stderr.write(r.stderr)
                return 1
            vals = dict(kv.split("=") for kv in r.stdout.split()[-len(PARTS) - 1:])
            us = [float(vals[k]) for k in PARTS]
            rows.append([rnd + 1, name] + us + [us[0] / args.streams, int(float(vals["gc"])), os.getloadavg()[0]])
    print_table(["round", "tree"] + [f"{k} us" for k in PARTS] + ["us / token", "collections", "load average"],
                rows, digits=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
