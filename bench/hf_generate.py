"""HF transformers ``generate`` on the shapes of ``bench/engine.py``: the reference beside kvserve's rows.

For each ``--synth SHAPE`` (the shape strings or names of ``bench/engine.py``; llama-style
architectures), a ``LlamaForCausalLM`` of that shape with transformers' own random initialisation
(speed does not depend on the values), in ``--dtype`` on ``--device``, its default attention and
cache. Per batch size: ``batch`` random prompts of ``--ctx`` tokens, greedy ``generate`` of 1 new
token and of ``1 + --steps`` new tokens (no end-of-sequence stop), each timed ``--reps`` times
after a warm-up; decode tok/s = batch · steps / (median long − median short), so the prompt's
prefill is not counted; prefill tok/s = batch · ctx / median short. With ``--roofline`` (CUDA):
decode against the same bandwidth roofline as ``bench/engine.py --roofline`` (every weight but the
embedding table plus each sequence's KV, at the measured copy bandwidth).

    python bench/hf_generate.py --synth "llama:n_layer=16,n_embd=2048,..." --device cuda --dtype bf16 \\
        --batches 1,64 --ctx 2048 --steps 32 --roofline
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import copy_bandwidth, synth_spec  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def build(shape: str, dtype: torch.dtype, device: torch.device, max_pos: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    s = synth_spec(shape, "F16")
    if s.arch != "llama":
        raise SystemExit(f"{shape!r}: only llama shapes are built here")
    cfg = LlamaConfig(vocab_size=s.n_vocab, hidden_size=s.n_embd, intermediate_size=s.n_ff,
                      num_hidden_layers=s.n_layer, num_attention_heads=s.n_head,
                      num_key_value_heads=s.n_head_kv, head_dim=s.head_dim, max_position_embeddings=max_pos,
                      rope_theta=s.rope_base, tie_word_embeddings=s.tied, rms_norm_eps=1e-5,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    model.eval()
    return s, model


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter but the token embedding table (a decode step gathers a row of it)."""
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    tied = model.get_output_embeddings().weight is emb
    return total - (0 if tied else emb.numel() * emb.element_size())


def timed_generate(model, ids: torch.Tensor, new: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, eos_token_id=None)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    assert out.shape[1] == ids.shape[1] + new
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> list[list]:
    """Prints the conditions and the table; returns its rows."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--synth", action="append", required=True, help="shape (bench/engine.py's --synth)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--batches", default="1,64")
    p.add_argument("--ctx", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--steps", type=int, default=32, help="timed decode steps")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--roofline", action="store_true")
    args = p.parse_args(argv)
    import transformers

    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    print_conditions("HF transformers generate (greedy), random weights of each shape", {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
        "context": args.ctx, "timed steps": args.steps, "reps": args.reps, "batches": batches,
    })
    bw = copy_bandwidth(device) if args.roofline and device.type == "cuda" else None
    rows = []
    for shape in args.synth:
        s, model = build(shape, DTYPES[args.dtype], device, args.ctx + args.steps + 16)
        wb = weight_bytes(model)
        kv_tok = s.n_layer * 2 * s.n_head_kv * s.head_dim * torch.finfo(DTYPES[args.dtype]).bits // 8
        with torch.inference_mode():
            for bs in batches:
                g = torch.Generator().manual_seed(bs)
                ids = torch.randint(1, s.n_vocab, (bs, args.ctx), generator=g).to(device)
                timed_generate(model, ids, 2, device)  # warm-up
                short = statistics.median(timed_generate(model, ids, 1, device) for _ in range(args.reps))
                long = statistics.median(timed_generate(model, ids, 1 + args.steps, device)
                                         for _ in range(args.reps))
                # (a difference within the timer's noise reads n/a)
                dec = bs * args.steps / (long - short) if long > short else float("nan")
                row = [shape.split(":")[0] + f" L{s.n_layer} d{s.n_embd}", bs, bs * args.ctx / short, dec,
                       1e3 * (long - short) / args.steps]
                if bw is not None:
                    roof = bs / ((wb + bs * args.ctx * kv_tok) / bw)
                    row += [wb / 1e9, bs * args.ctx * kv_tok / 1e9, roof, dec / roof]
                rows.append(row)
                print(f"{row[0]} batch {bs}: prefill {row[2]:.1f} tok/s, decode {dec:.1f} tok/s",
                      file=sys.stderr, flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    head = ["shape", "batch", "prefill tok/s (with 1 token)", "decode tok/s", "ms a step"]
    if bw is not None:
        print(f"copy bandwidth {bw / 1e9:.0f} GB/s (read + write)\n")
        head += ["weights GB", "KV read GB/step", "roofline tok/s", "fraction of roofline"]
    print_table(head, rows, digits=2)
    return rows


if __name__ == "__main__":
    main()
