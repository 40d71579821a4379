"""The dense (bf16) decode GEMVs: cuBLAS against the Triton GEMV of ``model/dense_gemv.py`` on the
linear layers of the "1B" and "8B" shapes, timed as ``dense_gemv.prepare`` times them at load
(the choice it makes is the one printed): GPU microseconds per call, replayed in a CUDA graph
over every layer of that shape in turn (under ``KVSERVE_GEMV_PDL`` each call overlapping the one
before, as in a step) (random weights, all layers of the model, so that the
reads come from memory as in a decode step). cuBLAS is timed with the kernel the Triton GEMV
takes into its prologue (the RMSNorm before Q/K/V and gate/up, act(gate)·up before down).
Fractions: the weight bytes ÷ the time, against the device's copy bandwidth (read + write)
measured in the same run.

    python bench/dense_gemv.py                 # needs CUDA
    python bench/dense_gemv.py --shapes 1B --rows 1
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import copy_bandwidth  # noqa: E402
from torch import nn  # noqa: E402

from kvserve.model import dense_gemv as D  # noqa: E402

# (layers, n_embd, n_ff, q heads, kv heads, head_dim, vocab): the shapes
SHAPES = {"1B": (16, 2048, 8192, 32, 8, 64, 49152), "8B": (32, 4096, 14336, 32, 8, 128, 49152)}


def fake_model(shape: str, device: torch.device) -> nn.Module:
    """Modules named as a fused Llama model's decode-step linear layers, random bf16 weights."""
    n_layer, d, ff, nh, nkv, hd, vocab = SHAPES[shape]
    root = nn.Module()
    root.layers = nn.ModuleList()
    for _ in range(n_layer):
        blk = nn.Module()
        blk.attn, blk.mlp = nn.Module(), nn.Module()
        blk.attn.qkv = nn.Linear(d, (nh + 2 * nkv) * hd, bias=False, device=device, dtype=torch.bfloat16)
        blk.attn.o = nn.Linear(nh * hd, d, bias=False, device=device, dtype=torch.bfloat16)
        blk.mlp.gate_up = nn.Linear(d, 2 * ff, bias=False, device=device, dtype=torch.bfloat16)
        blk.mlp.down = nn.Linear(ff, d, bias=False, device=device, dtype=torch.bfloat16)
        root.layers.append(blk)
    root.lm_head = nn.Linear(d, vocab, bias=False, device=device, dtype=torch.bfloat16)
    for p in root.parameters():
        p.requires_grad_(False)
        p.normal_(0, 0.02)
    return root


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="1B,8B")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    print_conditions("Dense decode GEMVs: cuBLAS vs Triton (bench/dense_gemv.py)", {
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "copy bandwidth GB/s (read + write)": f"{bw / 1e9:.0f}",
        "candidates (bn, bk, warps, programs/SM)": ", ".join(str(tuple(c)) for c in D.CANDIDATES),
        "programmatic dependent launch (KVSERVE_GEMV_PDL, _PRE)":
            f"on, {D.PRE_TILES} weight tile(s) before the wait" if D.PDL and D.pdl_supported(dev) else "off",
    })
    for shape in args.shapes.split(","):
        model = fake_model(shape, dev)
        D._CHOSEN.clear()
        D.prepare(model)
        sizes = {f"{m.weight.shape[0]}x{m.weight.shape[1]}": m.weight.numel() * 2 for m in model.modules()
                 if isinstance(m, nn.Linear)}
        labels = ["cublas"] + [D._label(c) for c in D.CANDIDATES]
        head = ["shape", "layers", "MiB", "role", "rows", *labels, "chosen", "chosen / roofline",
                "cuBLAS / roofline"]
        rows = []
        per_token = {1: [0.0, 0.0], D.MAX_ROWS: [0.0, 0.0]}  # rows → [cuBLAS µs, chosen µs] per token
        for label, n, role, r, times, chosen in D.TIMINGS:
            nbytes = sizes[label]
            best = times[chosen]
            per_token[r][0] += n * times["cublas"]
            per_token[r][1] += n * best
            cands = [times.get(x, float("nan")) for x in labels]
            rows.append([label, n, nbytes / 2**20, role, r, *cands, chosen, nbytes / (best * 1e-6) / bw,
                         nbytes / (times["cublas"] * 1e-6) / bw])
        print(f"## {shape}: µs per call (cuBLAS with its producer kernel)\n")
        print_table(head, rows, digits=2)
        for r, (cub, ch) in per_token.items():
            print(f"{shape}, {r} row(s): linear layers of one token {cub:.0f} µs with cuBLAS (+ norm / act·mul "
                  f"kernels), {ch:.0f} µs as chosen")
        print()
        del model
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
