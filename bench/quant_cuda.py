"""The CUDA quantized GEMV (Triton, ``kvserve.model.quant.triton_gemv``) against bf16 ``F.linear``
on the linear layers of a Llama-3-8B Q4_K_M file (Q/K/gate/up/o Q4_K; V, down, output Q6_K —
as the synthetic Q4_K_M files store them): GPU microseconds per call (CUDA-graph replay over
copies of the weights larger than the L2 together, as in a decode step), weight bytes read per second, and the fraction
of the device's copy bandwidth measured in the same run (the weight-bytes roofline).

    python bench/quant_cuda.py                     # needs CUDA
    python bench/quant_cuda.py --rows 1,4,8 --sweep   # also try the GEMV configurations

``--sweep`` times every (rows per program, groups per step, warps, programs per SM) of a small
grid at batch 1 and prints the best per tensor next to the default configuration.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import copy_bandwidth  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import cuda_pack, triton_gemv  # noqa: E402
from kvserve.model.quant.cuda_linear import CudaQuantLinear  # noqa: E402
from kvserve.model.synth import random_kquant  # noqa: E402

# (name, [(format, out)], in): one module each, members fused as the loader fuses them
LAYERS = [("qkv", [(Q.Q4_K, 4096), (Q.Q4_K, 1024), (Q.Q6_K, 1024)], 4096), ("o", [(Q.Q4_K, 4096)], 4096),
          ("gate_up", [(Q.Q4_K, 28672)], 4096), ("down", [(Q.Q6_K, 4096)], 14336),
          ("lm_head", [(Q.Q6_K, 128256)], 4096)]
PER_TOKEN = {"lm_head": 1}  # every other layer runs 32 times per token


def time_us(calls: list, calls_per_graph: int = 8) -> float:
    """GPU microseconds per call, replayed in a CUDA graph (no launch cost, as in the decode
    graph). ``calls`` run on distinct copies of the weights, in turn, so that together they
    exceed the 50 MB L2 and every call reads its weights from memory, as in a decode step."""
    for c in calls:
        c()
    n = max(calls_per_graph, len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g):
        for i in range(n):
            calls[i % len(calls)]()
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(5):
        g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e3 / (5 * n)


def n_copies(nbytes: int) -> int:
    return max(1, min(16, -(-256 * 2**20 // nbytes)))


def random_pack(qtype: Q, n: int, k: int, rng: np.random.Generator) -> cuda_pack.Packed:
    raw = torch.from_numpy(random_kquant(rng, (n, k), qtype, 0.05)).cuda()
    return cuda_pack.pack(raw, qtype, k)


def sweep(p: cuda_pack.Packed, x: torch.Tensor) -> tuple[triton_gemv.Config, float, float]:
    """(best configuration, its µs, the default configuration's µs) at batch 1."""
    best = (triton_gemv.default_config(p, 1), float("inf"))
    copies = [p] + [p._replace(q=p.q.clone(), gw=p.gw.clone(), sw=None if p.sw is None else p.sw.clone())
                    for _ in range(n_copies(p.nbytes) - 1)]
    out = torch.empty((1, p.n), dtype=x.dtype, device=x.device)
    for warps, reps in ((1, 1), (2, 1), (4, 1), (4, 2), (8, 2), (8, 4)):
        for programs in (2, 8):
            cfg = triton_gemv.Config(128 * warps * reps, warps, programs)
            t = time_us([lambda c=c: triton_gemv.gemv(x, c, out, cfg=cfg) for c in copies])
            if t < best[1]:
                best = (cfg, t)
    d = triton_gemv.default_config(p, 1)
    return best[0], best[1], time_us([lambda c=c: triton_gemv.gemv(x, c, out, cfg=d) for c in copies])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,8")
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args()
    bw = copy_bandwidth(torch.device("cuda"))
    print_conditions("CUDA quantized GEMV vs bf16 linear (Llama-3-8B Q4_K_M layers)", {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "copy bandwidth (measured)": f"{bw / 1e12:.2f} TB/s",
        "bytes": "Q4_K 5.125 bits/weight (4-bit codes, 6-bit sub-scales/mins and f16 super-scales "
                 "in int32 words); Q6_K 9.125 (8-bit codes, i8 sub-scales, f16 super-scale)",
        "timing": "CUDA-graph replay, mean per call; calls cycle through copies of the weights "
                  "(>= 256 MiB together, so that each call reads from memory, not from the 50 MB L2)"})
    rng = np.random.default_rng(0)
    rows, sweep_rows = [], []
    tot = {"quant": 0.0, "bf16": 0.0}
    dev = torch.device("cuda")
    for name, members, k in LAYERS:
        packs = [random_pack(q, n, k, rng) for q, n in members]
        mod = CudaQuantLinear(packs, None, dev)
        w = mod.dequantized_t(torch.bfloat16).t().contiguous()  # bf16 twin, row-major as the dense path
        qb = mod.weight_bytes()
        mods = [mod] + [copy.deepcopy(mod) for _ in range(n_copies(qb) - 1)]
        ws = [w] + [w.clone() for _ in range(n_copies(w.nbytes) - 1)]
        kinds = "+".join(q.name for q, _ in members)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expect = x.float() @ w.float().T
            err = ((mod(x).float() - expect).abs().max() / expect.abs().max()).item()
            t_q = time_us([lambda md=md: md(x) for md in mods])
            t_b = time_us([lambda wc=wc: F.linear(x, wc) for wc in ws])
            if m == 1:
                reps = PER_TOKEN.get(name, 32)
                tot["quant"] += t_q * reps
                tot["bf16"] += t_b * reps
            rows.append([name, kinds, f"{w.shape[0]}x{k}", m, t_q, t_b, t_b / t_q, qb / (t_q * 1e-6) / 1e9,
                         qb / (t_q * 1e-6) / bw, w.nbytes / (t_b * 1e-6) / bw, f"{err:.1e}"])
        if args.sweep:
            x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            for s in mod.segments:
                pk = s.packed()
                d = triton_gemv.default_config(pk, 1)
                cfg, t, t_d = sweep(pk, x)
                sweep_rows.append([name, f"{pk.bits}-bit gs{pk.gs}", f"{pk.n}x{pk.k}", str(tuple(d)), t_d,
                                   str(tuple(cfg)), t, pk.nbytes / (t * 1e-6) / bw])
        del w, ws, mod, mods
    print_table(["layer", "formats", "shape", "rows", "quant µs", "bf16 µs", "bf16/quant", "quant GB/s",
                 "quant / roofline", "bf16 / roofline", "max rel err"], rows, digits=2)
    print(f"\n32 layers + head at batch 1, linear layers only: quant {tot['quant'] / 1e3:.3f} ms/token "
          f"({1e6 / tot['quant']:.0f} tok/s bound), bf16 {tot['bf16'] / 1e3:.3f} ms/token "
          f"({1e6 / tot['bf16']:.0f} tok/s bound)\n")
    if sweep_rows:
        print_table(["layer", "layout", "shape", "default (bn, warps, programs)", "default µs", "best",
                     "best µs", "best / roofline"], sweep_rows, digits=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
