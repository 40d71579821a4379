"""Sampling time per step: the sampler's fast path against the full chain on the same rows.

For each (batch, chain): ``sample_batch`` on random [B, V] float32 logits on the device, every
row its own seeded sampler with a history (the prompt) of 512 tokens, each step's tokens
accepted; wall time per step (synchronized: the tokens reach the host) with
``KVSERVE_FAST_SAMPLER`` on and off, and whether both drew the same tokens.

    python bench/sampler_step.py [--device cuda] [--vocab 49152]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402

from kvserve.engine import sampler_fast  # noqa: E402
from kvserve.engine.sampler import SequenceSampler, sample_batch  # noqa: E402
from kvserve.engine.sampling_params import SamplingParams  # noqa: E402

CHAINS = {
    "default (top_k 40, top_p 0.95, min_p 0.05, temp 0.8)": {},
    "default + penalties (repeat 1.1, freq 0.1, presence 0.1, last 64)":
        dict(repeat_penalty=1.1, frequency_penalty=0.1, presence_penalty=0.1),
    "default + repeat 1.1 over the whole history (last -1)": dict(repeat_penalty=1.1, repeat_last_n=-1),
    "greedy + repeat 1.3": dict(temperature=0.0, repeat_penalty=1.3),
}


def run(batch: int, fields: dict, vocab: int, dev: torch.device, steps: int, fast: bool) -> tuple[float, list]:
    os.environ["KVSERVE_FAST_SAMPLER"] = "1" if fast else "0"
    g = torch.Generator().manual_seed(1)
    hist = torch.randint(0, vocab, (batch, 512), generator=g).tolist()
    samplers = [SequenceSampler(SamplingParams(seed=10 + i, **fields), vocab, history=hist[i]) for i in range(batch)]
    logits = [torch.randn(batch, vocab, generator=g).mul_(3).to(dev) for _ in range(4)]
    out, times = [], []
    for step in range(steps + 3):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = sample_batch(logits[step % 4], samplers)  # the tokens are on the host when it returns
        dt = time.perf_counter() - t0
        for s, r in zip(samplers, res):
            s.accept(r.token)
        out.append([r.token for r in res])
        if step >= 3:
            times.append(dt)
    times.sort()
    return times[len(times) // 2], out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batches", default="1,64")
    args = p.parse_args()
    dev = torch.device(args.device)
    print_conditions("sampling time per step: fast path vs full chain", {
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "vocab": args.vocab,
        "history": "512 random prompt tokens per row, then each step's token",
        "timing": f"median wall ms of {args.steps} steps after 3 warm-up, synchronized",
    })
    rows = []
    for b in [int(x) for x in args.batches.split(",")]:
        for name, fields in CHAINS.items():
            s = SequenceSampler(SamplingParams(**fields), args.vocab)
            assert sampler_fast.eligible(s), name
            t_fast, tok_fast = run(b, fields, args.vocab, dev, args.steps, True)
            t_chain, tok_chain = run(b, fields, args.vocab, dev, args.steps, False)
            rows.append([b, name, f"{t_chain * 1e3:.2f}", f"{t_fast * 1e3:.2f}", f"{t_chain / t_fast:.1f}",
                         "yes" if tok_fast == tok_chain else "NO"])
    print_table(["batch", "chain", "full chain ms", "fast path ms", "speed-up", "same tokens"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
