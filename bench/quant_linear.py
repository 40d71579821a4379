"""One linear layer per weight layout on the CPU: ms per call against the rows of the input.

For real model shapes (Qwen2.5-0.5B and SmolLM2-135M projections) and each layout the loader
can choose — ``int4`` (Q4_* one plane), ``int4x2`` (Q5_*/Q8_0 two planes; for many rows both
layouts dequantize each weight once, ``int4.dequantize_t``, and use the bf16 GEMM), ``bf16``/``f32`` dense — prints CPU-time milliseconds
per call (process CPU time, so that a shared machine's load matters less) and the weights/s.
This is the measurement behind ``quant.linear.GEMV_MAX_ROWS``.

    python bench/quant_linear.py                   # all shapes, rows 1,4,16,32,64,512
    python bench/quant_linear.py --rows 1,512 --threads 2
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,16,32,64,512")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
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
                row.append(cpu_ms(lambda: mod._dequant_gemm(xb)))
            wb = w.to(torch.bfloat16)
            row.append(cpu_ms(lambda: F.linear(x.to(torch.bfloat16), wb)))
            row.append(cpu_ms(lambda: F.linear(x, w)))
            out.append(row)
    print_table(["shape", "rows", "int4 kernel", "int4 deq+gemm", "int4x2 kernel", "int4x2 deq+gemm",
                 "bf16 dense", "f32 dense"], out, digits=3)


if __name__ == "__main__":
    main()
