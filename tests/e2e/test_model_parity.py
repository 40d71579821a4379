"""The engine's numbers against an independent reference: HF transformers on the same GGUF, fp32,
against kvserve's dequantized fp32 reference weights (``--dtype f32``; the quantized default is
compared with these in bench/logit_traces.py and with llama-server's goldens in the live tests)."""

from __future__ import annotations

import os

import pytest
import torch

from kvserve.plan import Plan, SeqChunk
from kvserve.model.runner import ModelRunner
from kvserve.model.tokenizer import Tokenizer
from kvserve.model.gguf_meta import read_metadata_file

from ..conftest import TEXTS

pytestmark = pytest.mark.slow


def _hf(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()


def _prompts(path: str) -> list[list[int]]:
    tok = Tokenizer.from_metadata(read_metadata_file(path))
    out = []
    for text in TEXTS:
        ids = tok.encode(text, add_special=True, parse_special=False)
        while len(ids) < 200:
            ids = ids + tok.encode(" " + text, add_special=False, parse_special=False)
        out.append(ids)
    return out


def _all_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    n_pages = -(-len(ids) // runner.page_size)
    plan = Plan((SeqChunk(0, tuple(ids), 0, tuple(range(n_pages)), "all"),))
    return runner.run(plan).logits[0]


def _check_parity(ours: torch.Tensor, ref: torch.Tensor) -> None:
    rel = (ours - ref).abs().max().item() / ref.abs().max().item()
    assert rel <= 1e-3, f"max |dlogit| / max |logit| = {rel}"
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 1e-2
    agree = ours.argmax(-1) == ref.argmax(-1)
    assert bool(agree[decided].all()), f"argmax differs at {(~agree & decided).nonzero().flatten().tolist()}"


@pytest.mark.parametrize("which", ["smollm", "gemma"])
def test_teacher_forced_logits_match_transformers(which, request):
    path = request.getfixturevalue(f"{which}_path")
    loaded = request.getfixturevalue(f"{which}_dense")
    hf = _hf(path)
    runner = ModelRunner(loaded, n_pages=64)
    for ids in _prompts(path):
        assert len(ids) >= 200
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        _check_parity(_all_logits(runner, ids), ref)


def test_greedy_generation_matches_transformers(smollm_path, smollm_dense):
    hf = _hf(smollm_path)
    tok = Tokenizer.from_metadata(read_metadata_file(smollm_path))
    runner = ModelRunner(smollm_dense, n_pages=64)
    prompts = [
        "The capital of France is",
        "def add(a, b):",
        "Once upon a time, in a small village,",
        "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
        "1, 2, 3, 4, 5,",
    ]
    for text in prompts:
        ids = tok.encode(text, add_special=True, parse_special=True)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids) :].tolist()
        pages = tuple(range(8))
        logits = runner.run(Plan((SeqChunk(0, tuple(ids), 0, pages),))).logits[0]
        ours: list[int] = []
        for _ in range(32):
            nxt = int(logits[-1].argmax())
            ours.append(nxt)
            if len(ours) == len(ref):
                break
            chunk = SeqChunk(0, (nxt,), len(ids) + len(ours) - 1, pages)
            logits = runner.run(Plan((chunk,))).logits[0]
        assert ours == ref[: len(ours)] and len(ours) == len(ref), text
