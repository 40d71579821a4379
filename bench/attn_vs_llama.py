"""kvserve's native CPU attention (``model/attn_native.py``) against llama.cpp's own CPU flash
attention (``ggml_flash_attn_ext``, called through ``bench/fattn_ggml.c`` built against a llama.cpp
build), on random inputs of the models' shapes: for each case the share of output elements that
are bit-identical and the max |difference|, and the same for torch's float32 SDPA over the same
float16 cache (the torch path's arithmetic) for scale.

llama.cpp takes one of three CPU paths: one query row at a time (decode, prompts of < 64 rows;
float16 V accumulator), a tiled path for >= 64 rows (float32), and a split over the keys for one
query over >= 512 keys. kvserve's kernel has the first one's arithmetic for every shape.

    python bench/attn_vs_llama.py --llama-src /work/peer/src --llama-build /work/peer/build [--time]

``--time``: also each side's process CPU time per (query row, head, key), one thread, repeated
calls on the same inputs (llama.cpp's op through ggml_graph_compute, kvserve's through
``attn_native.attend``).
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model import attn_native  # noqa: E402

SHAPES = {"smollm2": (9, 3, 64), "qwen2.5-0.5b": (14, 2, 64), "gemma3-270m": (4, 1, 256)}
CASES = [  # (rows, first position): the query rows see keys [0, first position + row]
    (1, 12), (1, 255), (1, 510), (1, 700), (11, 0), (13, 40), (63, 0), (64, 0), (100, 150),
]


def build(src: str, bld: str, out: str) -> str:
    exe = os.path.join(out, "fattn_ggml")
    here = os.path.dirname(os.path.abspath(__file__))
    lib = os.path.join(bld, "bin")
    subprocess.run(
        ["gcc", "-O2", os.path.join(here, "fattn_ggml.c"), "-o", exe, f"-I{src}/ggml/include", f"-L{lib}",
         "-lggml", "-lggml-base", "-lggml-cpu", f"-Wl,-rpath,{lib}", "-lm"],
        check=True,
    )
    return exe


def run_ggml(exe: str, tmp: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos0: int, scale: float,
             threads: int, reps: int = 0) -> tuple[torch.Tensor, float]:
    """llama.cpp's output, and with ``reps`` its CPU seconds per call."""
    t, h, d = q.shape
    L, hkv, _ = k.shape
    f16 = k.dtype == torch.float16
    inp, outp = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    with open(inp, "wb") as f:
        f.write(struct.pack("<8if", t, h, hkv, d, L, pos0, int(f16), threads, scale))
        f.write(q.permute(1, 0, 2).contiguous().numpy().tobytes())
        for x in (k, v):
            a = x.permute(1, 0, 2).contiguous()
            f.write((a.view(torch.int16) if f16 else a).numpy().tobytes())
    r = subprocess.run([exe, inp, outp] + ([str(reps)] if reps else []), check=True, capture_output=True, text=True)
    out = torch.from_numpy(np.fromfile(outp, dtype=np.float32).reshape(t, h, d).copy())
    return out, float(r.stdout) if reps else 0.0


def time_native(q, kv, keys, scale: float, reps: int) -> float:
    out = torch.empty(q.shape)
    attn_native.attend(q, kv, keys, 0, scale, out, threads=1)
    t0 = time.process_time()
    for _ in range(reps):
        attn_native.attend(q, kv, keys, 0, scale, out, threads=1)
    return (time.process_time() - t0) / reps


def compare(a: torch.Tensor, b: torch.Tensor) -> str:
    same = float((a == b).float().mean())
    return f"{100 * same:.1f}% / {float((a - b).abs().max()):.2e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", required=True, help="llama.cpp sources (for ggml/include)")
    ap.add_argument("--llama-build", required=True, help="its build directory (bin/libggml*.so)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kv", choices=["f16", "f32"], default="f16")
    ap.add_argument("--time", action="store_true", help="also ns per (row, head, key) of each, one thread")
    args = ap.parse_args()
    assert attn_native.available(), "the native attention kernel is not built"
    torch.manual_seed(0)
    kv_dtype = torch.float16 if args.kv == "f16" else torch.float32
    print_conditions("native CPU attention vs llama.cpp's ggml_flash_attn_ext", {
        "llama.cpp build": args.llama_build, "KV cache": args.kv, "threads (ggml)": 1 if args.time else args.threads,
        "inputs": "q ~ N(0, 1.5²), k, v ~ N(0, 1) rounded to the cache type, causal",
        "cell": "bit-identical output elements / max |difference|",
        "time": "process CPU time per (query row, head, key), one thread" if args.time else "not measured"})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.llama_src, args.llama_build, tmp)
        for name, (h, hkv, d) in SHAPES.items():
            for t, pos0 in CASES:
                L = pos0 + t
                q = torch.randn(t, h, d) * 1.5
                k = torch.randn(L, hkv, d).to(kv_dtype)
                v = torch.randn(L, hkv, d).to(kv_dtype)
                scale = d ** -0.5
                pairs = h * (t * pos0 + t * (t + 1) // 2)
                reps = max(3, int(3e7 / (pairs * 80))) if args.time else 0  # ~30 ms of llama.cpp's time
                want, ggml_s = run_ggml(exe, tmp, q, k, v, pos0, scale, 1 if args.time else args.threads, reps)
                kv = torch.stack([k, v])  # [2, L, Hkv, D]: one page of L rows
                keys = attn_native.NativeKeys([(pos0, t, [0])], L)
                got = attn_native.attend(q, kv, keys, 0, scale)
                g = h // hkv
                mask = torch.arange(L)[None, :] <= torch.arange(pos0, L)[:, None]
                sdpa = F.scaled_dot_product_attention(
                    q.transpose(0, 1), k.float().repeat_interleave(g, 1).transpose(0, 1),
                    v.float().repeat_interleave(g, 1).transpose(0, 1), attn_mask=mask, scale=scale,
                ).transpose(0, 1)
                path = "tiled" if t >= 64 else ("split keys" if t == 1 and L >= 512 else "one row")
                row = [name, t, L, path, compare(got, want), compare(sdpa, want)]
                if args.time:
                    ns = 1e9 / pairs
                    row += [f"{ggml_s * ns:.1f}", f"{time_native(q, kv, keys, scale, reps) * ns:.1f}"]
                rows.append(row)
    head = ["model shape", "rows", "keys", "llama.cpp path", "native kernel", "torch SDPA float32"]
    if args.time:
        head += ["llama.cpp ns/pair", "kvserve ns/pair"]
    print_table(head, rows)


if __name__ == "__main__":
    main()
