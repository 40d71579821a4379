"""Start-up time: process start → ``/health`` 200, for kvserve and (optionally) llama-server.

Each server is started ``--runs`` times (default 3) with ``-np 2 -c 2048 --host 127.0.0.1`` on
each model and its default threads, alone or ``--together N`` at once (as a test suite with N
workers starts them). Reported: the median seconds to a 200 from ``/health`` and the CPU seconds
of the load phase (the process' user+system time at that moment, which a busy machine inflates
less than wall time). Ratios are kvserve / llama-server.

    python bench/startup.py [--model PATH ...] [--llama-server PATH] [--runs 3] [--together 1]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import ServerProcess, default_models, median, print_conditions, print_table, ratio  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of a process (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_together(cmd: str, n: int) -> list[tuple[float, float]]:
    """Start ``n`` servers at once; (seconds to /health 200, CPU seconds then) of each."""
    servers = [ServerProcess(cmd) for _ in range(n)]
    try:
        out = []
        for s in servers:
            ready = s.wait_ready(timeout=300)
            out.append((ready, cpu_seconds(s.pid)))
        return out
    finally:
        for s in servers:
            s.stop()


def measure(cmd: str, runs: int, together: int) -> dict[str, Any]:
    got = [r for _ in range(runs) for r in start_together(cmd, together)]
    return {"ready_s": median([g[0] for g in got]), "cpu_s": median([g[1] for g in got])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=None, help="GGUF file (repeatable)")
    p.add_argument("--llama-server", default=None, help="path of the llama-server binary (the peer)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--together", type=int, default=1, help="servers started at the same time")
    p.add_argument("--kvserve-args", default="", help="extra kvserve flags")
    args = p.parse_args(argv)
    if not args.model:
        args.model = default_models()
    common = "-np 2 -c 2048 --host 127.0.0.1"
    cmds = {"kvserve": f"python -m kvserve {common} {args.kvserve_args}".strip()}
    if args.llama_server:
        cmds["llama-server"] = f"{shlex.quote(args.llama_server)} {common}"
    print_conditions("Start-up: process start to /health 200", {
        **{name: cmd + " -m MODEL" for name, cmd in cmds.items()},
        "runs": f"median of {args.runs} × {args.together} server(s) started together",
        "cpu": "user+system seconds of the server process when /health first answered 200",
    })
    rows = []
    for model in args.model:
        got = {name: measure(f"{cmd} -m {shlex.quote(model)}", args.runs, args.together) for name, cmd in cmds.items()}
        k = got["kvserve"]
        row: list[Any] = [os.path.basename(model), k["ready_s"], k["cpu_s"]]
        if "llama-server" in got:
            ll = got["llama-server"]
            row += [ll["ready_s"], ll["cpu_s"], ratio(k["ready_s"], ll["ready_s"])]
        rows.append(row)
    headers = ["model", "kvserve ready s", "kvserve cpu s"]
    if args.llama_server:
        headers += ["llama-server ready s", "llama-server cpu s", "ready ratio"]
    print_table(headers, rows, digits=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
