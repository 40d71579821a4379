"""The attention side of a batch-1 decode layer (CUDA): RoPE + KV write + split-K attention +
merge, as the separate kernels (``rope_write``, ``decode_attention``) and as the one-launch
``decode_fused`` at several split counts, key blocks and with/without programmatic dependent
launch (PDL), inside a step as the model runs it.

A CUDA graph replays L layers of: the Q/K/V projection (cuBLAS, bf16, [1, n_embd] x
[n_embd, (H + 2 Hkv) D]), the attention side, the output projection ([1, H D] x [H D, n_embd]).
Each layer has its own KV cache (2 x ctx x Hkv x D bf16, pages of 16 in shuffled order), so
that across layers the keys come from DRAM, not L2. The same graph without the attention side
(the projection's q goes straight to the output projection) is the floor: "µs / layer" is
(graph time - floor) / L, i.e. what the attention side adds to a layer, launch gaps included.
Each variant's output is compared with the separate kernels' (max |diff| / max |ref|).

    python bench/decode_attn_b1.py [--layers 16] [--ctx 2048,4096]

The Q/K/V projection runs as the project's Triton GEMV (its RMSNorm prologue, as the 1B
model's does) and, at the first context, as cuBLAS.
The last lines ``BEST <shape> splits=N block_n=N pdl=0|1`` name the fastest one-launch variant
after the Triton GEMV at the first context (for the engine rows of bench/gpu_matrix.sh).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":  # Triton 3.6's interpreter on NumPy >= 2.4 (tests do the same)
    from triton.runtime import interpreter

    _orig = interpreter._patch_lang_tensor

    def _patched(tensor, scope):
        _orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = _patched

from common import print_conditions, print_table  # noqa: E402

from kvserve.model import dense_gemv  # noqa: E402
from kvserve.model.backends import triton_kernels as tk  # noqa: E402
from kvserve.model.rope import RopeTables  # noqa: E402

SHAPES = {"1B": (32, 8, 64, 2048), "8B": (32, 8, 128, 4096)}  # H, Hkv, D, n_embd
PS = 16


def _time_graph(fn, reps: int = 5, iters: int = 40) -> float:
    """Median µs of one replay of ``fn`` captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / iters)
    return sorted(times)[len(times) // 2]


def run_shape(name: str, h: int, hkv: int, d: int, n_embd: int, ctx: int, layers: int, n_sm: int,
              variants: list[tuple[str, dict]], producer: str) -> list[list]:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16 if dev.type == "cuda" else torch.float32
    pages = ctx // PS + 1
    caches = []
    for _ in range(layers):
        kc = torch.randn(pages * PS, hkv, d, device=dev, dtype=bf, generator=gen)
        caches.append((kc, torch.randn_like(kc)))
    table = torch.randperm(pages, device=dev, generator=gen).to(torch.int32).view(1, pages)
    w_qkv = [torch.randn(n_embd, (h + 2 * hkv) * d, device=dev, dtype=bf, generator=gen) * n_embd**-0.5
             for _ in range(layers)]
    w_o = [torch.randn(h * d, n_embd, device=dev, dtype=bf, generator=gen) * (h * d) ** -0.5 for _ in range(layers)]
    x0 = torch.randn(1, n_embd, device=dev, dtype=bf, generator=gen)
    # "triton": the project's GEMV with its RMSNorm prologue (as the 1B model's Q/K/V runs);
    # "cublas": x @ W
    w_qkv_nk = [w.t().contiguous() for w in w_qkv] if producer == "triton" else []
    r0 = torch.randn_like(x0)
    norm_w = torch.ones(n_embd, device=dev, dtype=bf)
    gemv_cfg = dense_gemv.Config(8, 512, 4, 8)
    rope = RopeTables({(10000.0, 1.0)}, d, dev, ctx + 16)
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    zero = torch.zeros(1, dtype=torch.int32, device=dev)
    lens = torch.full((1,), ctx, dtype=torch.int32, device=dev)
    pos = lens - 1
    max_ctx = 1 << 18  # splits as a graph of the backend picks them: for the longest context
    default_ns = max(1, min(-(-2 * n_sm // hkv), 32, -(-max_ctx // 64)))
    x_out = torch.empty(1, n_embd, device=dev, dtype=bf)
    wss: dict[tuple, tk.DecodeWorkspace] = {}

    def step(kind: str, cfg: dict) -> None:
        x = x0
        for li in range(layers):
            if producer == "triton":
                qkv, _ = dense_gemv.gemv(x, w_qkv_nk[li], gemv_cfg, residual=r0, norm_w=norm_w, eps=1e-5)
            else:
                qkv = x @ w_qkv[li]
            q = qkv[:, : h * d].view(1, h, d)
            k = qkv[:, h * d : (h + hkv) * d].view(1, hkv, d)
            v = qkv[:, (h + hkv) * d :].view(1, hkv, d)
            kc, vc = caches[li]
            if kind == "floor":
                out = q
            elif kind == "apart":
                ws = wss.setdefault(("apart",), tk.DecodeWorkspace(1, h, d, default_ns, dev))
                qr = tk.rope_write(q, k, v, kc, vc, cos, sin, pos, zero, table, PS, d, False)
                out = torch.empty_like(qr)
                tk.decode_attention(qr, out, zero, kc, vc, table, zero, lens, ws, PS, d**-0.5, 0)
            elif kind == "merge":
                ws = wss.setdefault(("merge",), tk.DecodeWorkspace(1, h, d, default_ns, dev, n_head_kv=hkv))
                qr = tk.rope_write(q, k, v, kc, vc, cos, sin, pos, zero, table, PS, d, False)
                out = torch.empty_like(qr)
                tk.decode_fused(qr, None, None, out, zero, kc, vc, None, None, table, zero, lens, ws, PS, d**-0.5,
                                0, block_n=cfg.get("block_n"))
            else:
                ns = cfg["splits"]
                ws = wss.setdefault(("fused", ns), tk.DecodeWorkspace(1, h, d, ns, dev, n_head_kv=hkv))
                out = torch.empty(1, h, d, device=dev, dtype=bf)
                tk.decode_fused(q, k, v, out, zero, kc, vc, cos, sin, table, zero, lens, ws, PS, d**-0.5, 0, d, False,
                                block_n=cfg["block_n"], pdl=cfg["pdl"])
            x = out.reshape(1, h * d) @ w_o[li]
        x_out.copy_(x)

    timed = dev.type == "cuda"  # elsewhere (TRITON_INTERPRET=1): the outputs only, untimed
    floor = _time_graph(lambda: step("floor", {})) if timed else 0.0
    step("apart", {})
    ref = x_out.clone()
    rows = []
    for label, cfg in variants:
        kind = cfg.get("kind", "fused")
        try:
            t = _time_graph(lambda: step(kind, cfg)) if timed else 0.0
            step(kind, cfg)
            if timed:
                torch.cuda.synchronize()
            err = ((x_out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        except Exception as e:  # a configuration the compiler or the graph capture refuses
            rows.append([name, producer, ctx, label, None, None, None, f"failed: {type(e).__name__}: {str(e)[:80]}"])
            continue
        rows.append([name, producer, ctx, label, t, (t - floor) / layers, f"{err:.1e}", ""])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--ctx", default="2048,4096")
    ap.add_argument("--shapes", default="1B,8B")
    ap.add_argument("--producers", default="triton,cublas",
                    help="the Q/K/V projection before the attention side (cublas: at the first context only)")
    ap.add_argument("--quick", action="store_true", help="two fused variants only (a check of the script)")
    ap.add_argument("--splits", default="8,16,32", help="the one-launch kernel's split counts")
    ap.add_argument("--blocks-d64", default="64,128", help="its keys per block at head_dim 64")
    ap.add_argument("--blocks-d128", default="32,64", help="its keys per block at head_dim 128")
    ap.add_argument("--pdl", default="0,1", help="as a programmatic dependent launch (1) or not (0)")
    ap.add_argument("--no-merge", dest="merge", action="store_false",
                    help="leave out rope_write + split/merge in one launch")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 132
    print_conditions("attention side of a batch-1 decode layer", {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu (TRITON_INTERPRET=1: outputs only)", "dtype": "bf16", "page size": PS, "layers": args.layers,
        "PDL supported": tk.pdl_supported(dev),
        "timing": "CUDA graph of the layers, median of 5 x 40 replays; µs / layer = (graph - floor) / layers",
    })
    ctxs = [int(c) for c in args.ctx.split(",")]
    all_rows = []
    best: dict[str, tuple[float, str]] = {}
    for name in args.shapes.split(","):
        h, hkv, d, n_embd = SHAPES[name]
        blocks = [int(x) for x in (args.blocks_d64 if d <= 64 else args.blocks_d128).split(",")]
        variants: list[tuple[str, dict]] = [("apart (rope_write, split, merge)", {"kind": "apart"})]
        if args.merge:
            variants.append(("rope_write + split/merge fused", {"kind": "merge", "block_n": 64}))
        for pdl in (int(x) for x in args.pdl.split(",")):
            for ns in (int(x) for x in args.splits.split(",")):
                for bn in blocks:
                    variants.append((f"fused splits={ns} block_n={bn} pdl={pdl}",
                                     {"splits": ns, "block_n": bn, "pdl": bool(pdl)}))
        if args.quick:
            variants = variants[: 1 + args.merge] + [variants[1 + args.merge], variants[-1]]
        for producer in args.producers.split(","):
            for ctx in ctxs if producer == "triton" else ctxs[:1]:
                rows = run_shape(name, h, hkv, d, n_embd, ctx, args.layers, n_sm, variants, producer)
                all_rows += rows
                if ctx == ctxs[0] and producer == "triton":
                    for r in rows:
                        if r[3].startswith("fused ") and r[5] is not None and (name not in best or r[5] < best[name][0]):
                            best[name] = (r[5], r[3].removeprefix("fused "))
                torch.cuda.empty_cache()
    print_table(["shape", "Q/K/V by", "context", "variant", "graph µs", "µs / layer", "max rel diff", ""], all_rows,
                digits=2)
    for name, (_, label) in best.items():
        print(f"BEST {name} {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
