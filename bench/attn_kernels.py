"""Decode attention kernel alone (CUDA): effective KV bandwidth of the split-K paged decode kernel
at several launch configurations, on the model shapes of the engine matrix.

For each (shape, batch, context): K and V of every sequence in shuffled 16-token pages, one query
per sequence; the kernel time (triton.testing.do_bench, median) and the KV bytes it must read give
GB/s, to compare with the device's copy bandwidth. The row marked "default" is the
backend's own choice (splits, block_n; 4 warps, 2 stages).

    python bench/attn_kernels.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model.backends import triton_kernels as tk  # noqa: E402

SHAPES = {"1B (32/8 heads, d64)": (32, 8, 64), "8B (32/8 heads, d128)": (32, 8, 128)}
CONFIGS = [(64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 3), (32, 4, 2)]  # block_n, warps, stages


def main() -> int:
    from triton.testing import do_bench

    dev = torch.device("cuda")
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    print_conditions("paged decode attention kernel", {
        "device": torch.cuda.get_device_name(0), "dtype": "bf16", "page size": 16,
        "timing": "triton.testing.do_bench median, warm-up 25 ms, 100 ms of repeats",
    })
    rows = []
    for name, (h, hkv, d) in SHAPES.items():
        for batch, ctx in ((1, 2048), (64, 2048), (64, 8192)):
            pages = batch * ctx // 16
            perm = torch.randperm(pages, device=dev, dtype=torch.int64).to(torch.int32)
            table = perm.view(batch, ctx // 16).contiguous()
            kc = torch.randn(pages * 16, hkv, d, device=dev, dtype=torch.bfloat16)
            vc = torch.randn_like(kc)
            q = torch.randn(batch, h, d, device=dev, dtype=torch.bfloat16)
            out = torch.empty_like(q)
            ar = torch.arange(batch, device=dev, dtype=torch.int32)
            lens = torch.full((batch,), ctx, device=dev, dtype=torch.int32)
            kv_bytes = 2 * batch * ctx * hkv * d * 2
            default_ns = max(1, min(-(-2 * n_sm // (batch * hkv)), 32, -(-ctx // 64)))
            default_bn = 128 if d <= 64 and batch * hkv >= 128 else 64
            for ns in sorted({default_ns, 1, 4}):
                ws = tk.DecodeWorkspace(batch, h, d, ns, dev)
                for bn, nw, st in CONFIGS:
                    def run() -> None:
                        tk.decode_attention(q, out, ar, kc, vc, table, ar, lens, ws, 16, d**-0.5, 0,
                                            block_n=bn, num_warps=nw, num_stages=st)
                    try:
                        ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                    except Exception as e:  # a configuration the compiler refuses
                        rows.append([name, batch, ctx, ns, f"{bn}/{nw}/{st}", None, f"failed: {type(e).__name__}", ""])
                        continue
                    tag = "default" if (ns, bn, nw, st) == (default_ns, default_bn, 4, 2) else ""
                    rows.append([name, batch, ctx, ns, f"{bn}/{nw}/{st}", ms * 1e3, kv_bytes / (ms / 1e3) / 1e9, tag])
            del kc, vc
            torch.cuda.empty_cache()
    print_table(["shape", "batch", "context", "splits", "block_n/warps/stages", "µs", "KV GB/s", ""], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
