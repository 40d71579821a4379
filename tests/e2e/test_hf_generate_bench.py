"""``bench/hf_generate.py`` (the HF transformers reference rows of ``bench/gpu_matrix.sh``'s ``hf``
section) on a tiny llama shape on the CPU: it builds the model of the shape string, times
``generate`` per batch size and prints one row each, with the prompt excluded from decode."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

pytest.importorskip("transformers")

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
SHAPE = "llama:n_layer=2,n_embd=128,n_head=4,n_head_kv=2,head_dim=32,n_ff=256,n_vocab=512,tied=False"


def _load():
    path = os.path.join(BENCH, "hf_generate.py")
    spec = importlib.util.spec_from_file_location("kvserve_bench_hf_generate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hf_generate_rows_per_shape_and_batch(capsys):
    hf = _load()
    rows = hf.main(["--synth", SHAPE, "--device", "cpu", "--dtype", "f32", "--batches", "1,3", "--ctx", "16",
                    "--steps", "48", "--reps", "3"])
    out = capsys.readouterr().out
    assert [r[1] for r in rows] == [1, 3]
    for shape, batch, prefill, decode, ms in rows:
        assert shape == "llama L2 d128"
        assert prefill > 0 and ms > 0 and math.isfinite(decode) and decode > 0
        # decode is batch tokens per step of the long run beyond the short one: the prompt is not counted
        assert decode == pytest.approx(batch * 1e3 / ms)
    assert "| llama L2 d128 | 3 " in out and "transformers" in out


@pytest.mark.parametrize("tied", [False, True])
def test_hf_generate_model_has_the_shape(tied):
    import torch

    hf = _load()
    shape = SHAPE.replace("tied=False", f"tied={tied}")
    spec, model = hf.build(shape, torch.float32, torch.device("cpu"), 64)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
            cfg.head_dim, cfg.intermediate_size, cfg.vocab_size) == (2, 128, 4, 2, 32, 256, 512)
    assert cfg.tie_word_embeddings == tied and spec.n_vocab == 512
    emb = model.get_input_embeddings().weight
    every = sum(p.numel() * 4 for p in model.parameters())  # a tied table is one parameter
    # a step reads every weight but the embedding table, unless the table is also the output head
    assert hf.weight_bytes(model) == (every if tied else every - emb.numel() * 4)
