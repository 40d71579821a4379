"""Decode speed of kvserve under each OpenMP wait policy (``OMP_WAIT_POLICY``).

kvserve sets ``PASSIVE`` unless the environment names a policy. This starts the server
(``-np 1 -c 2048``, default threads) once per policy and run, and streams a 64-token greedy
reply (``ignore_eos``) after a warm-up reply; tok/s from the client's clock between the first
and the last streamed token. Policies alternate, so a change in machine load hits each alike.

    python bench/wait_policy.py [--model PATH] [--runs 3] [--policies PASSIVE,ACTIVE]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import ServerProcess, median, print_conditions, print_table, ratio  # noqa: E402
from vs_llama_server import decode_run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--n-predict", type=int, default=64)
    p.add_argument("--policies", default="PASSIVE,ACTIVE")
    args = p.parse_args(argv)
    if args.model is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
        from kvserve.model.files import default_model_path

        args.model = default_model_path()
    policies = args.policies.split(",")
    cmd = f"python -m kvserve -np 1 -c 2048 --host 127.0.0.1 -m {args.model}"
    print_conditions("Decode tok/s by OpenMP wait policy", {
        "server": cmd, "reply": f"streamed {args.n_predict}-token greedy reply after one warm-up",
        "runs": f"median of {args.runs}, policies alternating",
    })
    got: dict[str, list[float]] = {pol: [] for pol in policies}
    for _ in range(args.runs):
        for pol in policies:
            with ServerProcess(cmd, env={"OMP_WAIT_POLICY": pol}) as srv:
                srv.wait_ready()
                decode_run(srv.url, 8)
                got[pol].append(decode_run(srv.url, args.n_predict)[0])
            print(f"{pol}: {got[pol][-1]:.1f} tok/s", file=sys.stderr, flush=True)
    base = median(got[policies[0]])
    print_table(["OMP_WAIT_POLICY", "decode tok/s (median)", "runs", f"ratio to {policies[0]}"],
                [[pol, median(v), " ".join(f"{x:.1f}" for x in v), ratio(median(v), base)] for pol, v in got.items()],
                digits=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
