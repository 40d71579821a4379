"""Where a CPU decode step's time goes: each native call of the step timed on its own.

The model runner on the CPU (``bench/engine.py``'s decode loop, one sequence at ``--ctx`` tokens
of context) with every call into the native extensions wrapped by a timer: the quantized matrix
products (``_qmm.matmul``, by format and shape, with the weight bytes they read and the bandwidth
that makes), attention, RMSNorm, RoPE + KV write, act · up. The step is timed first without the
wrappers; "outside the calls" is the unwrapped step minus the calls' sum (Python, the embedding
row, the logits' copy). The wrappers add ~1 µs a call.

    python bench/cpu_calls.py --model qwen2.5-coder-0.5b-q4_k_m.gguf [--ctx 128] [--steps 20] [--threads N]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from gguf import GGML_QUANT_SIZES  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import Bench, parse_args  # noqa: E402

from kvserve.model import attn_native, ops_cpu  # noqa: E402
from kvserve.model.loader import DTYPES, load_gguf  # noqa: E402
from kvserve.model.quant import native  # noqa: E402

# bytes a weight by ``native.FORMATS`` id (the GGUF block's bytes / its weights)
BYTES_PER_WEIGHT = {v: GGML_QUANT_SIZES[q][1] / GGML_QUANT_SIZES[q][0] for q, v in native.FORMATS.items()}
FORMAT_NAMES = {v: q.name for q, v in native.FORMATS.items()}


class Timed:
    """A stand-in for an extension module whose functions add their time to ``stats``."""

    def __init__(self, module, stats: dict, label) -> None:  # noqa: ANN001
        self._module, self._stats, self._label = module, stats, label

    def __getattr__(self, name: str):  # noqa: ANN204
        f = getattr(self._module, name)
        if not callable(f) or name in ("best_isa",):
            return f
        stats, label = self._stats, self._label

        def timed(*a):  # noqa: ANN002, ANN202
            t0 = time.perf_counter()
            r = f(*a)
            s = stats[label(name, a)]
            s[0] += 1
            s[1] += time.perf_counter() - t0
            return r

        return timed


def mm_label(name: str, a: tuple) -> tuple:
    # matmul(fmt, x, M, K, w, N, y, ldy, threads, isa)
    return ("matmul", a[0], a[3], a[5]) if name == "matmul" else (name,)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit("the native kernels are not built here")
    print_conditions("native calls of one CPU decode step", {
        "model": os.path.basename(args.model), "context": args.ctx, "timed steps": args.steps,
        "threads": torch.get_num_threads(), "isa": native._ISA, "torch": torch.__version__,
    })
    bargs = parse_args(["--device", "cpu", "--model", args.model, "--prefill", "16", "--batches", "1",
                        "--ctx", str(args.ctx), "--steps", str(2 * args.steps + 8), "--weights", "quant"])
    loaded = load_gguf(args.model, dtype=DTYPES["f32"], device=torch.device("cpu"), weights="quant")
    bench = Bench(loaded, bargs)
    step = bench.decode_setup(1)
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    plain = (time.perf_counter() - t0) / args.steps

    stats: dict = collections.defaultdict(lambda: [0, 0.0])
    saved = native._qmm, ops_cpu._ops_cpu, attn_native._attn
    native._qmm = Timed(native._qmm, stats, mm_label)
    ops_cpu._ops_cpu = Timed(ops_cpu._ops_cpu, stats, lambda n, a: (n,))
    attn_native._attn = Timed(attn_native._attn, stats, lambda n, a: (n,))
    fwd = next((m._cpu_forward for m in loaded.model.modules() if getattr(m, "_cpu_forward", None)), None)
    bound = fwd.matmul if fwd is not None else None
    if bound is not None:  # the CPU forward keeps the extension's function itself
        fwd.matmul = native._qmm.matmul
    try:
        step = bench.decode_setup(1)
        for _ in range(2):
            step()
        stats.clear()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        wrapped = (time.perf_counter() - t0) / args.steps
    finally:
        native._qmm, ops_cpu._ops_cpu, attn_native._attn = saved
        if bound is not None:
            fwd.matmul = bound
    rows, total = [], 0.0
    for key, (n, secs) in sorted(stats.items(), key=lambda kv: -kv[1][1]):
        ms = 1e3 * secs / args.steps
        total += ms
        if key[0] == "matmul":
            _, fmt, k, cols = key
            nbytes = k * cols * BYTES_PER_WEIGHT[fmt] * n / args.steps
            rows.append([f"matmul {FORMAT_NAMES.get(fmt, fmt)} {k}×{cols}", n / args.steps, ms, nbytes / 1e6,
                         nbytes / (ms / 1e3) / 1e9])
        else:
            rows.append([key[0], n / args.steps, ms, None, None])
    rows.append(["(the calls' sum)", None, total, None, None])
    rows.append(["outside the calls", None, 1e3 * plain - total, None, None])
    print(f"step {1e3 * plain:.2f} ms (with the timers {1e3 * wrapped:.2f} ms)\n")
    print_table(["call", "calls a step", "ms a step", "MB read a step", "GB/s"], rows, digits=2)


if __name__ == "__main__":
    main()
