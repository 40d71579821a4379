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


def _load_hf(path: str) -> torch.nn.Module:
    """transformers' model of a GGUF. transformers parses the file once for the config and again
    for the weights, and builds gguf's tensor-name map once per submodule: during the load each
    is made once (the same objects, read only; the same model: ~15 -> ~6 s for SmolLM2, ~29 ->
    ~17 s for Gemma 3 on 2 cores)."""
    import gguf
    from transformers import AutoModelForCausalLM

    real_reader, real_name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict = {}
    name_maps: dict = {}

    def reader(file, *args):
        key = (os.fspath(file), args)
        if key not in readers:
            readers[key] = real_reader(file, *args)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in name_maps:
            name_maps[arch, n_blocks] = real_name_map(arch, n_blocks)
        return name_maps[arch, n_blocks]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        mp.setattr(gguf, "get_tensor_name_map", name_map)
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
        )
    return model.eval()


@pytest.fixture(scope="module")
def hf():
    """``hf(path)``: the transformers model of a GGUF, loaded once per file for this module (both
    SmolLM2 tests read it). The tests only run it (eval, no grad)."""
    loaded: dict[str, torch.nn.Module] = {}

    def get(path: str) -> torch.nn.Module:
        if path not in loaded:
            loaded[path] = _load_hf(path)
        return loaded[path]

    yield get
    loaded.clear()


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
def test_teacher_forced_logits_match_transformers(which, request, hf):
    path = request.getfixturevalue(f"{which}_path")
    loaded = request.getfixturevalue(f"{which}_dense")
    model = hf(path)
    runner = ModelRunner(loaded, n_pages=64)
    for ids in _prompts(path):
        assert len(ids) >= 200
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].float()
        _check_parity(_all_logits(runner, ids), ref)


def test_greedy_generation_matches_transformers(smollm_path, smollm_dense, hf):
    model = hf(smollm_path)
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
            out = model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        ref = out[0, len(ids) :].tolist()
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
