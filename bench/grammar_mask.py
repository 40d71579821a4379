"""Cost of grammar-constrained sampling per token, against unconstrained sampling, by vocabulary size.

For each vocabulary (SmolLM2's 49,152 tokens, and 151,936: a synthetic byte-level BPE of that
size, or a real GGUF's with --vocab-152k PATH, e.g. Qwen2.5) and batch size B, a JSON-schema
grammar walks a fixed JSON document token by token; at each step the script times, per token
(per row of the batch):

    unconstrained  sample_batch with the default chain (llama-server's defaults), no grammar
    mask fill      llguidance computing the B rows' bitmasks (parallel, off the GIL)
    mask apply     bitmask -> -inf on the logits' device (one copy, one masked_fill)
    constrained    sample_batch with grammars whose first draw is always rejected: the full
                   llama.cpp path (draw, check, mask, resample); the worst case per token
    check only     sample_batch with grammars whose first draw is accepted (logits peaked on
                   the document's next token): the common case when the model follows the grammar;
                   its ratio is against unconstrained sampling of the same peaked logits (the
                   sampler's chain itself costs more on peaked logits)

Logits are random (seeded) except in "check only". Times are medians over the steps; ratios are
against "unconstrained" measured in the same run. CPU numbers depend on the load of the machine:
compare the ratios, not the milliseconds.

    python bench/grammar_mask.py [--device cpu|cuda] [--batch 1,8] [--vocab-152k PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import print_conditions, print_table  # noqa: E402

from kvserve.engine.sampler import SequenceSampler, sample_batch  # noqa: E402
from kvserve.engine.sampling_params import SamplingParams  # noqa: E402
from kvserve.grammar import GrammarCompiler, GrammarSpec, alloc_bitmask, apply_bitmask_, fill_bitmask  # noqa: E402
from kvserve.model.files import default_model_path  # noqa: E402
from kvserve.model.gguf_meta import read_metadata_file  # noqa: E402
from kvserve.model.tokenizer import Tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city", "zip"]}},
    "required": ["name", "age", "email", "tags", "address"]}
DOC = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"],
       "address": {"city": "London", "zip": "W1"}}


def _tokenizer(path: str) -> Tokenizer:
    meta = {k: v for k, v in read_metadata_file(path).items() if k.startswith(("tokenizer.", "general."))}
    return Tokenizer.from_metadata(meta)


def _synthetic(n_vocab: int) -> Tokenizer:
    from kvserve.model.synth import SynthSpec, write_random_gguf

    with tempfile.TemporaryDirectory() as d:
        path = write_random_gguf(os.path.join(d, "v.gguf"), SynthSpec(n_vocab=n_vocab, n_embd=32, n_head=2,
                                                                      n_head_kv=1, head_dim=16, n_ff=32, n_layer=1))
        return _tokenizer(path)


def _median_ms(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times)


def bench_vocab(label: str, tok: Tokenizer, batch: int, device: torch.device, steps: int) -> list[Any]:
    compiler = GrammarCompiler(tok)
    V = compiler.n_vocab
    t = time.perf_counter()
    grammar = compiler.compile(GrammarSpec("json_schema", json.dumps(SCHEMA)))
    compile_ms = (time.perf_counter() - t) * 1000.0
    doc = compiler.text_to_tokens(json.dumps(DOC).encode())[:steps]
    params = SamplingParams(seed=1)
    gen = torch.Generator().manual_seed(0)
    res: dict[str, list[float]] = {k: [] for k in ("free", "free_peaked", "fill", "apply", "reject", "accept")}
    states = [grammar.new_state() for _ in range(batch)]
    bitmask = alloc_bitmask(batch, V, pin=device.type == "cuda")
    for tid in doc:
        logits = (torch.randn(batch, V, generator=gen) * 3.0).to(device)
        free = [SequenceSampler(params, V, tok.eog_ids) for _ in range(batch)]
        res["free"].append(_median_ms(lambda: sample_batch(logits, free), 5, device))
        res["fill"].append(_median_ms(lambda: fill_bitmask(states, bitmask), 1, device))  # first call: no reuse
        x = logits.clone()
        res["apply"].append(_median_ms(lambda: apply_bitmask_(x, bitmask), 5, device))
        # worst case: the unmasked draw falls outside the grammar (the document's next token is
        # pushed to -inf before the draw, so the first pick is almost surely rejected)
        bad = logits.clone()
        bad[:, tid] = float("-inf")
        con = [SequenceSampler(params, V, tok.eog_ids, grammar=s) for s in states]
        res["reject"].append(_median_ms(lambda: sample_batch(bad, con), 5, device))
        good = logits.clone()
        good[:, tid] = 100.0
        res["free_peaked"].append(_median_ms(lambda: sample_batch(good, free), 5, device))
        res["accept"].append(_median_ms(lambda: sample_batch(good, con), 5, device))
        for s in states:
            s.accept(tid)
    med = {k: statistics.median(v) / batch for k, v in res.items()}
    base = med["free"]
    return [label, V, batch, len(doc), f"{compile_ms:.1f}", f"{base:.3f}", f"{med['fill']:.3f}",
            f"{med['apply']:.3f}", f"{med['reject']:.3f} ({med['reject'] / base:.2f}x)",
            f"{med['free_peaked']:.3f}", f"{med['accept']:.3f} ({med['accept'] / med['free_peaked']:.2f}x)"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--steps", type=int, default=40, help="tokens of the JSON document walked")
    ap.add_argument("--vocab-152k", default="", help="GGUF whose vocabulary to use instead of the synthetic one")
    ap.add_argument("--synthetic-49k", action="store_true",
                    help="a synthetic 49,152-token vocabulary instead of SmolLM2's (no model package needed)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    vocabs = [("synthetic byte-level BPE", _synthetic(49152)) if a.synthetic_49k
              else ("SmolLM2-135M", _tokenizer(default_model_path()))]
    if a.vocab_152k:
        vocabs.append((os.path.basename(a.vocab_152k), _tokenizer(a.vocab_152k)))
    else:
        vocabs.append(("synthetic byte-level BPE", _synthetic(151936)))
    print_conditions("Grammar mask cost per token", {
        "device": str(device) + (f" ({torch.cuda.get_device_name()})" if device.type == "cuda" else ""),
        "torch threads": torch.get_num_threads(),
        "grammar": "JSON schema (5 required properties, nested object, string array), llama.cpp shapes",
        "sampling": "llama-server defaults (top_k 40, top_p 0.95, min_p 0.05, temperature 0.8), seeded",
        "timing": "median over document positions of the median of 5 runs (mask fill: the first run), per row (ms / token)",
    })
    rows = [bench_vocab(label, tok, int(b), device, a.steps) for label, tok in vocabs for b in a.batch.split(",")]
    print_table(["vocabulary", "n_vocab", "B", "steps", "compile ms", "unconstrained", "mask fill",
                 "mask apply", "constrained, rejected first draw", "unconstrained, peaked logits",
                 "constrained, accepted first draw"], rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
