"""Where the quantized CPU path's logits leave the float32 reference, one rounding at a time.

The int4 kernel (``quant.int4``) computes each linear layer as ``bf16(bf16(x) @ W.T)`` with
``W = (c − 8)·s + z`` from bf16 scales and offsets; the float32 reference (``--dtype f32``)
is ``x @ W_exact.T`` in float32. This script loads both, then replaces every quantized layer's
forward by a float32 emulation that applies a chosen subset of the kernel's three roundings —
the scales/offsets to bf16 ("s/z"), the activations to bf16 ("x"), the outputs to bf16 ("y") —
and reports, against the reference, the max |Δlogit| over a teacher-forced prompt, the last
position's, and the first draw's candidates as llama-server's default chain sees them (the top
probability after top_k 40 / top_p 0.95 / min_p 0.05 at temperature 1, and how many survive).
"layers" / "head" restrict the emulation to the blocks or to the output head. The row
"kernel" is the real path as loaded.

    python bench/quant_error_sources.py                       # SmolLM2 (the package's file)
    python bench/quant_error_sources.py --model qwen.gguf --prompt "def f(x):"
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.model.files import default_model_path  # noqa: E402
from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.quant import QuantLinear  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402
from kvserve.model.tokenizer import Tokenizer  # noqa: E402
from kvserve.plan import Plan, SeqChunk  # noqa: E402

PROMPT = "Today was the day. Today I would finally become a"
CASES = [  # (name, weights from bf16 s/z, round x, round y, where)
    ("none (= f32 reference)", False, False, False, "all"),
    ("s/z", True, False, False, "all"),
    ("x", False, True, False, "all"),
    ("y", False, False, True, "all"),
    ("x + y", False, True, True, "all"),
    ("s/z + x + y", True, True, True, "all"),
    ("s/z + x + y, layers only", True, True, True, "layers"),
    ("s/z + x + y, head only", True, True, True, "head"),
    ("s/z, head only", True, False, False, "head"),
    ("y, head only", False, False, True, "head"),
]


def logits(loaded, ids: list[int]) -> torch.Tensor:
    pages = len(ids) // 16 + 2
    runner = ModelRunner(loaded, n_pages=pages, page_size=16)
    return runner.run(Plan((SeqChunk(0, tuple(ids), 0, tuple(range(pages)), "all"),))).logits[0].float()


def first_draw(row: torch.Tensor) -> tuple[float, int]:
    """llama-server's default chain at temperature 1: (top probability, candidates left)."""
    p = torch.softmax(row.topk(40).values, -1)
    keep = int((torch.cumsum(p, -1) < 0.95).sum()) + 1
    p = p[:keep]
    p = p[p >= 0.05 * p[0]]
    p = p / p.sum()
    return float(p[0]), int(p.numel())


def emulate(mod: QuantLinear, w: torch.Tensor, rx: bool, ry: bool):
    def forward(x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, mod.in_features)
        y = F.linear(x2.bfloat16().float() if rx else x2, w)
        if ry:
            y = y.bfloat16().float()
        if mod.bias is not None:
            y = y + mod.bias
        return y.to(x.dtype).view(*x.shape[:-1], -1)
    return forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = args.model or default_model_path()
    quant, ref = load_gguf(path), load_gguf(path, weights="dense")
    ids = Tokenizer.from_metadata(quant.metadata).encode(args.prompt, True, False)
    print_conditions("quantized CPU path vs the float32 reference, by rounding", {
        "model": os.path.basename(path), "weights": quant.summary.line() if quant.summary else quant.weights,
        "torch": torch.__version__, "prompt": f"{len(ids)} tokens, teacher-forced, logits of every position",
        "first draw": "top_k 40, top_p 0.95, min_p 0.05, temperature 1 (llama-server's defaults)"})
    want = logits(ref, ids)
    dense = dict(ref.model.named_modules())
    mods = {n: m for n, m in quant.model.named_modules() if isinstance(m, QuantLinear)}
    def exact_weight(n: str) -> torch.Tensor:
        if n not in dense:  # a tied head: the embedding matrix
            return ref.model.embed.weight.float()
        m = dense[n]
        return m.dequantized() if hasattr(m, "dequantized") else m.weight.float()

    exact = {n: exact_weight(n) for n in mods}
    kernel_w = {n: m.dequantized() for n, m in mods.items()}
    rows: list[list[object]] = []

    def report(name: str, got: torch.Tensor) -> None:
        top, n = first_draw(got[-1])
        d = (got - want).abs()
        rows.append([name, f"{d.max().item():.3f}", f"{d[-1].max().item():.3f}", f"{top:.3f}", n])

    report("kernel (as loaded)", logits(quant, ids))
    saved = {n: m.forward for n, m in mods.items()}
    for name, sz, rx, ry, where in CASES:
        for n, m in mods.items():
            on = where == "all" or (where == "head") == ("layers." not in n)
            m.forward = emulate(m, kernel_w[n] if sz and on else exact[n], rx and on, ry and on)
        report(name, logits(quant, ids))
    for n, m in mods.items():
        m.forward = saved[n]
    head = ["roundings emulated", "max |Δlogit|", "last position", "first draw top p", "candidates"]
    print_table(head, rows)


if __name__ == "__main__":
    main()
