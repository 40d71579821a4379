"""The CUDA 4-bit GEMV (Triton) against bf16 ``F.linear`` on the linear layers of a Llama-3-8B
decoder, batch 1: microseconds per call, weight bytes read per second and the fraction of the
device's copy bandwidth measured in the same run (the weight-bytes roofline).

    python bench/quant_cuda.py                 # needs CUDA
    python bench/quant_cuda.py --rows 1,4,16
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model.quant import triton_q4  # noqa: E402
from kvserve.model.quant.groups import Groups  # noqa: E402

# (name, out, in): Llama-3-8B with Q/K/V and gate/up fused as the loader fuses them
SHAPES = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096)]


def time_us(fn, iters: int = 50) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=iters)) * 1e3


def copy_bandwidth() -> float:
    """bytes/s of a device-to-device copy of 2 GiB (read + write counted)."""
    a = torch.empty(1 << 31, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = time_us(lambda: b.copy_(a))
    return 2 * a.numel() / (us * 1e-6)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1")
    args = p.parse_args()
    bw = copy_bandwidth()
    print_conditions("CUDA 4-bit GEMV vs bf16 linear (Llama-3-8B layers)", {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "copy bandwidth (measured)": f"{bw / 1e12:.2f} TB/s",
        "q4 bytes": "codes 0.5 B + f16 scale and offset per 32 weights (5 bits/weight)",
        "timing": "triton.testing.do_bench median"})
    rng = np.random.default_rng(0)
    rows = []
    tot = {"q4": 0.0, "bf16": 0.0}
    for name, n, k in SHAPES:
        codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
        s = rng.uniform(1e-3, 1e-2, (n, k // 32)).astype(np.float32)
        q, sc, of = (t.cuda() for t in triton_q4.pack(Groups(codes, s, -8 * s, 4)))
        w = triton_q4.dequantize(q, sc, of, torch.bfloat16)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            t_q = time_us(lambda: triton_q4.gemv(x, q, sc, of))
            t_b = time_us(lambda: F.linear(x, w))
            qb = q.nbytes + sc.nbytes + of.nbytes
            if m == 1:
                tot["q4"] += t_q * (32 if name != "lm_head" else 1)
                tot["bf16"] += t_b * (32 if name != "lm_head" else 1)
            rows.append([name, f"{n}x{k}", m, t_q, t_b, t_b / t_q, qb / (t_q * 1e-6) / 1e9,
                         qb / (t_q * 1e-6) / bw, w.nbytes / (t_b * 1e-6) / bw])
        del w
    print_table(["layer", "shape", "rows", "q4 µs", "bf16 µs", "bf16/q4", "q4 GB/s", "q4 / roofline",
                 "bf16 / roofline"], rows, digits=2)
    print(f"32 layers + head at batch 1, linear layers only: q4 {tot['q4'] / 1e3:.2f} ms/token "
          f"({1e6 / tot['q4']:.0f} tok/s bound), bf16 {tot['bf16'] / 1e3:.2f} ms/token "
          f"({1e6 / tot['bf16']:.0f} tok/s bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
