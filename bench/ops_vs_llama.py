"""Each op of kvserve's CPU forward pass against llama.cpp's, fed llama.cpp's own inputs.

llama.cpp runs one prompt (``bench/ggml_dump.cpp``, built against a llama.cpp build, writes every
float32 node of its graph); then every op of kvserve's Llama forward pass (the quantized path as
loaded: native linear kernels, the CPU backend's RoPE and attention) takes llama.cpp's input of
that op and its output is compared with llama.cpp's output of the same op: the share of
bit-identical elements and the max |difference|, over the layers. An op that is not bit-identical
makes the logits differ at least at the ulp level, and the quantized path (activations rounded to
8-bit blocks) grows such differences to ~0.1 in the logits (docs/benchmarks.md §6), so that seeded
draws part. Llama-architecture models (SmolLM2) only.

    python bench/ops_vs_llama.py --llama-src /work/peer/src --llama-build /work/peer/build
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model import attn_native, ops_cpu  # noqa: E402
from kvserve.model.files import default_model_path  # noqa: E402
from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.rope import RopeTables, apply_rope_full  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402
from kvserve.model.tokenizer import Tokenizer  # noqa: E402
from kvserve.plan import Plan, SeqChunk  # noqa: E402

PROMPT = "Today was the day. Today I would finally become a"  # upstream test_n_probs_post_sampling


def build(src: str, bld: str, out: str) -> str:
    exe = os.path.join(out, "ggml_dump")
    here = os.path.dirname(os.path.abspath(__file__))
    lib = os.path.join(bld, "bin")
    subprocess.run(
        ["g++", "-O1", "-std=c++17", os.path.join(here, "ggml_dump.cpp"), "-o", exe, f"-I{src}/common",
         f"-I{src}/include", f"-I{src}/ggml/include", f"-I{src}/vendor", f"-L{lib}", "-lllama-common", "-lllama",
         "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}"],
        check=True,
    )
    return exe


def read_dump(path: str) -> dict[str, list[np.ndarray]]:
    out: dict[str, list[np.ndarray]] = {}
    with open(path, "rb") as f:
        while name := f.read(128):
            ne = np.frombuffer(f.read(32), np.int64)
            n = int(np.prod(ne))
            a = np.frombuffer(f.read(4 * n), np.float32).reshape(tuple(ne[::-1]))
            out.setdefault(name.split(b"\0")[0].decode(), []).append(a)
    return out


def first_draw(row: torch.Tensor) -> float:
    """The top probability after llama-server's default chain at temperature 1."""
    p = torch.softmax(row.topk(40).values, -1)
    p = p[: int((torch.cumsum(p, -1) < 0.95).sum()) + 1]
    p = p[p >= 0.05 * p[0]]
    return float(p[0] / p.sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", required=True, help="llama.cpp sources (common/, include/, ggml/include)")
    ap.add_argument("--llama-build", required=True, help="its build directory (bin/lib*.so)")
    ap.add_argument("--model", default=None, help="a Llama-architecture GGUF (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--prompt", default=PROMPT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = args.model or default_model_path()
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(args.llama_src, args.llama_build, tmp)
        dump = os.path.join(tmp, "nodes.bin")
        subprocess.run([exe, "-m", path, "-p", args.prompt, "-c", "512", "-t", "1", "-fa", "on", "-ngl", "0"],
                       env=dict(os.environ, DUMP_OUT=dump), check=True, capture_output=True)
        nodes = read_dump(dump)
    loaded = load_gguf(path)
    cfg, m = loaded.cfg, loaded.model
    ids = Tokenizer.from_metadata(loaded.metadata).encode(args.prompt, True, True)  # as llama.cpp tokenizes it
    t = len(ids)
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv

    def g(name: str, i: int = 0, *shape: int) -> torch.Tensor:
        a = nodes[name][i]  # (ne3, ne2, ne1, ne0); the last layer keeps the output rows only after attention
        return torch.from_numpy(a.copy()).reshape(*(shape or (-1, a.shape[-1])))

    stats: dict[str, list[tuple[float, float]]] = {}

    def cmp(op: str, got: torch.Tensor, want: torch.Tensor) -> None:
        got = got.reshape(want.shape).float()
        stats.setdefault(op, []).append((float((got == want).float().mean()), float((got - want).abs().max())))

    pos = torch.arange(t)
    for i, blk in enumerate(m.layers):
        x = g("embd") if i == 0 else g(f"l_out-{i - 1}")
        cmp("attn_norm (RMSNorm)", blk.attn_norm.forward(x), g(f"attn_norm-{i}"))
        qkv = blk.attn.qkv.forward(g(f"attn_norm-{i}"))
        q_n, k_n = nh * hd, nkv * hd
        cmp("Q, K, V projections", qkv, torch.cat([g(f"Qcur-{i}"), g(f"Kcur-{i}"), g(f"Vcur-{i}")], -1))
        key = cfg.layer_rope(i)
        tables = RopeTables({key}, cfg.rope_dim, torch.device("cpu"), t)
        q = g(f"Qcur-{i}", 2, t, nh, hd)
        want = torch.cat([q, g(f"Kcur-{i}", 2, t, nkv, hd)], 1)
        qk = torch.cat([g(f"Qcur-{i}", 1, t, nh, hd), g(f"Kcur-{i}", 1, t, nkv, hd)], 1)
        c, s = tables.full(key, cfg.rope_style)
        cmp("RoPE (Q and K), torch reference", apply_rope_full(qk, c.index_select(0, pos), s.index_select(0, pos),
                                                               cfg.rope_style), want)
        if ops_cpu.enabled(qk):  # what the CPU forward pass runs: rotated in place, K and V written to a pool
            buf = torch.cat([qk.reshape(t, -1), g(f"Vcur-{i}", 1, t, nkv, hd).reshape(t, -1)], 1).contiguous()
            pool = torch.empty(2, t, nkv, hd, dtype=torch.float16)
            out = ops_cpu.rope_kv(buf, nh, nkv, hd, tables.cos[key], tables.sin[key], pos, pos, pool,
                                  cfg.rope_style == "neox")
            cmp("RoPE (Q and K), native", out[:, : nh + nkv], want)
        kv = torch.stack([g(f"Kcur-{i}", 2, t, nkv, hd), g(f"Vcur-{i}", 1, t, nkv, hd)]).half()
        if attn_native.available():
            o = attn_native.attend(q, kv, attn_native.NativeKeys([(0, t, [0])], t), 0, cfg.attn_scale)
            cmp("attention (native kernel, KV f16)", o, g(f"kqv_out-{i}"))
        cmp("attention output projection", blk.attn.o.forward(g(f"kqv_out-{i}")), g(f"attn_out-{i}"))
        cmp("ffn_norm (RMSNorm)", blk.ffn_norm.forward(g(f"ffn_inp-{i}")), g(f"ffn_norm-{i}"))
        gu = blk.mlp.gate_up.forward(g(f"ffn_norm-{i}"))
        cmp("gate, up projections", gu, torch.cat([g(f"ffn_gate-{i}"), g(f"ffn_up-{i}")], -1))
        mlp = blk.mlp
        down, mlp.down.forward = mlp.down.forward, lambda h: h  # the activation alone: down(x) = x
        try:
            gate_up, mlp.gate_up.forward = mlp.gate_up.forward, lambda _: torch.cat([g(f"ffn_gate-{i}"), g(f"ffn_up-{i}")], -1)
            cmp("SwiGLU", mlp.forward(g(f"ffn_norm-{i}")), g(f"ffn_swiglu-{i}"))
        finally:
            mlp.down.forward, mlp.gate_up.forward = down, gate_up
        cmp("down projection", blk.mlp.down.forward(g(f"ffn_swiglu-{i}")), g(f"ffn_out-{i}"))
        cmp("residual adds", g(f"ffn_out-{i}") + g(f"ffn_inp-{i}"), g(f"l_out-{i}"))
    rn = g("result_norm", 0, -1, cfg.n_embd)
    cmp("output norm (RMSNorm)", m.norm.forward(g(f"l_out-{cfg.n_layer - 1}")[-rn.shape[0]:]), rn)
    logits = g("result_output", 0, rn.shape[0], -1)
    cmp("output head", m.logits(rn), logits)
    cmp("token embeddings", m.embed_tokens(torch.tensor(ids)), g("embd"))
    pages = t // 16 + 2
    runner = ModelRunner(loaded, n_pages=pages, page_size=16, kv_dtype=torch.float16)
    ours = runner.run(Plan((SeqChunk(0, tuple(ids), 0, tuple(range(pages)), "last"),))).logits[0].float()[-1]
    print_conditions("kvserve's ops against llama.cpp's, on llama.cpp's inputs", {
        "model": os.path.basename(path), "prompt": f"{t} tokens", "llama.cpp build": args.llama_build,
        "llama.cpp": "-t 1 -fa on, KV f16", "kvserve": loaded.summary.line() if loaded.summary else loaded.weights,
        "first draw top p (temperature 1, default chain)": f"llama.cpp {first_draw(logits[-1]):.4f}, kvserve "
        f"{first_draw(ours):.4f}; max |Δlogit| {float((ours - logits[-1]).abs().max()):.3f}"})
    rows = [[op, f"{100 * min(a for a, _ in v):.2f}% / {100 * sum(a for a, _ in v) / len(v):.2f}%",
             f"{max(d for _, d in v):.2e}", len(v)] for op, v in stats.items()]
    print_table(["op", "bit-identical elements, min / mean over layers", "max |difference|", "layers"], rows)


if __name__ == "__main__":
    main()
