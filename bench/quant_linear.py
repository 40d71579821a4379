"""One linear layer per weight layout on the CPU: ms per call against the rows of the input.

For real model shapes (Qwen2.5-0.5B and SmolLM2-135M projections) and each layout the loader
can choose — ``int4`` (Q4_* one plane), ``int4x2`` (Q5_*/Q8_0 two planes; for many rows both
layouts dequantize each weight once, ``int4.dequantize_t``, then run the bf16 GEMM), ``bf16``/``f32``
dense — prints CPU-time milliseconds per call (process CPU time, so that a shared machine's load
matters less).
With ``--model``, whole-model prefills instead: one prompt of each ``--prefill`` length with every
quantized layer forced onto the int4 kernel, then onto dequantize + GEMM (weights streamed from
memory, as in a real prefill). That crossover is ``quant.linear.GEMV_MAX_ROWS``.

    python bench/quant_linear.py                   # all shapes, rows 1,4,16,32,64,512
    python bench/quant_linear.py --rows 1,512 --threads 2
    python bench/quant_linear.py --model model.gguf --prefill 32,48,64,96,128
    python bench/quant_linear.py --kernel-dtypes --rows 1,4   # the int4 kernel per activation dtype
    python bench/quant_linear.py --native --model model.gguf --rows 1,4,16,128,512

``--native``: every distinct linear layer of the model (the modules the loader builds, fused as
they run) on the native kernels (``quant.native``) against the same tensors on the int4 layout
(``KVSERVE_NATIVE=0``; Q6_K and other formats without one are bf16 dense there), both loaded in
this process and timed alternately (CPU time, weights warm in cache): robust to machine load.

``--kernel-dtypes``: the int4 kernel itself with bf16, float16 and float32 activations (scales and
offsets in the same dtype; the output comes in it too), against an exact float64 product: ms per
call and max |error| relative to max |y| (the weights' scales exact in every dtype).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model.quant import int4  # noqa: E402
from kvserve.model.quant.groups import Groups  # noqa: E402
from kvserve.model.quant.linear import QuantLinear  # noqa: E402

SHAPES = {"qwen gate_up": (9728, 896), "qwen down": (896, 4864), "qwen qkv": (1152, 896),
          "smol gate_up": (3072, 576)}


def cpu_ms(f, min_s: float = 0.3) -> float:
    f()
    n, t0 = 0, time.process_time()
    while True:
        f()
        n += 1
        dt = time.process_time() - t0
        if dt >= min_s and n >= 3:
            return dt / n * 1e3 / torch.get_num_threads()


def groups(n: int, k: int, bits: int) -> Groups:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
    s = rng.uniform(1e-3, 1e-2, (n, k // 32)).astype(np.float32)
    return Groups(codes, s, -(2 ** (bits - 1)) * s, bits)


def model_crossover(path: str, lengths: list[int], threads: int) -> None:
    from kvserve.model.loader import load_gguf
    from kvserve.model.runner import ModelRunner
    from kvserve.plan import Plan, SeqChunk

    loaded = load_gguf(path)
    runner = ModelRunner(loaded, n_pages=max(lengths) // 16 + 2, page_size=16, n_ubatch=max(lengths))
    mods = [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]
    print_conditions("whole-model prefill: int4 kernel vs dequantize + GEMM (CPU)", {
        "model": os.path.basename(path), "torch": torch.__version__, "threads": threads,
        "timing": "process CPU time per prefill / threads, mean of 3 after 1 warm-up",
        "prompt": "token ids 5.., logits last", "cells": "ms per prefill"})
    out = []
    for n in lengths:
        plan = Plan((SeqChunk(0, tuple(range(5, 5 + n)), 0, tuple(range(n // 16 + 1)), "last"),))
        row: list[object] = [n]
        for rows in (1 << 30, 0):  # every layer on the kernel, then every layer dequantized
            for m in mods:
                m.gemv_max_rows = rows
            row.append(cpu_ms(lambda: runner.run(plan), min_s=0.0))
        out.append(row)
    print_table(["prompt tokens", "int4 kernel", "dequantize + GEMM"], out, digits=0)


def native_vs_int4(path: str, rows: list[int], threads: int) -> None:
    from kvserve.model.loader import load_gguf
    from kvserve.model.quant import native

    if not native.available():
        raise SystemExit(native.unavailable_reason())
    old = os.environ.get("KVSERVE_NATIVE")
    os.environ["KVSERVE_NATIVE"] = "0"
    int4_model = load_gguf(path)
    os.environ["KVSERVE_NATIVE"] = "1"
    nat_model = load_gguf(path)
    if old is None:
        del os.environ["KVSERVE_NATIVE"]
    else:
        os.environ["KVSERVE_NATIVE"] = old
    print_conditions("linear layers: native kernels vs the int4 layout, same process (CPU)", {
        "model": os.path.basename(path), "torch": torch.__version__, "threads": threads,
        "native kernels": native.isa_name(native.best_isa()),
        "load average (1, 5, 15 min)": " ".join(f"{v:.1f}" for v in os.getloadavg()),
        "timing": "process CPU time per call / threads, the two alternating per cell; weights warm in cache",
        "cells": "ms per call; ratio = int4 ms / native ms (> 1: native faster)"})
    seen: set[tuple] = set()
    out = []
    for name, mod in nat_model.model.named_modules():
        if not isinstance(mod, native.NativeLinear):
            continue
        key = (name.rpartition(".")[2], mod.in_features, mod.out_features, tuple(mod.qtypes))
        if key in seen:
            continue
        seen.add(key)
        other = int4_model.model.get_submodule(name)
        for m in rows:
            x = torch.randn(m, mod.in_features)
            tn, ti = [], []
            for _ in range(2):
                tn.append(cpu_ms(lambda: mod(x), min_s=0.15))
                ti.append(cpu_ms(lambda: other(x), min_s=0.15))
            a, b = min(tn), min(ti)
            out.append([key[0], "/".join(q.name for q in key[3]), f"{key[2]}x{key[1]}", getattr(other, "path", "?"),
                        m, a, b, f"{b / a:.2f}"])
    print_table(["layer", "types", "N x K", "other path", "rows", "native ms", "int4 ms", "ratio"], out, digits=3)


def kernel_dtypes(rows: list[int], shapes: list[str]) -> None:
    print_conditions("the int4 kernel by activation dtype (CPU)", {
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "timing": "process CPU time per call / threads",
        "weights": "random 4-bit codes, scales 2^-k (exact in bf16)",
        "error": "max |y - y_exact| / max |y_exact|, y_exact in float64"})
    out = []
    rng = np.random.default_rng(0)
    for name in shapes:
        n, k = SHAPES[name]
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        s = 2.0 ** -rng.integers(6, 10, (n, k // 32)).astype(np.float64)
        packed, sz, _ = int4.pack([int4.Plane(codes, s, np.zeros_like(s))], n)  # W = (c - 8)·s
        w = torch.from_numpy(((codes.astype(np.float64) - 8).reshape(n, -1, 32) * s[..., None]).reshape(n, k))
        for m in rows:
            x = torch.randn(m, k, dtype=torch.float64)
            exact = x @ w.T
            row: list[object] = [name, m]
            for dt in (torch.bfloat16, torch.float16, torch.float32):
                xd, szd = x.to(dt), sz.to(dt)
                row.append(cpu_ms(lambda: int4.matmul(xd, packed, szd)))
                y = int4.matmul(xd, packed, szd)[:, :n].double()
                row.append(f"{((y - exact).abs().max() / exact.abs().max()).item():.1e}")
            out.append(row)
    print_table(["shape", "rows", "bf16 ms", "bf16 error", "float16 ms", "float16 error", "float32 ms",
                 "float32 error"], out, digits=3)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,16,32,64,512")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--model", help="a GGUF file: time whole-model prefills at --prefill lengths instead")
    p.add_argument("--prefill", default="32,48,64,96,128")
    p.add_argument("--native", action="store_true",
                   help="with --model: each layer on the native kernels against the int4 layout, same process")
    p.add_argument("--kernel-dtypes", action="store_true",
                   help="the int4 kernel with bf16 / float16 / float32 activations: time and error")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.kernel_dtypes:
        kernel_dtypes([int(r) for r in args.rows.split(",")], args.shapes.split(","))
        return
    if args.native:
        native_vs_int4(args.model, [int(r) for r in args.rows.split(",")], args.threads)
        return
    if args.model:
        model_crossover(args.model, [int(r) for r in args.prefill.split(",")], args.threads)
        return
    rows = [int(r) for r in args.rows.split(",")]
    print_conditions("quantized linear layers (CPU)", {
        "torch": torch.__version__, "threads": args.threads, "timing": "process CPU time per call / threads",
        "cells": "ms per call"})
    out = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        mods = {"int4": QuantLinear([groups(n, k, 4)]), "int4x2": QuantLinear([groups(n, k, 8)])}
        w = torch.randn(n, k) * 0.01
        for m in rows:
            x = torch.randn(m, k)
            row = [name, m]
            for lay, mod in mods.items():
                xb = x.to(torch.bfloat16)
                row.append(cpu_ms(lambda: int4.matmul(xb, mod.packed, mod.scale_zero)))
                row.append(cpu_ms(lambda: mod._dequant_gemm(xb)))  # planes combined
            wb = w.to(torch.bfloat16)
            row.append(cpu_ms(lambda: F.linear(x.to(torch.bfloat16), wb)))
            row.append(cpu_ms(lambda: F.linear(x, w)))
            out.append(row)
    print_table(["shape", "rows", "int4 kernel", "int4 deq+gemm", "int4x2 kernel", "int4x2 deq+gemm",
                 "bf16 dense", "f32 dense"], out, digits=3)


if __name__ == "__main__":
    main()
