"""Where a burst's requests wait before their first token: the timeline a server writes with
``KVSERVE_TTFT_TRACE=PATH`` (``kvserve.engine.ttft_trace``), by burst.

    KVSERVE_TTFT_TRACE=/tmp/t.json python bench/host_overhead.py --workloads burst ...
    python bench/ttft_trace.py /tmp/t.json [--gap-ms 200] [--min-size 16]

Requests are grouped into bursts by their reception times (a gap of more than ``--gap-ms``
starts a new one; groups under ``--min-size`` requests, warm-ups and scrapes, are left out).
For each burst: the distribution (min, quartiles, max, ms from the burst's first reception) of
the four times — received (the HTTP body read and parsed), submitted (validated and tokenized,
in the engine's queue), admitted (taken in by the engine thread), first (the first token
sampled) — and how many distinct engine steps gave the burst its first tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_table  # noqa: E402

NAMES = ("received", "submitted", "admitted", "first")


def bursts(rows: list[list[float]], gap_s: float, min_size: int) -> list[list[list[float]]]:
    out: list[list[list[float]]] = []
    last = None
    for r in sorted(rows, key=lambda r: r[0]):
        if last is None or r[0] - last > gap_s:
            out.append([])
        out[-1].append(r)
        last = r[0]
    return [b for b in out if len(b) >= min_size]


def quartiles(v: list[float]) -> list[float]:
    v = sorted(v)
    n = len(v)
    return [v[0], v[n // 4], v[n // 2], v[(3 * n) // 4], v[-1]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace")
    p.add_argument("--gap-ms", type=float, default=200.0)
    p.add_argument("--min-size", type=int, default=16)
    args = p.parse_args(argv)
    with open(args.trace) as f:
        rows = json.load(f)
    table = []
    for i, b in enumerate(bursts(rows, args.gap_ms / 1e3, args.min_size), 1):
        t0 = min(r[0] for r in b)
        for j, name in enumerate(NAMES):
            table.append([i, len(b), name, *(round(1e3 * (t - t0), 1) for t in quartiles([r[j] for r in b]))])
        steps = len({round(r[3], 6) for r in b})
        table.append([i, len(b), "first-token steps", steps, "", "", "", ""])
    print_table(["burst", "requests", "time", "min ms", "p25", "p50", "p75", "max"], table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
