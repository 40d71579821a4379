"""Cascade decode kernel against plain split-K decode (CUDA): sequences whose page tables share a
prefix, the prefix read once per group (``tk.CascadeGroups``) or once per sequence (plain).

For each (shape, batch, shared prefix, own tokens): one group of ``batch`` sequences sharing the
prefix pages, each with its own pages after it; the kernel time of both paths (median, replayed
as a CUDA graph as decode steps are, so launch latency is left out), the time of the cascade's
shared-prefix kernel alone, the KV bytes each path must read, and the outputs' max difference.

    python bench/cascade_decode.py            (--smoke: one tiny case on the CPU under Triton's interpreter)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model.attention import cascade_groups  # noqa: E402
from kvserve.model.backends import triton_kernels as tk  # noqa: E402
from kvserve.model.backends.triton_backend import TritonBackend  # noqa: E402

SHAPES = {"1B (32/8 heads, d64)": (32, 8, 64), "8B (32/8 heads, d128)": (32, 8, 128)}
CASES = [(8, 2048, 32), (64, 2048, 32), (64, 2048, 512), (64, 8192, 64), (16, 512, 16)]  # batch, shared, own
PS = 16


def main() -> int:
    smoke = "--smoke" in sys.argv
    if smoke:
        def do_bench(fn, **_):  # type: ignore[no-untyped-def]
            fn()
            return 1.0
        dev, n_sm = torch.device("cpu"), 8
        global CASES, SHAPES
        CASES, SHAPES = [(3, 64, 20)], {"tiny (4/2 heads, d32)": (4, 2, 32)}
    else:
        from triton.testing import do_bench_cudagraph

        def do_bench(fn, **_):  # type: ignore[no-untyped-def]
            return do_bench_cudagraph(fn, rep=100, return_mode="median")

        dev = torch.device("cuda")
        n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    print_conditions("cascade (shared-prefix) decode attention vs plain split-K decode", {
        "device": torch.cuda.get_device_name(0) if not smoke else "cpu (smoke)", "dtype": "bf16", "page size": PS,
        "layout": "one group: every sequence's table starts with the same prefix pages, then its own",
        "splits": "the backend's own choices (num_splits, shared_splits)",
        "timing": "triton.testing.do_bench_cudagraph median (launches replayed in a CUDA graph), 100 ms of repeats",
    })
    rows: list[list] = []
    sweep: list[list] = []
    for name, (h, hkv, d) in SHAPES.items():
        for batch, shared, own in CASES:
            sp, op = shared // PS, -(-own // PS)
            pages = sp + batch * op
            perm = torch.randperm(pages, device=dev, dtype=torch.int64).to(torch.int32)
            prefix, rest = perm[:sp], perm[sp:].view(batch, op)
            table = torch.cat([prefix.expand(batch, sp), rest], 1).contiguous()
            dt = torch.float32 if smoke else torch.bfloat16
            kc = torch.randn(pages * PS, hkv, d, device=dev, dtype=dt)
            vc = torch.randn_like(kc)
            q = torch.randn(batch, h, d, device=dev, dtype=dt)
            lens_l = [shared + own] * batch
            lens = torch.tensor(lens_l, device=dev, dtype=torch.int32)
            ar = torch.arange(batch, device=dev, dtype=torch.int32)
            host_tables = [(table[b].tolist(), lens_l[b]) for b in range(batch)]
            groups = cascade_groups(host_tables, PS)
            be = TritonBackend.__new__(TritonBackend)  # only its launch heuristics
            be.n_sm, be.cfg = n_sm, type("C", (), {"n_head_kv": hkv, "n_head": h})()
            ns_plain = be.num_splits(batch, shared + own)
            ws_plain = tk.DecodeWorkspace(batch, h, d, ns_plain, dev)
            casc = tk.cascade_groups_tensor(groups, lens_l, dev)
            n_sh = be.shared_splits(len(groups), batch * (h // hkv), shared)
            ws_c = tk.DecodeWorkspace(batch, h, d, be.num_splits(batch, own), dev, shared_splits=n_sh)
            out_p, out_c = torch.empty_like(q), torch.empty_like(q)

            def plain() -> None:
                tk.decode_attention(q, out_p, ar, kc, vc, table, ar, lens, ws_plain, PS, d**-0.5, 0)

            def cascade() -> None:
                tk.decode_attention(q, out_c, ar, kc, vc, table, ar, lens, ws_c, PS, d**-0.5, 0, cascade=casc)

            def shared_only() -> None:
                tk.shared_prefix_attention(q, ar, kc, vc, table, ar, lens, casc, ws_c, PS, d**-0.5, 0)

            ms_p = do_bench(plain)
            ms_c = do_bench(cascade)
            ms_s = do_bench(shared_only)
            for bn, nw in ((64, 4), (32, 4), (64, 8), (32, 8), (16, 4)):  # the shared kernel's launch options
                def variant() -> None:
                    tk.shared_prefix_attention(q, ar, kc, vc, table, ar, lens, casc, ws_c, PS, d**-0.5, 0,
                                               block_n=bn, num_warps=nw)
                try:
                    sweep.append([name, batch, shared, f"{bn}/{nw}", f"{do_bench(variant) * 1e3:.1f}"])
                except Exception as e:  # a configuration the compiler refuses
                    sweep.append([name, batch, shared, f"{bn}/{nw}", f"failed: {type(e).__name__}"])
            diff = (out_p.float() - out_c.float()).abs().max().item()
            per_tok = 2 * hkv * d * 2
            bytes_p, bytes_c = batch * (shared + own) * per_tok, (shared + batch * own) * per_tok
            rows.append([name, batch, shared, own, f"{ms_p * 1e3:.1f}", f"{ms_c * 1e3:.1f}", f"{ms_s * 1e3:.1f}",
                         f"{ms_p / ms_c:.2f}",
                         f"{bytes_p / 2**20:.1f}", f"{bytes_c / 2**20:.1f}", f"{bytes_p / (ms_p / 1e3) / 1e9:.0f}",
                         f"{diff:.2e}"])
            del kc, vc
            torch.cuda.empty_cache()
    print_table(["shape", "batch", "shared", "own", "plain µs", "cascade µs", "of it shared kernel µs", "speed-up",
                 "plain KV MiB",
                 "cascade KV MiB", "plain GB/s", "max |Δ|"], rows)
    print_table(["shape", "batch", "shared", "shared kernel block_n/warps", "µs"], sweep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
