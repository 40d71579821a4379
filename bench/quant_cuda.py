"""The CUDA quantized GEMV (Triton: ``triton_gemv`` on float32 activations, ``triton_q8`` on int8
ones, each module as it runs in a decode step) against bf16 ``F.linear`` on the linear layers of
a Llama-3-8B Q4_K_M file (Q/K/gate/up/o Q4_K; V, down, output Q6_K — as the synthetic Q4_K_M
files store them): GPU microseconds per call (CUDA-graph replay over copies of the weights
larger than the L2 together, as in a decode step) and the fraction of the device's copy
bandwidth measured in the same run (the weight-bytes roofline).

    python bench/quant_cuda.py                     # needs CUDA
    python bench/quant_cuda.py --rows 1,4,8 --sweep   # also try the GEMV configurations

The int8 columns: ``triton_q8`` (a group a loop step) and ``triton_q8_tile`` (a tile of groups
a step, the default). ``--sweep`` times every configuration of a small grid at batch 1 for one
kernel (``--sweep-act``: tile, int8 or float; for tile: columns a program, warps, code words a
column a step, programs a multiprocessor) and prints the best per tensor next to the default
configuration, then the three best of batch 1 and the default again at 4 batch rows;
``--best FILE`` keeps the best per tensor (``KVSERVE_GEMV_TILE_TUNING`` for tile,
``KVSERVE_GEMV_TUNING`` for the others).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import copy_bandwidth  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import cuda_linear, cuda_pack, triton_gemv, triton_q8, triton_q8_tile  # noqa: E402
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


def random_pack(qtype: Q, n: int, k: int, rng: np.random.Generator,
                q6_planes: bool = False) -> cuda_pack.Packed:
    raw = torch.from_numpy(random_kquant(rng, (n, k), qtype, 0.05)).cuda()
    return cuda_pack.pack(raw, qtype, k, q6_planes=q6_planes)


GRID = [(1, 1), (1, 2), (2, 2), (4, 1), (4, 2), (8, 2), (8, 4)]  # (warps, 16-byte loads a thread per row)
# the tiled kernel: (columns a program, warps) × code words a column a loop step × programs an SM
TILE_GRID = [(128, 1), (256, 2), (512, 4)]
TILE_WORDS = (16, 32)
TILE_PROGRAMS = (2, 4, 8, 16)


def tile_configs(spec: str | None, programs: str | None) -> list:
    """The tiled kernel's grid: ``spec`` "BNxWARPSxWORDS,..." (default: ``TILE_GRID`` × ``TILE_WORDS``)
    × ``programs`` "P,..." (default ``TILE_PROGRAMS``)."""
    shapes = ([tuple(int(v) for v in c.split("x")) for c in spec.split(",")] if spec else
              [(bn, warps, words) for bn, warps in TILE_GRID for words in TILE_WORDS])
    progs = [int(v) for v in programs.split(",")] if programs else list(TILE_PROGRAMS)
    return [triton_q8_tile.TileConfig(bn, warps, pr, words) for bn, warps, words in shapes for pr in progs]


def configs(act: str, tile_spec: str | None = None, tile_programs: str | None = None) -> list:
    if act == "tile":
        return tile_configs(tile_spec, tile_programs)
    return [triton_gemv.Config(128 * warps * reps, warps, programs, 1) for warps, reps in GRID
            for programs in (2, 8, 16)]


def sweep(p: cuda_pack.Packed, k: int, act: str, grid: list) -> dict:
    """Every configuration of the grid at batch 1 (the GEMV kernel alone: the int8 kernels'
    activations quantized beforehand); the 3 best and the default at 4 rows."""
    copies = [p] + [p._replace(q=p.q.clone(), gw=p.gw.clone(), sw=None if p.sw is None else p.sw.clone())
                    for _ in range(n_copies(p.nbytes) - 1)]
    mod = {"int8": triton_q8, "tile": triton_q8_tile, "float": triton_gemv}[act]

    def t_of(cfg, m: int) -> float:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xin = triton_q8.quantize_x(x) if act != "float" else x
        out = torch.empty((m, p.n), dtype=x.dtype, device=x.device)
        try:
            return time_us([lambda c=c: mod.gemv(xin, c, out, cfg=cfg) for c in copies])
        except Exception as e:  # a configuration Triton cannot compile: reported, skipped
            print(f"  {tuple(cfg)} at {m} rows: {type(e).__name__}: {str(e)[:200]}")
            return float("inf")

    res = [(t_of(cfg, 1), cfg) for cfg in grid]
    res.sort(key=lambda r: r[0])
    d1 = mod.default_config(p, 1)
    at4 = sorted([(t_of(c, 4), c) for _, c in res[:3]], key=lambda r: r[0])
    return dict(best=res[0], default=(t_of(d1, 1), d1), best4=at4[0], default4=(t_of(d1, 4), d1),
                all=[(t, tuple(c)) for t, c in res])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="1,4,8")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--q6-planes", action="store_true",
                   help="Q6_K as 6-bit codes in two planes (6.625 bits a weight; the tiled kernel only)")
    p.add_argument("--kernels", default="float,int8,tile",
                   help="the table's quantized kernels: float, int8 (a group a step), tile (int8, tiled)")
    p.add_argument("--dump", help="write every sweep timing to this JSON file")
    p.add_argument("--best", help="write the best configuration at batch 1 per tensor (by weight bytes) "
                                  "to this JSON file (for KVSERVE_GEMV_TUNING)")
    p.add_argument("--layers", default=",".join(name for name, _, _ in LAYERS),
                   help="the layers to time (the per-token totals then count only these)")
    p.add_argument("--sweep-act", default="tile", choices=["tile", "int8", "float"],
                   help="the kernel --sweep times (int8: the group-a-step kernel, tile: the tiled one)")
    p.add_argument("--tile-configs", help="the tiled kernel's sweep: BNxWARPSxWORDS,... (columns a program, "
                                          "warps, code words a column a loop step; default: the grid in this file)")
    p.add_argument("--tile-programs", help="programs a multiprocessor the tiled sweep tries: P,...")
    args = p.parse_args()
    dump: dict[str, list] = {}
    bw = copy_bandwidth(torch.device("cuda"))
    print_conditions("CUDA quantized GEMV vs bf16 linear (Llama-3-8B Q4_K_M layers)", {
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "copy bandwidth (measured)": f"{bw / 1e12:.2f} TB/s",
        "bytes": "Q4_K 4.625 bits/weight (4-bit codes, 6-bit sub-scales/mins in 8-bit fields and f16 super-scales "
                 "in int32 words); Q6_K " + ("6.625 (6-bit codes in two planes" if args.q6_planes else
                                             "8.625 (8-bit codes") + ", i8 sub-scales, f16 super-scale)",
        "timing": "CUDA-graph replay, mean per call; calls cycle through copies of the weights "
                  "(>= 256 MiB together, so that each call reads from memory, not from the 50 MB L2)"})
    rng = np.random.default_rng(0)
    rows, sweep_rows = [], []
    kinds_q = (("float", "float", "group"), ("int8", "int8", "group"), ("tile", "int8", "tile"))
    chosen = args.kernels.split(",")
    tot = {"float": 0.0, "int8": 0.0, "tile": 0.0, "bf16": 0.0}
    best: dict[int, tuple] = {}
    dev = torch.device("cuda")
    layers = [(name, members, k, [random_pack(q, n, k, rng, args.q6_planes) for q, n in members])
              for name, members, k in LAYERS if name in args.layers.split(",")]
    if args.sweep:  # first, so that the table below runs each tensor's best configuration
        for name, members, k, packs in layers:
            for s in CudaQuantLinear(packs, None, dev).segments:
                pk = s.packed()
                r = sweep(pk, k, args.sweep_act, configs(args.sweep_act, args.tile_configs, args.tile_programs))
                best[pk.nbytes] = tuple(r["best"][1])
                if args.best:
                    with open(args.best, "w") as fh:
                        json.dump(best, fh)
                mb = pk.nbytes / 2**20
                (t_d, d), (t, cfg), (t_d4, _), (t4, cfg4) = r["default"], r["best"], r["default4"], r["best4"]
                sweep_rows.append([name, f"{pk.bits}-bit gs{pk.gs}", f"{pk.n}x{pk.k}", f"{mb:.1f}",
                                   str(tuple(d)), t_d, str(tuple(cfg)), t, pk.nbytes / (t * 1e-6) / bw,
                                   t_d4, str(tuple(cfg4)), t4])
                print("sweep", sweep_rows[-1], "top 5:", r["all"][:5], flush=True)
                dump[f"{name} {pk.bits}-bit {pk.n}x{pk.k} {pk.nbytes}"] = r["all"]
                if args.dump:
                    with open(args.dump, "w") as fh:
                        json.dump(dump, fh)
        tuned = {"tile": triton_q8_tile, "int8": triton_q8}.get(args.sweep_act)
        if tuned is not None:
            cls = triton_q8_tile.TileConfig if args.sweep_act == "tile" else triton_gemv.Config
            tuned.TUNING.update({nb: cls(*c) for nb, c in best.items()})
            print(f"the table below runs the {args.sweep_act} kernel's best configuration per tensor\n")
    for name, members, k, packs in layers:
        mod = CudaQuantLinear(packs, None, dev)
        w = mod.dequantized_t(torch.bfloat16).t().contiguous()  # bf16 twin, row-major as the dense path
        qb = mod.weight_bytes()
        mods = [mod] + [copy.deepcopy(mod) for _ in range(n_copies(qb) - 1)]
        ws = [w] + [w.clone() for _ in range(n_copies(w.nbytes) - 1)]
        kinds = "+".join(q.name for q, _ in members)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            expect = x.float() @ w.float().T
            t_b = time_us([lambda wc=wc: F.linear(x, wc) for wc in ws])
            row: list = [name, kinds, f"{w.shape[0]}x{k}", m]
            for act, acts, kern in kinds_q:
                if act not in chosen:
                    row += ["-"] * 3
                    continue
                cuda_linear.ACTIVATIONS, cuda_linear.KERNEL = acts, kern
                err = ((mod(x).float() - expect).abs().max() / expect.abs().max()).item()
                t_q = time_us([lambda md=md: md(x) for md in mods])
                if m == 1:
                    tot[act] += t_q * PER_TOKEN.get(name, 32)
                row += [t_q, qb / (t_q * 1e-6) / bw, f"{err:.1e}"]
            if m == 1:
                tot["bf16"] += t_b * PER_TOKEN.get(name, 32)
            rows.append(row + [t_b, w.nbytes / (t_b * 1e-6) / bw, t_b / t_q])
        del w, ws, mod, mods
    print_table(["layer", "formats", "shape", "rows", "float-x µs", "float-x / roofline", "float-x max rel err",
                 "int8-x µs", "int8-x / roofline", "int8-x max rel err", "int8-x tiled µs", "tiled / roofline",
                 "tiled max rel err", "bf16 µs", "bf16 / roofline", "bf16 / tiled"], rows, digits=2)
    print(f"\n32 layers + head at batch 1, linear layers only ({args.layers}): "
          + ", ".join(f"{a} {t / 1e3:.3f} ms/token ({1e6 / t:.0f} tok/s bound)" for a, t in
                      (("quant float-x", tot["float"]), ("quant int8-x", tot["int8"]),
                       ("quant int8-x tiled", tot["tile"]), ("bf16", tot["bf16"])) if t > 0)
          + "\n", flush=True)
    if sweep_rows:
        print(f"sweep of the {args.sweep_act} kernel\n")
        print_table(["layer", "layout", "shape", "MiB", "default configuration", "default µs",
                     "best at 1 row", "best µs", "best / roofline", "default µs, 4 rows",
                     "best at 4 rows (of the 3 best at 1)", "µs"], sweep_rows, digits=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
