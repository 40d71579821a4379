"""The native linear kernels (``quant.native.matmul``) of two source trees, on SmolLM2-135M's
shapes, alternated in one run: ms per model step (the 30 layers' Q4_1 projections and the Q8_0
output head) for a few row counts, best of ``--reps`` calls each (one thread; random weights of
the real formats). For before/after comparisons of kernel changes: each tree's ``src`` (with its
extension built in place) runs in its own child process, ``--rounds`` times in turn.

    python bench/qmm_trees.py --tree /path/to/old/checkout --tree .

(At 128 rows the head's 49152 columns dominate; a prefill runs the head on its last row only.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_conditions, print_table  # noqa: E402

# (format, N, K, calls per step): fused QKV, attn output, fused gate/up, down (30 layers), head
SHAPES = [("Q4_1", 960, 576, 30), ("Q4_1", 576, 576, 30), ("Q4_1", 3072, 576, 30), ("Q4_1", 576, 1536, 30),
          ("Q8_0", 49152, 576, 1)]

CHILD = r"""
import json, sys, time
import numpy as np, torch
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from kvserve.model.quant import native
torch.set_num_threads(1)
rows, reps, shapes = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
out = {}
for m in rows:
    total = 0.0
    for fmt, n, k, calls in shapes:
        qt = Q[fmt]
        bw, bb = GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (n, k // bw, bb), dtype=np.uint8)
        raw[..., 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)  # finite f16 scales
        if fmt == "Q4_1":
            raw[..., 2:4] = np.frombuffer(np.float16(-0.05).tobytes(), np.uint8)
        w = torch.from_numpy(raw.reshape(n, -1))
        x = torch.randn(m, k)
        best = 1e9
        for _ in range(reps):
            t = time.perf_counter()
            native.matmul(qt, x, w, threads=1)
            best = min(best, time.perf_counter() - t)
        total += best * calls
    out[m] = total * 1e3
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", action="append", required=True, help="a checkout (its src/ is imported); twice")
    ap.add_argument("--rows", default="1,4,128")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    res: dict[str, list[dict[str, float]]] = {t: [] for t in args.tree}
    for _ in range(args.rounds):
        for t in args.tree:
            env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(t), "src"))
            cfg = json.dumps([rows, args.reps, SHAPES])
            p = subprocess.run([sys.executable, "-c", CHILD, cfg], env=env, capture_output=True, text=True, check=True)
            res[t].append(json.loads(p.stdout))
    print_conditions("native kernels of two trees, SmolLM2-135M shapes", {
        "shapes": "30 × Q4_1 (960×576, 576×576, 3072×576, 576×1536) + Q8_0 head 49152×576",
        "timing": f"best of {args.reps} calls, one thread, {args.rounds} rounds alternated"})
    table = [[t, *[" / ".join(f"{r[str(m)]:.2f}" for r in res[t]) for m in rows]] for t in args.tree]
    print_table(["tree", *[f"{m} rows: ms per step (each round)" for m in rows]], table)


if __name__ == "__main__":
    main()
