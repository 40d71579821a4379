"""Top functions per thread from a py-spy raw profile (``py-spy record -f raw --threads``).

Each line of a raw profile is one distinct stack (``thread (tid): name;frame;frame ... count``).
Per thread this prints the share of its samples in each function's own lines (the innermost
frame: where the thread was) and, inclusive, in each function that was on the stack. py-spy
counts only samples where a thread was not idle (waiting in a system call that sleeps), so the
shares are of a thread's active time, and C code (a torch call, a socket write, the event
loop's own work) counts in the Python frame that called it.

    python bench/pyspy_top.py PROFILE.txt [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from typing import Any

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame(f: str) -> str:
    """``fn (path/to/file.py:123)`` -> ``fn (file.py)``: lines of one function together."""
    m = _FRAME.match(f.strip())
    if not m:
        return f.strip()
    return f"{m['fn']} ({m['file'].rsplit('/', 1)[-1]})"


def load(path: str) -> dict[str, tuple[int, collections.Counter, collections.Counter]]:
    """thread -> (samples, own counts, inclusive counts)."""
    own: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    inc: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    tot: collections.Counter = collections.Counter()
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            stack, _, cnt = line.rstrip("\n").rpartition(" ")
            if not stack or not cnt.isdigit():
                continue
            n = int(cnt)
            thread, *frames = stack.split(";")
            thread = re.sub(r"\(\d+\)", "", thread).replace("thread", "").strip(" :") or thread
            fr = [_frame(f) for f in frames]
            tot[thread] += n
            if fr:
                own[thread][fr[-1]] += n
            for f in set(fr):
                inc[thread][f] += n
    return {t: (tot[t], own[t], inc[t]) for t in tot}


def tables(path: str, top: int, min_samples: int = 20) -> list[tuple[str, list[list[Any]], list[list[Any]]]]:
    out = []
    for thread, (n, own, inc) in sorted(load(path).items(), key=lambda kv: -kv[1][0]):
        if n < min_samples:
            continue
        out.append((f"{thread} ({n} samples)",
                    [[f[:90], 100.0 * c / n] for f, c in own.most_common(top)],
                    [[f[:90], 100.0 * c / n] for f, c in inc.most_common(top)]))
    return out


def print_tables(path: str, top: int) -> None:
    from common import print_table

    for thread, own, inc in tables(path, top):
        print(f"### {thread}: own\n")
        print_table(["function (own lines)", "% of samples"], own, digits=1)
        print(f"### {thread}: inclusive\n")
        print_table(["function (on the stack)", "% of samples"], inc, digits=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)
    print_tables(args.profile, args.top)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    sys.exit(main())
