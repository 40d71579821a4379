"""Server memory footprint and prompt reuse over five fixed HTTP workloads, one fresh server
process per (config, scenario).

Scenarios (all requests: temperature 0, ignore_eos true, streamed; ``cache_prompt`` is never
sent, so the server's default applies and ``--no-cache-prompt`` takes effect):

    idle                  start, wait ``20 s`` with no request
    shared_prefix_burst   8 concurrent /completion requests: one ~3.7k-token system prompt plus
                          a distinct question each, 128 new tokens
    seqshare              the same 8 requests one after another
    multiturn             one /v1/chat/completions conversation of 8 turns: a ~1,000-character
                          user message, 128 new tokens, the assistant reply echoed back
    churn                 32 distinct ~2,000-character /completion prompts in sequence, 32 new tokens

Memory: the RSS of the server process and all its descendants (/proc), sampled every 100 ms
from process start. ``ready`` is the sample when /health first answered 200, ``peak`` the
maximum over the whole life (model load included), ``run peak`` the maximum from ready on (what
the workload adds; the memory check uses it, since the load peak is the same for every config),
``settle`` the sample 2 s after the last response. On GPU servers the RSS misses device memory: if the server's /metrics has gauges
named ``kvserve:cuda_*_bytes`` (or ``*cuda*memory*bytes``) they are sampled alongside (needs
``--metrics`` on the server command) and their peak is shown; otherwise GPU memory is skipped.

Configs: ``default`` (the command as given), ``no-cache-prompt`` (+ ``--no-cache-prompt``),
``cache-ram-0`` (+ ``--cache-ram 0``), and ``peer`` (``--peer CMD``, any llama-server-compatible
command, run with the same workloads).

    python bench/footprint.py                                   # SmolLM2, all configs and scenarios
    python bench/footprint.py --scale 0.1 --scenarios seqshare,multiturn --configs default,no-cache-prompt
    python bench/footprint.py --peer "llama-server -m M.gguf -np 8 -c 32768"
    python bench/footprint.py --server-args "-m other.gguf --device cuda"

Texts are generated from fixed seeds: every config and the peer get identical requests.
After the table the acceptance checks are listed (``--strict``: exit 1 when one fails).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
from common import (  # noqa: E402
    MIB,
    ReqResult,
    ServerProcess,
    fmt,
    make_text,
    make_text_chars,
    percentile,
    print_conditions,
    print_table,
    ratio,
    scrape_metrics,
    stream_chat,
    stream_completion,
)
from proc_memory import MemorySampler, tree_rss_bytes  # noqa: E402

SCENARIOS = ("idle", "shared_prefix_burst", "seqshare", "multiturn", "churn")
CONFIG_FLAGS = {"default": "", "no-cache-prompt": "--no-cache-prompt", "cache-ram-0": "--cache-ram 0",
                "cache-ram-64": "--cache-ram 64"}
DEFAULT_CACHE_RAM_MIB = 8192  # kvserve's (and llama-server's) --cache-ram default
DEFAULT_CMD = "{python} -m kvserve -np 8 -c 32768 --metrics"
TOKENS_PER_WORD = 1.1  # make_text on the SmolLM2 tokenizer
GPU_METRIC = re.compile(r"^kvserve:(cuda_[a-z_]*bytes|[a-z_]*cuda[a-z_]*memory[a-z_]*bytes)$")


@dataclass(frozen=True)
class Workload:
    """Sizes after ``--scale``."""

    system_words: int
    question_words: int
    n_predict: int
    turn_chars: int
    churn_chars: int
    churn_predict: int
    idle_s: float
    n_burst: int = 8
    n_turns: int = 8
    n_churn: int = 32

    @staticmethod
    def scaled(scale: float) -> Workload:
        return Workload(
            system_words=max(20, round(3700 * scale / TOKENS_PER_WORD)),
            question_words=max(6, round(25 * min(1.0, scale * 4))),
            n_predict=max(4, round(128 * scale)),
            turn_chars=max(80, round(1000 * scale)),
            churn_chars=max(120, round(2000 * scale)),
            churn_predict=max(4, round(32 * scale)),
            idle_s=max(2.0, 20 * scale),
        )


@dataclass
class Outcome:
    config: str
    scenario: str
    ready_mib: float = 0.0
    peak_mib: float = 0.0  # whole life, model load included
    run_peak_mib: float = 0.0  # from /health ready on: what the workload adds
    settle_mib: float = 0.0
    wall_s: float = 0.0
    results: list[ReqResult] = field(default_factory=list)
    gpu_peak_mib: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> list[ReqResult]:
        return [r for r in self.results if r.error is None]

    def ttft_ms(self, q: float) -> float | None:
        v = percentile([r.ttft for r in self.ok if r.ttft is not None], q)
        return None if v is None else v * 1000

    @property
    def prompt_n(self) -> int:
        return sum(r.prompt_n for r in self.ok)

    @property
    def cache_n(self) -> int:
        return sum(r.cache_n for r in self.ok)


# -- workloads ----------------------------------------------------------------------------------------
def burst_prompts(w: Workload) -> list[str]:
    system = "System: You answer questions about the report below.\n\n" + make_text(37, w.system_words)
    return [f"{system}\n\nUser question {i + 1}: {make_text(500 + i, w.question_words)}?\nAnswer:"
            for i in range(w.n_burst)]


def body(prompt: str, n_predict: int) -> dict[str, Any]:
    return {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True}


async def run_scenario(name: str, url: str, w: Workload, timeout: float) -> list[ReqResult]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout),
                                 limits=httpx.Limits(max_connections=16)) as client:
        if name == "idle":
            await asyncio.sleep(w.idle_s)
            return []
        if name == "shared_prefix_burst":
            return list(await asyncio.gather(
                *(stream_completion(client, url, body(p, w.n_predict)) for p in burst_prompts(w))))
        if name == "seqshare":
            return [await stream_completion(client, url, body(p, w.n_predict)) for p in burst_prompts(w)]
        if name == "multiturn":
            messages: list[dict[str, str]] = []
            out = []
            for turn in range(w.n_turns):
                messages.append({"role": "user", "content": make_text_chars(900 + turn, w.turn_chars)})
                r = await stream_chat(client, url, {"messages": messages, "max_tokens": w.n_predict,
                                                    "temperature": 0, "ignore_eos": True})
                out.append(r)
                if r.error:
                    break
                messages.append({"role": "assistant", "content": r.text})
            return out
        if name == "churn":
            return [await stream_completion(client, url, body(make_text_chars(2000 + i, w.churn_chars),
                                                              w.churn_predict)) for i in range(w.n_churn)]
    raise ValueError(f"unknown scenario {name!r}")


# -- one (config, scenario) ---------------------------------------------------------------------------
def gpu_reader(url: str) -> Callable[[], dict[str, float]] | None:
    """A /metrics reader of the GPU memory gauges, or None when the server has none."""
    m = scrape_metrics(url)
    if not m or not any(GPU_METRIC.match(k) for k in m):
        return None

    def read() -> dict[str, float]:
        got = scrape_metrics(url, timeout=1.0) or {}
        return {k: v for k, v in got.items() if GPU_METRIC.match(k)}

    return read


def measure(config: str, cmd: str, scenario: str, w: Workload, args: argparse.Namespace) -> Outcome:
    out = Outcome(config, scenario)
    t_ready = float("inf")
    srv = ServerProcess(cmd)
    sampler = MemorySampler(srv.pid, interval=0.1).start()
    try:
        srv.wait_ready(args.start_timeout)
        t_ready = time.monotonic()
        out.ready_mib = sampler.sample() / MIB
        sampler.extra = gpu_reader(srv.url)
        t0 = time.monotonic()
        out.results = asyncio.run(run_scenario(scenario, srv.url, w, args.timeout))
        out.wall_s = time.monotonic() - t0
        time.sleep(args.settle_s)
        out.settle_mib = tree_rss_bytes(srv.pid) / MIB
    except Exception as e:  # noqa: BLE001 - one failed cell does not stop the matrix
        out.error = f"{type(e).__name__}: {e}"[:300]
    finally:
        sampler.stop()
        failed = out.error is not None or any(r.error for r in out.results)
        srv.stop(keep_log=failed)
    out.peak_mib = sampler.peak / MIB
    out.run_peak_mib = sampler.peak_since(t_ready) / MIB if out.ready_mib else 0.0
    out.gpu_peak_mib = {k.removeprefix("kvserve:"): v / MIB for k, v in sampler.extra_peak.items()}
    errs = [r.error for r in out.results if r.error]
    if errs and out.error is None:
        out.error = f"{len(errs)} failed requests (first: {errs[0]})"
    print(f"{config} / {scenario}: peak {out.peak_mib:.0f} MiB, wall {out.wall_s:.1f} s, "
          f"cache_n {out.cache_n}" + (f", ERROR {out.error}" if out.error else ""), file=sys.stderr, flush=True)
    return out


# -- report ---------------------------------------------------------------------------------------------
def acceptance(outs: dict[tuple[str, str], Outcome]) -> list[tuple[str, bool | None, str]]:
    """The acceptance checks; None when the cells needed were not run."""
    checks: list[tuple[str, bool | None, str]] = []
    for sc in ("shared_prefix_burst", "seqshare", "multiturn"):
        o = outs.get(("default", sc))
        checks.append((f"default {sc}: cached > 0", None if o is None or o.error else o.cache_n > 0,
                       "n/a" if o is None else f"cache_n = {o.cache_n}"))
    for sc in ("shared_prefix_burst", "seqshare"):
        d, n = outs.get(("default", sc)), outs.get(("no-cache-prompt", sc))
        sp = ratio(n.wall_s, d.wall_s) if d and n and not d.error and not n.error else None
        checks.append((f"{sc}: default >= 1.6x faster than no-cache-prompt", None if sp is None else sp >= 1.6,
                       f"speed-up {fmt(sp, 2)}"))
    for sc in ("idle", "shared_prefix_burst", "seqshare", "multiturn"):
        d, n = outs.get(("default", sc)), outs.get(("no-cache-prompt", sc))
        r = ratio(d.run_peak_mib, n.run_peak_mib) if d and n and not d.error and not n.error else None
        checks.append((f"{sc}: run peak default <= no-cache-prompt + 15%", None if r is None else r <= 1.15,
                       f"run peak ratio {fmt(r, 3)}"))
    # Churn shares nothing: what the cache keeps is bounded by --cache-ram, not by a ratio.
    n = outs.get(("no-cache-prompt", "churn"))
    for config, budget in (("default", DEFAULT_CACHE_RAM_MIB), ("cache-ram-64", 64)):
        d = outs.get((config, "churn"))
        extra = d.run_peak_mib - n.run_peak_mib if d and n and not d.error and not n.error else None
        checks.append((f"churn: {config} run peak - no-cache-prompt <= --cache-ram {budget} MiB (+5% RSS noise)",
                       None if extra is None else extra <= budget + 0.05 * n.run_peak_mib,
                       "n/a" if extra is None else f"{extra:.0f} MiB"))
    return checks


def report(outs: dict[tuple[str, str], Outcome], configs: list[str], scenarios: list[str]) -> int:
    gpu_keys = sorted({k for o in outs.values() for k in o.gpu_peak_mib})
    rows = []
    for sc in scenarios:
        base = outs.get(("no-cache-prompt", sc))
        for cfg in configs:
            o = outs.get((cfg, sc))
            if o is None:
                continue
            ok_base = base is not None and not base.error
            speed = ratio(base.wall_s, o.wall_s) if base is not None and ok_base and sc != "idle" else None
            peak = ratio(o.run_peak_mib, base.run_peak_mib) if base is not None and ok_base else None
            rows.append([sc, cfg, o.ready_mib, o.peak_mib, o.run_peak_mib, o.settle_mib]
                        + [o.gpu_peak_mib.get(k) for k in gpu_keys]
                        + [o.wall_s, o.ttft_ms(50), o.ttft_ms(95), len(o.ok), o.prompt_n, o.cache_n,
                           fmt(speed, 2), fmt(peak, 3), o.error or ""])
    head = ["scenario", "config", "ready MiB", "peak MiB", "run peak MiB", "settle MiB"]
    head += [f"peak {k} MiB" for k in gpu_keys]
    head += ["wall s", "TTFT p50 ms", "TTFT p95 ms", "ok", "prompt_n", "cache_n",
             "speed-up vs no-cache", "run peak vs no-cache", "error"]
    print_table(head, rows)
    checks = acceptance(outs)
    print("## Acceptance checks\n")
    print_table(["check", "result", "measured"],
                [[c, "n/a" if ok is None else ("PASS" if ok else "FAIL"), m] for c, ok, m in checks])
    return sum(1 for _, ok, _ in checks if ok is False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cmd", default=DEFAULT_CMD, help=f"kvserve command (default: {DEFAULT_CMD!r}); "
                   "configs append their flags; --port is appended unless {port} appears")
    p.add_argument("--server-args", default="", help="extra arguments for every kvserve config")
    p.add_argument("--model", help="shorthand for --server-args '-m PATH' (default: the embedded SmolLM2)")
    p.add_argument("--peer", help="a llama-server-compatible command run as config 'peer'")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--configs", default=None, help="default,no-cache-prompt,cache-ram-0[,cache-ram-64][,peer]")
    p.add_argument("--scale", type=float, default=1.0, help="shrinks prompt lengths, token counts and idle time")
    p.add_argument("--settle-s", type=float, default=2.0, help="idle time before the settle sample")
    p.add_argument("--timeout", type=float, default=900.0, help="per-request timeout, seconds")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--strict", action="store_true", help="exit 1 when an acceptance check fails")
    args = p.parse_args(argv)
    args.scenarios = [s for s in args.scenarios.split(",") if s]
    bad = [s for s in args.scenarios if s not in SCENARIOS]
    if bad:
        p.error(f"unknown scenarios {bad}; choose from {SCENARIOS}")
    if args.configs is None:
        args.configs = list(CONFIG_FLAGS) + (["peer"] if args.peer else [])
    else:
        args.configs = [c for c in args.configs.split(",") if c]
    for c in args.configs:
        if c not in CONFIG_FLAGS and c != "peer":
            p.error(f"unknown config {c!r}")
        if c == "peer" and not args.peer:
            p.error("config 'peer' needs --peer CMD")
    return args


def command_for(config: str, args: argparse.Namespace) -> str:
    if config == "peer":
        return str(args.peer)
    if not args.model and "-m " not in f"{args.cmd} {args.server_args} ":
        from common import default_models

        args.model = default_models()[0]  # without a model kvserve would start as the router
    extra = " ".join(x for x in (args.server_args, f"-m {args.model}" if args.model else "",
                                 CONFIG_FLAGS[config]) if x)
    return f"{args.cmd} {extra}".strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    w = Workload.scaled(args.scale)
    print_conditions(
        "kvserve memory footprint and prompt reuse",
        {
            "configs": "; ".join(f"{c}: `{command_for(c, args)}`" for c in args.configs),
            "scenarios": ", ".join(args.scenarios),
            "scale": args.scale,
            "idle": f"{w.idle_s:.0f} s",
            "shared_prefix_burst / seqshare": f"{w.n_burst} requests, system prompt {w.system_words} words "
                                              f"(~{w.system_words * TOKENS_PER_WORD:.0f} SmolLM2 tokens) + "
                                              f"{w.question_words}-word question, {w.n_predict} new tokens",
            "multiturn": f"{w.n_turns} turns of ~{w.turn_chars} characters, {w.n_predict} new tokens, replies echoed",
            "churn": f"{w.n_churn} distinct ~{w.churn_chars}-character prompts, {w.churn_predict} new tokens",
            "sampling": "temperature 0, ignore_eos true, streamed; cache_prompt not sent (server default)",
            "memory": "RSS of the server process tree every 100 ms from start (model load included); "
                      f"settle = {args.settle_s:.0f} s after the last response",
            "process": "one fresh server per (config, scenario), run one at a time",
        },
    )
    outs: dict[tuple[str, str], Outcome] = {}
    for sc in args.scenarios:
        for cfg in args.configs:
            outs[(cfg, sc)] = measure(cfg, command_for(cfg, args), sc, w, args)
    failed = report(outs, args.configs, args.scenarios)
    errors = [o for o in outs.values() if o.error]
    if errors:
        print(f"{len(errors)} cells had errors")
    return 1 if errors or (args.strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
